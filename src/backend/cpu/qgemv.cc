// AVX2 kernels for quantised matrix-vector products. Per 32-element block: Q8_0 is d*sum(q*x);
// Q4_1 is d*sum(q*x) + m*sum(x), with sum(x) per block computed once per input vector; Q4_0 is
// d*sum((q-8)*x). Rows are split across OpenMP threads.
#include "backend/cpu/qgemv.h"

#include <immintrin.h>

#include <cstring>
#include <vector>

#include "backend/cpu/vec.h"
#include "core/error.h"

namespace ct::cpu {
namespace {

constexpr int kQK = 32;

// The block scale, converted by the F16C instruction: exact like fp16_to_f32, which does it in
// software with branches and was a visible part of decode time (two conversions per Q4_1 block).
inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// sum_j q_j * x_j for 32 unsigned nibbles (low nibbles are elements 0..15, high 16..31).
inline __m256 dot_nibbles(const uint8_t* qs, const float* x, __m256 offset) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(raw, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
  __m256 acc = _mm256_setzero_ps();
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int k = 0; k < 4; ++k) {
    const __m256 q = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k])), offset);
    acc = _mm256_fmadd_ps(q, _mm256_loadu_ps(x + 8 * k), acc);
  }
  return acc;
}

inline __m256 dot_int8(const int8_t* qs, const float* x) {
  __m256 acc = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * k));
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    acc = _mm256_fmadd_ps(q, _mm256_loadu_ps(x + 8 * k), acc);
  }
  return acc;
}

}  // namespace

bool qgemv_supported(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q8_0;
}

namespace {

// One output row: sum over the row's blocks. xsum: per-block sums of x (Q4_1 only).
inline float qgemv_row(const QMatrix& w, int r, const float* x, const float* xsum) {
  const int nb = w.cols / kQK;
  const uint8_t* row = w.data + (size_t)r * w.row_bytes;
  __m256 acc = _mm256_setzero_ps();
  float extra = 0;
  if (w.type == GgmlType::Q8_0) {
    for (int b = 0; b < nb; ++b) {
      const uint8_t* blk = row + (size_t)b * 34;
      acc = _mm256_fmadd_ps(_mm256_set1_ps(half(blk)),
                            dot_int8(reinterpret_cast<const int8_t*>(blk + 2), x + b * kQK), acc);
    }
  } else if (w.type == GgmlType::Q4_1) {
    for (int b = 0; b < nb; ++b) {
      const uint8_t* blk = row + (size_t)b * 20;
      acc = _mm256_fmadd_ps(_mm256_set1_ps(half(blk)),
                            dot_nibbles(blk + 4, x + b * kQK, _mm256_setzero_ps()), acc);
      extra += half(blk + 2) * xsum[b];
    }
  } else {  // Q4_0
    for (int b = 0; b < nb; ++b) {
      const uint8_t* blk = row + (size_t)b * 18;
      acc = _mm256_fmadd_ps(_mm256_set1_ps(half(blk)),
                            dot_nibbles(blk + 2, x + b * kQK, _mm256_set1_ps(-8.0f)), acc);
    }
  }
  return hsum256_ps(acc) + extra;
}

}  // namespace

void qgemv(const QMatrix& w, const float* x, float* y) {
  const QMatrix* ws[1] = {&w};
  float* ys[1] = {y};
  qgemv_many(ws, ys, 1, x);
}

void qgemv_many(const QMatrix* const* ws, float* const* ys, int n, const float* x) {
  CT_ASSERT(n >= 1 && n <= kMaxMany, "qgemv_many: {} matrices", n);
  int offset[kMaxMany + 1] = {0};
  bool any_q4_1 = false;
  for (int m = 0; m < n; ++m) {
    const QMatrix& w = *ws[m];
    CT_ASSERT(qgemv_supported(w.type) && w.cols % kQK == 0 && w.cols == ws[0]->cols,
              "type {} cols {} (first matrix: {} cols)", ggml_type_name(w.type), w.cols,
              ws[0]->cols);
    offset[m + 1] = offset[m] + w.rows;
    any_q4_1 = any_q4_1 || w.type == GgmlType::Q4_1;
  }
  const int nb = ws[0]->cols / kQK;
  std::vector<float> xsum;
  if (any_q4_1) {
    xsum.resize(nb);
    for (int b = 0; b < nb; ++b) {
      float s = 0;
      for (int j = 0; j < kQK; ++j) s += x[b * kQK + j];
      xsum[b] = s;
    }
  }
  // One parallel region over the rows of all the matrices: one fork/join instead of n.
  const int total = offset[n];
#pragma omp parallel for schedule(static) if (total >= 64)
  for (int i = 0; i < total; ++i) {
    int m = 0;
    while (i >= offset[m + 1]) ++m;
    ys[m][i - offset[m]] = qgemv_row(*ws[m], i - offset[m], x, xsum.data());
  }
}

void qgemv_ref(const QMatrix& w, const float* x, float* y) {
  std::vector<float> row(w.cols);
  for (int r = 0; r < w.rows; ++r) {
    ggml_to_f32(w.type, w.data + (size_t)r * w.row_bytes, row.data(), w.cols);
    double acc = 0;
    for (int c = 0; c < w.cols; ++c) acc += (double)row[c] * x[c];
    y[r] = (float)acc;
  }
}

}  // namespace ct::cpu
