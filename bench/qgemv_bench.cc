// Decode matrix-vector products per ggml type, on the same matrix and input in the same run: the
// default kernel (cpu::qgemv; 8-bit activations with integer dot products for Q4_0, Q4_1, Q5_0,
// Q8_0, Q4_K, Q5_K, Q6_K), the same forced to AVX2 (no VNNI), the F32-activation kernel it
// replaced (QgemvPath::kF32) and the generic dequantise-and-dot path (cpu::qgemv_dequant). The
// matrix has the shape of Qwen2.5-0.5B's ffn_down (896 rows x 4864 columns, a multiple of every
// block size), random N(0, 0.5^2) weights encoded by our encoders. BM_QGemvBatch runs
// cpu::qgemv_batch on the matrices of the types with 8-bit kernels with 1-16 input rows (counter
// per_row: time per input row), against one qgemv per row (the loop qgemv_batch was before it had a
// multi-row kernel). Run with OMP_NUM_THREADS=1 for one core's figures (docs/PERFORMANCE.md,
// "Decode kernels per type"):
//   OMP_NUM_THREADS=1 build/bench/ct_micro_bench --benchmark_filter=QGemv
#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/qgemm.h"
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

// The kRows x cols matrix of type t.
const Problem& problem(GgmlType t, int cols = kCols) {
  static std::map<std::pair<GgmlType, int>, Problem> cache;
  auto it = cache.find({t, cols});
  if (it != cache.end()) return it->second;
  Problem& p = cache[{t, cols}];
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<float> wf((size_t)kRows * cols);
  for (float& v : wf) v = nd(rng);
  const size_t rb = ct::ggml_row_bytes(t, cols);
  p.packed.resize(rb * kRows);
  for (int r = 0; r < kRows; ++r) {
    ct::ggml_from_f32(t, wf.data() + (size_t)r * cols, p.packed.data() + r * rb, cols);
  }
  p.x.resize(cols);
  for (float& v : p.x) v = nd(rng);
  p.y.resize(kRows);
  p.w = ct::cpu::QMatrix{t, p.packed.data(), kRows, cols, rb};
  return p;
}

enum class Variant { kNative, kAvx2, kF32, kDequant };

void BM_QGemv(benchmark::State& state, GgmlType t, Variant v) {
  const Problem& p = problem(t);
  std::vector<float> y(kRows);
  for (auto _ : state) {
    switch (v) {
      case Variant::kNative:
        ct::cpu::qgemv(p.w, p.x.data(), y.data());
        break;
      case Variant::kAvx2:
        ct::cpu::qgemv(p.w, p.x.data(), y.data(), ct::cpu::QgemvPath::kAvx2);
        break;
      case Variant::kF32:
        ct::cpu::qgemv(p.w, p.x.data(), y.data(), ct::cpu::QgemvPath::kF32);
        break;
      case Variant::kDequant:
        ct::cpu::qgemv_dequant(p.w, p.x.data(), y.data());
        break;
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)p.packed.size());
}

