// ct_policy_dump: every registered policy's selections and results on tiny random models, as
// bit patterns, for checking that a refactor changes nothing: build it at two commits, run both
// (OMP_NUM_THREADS=1) and compare the outputs with cmp. Per line: model shape, rank mode of the
// records, r, policy, FNV-1a of the logits, of the query attention and of layer 1's K cache, the
// active and loaded row counts, and the per-chunk selections. Float bits differ between CPUs, so
// compare outputs of one machine only. (The policy-objects refactor of the seventh session was
// checked this way: 116 lines identical. The oracles' input changed in the eighth session, from
// given selections to a made-up drift.)
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "reuse/encoder.h"
#include "reuse/selective.h"
#include "support/random_data.h"
#include "support/tiny_model.h"
using namespace ct;
static uint64_t h64(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int i = 0; i < 4; ++i) {
      h ^= (u >> (8 * i)) & 255;
      h *= 1099511628211ull;
    }
  }
  return h;
}
int main() {
  std::vector<const char*> names;
  for (const Policy* p : all_policies()) names.push_back(p->name());
  for (const char* v : {"llama", "qwen2"}) {
    test::TinyModelOptions o;
    o.n_layer = 4;
    if (std::string(v) == "qwen2") {
      o.arch = "qwen2";
      o.rope_theta = 1e6f;
    }
    const std::string path =
        (std::filesystem::temp_directory_path() / ("ct_policy_dump_" + std::string(v) + ".gguf"))
            .string();
    test::write_tiny_model(path, o);
    auto m = Model::load(path);
    for (RankMode mode : {RankMode::kProbe, RankMode::kLowFreq}) {
      EncodeOptions eo;
      eo.rank.mode = mode;
      ChunkKV a = encode_chunk(*m, test::random_byte_tokens(61, 16), eo);
      ChunkKV b = encode_chunk(*m, test::random_byte_tokens(30, 17), eo);
      ChunkKV c = encode_chunk(*m, test::random_byte_tokens(45, 18), eo);
      InMemoryChunk sa(a), sb(b), sc(c);
      ComposedRequest req{
          test::random_byte_tokens(4, 18), {&sa, &sb, &sc, &sa}, test::random_byte_tokens(6, 19)};
      // A made-up true drift for the oracles: deterministic, unequal across chunks.
      std::vector<std::vector<float>> drift;
      for (const InMemoryChunk* s : {&sa, &sb, &sc, &sa}) {
        const int n = s->meta().n_tok;
        drift.emplace_back();
        for (int t = 0; t < n; ++t) drift.back().push_back((float)((t * 37 + n) % 101));
      }
      for (double r : {0.15, 0.5}) {
        for (const char* n : names) {
          if (mode == RankMode::kLowFreq && std::string(n).rfind("probe", 0) == 0) continue;
          const RequestLayout lay = layout_request(req);
          KVCache kv = m->make_cache(lay.n_total);
          Workspace ws;
          SelectiveOptions opt;
          opt.policy.kind = &find_policy(n);
          opt.policy.ratio = r;
          opt.policy.drift = &drift;
          PrefixCache pc(2);
          opt.prefix_cache = &pc;
          if (std::string(n) == "prefix") {
            // Prime with a request sharing the prefix and the first chunk.
            ComposedRequest p1{req.prefix, {&sa}, test::random_byte_tokens(3, 20)};
            SelectiveOptions o1 = opt;
            KVCache kv1 = m->make_cache(200);
            selective_prefill(*m, p1, o1, kv1, ws);
          }
          std::vector<float> qa;
          opt.query_attention = &qa;
          SelectionReport rep;
          PrefillBreakdown bd;
          auto lg = selective_prefill(*m, req, opt, kv, ws, &bd, &rep);
          std::printf(
              "%s %s r=%.2f %-10s logits=%016llx attn=%016llx kv0=%016llx active=%d loaded=%d sel=",
              v, rank_mode_name(mode), r, n, (unsigned long long)h64(lg),
              (unsigned long long)h64(qa),
              (unsigned long long)h64(
                  std::vector<float>(kv.k(1), kv.k(1) + kv.n_pos * kv.kv_dim())),
              bd.n_active, bd.n_loaded);
          for (auto& s : rep.selected) {
            std::printf("[");
            for (int t : s) std::printf("%d,", t);
            std::printf("]");
          }
          std::printf("\n");
        }
      }
    }
  }
}
