// The tokenizer against llama.cpp's own tokenizer tests: for each vocabulary-only GGUF of
// llama.cpp's models/ (fetched by tools/fetch_vocab_tests.sh into CACHETUNE_VOCAB_DIR, default
// ~/.cache/cachetune/vocab), every input of ggml-vocab-NAME.gguf.inp must tokenise to the ids on
// the same line of .out, as llama.cpp's test-tokenizer-0 checks (add_special and parse_special
// off). A vocabulary whose files are absent is skipped.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace ct {
namespace {

std::string vocab_dir() {
  if (const char* env = std::getenv("CACHETUNE_VOCAB_DIR")) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/cachetune/vocab";
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The cases of an .inp file: texts separated by "\n__ggml_vocab_test__\n", the file ending with
// one (so no empty case follows it), as test-tokenizer-0.cpp splits them.
std::vector<std::string> read_inputs(const std::string& path) {
  const std::string raw = read_all(path), sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> cases;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      cases.push_back(raw.substr(pos));
      break;
    }
    cases.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  return cases;
}

// One line of ids per case, space-separated (an empty line for an empty case).
std::vector<std::vector<int32_t>> read_outputs(const std::string& path) {
  std::istringstream in(read_all(path));
  std::vector<std::vector<int32_t>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ids(line);
    std::vector<int32_t> v;
    for (int32_t id; ids >> id;) v.push_back(id);
    out.push_back(std::move(v));
  }
  return out;
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return "[" + s + "]";
}

std::string escaped(const std::string& text) {
  std::string s;
  for (unsigned char c : text) {
    if (c == '\n') {
      s += "\\n";
    } else if (c == '\t') {
      s += "\\t";
    } else {
      s.push_back((char)c);
    }
  }
  return s;
}

class VocabRefTest : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabRefTest, EveryLineMatchesLlamaCpp) {
  const std::string base = vocab_dir() + "/ggml-vocab-" + GetParam() + ".gguf";
  for (const std::string& p : {base, base + ".inp", base + ".out"}) {
    if (!std::filesystem::exists(p)) {
      GTEST_SKIP() << p << " not found; run tools/fetch_vocab_tests.sh (needs network) or set "
                   << "CACHETUNE_VOCAB_DIR";
    }
  }
  const auto gguf = GgufFile::open(base);
  const Tokenizer tok = Tokenizer::from_gguf(*gguf);
  const std::vector<std::string> inputs = read_inputs(base + ".inp");
  const std::vector<std::vector<int32_t>> expected = read_outputs(base + ".out");
  ASSERT_EQ(inputs.size(), expected.size()) << base << ": .inp and .out differ in case count";
  ASSERT_GE(inputs.size(), 40u) << base;
  size_t n_match = 0;
  int n_shown = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int32_t> got = tok.encode(inputs[i], /*parse_special=*/false);
    if (got == expected[i]) {
      ++n_match;
    } else if (++n_shown <= 5) {
      ADD_FAILURE() << GetParam() << " case " << i << ": '" << escaped(inputs[i])
                    << "'\n  expected " << ids_str(expected[i]) << "\n  got      " << ids_str(got);
    }
  }
  std::printf("[ vocab    ] %s: %zu of %zu lines match llama.cpp\n", GetParam(), n_match,
              inputs.size());
  EXPECT_EQ(n_match, inputs.size()) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(LlamaCppVocabs, VocabRefTest,
                         ::testing::Values("qwen2", "qwen35", "llama-bpe", "llama-spm", "phi-3",
                                           "gpt-2", "starcoder", "refact", "command-r", "mpt"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

std::string model_dir() {
  if (const char* env = std::getenv("CACHETUNE_MODEL_DIR")) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/cachetune/models";
}

// Qwen2.5 uses Qwen2's tokenizer, so the real files people run must give llama.cpp's qwen2 ids on
// the same cases; their chat template is ChatML with Qwen's default system message.
TEST(RealModelVocabTest, Qwen25FilesTokeniseAsLlamaCppsQwen2) {
  const std::string base = vocab_dir() + "/ggml-vocab-qwen2.gguf";
  if (!std::filesystem::exists(base + ".inp") || !std::filesystem::exists(base + ".out")) {
    GTEST_SKIP() << base << ".inp/.out not found; run tools/fetch_vocab_tests.sh";
  }
  std::vector<std::string> files;
  if (std::filesystem::is_directory(model_dir())) {
    for (const auto& e : std::filesystem::directory_iterator(model_dir())) {
      const std::string name = e.path().filename().string();
      if (name.rfind("Qwen2.5", 0) == 0 && e.path().extension() == ".gguf") {
        files.push_back(e.path().string());
      }
    }
  }
  if (files.empty()) GTEST_SKIP() << "no Qwen2.5*.gguf in " << model_dir();
  const std::vector<std::string> inputs = read_inputs(base + ".inp");
  const std::vector<std::vector<int32_t>> expected = read_outputs(base + ".out");
  ASSERT_EQ(inputs.size(), expected.size());
  for (const std::string& path : files) {
    const auto gguf = GgufFile::open(path);
    const Tokenizer tok = Tokenizer::from_gguf(*gguf);
    size_t n_match = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::vector<int32_t> got = tok.encode(inputs[i], false);
      if (got == expected[i]) {
        ++n_match;
      } else {
        ADD_FAILURE() << path << " case " << i << ": '" << escaped(inputs[i]) << "'\n  expected "
                      << ids_str(expected[i]) << "\n  got      " << ids_str(got);
      }
    }
    std::printf("[ vocab    ] %s: %zu of %zu lines match llama.cpp's qwen2\n", path.c_str(),
                n_match, inputs.size());
    EXPECT_FALSE(tok.add_bos()) << path;
    EXPECT_TRUE(tok.is_eog(tok.find_token("<|im_end|>"))) << path;
    EXPECT_TRUE(tok.is_eog(tok.find_token("<|endoftext|>"))) << path;
    EXPECT_EQ(tok.apply_chat_template({{"user", "Hi"}}, true),
              "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
              "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        << path;
  }
}

}  // namespace
}  // namespace ct
