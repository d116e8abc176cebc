// Matrix-vector products straight from GGUF quantised blocks (Q4_0, Q4_1, Q8_0), for decoding:
// one token reads every weight once, so reading 4.5-8.5 bits per weight instead of an F32 copy's
// 32 is what makes decode fast. Results equal the dequantised-F32 product up to float rounding.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/ggml_types.h"

namespace ct::cpu {

// A weight matrix [rows][cols] in its packed GGUF form (points into the mapped file).
struct QMatrix {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int rows = 0, cols = 0;
  size_t row_bytes = 0;
  bool valid() const { return data != nullptr; }
};

bool qgemv_supported(GgmlType t);  // Q4_0, Q4_1, Q8_0

// y[rows] = W x. cols must be a multiple of 32.
void qgemv(const QMatrix& w, const float* x, float* y);
// y_m = W_m x for n <= kMaxMany matrices sharing the input (Q, K, V; gate, up), in one parallel
// region. Every W_m must have the same cols. Results equal n qgemv calls bit for bit.
constexpr int kMaxMany = 4;
void qgemv_many(const QMatrix* const* ws, float* const* ys, int n, const float* x);
// Reference: dequantise each row (ggml_to_f32) and accumulate in double.
void qgemv_ref(const QMatrix& w, const float* x, float* y);

}  // namespace ct::cpu