// Types that stay on F32 kernels: the kernel and the generic path.
#define CT_QGEMV_BENCH(name, type)                                     \
  BENCHMARK_CAPTURE(BM_QGemv, name##_kernel, type, Variant::kNative)   \
      ->Unit(benchmark::kMicrosecond);                                 \
  BENCHMARK_CAPTURE(BM_QGemv, name##_dequant, type, Variant::kDequant) \
      ->Unit(benchmark::kMicrosecond)
// Types with 8-bit kernels: also the AVX2 path, the F32-activation kernel and several rows
// (CT_QGEMV_BATCH_BENCH, below).
#define CT_QGEMV_BENCH8(name, type)                                                              \
  CT_QGEMV_BENCH(name, type);                                                                    \
  CT_QGEMV_BATCH_BENCH(name, type);                                                              \
  BENCHMARK_CAPTURE(BM_QGemv, name##_avx2, type, Variant::kAvx2)->Unit(benchmark::kMicrosecond); \
  BENCHMARK_CAPTURE(BM_QGemv, name##_f32, type, Variant::kF32)->Unit(benchmark::kMicrosecond)


// n = range(0) input rows through the kRows x range(1) matrix of type t: one qgemv_batch (multi-row kernel) or n qgemv calls.
void BM_QGemvBatch(benchmark::State& state, GgmlType t, bool batched) {
  const int n = (int)state.range(0), cols = (int)state.range(1);
  const Problem& p = problem(t, cols);
  std::vector<float> x((size_t)n * cols), y((size_t)n * kRows);
  for (int i = 0; i < n; ++i) std::copy(p.x.begin(), p.x.end(), x.begin() + (size_t)i * cols);
  for (size_t j = 0; j < x.size(); ++j) x[j] *= 1.0f + 0.001f * (float)(j % 7);
  const ct::cpu::QMatrix* ws[1] = {&p.w};
  for (auto _ : state) {
    if (batched) {
      ct::cpu::qgemv_batch(ws, 1, x.data(), n, y.data(), kRows);
    } else {
      for (int i = 0; i < n; ++i) {
        ct::cpu::qgemv(p.w, x.data() + (size_t)i * cols, y.data() + (size_t)i * kRows);
      }
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["per_row"] = benchmark::Counter(
      (double)state.iterations() * n, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["GMAC/s"] = benchmark::Counter(
      (double)state.iterations() * n * kRows * cols * 1e-9, benchmark::Counter::kIsRate);
}

// Rows 1-16 at ffn_down's 4,864 columns (8-bit inputs of 8 rows: 38 KiB), and 1, 4 and 8 at 576
// (SmolLM2's width: 18 blocks, a row's last two in a group of their own).
#define CT_QGEMV_BATCH_BENCH(name, type)                                                      \
  BENCHMARK_CAPTURE(BM_QGemvBatch, name##_batch, type, true)                                  \
      ->ArgsProduct({{1, 2, 4, 6, 8, 16}, {kCols}})                                           \
      ->Args({1, 576})                                                                        \
      ->Args({4, 576})                                                                        \
      ->Args({8, 576})                                                                        \
      ->Unit(benchmark::kMicrosecond);                                                        \
  BENCHMARK_CAPTURE(BM_QGemvBatch, name##_row_by_row, type, false)                            \
      ->Args({8, kCols})                                                                      \
      ->Unit(benchmark::kMicrosecond)

CT_QGEMV_BENCH(f16, GgmlType::F16);
CT_QGEMV_BENCH(bf16, GgmlType::BF16);
CT_QGEMV_BENCH(q5_1, GgmlType::Q5_1);
CT_QGEMV_BENCH(q2_K, GgmlType::Q2_K);
CT_QGEMV_BENCH(q3_K, GgmlType::Q3_K);
CT_QGEMV_BENCH8(q4_0, GgmlType::Q4_0);
CT_QGEMV_BENCH8(q4_1, GgmlType::Q4_1);
CT_QGEMV_BENCH8(q5_0, GgmlType::Q5_0);
CT_QGEMV_BENCH8(q8_0, GgmlType::Q8_0);
// Qwen2.5-0.5B's width (896 columns: 28 blocks of 32, no whole super-block): its Q5_0 and Q8_0
// projections (q, k, v, o, gate, up; the head is Q8_0 at this width too).
#define CT_QGEMV_BATCH_BENCH896(name, type)                 \
  BENCHMARK_CAPTURE(BM_QGemvBatch, name##_batch, type, true) \
      ->Args({1, 896})                                       \
      ->Args({8, 896})                                       \
      ->Unit(benchmark::kMicrosecond)
CT_QGEMV_BATCH_BENCH896(q5_0, GgmlType::Q5_0);
CT_QGEMV_BATCH_BENCH896(q8_0, GgmlType::Q8_0);
CT_QGEMV_BENCH8(q4_K, GgmlType::Q4_K);
CT_QGEMV_BENCH8(q5_K, GgmlType::Q5_K);
CT_QGEMV_BENCH8(q6_K, GgmlType::Q6_K);

// Prefill-sized products (n input rows): what the prefill did before (the matrix dequantised to
// F32, then one SGEMM), the 8-bit multi-row decode kernel (qgemv_batch, kMaxBatchRows rows at a
// time) and the quantised GEMM (cpu::qgemm, native and forced to AVX2). Counters: per_row (time
// per input row) and GMAC/s.
//   OMP_NUM_THREADS=1 build/bench/ct_micro_bench --benchmark_filter=Prefill
enum class PrefillVariant { kSgemm, kRows16, kQgemm, kQgemmAvx2 };

void BM_Prefill(benchmark::State& state, GgmlType t, PrefillVariant v) {
  const Problem& p = problem(t);
  const int n = (int)state.range(0);
  std::vector<float> x((size_t)n * kCols), y((size_t)n * kRows), wf;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& e : x) e = nd(rng);
  const ct::cpu::QMatrix* ws[1] = {&p.w};
  for (auto _ : state) {
    switch (v) {
      case PrefillVariant::kSgemm:
        wf.resize((size_t)kRows * kCols);
        ct::cpu::qmatrix_to_f32(p.w, 0, kRows, wf.data());
        ct::cpu::matmul_wt(x.data(), n, kCols, wf.data(), kRows, y.data());
        break;
      case PrefillVariant::kRows16:
        for (int r0 = 0; r0 < n; r0 += ct::cpu::kMaxBatchRows) {
          const int nr = std::min(ct::cpu::kMaxBatchRows, n - r0);
          ct::cpu::qgemv_batch(ws, 1, x.data() + (size_t)r0 * kCols, nr,
                               y.data() + (size_t)r0 * kRows, kRows);
        }
        break;
      case PrefillVariant::kQgemm:
        ct::cpu::qgemm(ws, 1, x.data(), n, y.data(), kRows);
        break;
      case PrefillVariant::kQgemmAvx2:
        ct::cpu::qgemm(ws, 1, x.data(), n, y.data(), kRows, ct::cpu::QgemmPath::kAvx2);
        break;
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["per_row"] = benchmark::Counter(
      (double)state.iterations() * n, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["GMAC/s"] = benchmark::Counter(
      (double)state.iterations() * n * kRows * (double)kCols * 1e-9, benchmark::Counter::kIsRate);
}

#define CT_PREFILL_BENCH1(name, type, v)                                            \
  BENCHMARK_CAPTURE(BM_Prefill, name, type, v)                                      \
      ->Arg(8)->Arg(32)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)
#define CT_PREFILL_BENCH(name, type)                                               \
  CT_PREFILL_BENCH1(name##_sgemm, type, PrefillVariant::kSgemm);                   \
  CT_PREFILL_BENCH1(name##_rows16, type, PrefillVariant::kRows16);                 \
  CT_PREFILL_BENCH1(name##_qgemm, type, PrefillVariant::kQgemm);                   \
  CT_PREFILL_BENCH1(name##_qgemm_avx2, type, PrefillVariant::kQgemmAvx2)
CT_PREFILL_BENCH(q4_K, GgmlType::Q4_K);
CT_PREFILL_BENCH(q6_K, GgmlType::Q6_K);
CT_PREFILL_BENCH(q5_0, GgmlType::Q5_0);
CT_PREFILL_BENCH(q8_0, GgmlType::Q8_0);

}  // namespace
