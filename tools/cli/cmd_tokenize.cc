// `cachetune tokenize`: print the token ids of a text under a GGUF file's tokenizer, one line,
// space-separated, as llama.cpp's llama-tokenize --ids does. Reads only the tokenizer metadata, so
// it works on vocabulary-only files and does not load the weights.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/paths.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tools/cli/commands.h"

namespace ct::cli {
namespace {

struct TokenizeArgs {
  std::string model = default_model_path();
  std::string text;
  std::string file;
  bool no_bos = false;
  bool special = false;
};

void run_tokenize(const TokenizeArgs& a) {
  std::string text = a.text;
  if (!a.file.empty()) {
    std::ifstream f(a.file, std::ios::binary);
    CT_THROW_IF_NOT(f.good(), "cannot open text file '{}'", a.file);
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  const auto gguf = GgufFile::open(a.model);
  const Tokenizer tok = Tokenizer::from_gguf(*gguf);
  std::vector<int32_t> ids;
  // BOS as llama.cpp adds it with add_special: when the file asks for it.
  if (!a.no_bos && tok.add_bos()) {
    CT_THROW_IF_NOT(tok.bos() >= 0, "{}: tokenizer.ggml.add_bos_token is true but no BOS token",
                    a.model);
    ids.push_back(tok.bos());
  }
  const std::vector<int32_t> body = tok.encode(text, a.special);
  ids.insert(ids.end(), body.begin(), body.end());
  std::string line;
  for (int32_t id : ids) line += (line.empty() ? "" : " ") + std::to_string(id);
  std::printf("%s\n", line.c_str());
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* c =
      app.add_subcommand("tokenize", "Print the token ids of a text, space-separated on one line");
  c->add_option("-m,--model", a->model, "GGUF file (a vocabulary-only file is enough)")
      ->capture_default_str();
  auto* text = c->add_option("-t,--text", a->text, "Text to tokenise");
  auto* file = c->add_option("-f,--file", a->file, "Read the text from a file (bytes as they are)");
  text->excludes(file);
  file->excludes(text);
  c->add_flag("--no-bos", a->no_bos, "Do not add BOS even where the file asks for it");
  c->add_flag("--special", a->special,
              "Parse special tokens written in the text (e.g. <|im_start|>) into their ids");
  c->callback([a] { run_tokenize(*a); });
}

}  // namespace ct::cli
