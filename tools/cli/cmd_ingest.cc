// `cachetune ingest`: encode documents (text files, or a JSONL file's "chunks") into the cache
// pool, printing each chunk's id, size, tier and encoding/ranking time.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/data_jsonl.h"
#include "core/error.h"
#include "reuse/prompt.h"
#include "tools/cli/commands.h"
#include "tools/cli/engine_flags.h"
#include "tools/cli/progress.h"

namespace ct::cli {
namespace {

struct IngestArgs {
  EngineFlags engine;
  std::vector<std::string> files;
  std::string tier;
  int limit = 0;
};

// Documents from a file: a .jsonl file contributes every example's "chunks"; any other file is
// one document.
std::vector<std::string> read_docs(const std::string& path, int limit) {
  std::ifstream f(path, std::ios::binary);
  CT_THROW_IF_NOT(f.good(), "cannot open '{}'", path);
  std::vector<std::string> docs;
  if (path.size() > 6 && path.substr(path.size() - 6) == ".jsonl") {
    for (DataExample& ex : read_data_jsonl(path, {.limit = limit, .question = false}))
      for (std::string& c : ex.chunks) docs.push_back(std::move(c));
  } else {
    std::stringstream ss;
    ss << f.rdbuf();
    docs.push_back(ss.str());
  }
  return docs;
}

void run_ingest(const IngestArgs& a) {
  CT_THROW_IF_NOT(!a.files.empty(), "give one or more document files (text, or .jsonl)");
  Engine eng(a.engine.options());
  std::vector<std::string> docs;
  for (const auto& f : a.files) {
    auto d = read_docs(f, a.limit);
    docs.insert(docs.end(), d.begin(), d.end());
  }
  Progress prog("ingest");
  int n_new = 0;
  double enc_ms = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    const auto toks = tokenize_chunk(eng.model().tokenizer(), docs[i]);
    ChunkInfo c = eng.ensure_chunk(toks, a.tier);
    prog.update((long)i + 1, (long)docs.size());
    n_new += !c.hit;
    enc_ms += c.encode_ms;
    std::printf("%s  %5d tokens  %-6s  %s", c.id.substr(0, 16).c_str(), c.n_tok, c.tier.c_str(),
                c.hit ? "cached" : "encoded");
    if (!c.hit) std::printf("  encode %.1f ms (ranking %.1f ms)", c.encode_ms, c.rank_ms);
    std::printf("\n");
  }
  prog.done();
  std::fprintf(stderr, "%zu chunks, %d newly encoded in %.1f s\n", docs.size(), n_new,
               enc_ms / 1e3);
}

}  // namespace

void register_ingest(CLI::App& app) {
  auto a = std::make_shared<IngestArgs>();
  CLI::App* c = app.add_subcommand("ingest", "Encode documents into the chunk cache");
  a->engine.add(c);
  c->add_option("files", a->files, "Text files (one document each) or .jsonl files (chunks)");
  c->add_option("--tier", a->tier, "Tier to store new encodings in (default: the top tier)");
  c->add_option("--limit", a->limit, "At most this many examples per .jsonl file");
  c->callback([a] { run_ingest(*a); });
}

}  // namespace ct::cli
