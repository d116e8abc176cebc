// Prefill on the CPU backend and on the GPU decoder, in the same run, for random models with
// real models' layer shapes and the tiny test vocabulary: shape 0 is SmolLM2-135M's (30 layers,
// 576 wide, 9/3 heads of 64, FFN 1536; F32 weights, a ~430 MB file), shape 1 Qwen2.5-1.5B's
// (qwen2: 28 layers, 1536 wide, 12/2 heads of 128, FFN 8960, QKV biases; Q8_0 matrices, a
// ~1.6 GB file, dequantised to F32 for the GPU). Each runs the plain prefill and a composed
// request (32-token prefix, six 500-token chunks held in host memory, 32-token query) with full
// recompute and with cachetune at r = 0.15 (the paper's CPU-cache setting); shape 1 on the GPU
// only (its CPU rows would take minutes; its chunks are encoded there too). BM_DecodeCuda times
// decode steps of 1, 8 and 32 sequences at once (decode_batch). Built where
// bench/CMakeLists.txt defines CT_BENCH_TINY_MODEL (CT_CUDA builds: a CPU/GPU comparison); the
// GPU cases skip ("no CUDA device") on a machine without a device, before writing any model.
#if defined(CT_BENCH_TINY_MODEL)
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
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

constexpr int kShapes = 2;  // 0: SmolLM2-135M's layers, 1: Qwen2.5-1.5B's

// Each shape's model, written on first use into a temporary directory.
const ct::Model& shaped_model(int shape) {
  static ct::test::TempDir* dir = new ct::test::TempDir();
  static std::unique_ptr<ct::Model> models[kShapes];
  if (!models[shape]) {
    ct::test::TinyModelOptions o;
    o.context_length = kCtx;
    if (shape == 0) {
      o.n_layer = 30;
      o.n_embd = 576;
      o.n_head = 9;
      o.n_head_kv = 3;
      o.head_dim = 64;
      o.n_ff = 1536;
    } else {
      o.arch = "qwen2";
      o.n_layer = 28;
      o.n_embd = 1536;
      o.n_head = 12;
      o.n_head_kv = 2;
      o.head_dim = 128;
      o.n_ff = 8960;
      o.rope_theta = 1000000.0f;
      o.weight_type = ct::GgmlType::Q8_0;
      o.tied_output = false;
    }
    const std::string path = dir->path() + "/shape" + std::to_string(shape) + ".gguf";
    models[shape] = ct::Model::load(ct::test::write_tiny_model(path, o));
  }
  return *models[shape];
}

