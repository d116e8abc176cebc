// Matrix-vector products straight from GGUF blocks, for decoding: one token reads every weight
// once, so reading 2.6-8.5 bits per weight instead of an F32 copy's 32 is what makes decode fast.
// Every type of the ggml type table (core/ggml_types.h) has a kernel here (the CPU side of the
// traits, as ggml-cpu's type_traits_cpu): fused AVX2 dot products read the blocks directly.
// Results equal the dequantised-F32 product up to float rounding.
#pragma once

#include <cstddef>
#include <cstdint>

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

// y[rows] = W x. cols must be a multiple of the type's block size.
void qgemv(const QMatrix& w, const float* x, float* y);
// y_m = W_m x for n <= kMaxMany matrices sharing the input (Q, K, V; gate, up), in one parallel
// region. Every W_m must have the same cols. Results equal n qgemv calls bit for bit.
constexpr int kMaxMany = 4;
void qgemv_many(const QMatrix* const* ws, float* const* ys, int n, const float* x);
// Several input rows through the same matrices (a decode step over a batch of sequences):
// for each row i < n_rows, y[i*y_stride + off_m + r] = (W_m x_i)[r], where off_m is the total rows
// of W_0..W_{m-1}. Each row's results equal qgemv_many on that row alone, bit for bit, so a
// request decoded in a batch gives exactly the tokens it gives alone.
constexpr int kMaxBatchRows = 16;
void qgemv_batch(const QMatrix* const* ws, int n_mats, const float* x, int n_rows, float* y,
                 int y_stride);
// The generic path for any type, which the dedicated kernels replaced: dequantise 256 elements
// at a time with the format table's fast path (ggml_to_f32) into a stack buffer, then dot. Kept
// as the baseline of bench/qgemv_bench.cc and as a second check in the tests.
void qgemv_dequant(const QMatrix& w, const float* x, float* y);
// Reference: dequantise each row (ggml_to_f32_ref) and accumulate in double.
void qgemv_ref(const QMatrix& w, const float* x, float* y);

// dst[r - r0][cols] = rows [r0, r1) of W as F32 (ggml_to_f32, rows split across threads).
void qmatrix_to_f32(const QMatrix& w, int r0, int r1, float* dst);

}  // namespace ct::cpu
