// Decode matrix-vector products per ggml type: the dedicated kernel (cpu::qgemv) against the
// generic dequantise-and-dot path it replaced (cpu::qgemv_dequant), on the same matrix and input
// in the same run. The matrix has the shape of Qwen2.5-0.5B's ffn_down (896 rows x 4864 columns,
// a multiple of every block size), random N(0, 0.5^2) weights encoded by our encoders. Run with
// OMP_NUM_THREADS=1 for one core's figures (docs/PERFORMANCE.md, "Decode kernels per type"):
//   OMP_NUM_THREADS=1 build/bench/ct_micro_bench --benchmark_filter=QGemv
#include <benchmark/benchmark.h>

#include <map>
#include <random>
#include <vector>

#include "backend/cpu/qgemv.h"
#include "core/ggml_types.h"

namespace {

using ct::GgmlType;

constexpr int kRows = 896, kCols = 4864;

struct Problem {
  std::vector<uint8_t> packed;
  std::vector<float> x, y;
  ct::cpu::QMatrix w;
};

const Problem& problem(GgmlType t) {
  static std::map<GgmlType, Problem> cache;
  auto it = cache.find(t);
  if (it != cache.end()) return it->second;
  Problem& p = cache[t];
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<float> wf((size_t)kRows * kCols);
  for (float& v : wf) v = nd(rng);
  const size_t rb = ct::ggml_row_bytes(t, kCols);
  p.packed.resize(rb * kRows);
  for (int r = 0; r < kRows; ++r) {
    ct::ggml_from_f32(t, wf.data() + (size_t)r * kCols, p.packed.data() + r * rb, kCols);
  }
  p.x.resize(kCols);
  for (float& v : p.x) v = nd(rng);
  p.y.resize(kRows);
  p.w = ct::cpu::QMatrix{t, p.packed.data(), kRows, kCols, rb};
  return p;
}

void BM_QGemv(benchmark::State& state, GgmlType t, bool kernel) {
  const Problem& p = problem(t);
  std::vector<float> y(kRows);
  for (auto _ : state) {
    if (kernel) {
      ct::cpu::qgemv(p.w, p.x.data(), y.data());
    } else {
      ct::cpu::qgemv_dequant(p.w, p.x.data(), y.data());
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)p.packed.size());
}

#define CT_QGEMV_BENCH(name, type)                                                       \
  BENCHMARK_CAPTURE(BM_QGemv, name##_kernel, type, true)->Unit(benchmark::kMicrosecond); \
  BENCHMARK_CAPTURE(BM_QGemv, name##_dequant, type, false)->Unit(benchmark::kMicrosecond)

CT_QGEMV_BENCH(f16, GgmlType::F16);
CT_QGEMV_BENCH(bf16, GgmlType::BF16);
CT_QGEMV_BENCH(q5_1, GgmlType::Q5_1);
CT_QGEMV_BENCH(q2_K, GgmlType::Q2_K);
CT_QGEMV_BENCH(q3_K, GgmlType::Q3_K);
// Types that had dedicated kernels before, for scale.
CT_QGEMV_BENCH(q4_1, GgmlType::Q4_1);
CT_QGEMV_BENCH(q4_K, GgmlType::Q4_K);
CT_QGEMV_BENCH(q6_K, GgmlType::Q6_K);

}  // namespace