void BM_PrefillCpu(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const ct::Model& m = shaped_model(0);
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
  const ct::Model& m = shaped_model(static_cast<int>(state.range(1)));
  const std::vector<int32_t> toks = ct::test::random_byte_tokens(n, 3);
  auto dec = ct::make_cuda_decoder(m, kCtx);
  ct::cuda_prefill(*dec, m, toks.data(), n, 0);  // warm-up: cuBLAS handles, scratch growth
  for (auto _ : state) benchmark::DoNotOptimize(ct::cuda_prefill(*dec, m, toks.data(), n, 0));
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

// Decode steps on the GPU for S sequences at once (cuda::Decoder::decode_batch): one decoder
// per shape with kDecodeSeqs slots, each prefilled once with a 1,024-token context (kept across
// the benchmark's calls, so the weights are converted and uploaded once); a step decodes a token
// of each of the first S slots at position 1,024. Args: S, shape. tok/s counts all S rows;
// S = 1 is the one-request rate it is compared with.
constexpr int kDecodeSeqs = 32, kDecodeCtx = 1024;

struct DecodeSetup {
  std::unique_ptr<ct::cuda::Decoder> dec;
  std::vector<int32_t> toks, pos, seqs;
};

DecodeSetup& decode_setup(int shape) {
  // Never freed, like the model directory: device memory released after the CUDA runtime has
  // shut down at exit would fail.
  static DecodeSetup* setups[kShapes] = {};
  if (!setups[shape]) {
    const ct::Model& m = shaped_model(shape);
    auto* s = new DecodeSetup();
    s->dec = ct::make_cuda_decoder(m, kDecodeCtx + 1, kDecodeSeqs);
    for (int q = 0; q < kDecodeSeqs; ++q) {
      s->dec->select(q);
      const std::vector<int32_t> prompt = ct::test::random_byte_tokens(kDecodeCtx, 50 + q);
      ct::cuda_prefill(*s->dec, m, prompt.data(), kDecodeCtx, 0);
      s->toks.push_back(prompt[q]);
      s->pos.push_back(kDecodeCtx);
      s->seqs.push_back(q);
    }
    setups[shape] = s;
  }
  return *setups[shape];
}

void BM_DecodeCuda(benchmark::State& state) {
  if (!ct::cuda_ranking_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int n_seq = static_cast<int>(state.range(0)), shape = static_cast<int>(state.range(1));
  const ct::Model& m = shaped_model(shape);
  DecodeSetup& s = decode_setup(shape);
  // Warm-up: scratch growth for this S. Each step rewrites position 1,024 of its slots.
  ct::cuda_decode_batch(*s.dec, m, s.toks.data(), s.pos.data(), s.seqs.data(), n_seq);
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        ct::cuda_decode_batch(*s.dec, m, s.toks.data(), s.pos.data(), s.seqs.data(), n_seq));
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(n_seq),
                                               benchmark::Counter::kIsIterationInvariantRate);
}

// The composed request of the selective benchmarks, its chunks encoded once per shape on the
// CPU.
struct Request {
  std::vector<ct::ChunkKV> records;
  std::vector<std::unique_ptr<ct::InMemoryChunk>> sources;
  ct::ComposedRequest req;
};

const Request& composed_request(int shape) {
  static Request* requests[kShapes] = {};
  Request*& r = requests[shape];
  if (r == nullptr) {
    auto* out = new Request();
    const ct::Model& m = shaped_model(shape);
    // Shape 1 is encoded on the GPU (its benchmarks run only there): minutes on the host.
    std::unique_ptr<ct::DeviceSequence> dev;
    ct::EncodeOptions eo;
    if (shape == 1) {
      dev = ct::make_device("cuda", m, 2048);
      eo.device = dev.get();
    }
    out->records.reserve(6);
    for (int b = 0; b < 6; ++b) {
      out->records.push_back(ct::encode_chunk(m, ct::test::random_byte_tokens(500, 100 + b), eo));
    }
    for (const auto& rec : out->records) {
      out->sources.push_back(std::make_unique<ct::InMemoryChunk>(rec));
      out->req.chunks.push_back(out->sources.back().get());
    }
    out->req.prefix = ct::test::random_byte_tokens(32, 1);
    out->req.query = ct::test::random_byte_tokens(32, 2);
    r = out;
  }
  return *r;
}

// Args: device (0 CPU, 1 GPU), policy (0 full, 1 cachetune at r = 0.15), shape.
void BM_Selective(benchmark::State& state) {
  const bool gpu = state.range(0) == 1;
  if (gpu && !ct::cuda_ranking_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const int shape = static_cast<int>(state.range(2));
  const ct::Model& m = shaped_model(shape);
  const Request& r = composed_request(shape);
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
    ->ArgsProduct({{0, 1}, {0, 1}, {0}})
    ->Args({1, 0, 1})
    ->Args({1, 1, 1})
    ->ArgNames({"gpu", "cachetune", "shape"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_DecodeCuda)
    ->ArgsProduct({{1, 8, 32}, {0, 1}})
    ->ArgNames({"seqs", "shape"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_PrefillCpu)->Arg(512)->Arg(3000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PrefillCuda)
    ->ArgsProduct({{512, 3000}, {0, 1}})
    ->ArgNames({"tokens", "shape"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
#endif
