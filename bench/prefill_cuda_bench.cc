// Prefill on the CPU backend and on the GPU decoder, in the same run, for a random model with
// SmolLM2-135M's layer shapes (30 layers, 576 wide, 9/3 heads of 64, FFN 1536; F32 weights, the
// tiny test vocabulary): the plain prefill, and a composed request (32-token prefix, six
// 500-token chunks held in host memory, 32-token query) with full recompute and with cachetune
// at r = 0.15 (the paper's CPU-cache setting). Built where bench/CMakeLists.txt defines
// CT_BENCH_TINY_MODEL (CT_CUDA builds: a CPU/GPU comparison; it writes a ~430 MB model); the GPU
// cases skip ("no CUDA device") on a machine without a device.
#if defined(CT_BENCH_TINY_MODEL)
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "backend/cpu_forward.h"
#include "backend/gpu_decoder.h"
#include "reuse/encoder.h"
#include "reuse/freq_rank.h"
#include "reuse/selective.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace {

constexpr int kCtx = 4096;

// Written once per process into a temporary directory (about 430 MB of F32 weights).
const ct::Model& smol_shaped_model() {
  static ct::test::TempDir* dir = new ct::test::TempDir();
  static std::unique_ptr<ct::Model> m = [] {
    ct::test::TinyModelOptions o;
    o.n_layer = 30;
    o.n_embd = 576;
    o.n_head = 9;
    o.n_head_kv = 3;
    o.head_dim = 64;
    o.n_ff = 1536;
    o.context_length = kCtx;
    return ct::Model::load(ct::test::write_tiny_model(dir->path() + "/smol_shaped.gguf", o));
  }();
  return *m;
}

void BM_PrefillCpu(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const ct::Model& m = smol_shaped_model();
  const std::vector<int32_t> toks = ct::test::random_byte_tokens(n, 3);
  ct::KVCache kv = m.make_cache(kCtx);
  ct::Workspace ws;
  for (auto _ : state) benchmark::DoNotOptimize(ct::cpu::prefill(m, toks.data(), n, 0, kv, ws));
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_PrefillCuda(benchmark::State& state) {
  if (!ct::cuda_ranking_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int n = static_cast<int>(state.range(0));
  const ct::Model& m = smol_shaped_model();
  const std::vector<int32_t> toks = ct::test::random_byte_tokens(n, 3);
  auto dec = ct::make_cuda_decoder(m, kCtx);
  ct::cuda_prefill(*dec, m, toks.data(), n, 0);  // warm-up: cuBLAS handles, scratch growth
  for (auto _ : state) benchmark::DoNotOptimize(ct::cuda_prefill(*dec, m, toks.data(), n, 0));
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

// The composed request of the selective benchmarks, its chunks encoded once on the CPU.
struct Request {
  std::vector<ct::ChunkKV> records;
  std::vector<std::unique_ptr<ct::InMemoryChunk>> sources;
  ct::ComposedRequest req;
};

const Request& composed_request() {
  static Request* r = [] {
    auto* out = new Request();
    const ct::Model& m = smol_shaped_model();
    out->records.reserve(6);
    for (int b = 0; b < 6; ++b) {
      out->records.push_back(
          ct::encode_chunk(m, ct::test::random_byte_tokens(500, 100 + b), ct::EncodeOptions{}));
    }
    for (const auto& rec : out->records) {
      out->sources.push_back(std::make_unique<ct::InMemoryChunk>(rec));
      out->req.chunks.push_back(out->sources.back().get());
    }
    out->req.prefix = ct::test::random_byte_tokens(32, 1);
    out->req.query = ct::test::random_byte_tokens(32, 2);
    return out;
  }();
  return *r;
}

// Args: device (0 CPU, 1 GPU), policy (0 full, 1 cachetune at r = 0.15).
void BM_Selective(benchmark::State& state) {
  const bool gpu = state.range(0) == 1;
  if (gpu && !ct::cuda_ranking_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const ct::Model& m = smol_shaped_model();
  const Request& r = composed_request();
  const int n_total = ct::layout_request(r.req).n_total;
  std::unique_ptr<ct::DeviceSequence> dev;
  if (gpu) dev = ct::make_device("cuda", m, n_total);
  ct::SelectiveOptions so;
  so.policy.kind = &ct::find_policy(state.range(1) == 1 ? "cachetune" : "full");
  so.policy.ratio = 0.15;
  so.device = dev.get();
  ct::KVCache kv = m.make_cache(n_total);
  ct::Workspace ws;
  ct::PrefillBreakdown bd;
  ct::selective_prefill(m, r.req, so, kv, ws, &bd);  // warm-up
  double first = 0, to_host = 0, load_wait = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(ct::selective_prefill(m, r.req, so, kv, ws, &bd));
    first += bd.total_ms - bd.kv_to_host_ms;
    to_host += bd.kv_to_host_ms;
    load_wait += bd.load_wait_ms;
  }
  // Time to the first token's logits: the copy of the cache back to the host comes after it.
  state.counters["first_logits_ms"] =
      benchmark::Counter(first / state.iterations(), benchmark::Counter::kDefaults);
  state.counters["kv_to_host_ms"] =
      benchmark::Counter(to_host / state.iterations(), benchmark::Counter::kDefaults);
  state.counters["load_wait_ms"] =
      benchmark::Counter(load_wait / state.iterations(), benchmark::Counter::kDefaults);
  state.counters["active_rows"] = bd.n_active;
  state.counters["tokens"] = n_total;
}

}  // namespace

BENCHMARK(BM_Selective)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"gpu", "cachetune"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_PrefillCpu)->Arg(512)->Arg(3000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PrefillCuda)->Arg(512)->Arg(3000)->Unit(benchmark::kMillisecond)->UseRealTime();
#endif
