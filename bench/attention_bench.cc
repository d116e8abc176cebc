// Attention of a decode step: n_seq sequences, one query row each, every sequence with its own
// KV cache of n_keys positions, in one cpu::attention(args, n) call (what forward_batch does per
// layer). The caches of 30 layers are cycled, one layer per iteration, so that the keys and
// values come from memory the way they do between a step's layers, not from a warm L1/L2.
// Shapes: SmolLM2-135M (9 heads, 3 KV heads, head size 64), Qwen2.5-0.5B (14, 2, 64).
// The third argument is the cache's type: 0 F32, 1 F16 (the live cache's default), 2 Q8_0.
// Counter per_row: time per query row. One core's figures:
//   OMP_NUM_THREADS=1 build/bench/ct_micro_bench --benchmark_filter=AttentionDecode
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backend/cpu/ops.h"

namespace {

constexpr int kLayers = 30;

void BM_AttentionDecode(benchmark::State& state, int n_head, int n_kv, int hd) {
  const int n_keys = (int)state.range(0), n_seq = (int)state.range(1);
  const ct::KvDtype type = state.range(2) == 2   ? ct::KvDtype::Q8_0
                           : state.range(2) == 1 ? ct::KvDtype::F16
                                                 : ct::KvDtype::F32;
  const int kvd = n_kv * hd, qd = n_head * hd;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t cache = (size_t)n_keys * kvd;
  std::vector<float> kv((size_t)kLayers * n_seq * 2 * cache), q((size_t)n_seq * qd),
      out((size_t)n_seq * qd);
  for (float& v : kv) v = nd(rng);
  for (float& v : q) v = nd(rng);
  const size_t cache_bytes = ct::kv_bytes(type, cache);
  std::vector<char> stored(ct::kv_bytes(type, kv.size()));  // the caches in their type
  ct::kv_pack(type, kv.data(), stored.data(), kv.size());
  const int32_t pos = n_keys - 1;
  std::vector<ct::cpu::AttnArgs> args(n_seq);
  int layer = 0;
  for (auto _ : state) {
    for (int s = 0; s < n_seq; ++s) {
      ct::cpu::AttnArgs& a = args[s];
      const char* k = stored.data() + ((size_t)layer * n_seq + s) * 2 * cache_bytes;
      a.q = q.data() + (size_t)s * qd;
      a.q_pos = &pos;
      a.n_q = 1;
      a.k = k;
      a.v = k + cache_bytes;
      a.kv_dtype = type;
      a.n_head = n_head;
      a.n_kv_head = n_kv;
      a.head_dim = hd;
      a.out = out.data() + (size_t)s * qd;
    }
    ct::cpu::attention(args.data(), n_seq);
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % kLayers;
  }
  state.counters["per_row"] = benchmark::Counter((double)state.iterations() * n_seq,
                                                 benchmark::Counter::kIsRate |
                                                     benchmark::Counter::kInvert);
}

void decode_shapes(benchmark::internal::Benchmark* b) {
  for (int keys : {128, 512, 2048}) {
    for (int seqs : {1, 8}) {
      for (int type : {0, 1, 2}) b->Args({keys, seqs, type});
    }
  }
}

BENCHMARK_CAPTURE(BM_AttentionDecode, smollm2, 9, 3, 64)->Apply(decode_shapes);
BENCHMARK_CAPTURE(BM_AttentionDecode, qwen05, 14, 2, 64)->Apply(decode_shapes);

}  // namespace
