// Matrix-vector products straight from GGUF blocks, for decoding: one token reads every weight
// once, so reading 2.6-8.5 bits per weight instead of an F32 copy's 32 is what makes decode fast.
// Every type of the ggml type table (core/ggml_types.h) has a kernel here (the CPU side of the
// traits, as ggml-cpu's type_traits_cpu): fused AVX2 dot products read the blocks directly. The
// types of the common GGUF files quantise the input to 8 bits first and use integer dot products
// (qgemv_q8.h), as llama.cpp does; their results equal the dequantised product with the rounded
// input (qgemv_input) up to float rounding, the others the product with x itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/ggml_types.h"

namespace ct::cpu {

// A weight matrix [rows][cols] in its GGUF encoding (points into the mapped file; not owned).
struct QMatrix {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int rows = 0, cols = 0;
  size_t row_bytes = 0;
  bool valid() const { return data != nullptr; }
};

// True for every type with a row in the ggml type table.
bool qgemv_supported(GgmlType t);

// Which kernels a product uses. kNative (the default): 8-bit activations with
// integer dot products for Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K (VNNI where the compiler
// targets it, else AVX2), F32 kernels for the other types. kAvx2: the same without VNNI, equal to
// kNative bit for bit (every integer sum is exact in both), so tests run the AVX2 code on any
// machine. kF32: every type on its F32-activation kernel, the path before 8-bit activations (no
// activation rounding, slower), kept as the benchmark baseline.
enum class QgemvPath { kNative, kAvx2, kF32 };

// y[rows] = W x. cols must be a multiple of the type's block size.
void qgemv(const QMatrix& w, const float* x, float* y, QgemvPath path = QgemvPath::kNative);
// Memory that a product's threads prefetch while they multiply: what the caller reads next (a
// decode step's next-layer K/V caches, which attention would otherwise wait on). The spans' cache
// lines are spread evenly over the product's weight rows, each thread fetching the share that
// falls on its rows, so the fetches run while the product computes; with several input rows the
// product is compute-bound and the memory idle. Prefetches never fault and change no result.
struct SidePrefetch {
  struct Span {
    const void* p;
    size_t bytes;
  };
  const Span* spans = nullptr;
  int n = 0;
};

// A SidePrefetch's cache lines numbered across its spans (span k's lines i < ceil(bytes / 64) at
// p + 64 i), and the share of each of a product's `total` output rows: row t takes lines
// [L t / total, L (t + 1) / total) of the L, so the rows of a static split fetch every line once.
class SideLines {
 public:
  void reset(const SidePrefetch* side);
  size_t size() const { return first_.empty() ? 0 : first_.back(); }
  // Calls f(address of the line) for each line of row t's share, in order.
  template <class F>
  void each_of_row(int t, int total, F&& f) const {
    size_t at = size() * (size_t)t / (size_t)total;
    const size_t end = size() * (size_t)(t + 1) / (size_t)total;
    if (at == end) return;
    size_t k = first_span(at);
    for (; at < end; ++at) {
      while (at >= first_[k + 1]) ++k;
      f(static_cast<const char*>(spans_[k].p) + (at - first_[k]) * 64);
    }
  }

 private:
  size_t first_span(size_t line) const;  // the span holding line (< size())
  const SidePrefetch::Span* spans_ = nullptr;
  std::vector<size_t> first_;  // first_[k]: span k's first line; first_[n]: the count
};

// y_m = W_m x for n <= kMaxMany matrices sharing the input (Q, K, V; gate, up), in one parallel
// region. Every W_m must have the same cols. Results equal n qgemv calls bit for bit.
constexpr int kMaxMany = 4;
void qgemv_many(const QMatrix* const* ws, float* const* ys, int n, const float* x,
                QgemvPath path = QgemvPath::kNative, const SidePrefetch* side = nullptr);
// Several input rows through the same matrices (a decode step over a batch of sequences):
// for each row i < n_rows, y[i*y_stride + off_m + r] = (W_m x_i)[r], where off_m is the total rows
// of W_0..W_{m-1}. Each row's results equal qgemv_many on that row alone, bit for bit, so a
// request decoded in a batch gives exactly the tokens it gives alone.
// Each weight block is decoded once for all the rows (weights read from memory once per step).
constexpr int kMaxBatchRows = 16;
void qgemv_batch(const QMatrix* const* ws, int n_mats, const float* x, int n_rows, float* y,
                 int y_stride, QgemvPath path = QgemvPath::kNative,
                 const SidePrefetch* side = nullptr);
// True for the types whose kNative/kAvx2 kernels round the input to 8 bits (listed above).
bool qgemv_uses_8bit_input(GgmlType t);
// True where kNative uses VNNI (__AVX512VNNI__ with __AVX512VL__, or __AVXVNNI__).
bool qgemv_has_vnni();
// x_used[cols] = the input type t's kernel multiplies under `path`: x rounded to 8 bits as that
// kernel quantises it (blocks of 32 elements with scale max|x| / 127 for Q4_0, Q4_1, Q5_0, Q8_0;
// blocks of 256 for the K-quants), else x itself. The kernels equal qgemv_ref on x_used up to
// float rounding; |x - x_used| <= half a step (scale / 2) per element.
void qgemv_input(GgmlType t, const float* x, int cols, float* x_used,
                 QgemvPath path = QgemvPath::kNative);
// The generic path for any type, which the dedicated kernels replaced: dequantise 256 elements
// at a time with the format table's fast path (ggml_to_f32) into a stack buffer, then dot. Kept
// as the baseline of bench/qgemv_bench.cc and as a second check in the tests.
void qgemv_dequant(const QMatrix& w, const float* x, float* y);
// Reference: dequantise each row (ggml_to_f32_ref) and accumulate in double.
void qgemv_ref(const QMatrix& w, const float* x, float* y);

// dst[r - r0][cols] = rows [r0, r1) of W as F32 (ggml_to_f32, rows split across threads).
void qmatrix_to_f32(const QMatrix& w, int r0, int r1, float* dst);

}  // namespace ct::cpu
