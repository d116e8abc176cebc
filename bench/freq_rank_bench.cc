// Offline ranking cost for one chunk with SmolLM2-135M's KV shape (30 layers, 3 KV heads x 64 =
// 192 channels) at 3,000 tokens, the chunk size the paper times (0.69 ms on a GPU).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "reuse/freq_rank.h"

namespace {

constexpr int kLayers = 30;
constexpr int kKvDim = 192;

struct ChunkKv {
  std::vector<std::vector<float>> k, v;  // F32 [kLayers][n_tok][kKvDim]
  std::vector<const float*> kp, vp;
  explicit ChunkKv(int n_tok) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int l = 0; l < kLayers; ++l) {
      k.emplace_back(static_cast<size_t>(n_tok) * kKvDim);
      v.emplace_back(static_cast<size_t>(n_tok) * kKvDim);
      for (float& x : k.back()) x = nd(rng);
      for (float& x : v.back()) x = nd(rng);
    }
    for (int l = 0; l < kLayers; ++l) {
      kp.push_back(k[l].data());
      vp.push_back(v[l].data());
    }
  }
};

void run(benchmark::State& state, ct::RankMode mode) {
  const int n_tok = static_cast<int>(state.range(0));
  const ChunkKv kv(n_tok);
  const ct::RankOptions opt{mode, 0.5};
  ct::rank_chunk_tokens(kv.kp, kv.vp, n_tok, kKvDim, opt);  // plan creation outside the timing
  for (auto _ : state) {
    benchmark::DoNotOptimize(ct::rank_chunk_tokens(kv.kp, kv.vp, n_tok, kKvDim, opt));
  }
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(n_tok), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_RankLowFreq(benchmark::State& state) { run(state, ct::RankMode::kLowFreq); }
void BM_RankL2(benchmark::State& state) { run(state, ct::RankMode::kL2); }

void BM_BandEnergy(benchmark::State& state) {
  const int n_tok = static_cast<int>(state.range(0));
  const ChunkKv kv(n_tok);
  for (auto _ : state) {
    benchmark::DoNotOptimize(ct::kv_band_energy(kv.kp, kv.vp, n_tok, kKvDim, 10));
  }
}

}  // namespace

BENCHMARK(BM_RankLowFreq)->Arg(3000)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RankL2)->Arg(3000)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_BandEnergy)->Arg(3000)->Unit(benchmark::kMillisecond)->UseRealTime();
