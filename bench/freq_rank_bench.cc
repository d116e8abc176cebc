// Offline ranking cost for one chunk with SmolLM2-135M's KV shape (30 layers, 3 KV heads x 64 =
// 192 channels) at 3,000 tokens, the chunk size the paper times (0.69 ms on a GPU).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "reuse/freq_rank.h"
#include "backend/cuda/band_norms.h"  // without CUDA its constructor throws (backend/registry.h)

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

void run(benchmark::State& state, ct::RankMode mode, ct::RankDevice device = ct::RankDevice::kCpu) {
  if (device == ct::RankDevice::kCuda && !ct::cuda_ranking_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int n_tok = static_cast<int>(state.range(0));
  const ChunkKv kv(n_tok);
  ct::RankOptions opt;
  opt.mode = mode;
  opt.alpha = 0.5;
  opt.device = device;
  ct::rank_chunk_tokens(kv.kp, kv.vp, n_tok, kKvDim, opt);  // plan creation outside the timing
  for (auto _ : state) {
    benchmark::DoNotOptimize(ct::rank_chunk_tokens(kv.kp, kv.vp, n_tok, kKvDim, opt));
  }
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(n_tok), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_RankLowFreq(benchmark::State& state) { run(state, ct::RankMode::kLowFreq); }
void BM_RankL2(benchmark::State& state) { run(state, ct::RankMode::kL2); }

// The whole call with host K/V: upload (pageable memory), cuFFT, norms, scoring and sort.
void BM_RankLowFreqCuda(benchmark::State& state) {
  run(state, ct::RankMode::kLowFreq, ct::RankDevice::kCuda);
}
// K/V already on the device, as right after a GPU prefill (the paper's setting): transforms,
// band mask, norms and the copy of the 2 x layers x N norms back to the host. Args: tokens,
// layers, KV channels; {3000, 32, 1024} is Mistral-7B / Llama-3-8B's KV shape (8 KV heads x 128),
// the model size the paper's 0.69 ms refers to.
void BM_BandNormsCudaResident(benchmark::State& state) {
  if (!ct::cuda_ranking_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int n_tok = static_cast<int>(state.range(0));
  const int layers = static_cast<int>(state.range(1));
  const int kv_dim = static_cast<int>(state.range(2));
  std::vector<float> host(static_cast<size_t>(n_tok) * kv_dim);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& x : host) x = nd(rng);
  // Every matrix uploads the same random block: the transform cost does not depend on the values.
  const std::vector<const float*> mats(2 * layers, host.data());
  ct::cuda::BandNorms bn(2 * layers, n_tok, kv_dim);
  bn.upload(mats);
  const int hi = ct::n_keep_bins(0.5, n_tok);
  bn.run(true, 0, hi);  // warm-up: first-launch and cuFFT setup costs
  for (auto _ : state) benchmark::DoNotOptimize(bn.run(true, 0, hi));
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(n_tok), benchmark::Counter::kIsIterationInvariantRate);
}

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
// Registered in every build; they skip ("no CUDA device") where CUDA is not built or no device.
BENCHMARK(BM_RankLowFreqCuda)->Arg(3000)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_BandNormsCudaResident)
    ->Args({3000, kLayers, kKvDim})
    ->Args({512, kLayers, kKvDim})
    ->Args({3000, 32, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_BandEnergy)->Arg(3000)->Unit(benchmark::kMillisecond)->UseRealTime();
