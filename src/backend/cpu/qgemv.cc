// AVX2 kernels for matrix-vector products from GGUF blocks, one per ggml type, in a table next to
// the format table (core/ggml_types.h). Fused kernels: Q8_0 is d*sum(q*x); Q4_0/Q5_0 are
// d*sum((q-8|16)*x); Q4_1 is d*sum(q*x) + m*sum(x); the K-quants with mins (Q4_K, Q5_K) are
// sum over sub-blocks of d*sc*sum(q*x) - dmin*m*sum(x); Q6_K is sum of d*sc*sum((q-32)*x). The
// per-32-element sums of x that the mins need are computed once per input vector. Other types
// dequantise up to 256 elements into a stack buffer (the format table's fast path) and dot that.
// Rows are split across OpenMP threads.
#include "backend/cpu/qgemv.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/vec.h"
#include "core/error.h"

namespace ct::cpu {
namespace {

constexpr int kQK = 32;
constexpr int kQKK = (int)kGgmlQK_K;

// One output row: the dot product of a packed row of `cols` elements with x. xsum32[b] is the
// sum of x[32b, 32b + 32), for kernels that need it.
using RowDot = float (*)(const uint8_t* row, const float* x, const float* xsum32, int cols);

// The block scale, converted by the F16C instruction: exact like fp16_to_f32, which does it in
// software with branches and was a visible part of decode time (two conversions per Q4_1 block).
inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// sum_j q_j * x_j over 8 elements whose unsigned 8-bit quants are the low 8 bytes of b, plus acc.
inline __m256 fma_u8x8(__m128i b, const float* x, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), _mm256_loadu_ps(x), acc);
}

// sum_j q_j * x_j over 32 elements with unsigned 8-bit quants q (one byte each, element order).
inline __m256 dot_u8x32(__m256i q, const float* x) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  __m256 acc = fma_u8x8(lo, x, _mm256_setzero_ps());
  acc = fma_u8x8(_mm_srli_si128(lo, 8), x + 8, acc);
  acc = fma_u8x8(hi, x + 16, acc);
  return fma_u8x8(_mm_srli_si128(hi, 8), x + 24, acc);
}

// The same for signed 8-bit quants.
inline __m256 fma_i8x8(__m128i b, const float* x, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_loadu_ps(x), acc);
}

inline __m256 dot_i8x32(__m256i q, const float* x) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  __m256 acc = fma_i8x8(lo, x, _mm256_setzero_ps());
  acc = fma_i8x8(_mm_srli_si128(lo, 8), x + 8, acc);
  acc = fma_i8x8(hi, x + 16, acc);
  return fma_i8x8(_mm_srli_si128(hi, 8), x + 24, acc);
}

// 16 packed bytes -> 32 nibbles as bytes: low nibbles (elements 0..15), then high (16..31).
inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
}

// The 32 fifth bits of a Q5 block (bit j of qh for element j) as 0x10 or 0 per byte.
inline __m256i q5_high_bits(const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const __m256i bytes = _mm256_shuffle_epi8(
      _mm256_set1_epi32((int)qh), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                   2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

float dot_f32(const uint8_t* row, const float* x, const float*, int cols) {
  return vec_dot(reinterpret_cast<const float*>(row), x, cols);
}

// Offset types (Q4_0, Q5_0, Q6_K) subtract the offset in the 8-bit integers, which is exact,
// rather than as offset * sum(x) afterwards, which would cancel.
float dot_q4_0(const uint8_t* row, const float* x, const float*, int cols) {
  const __m256i eight = _mm256_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < cols / kQK; ++b) {
    const uint8_t* blk = row + (size_t)b * 18;
    const __m256i q = _mm256_sub_epi8(nibbles32(blk + 2), eight);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(blk)), dot_i8x32(q, x + b * kQK), acc);
  }
  return hsum256_ps(acc);
}

float dot_q4_1(const uint8_t* row, const float* x, const float* xsum, int cols) {
  __m256 acc = _mm256_setzero_ps();
  float extra = 0;
  for (int b = 0; b < cols / kQK; ++b) {
    const uint8_t* blk = row + (size_t)b * 20;
    acc =
        _mm256_fmadd_ps(_mm256_set1_ps(half(blk)), dot_u8x32(nibbles32(blk + 4), x + b * kQK), acc);
    extra += half(blk + 2) * xsum[b];
  }
  return hsum256_ps(acc) + extra;
}

float dot_q5_0(const uint8_t* row, const float* x, const float*, int cols) {
  const __m256i sixteen = _mm256_set1_epi8(16);
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < cols / kQK; ++b) {
    const uint8_t* blk = row + (size_t)b * 22;
    const __m256i q =
        _mm256_sub_epi8(_mm256_or_si256(nibbles32(blk + 6), q5_high_bits(blk + 2)), sixteen);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(blk)), dot_i8x32(q, x + b * kQK), acc);
  }
  return hsum256_ps(acc);
}

float dot_q8_0(const uint8_t* row, const float* x, const float*, int cols) {
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < cols / kQK; ++b) {
    const uint8_t* blk = row + (size_t)b * 34;
    __m256 s = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * k));
      s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)),
                          _mm256_loadu_ps(x + b * kQK + 8 * k), s);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(blk)), s, acc);
  }
  return hsum256_ps(acc);
}

// Sub-block j (< 8) scale and min of a Q4_K/Q5_K super-block (see core/ggml_types.cc).
inline void q4_k_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K (kFive false) and Q5_K: d, dmin, 12 scale bytes, [Q5_K: 32 bytes qh], 128 bytes qs.
template <bool kFive>
float dot_q45_k(const uint8_t* row, const float* x, const float* xsum, int cols) {
  constexpr size_t kBytes = kFive ? 176 : 144;
  const __m256i mask = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int b = 0; b < cols / kQKK; ++b) {
    const uint8_t* blk = row + (size_t)b * kBytes;
    const float d = half(blk), dmin = half(blk + 2);
    const uint8_t* scales = blk + 4;
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    const __m256i qh = kFive ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16))
                             : _mm256_setzero_si256();
    const float* xb = x + b * kQKK;
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      const __m256i nib[2] = {_mm256_and_si256(raw, mask),
                              _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask)};
      for (int hi = 0; hi < 2; ++hi) {
        const int s = 2 * c + hi;
        __m256i q = nib[hi];
        if (kFive) {
          // Bit s of each qh byte moved to bit 4; masked to one bit, 16-bit shifts cannot carry.
          q = _mm256_or_si256(
              q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, s), one), 4));
        }
        int sc, m;
        q4_k_scale_min(scales, s, sc, m);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc), dot_u8x32(q, xb + 32 * s), acc);
        mins += dmin * (float)m * xsum[b * 8 + s];
      }
    }
  }
  return hsum256_ps(acc) - mins;
}

// Q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales, d. Element 128h + 32k + l (k < 4, l < 32):
// low nibble (k odd: of ql[64h + 32 + l], k >= 2: the high nibble) and 2 bits of qh[32h + l] at
// bit 2k; minus 32, times d * scales[8h + 2k + l / 16].
float dot_q6_k(const uint8_t* row, const float* x, const float*, int cols) {
  const __m256i mask4 = _mm256_set1_epi8(0x0f), mask2 = _mm256_set1_epi8(3);
  const __m256i off = _mm256_set1_epi8(32);
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < cols / kQKK; ++b) {
    const uint8_t* blk = row + (size_t)b * 210;
    const float d = half(blk + 208);
    const auto* scales = reinterpret_cast<const int8_t*>(blk + 192);
    const float* xb = x + b * kQKK;
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      const __m256i lo[4] = {_mm256_and_si256(ql0, mask4), _mm256_and_si256(ql1, mask4),
                             _mm256_and_si256(_mm256_srli_epi16(ql0, 4), mask4),
                             _mm256_and_si256(_mm256_srli_epi16(ql1, 4), mask4)};
      for (int k = 0; k < 4; ++k) {
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), mask2);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo[k], _mm256_slli_epi16(hi, 4)), off);
        const float* xq = xb + 128 * h + 32 * k;
        const __m128i qlo = _mm256_castsi256_si128(q), qhi = _mm256_extracti128_si256(q, 1);
        // Each 16 elements have their own scale.
        const __m256 s0 =
            fma_i8x8(_mm_srli_si128(qlo, 8), xq + 8, fma_i8x8(qlo, xq, _mm256_setzero_ps()));
        const __m256 s1 =
            fma_i8x8(_mm_srli_si128(qhi, 8), xq + 24, fma_i8x8(qhi, xq + 16, _mm256_setzero_ps()));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)scales[8 * h + 2 * k]), s0, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)scales[8 * h + 2 * k + 1]), s1, acc);
      }
    }
  }
  return hsum256_ps(acc);
}

// Any type: dequantise up to 256 elements (a multiple of every block size) with the format
// table's fast path into a stack buffer that stays in L1, then dot.
template <GgmlType kType>
float dot_dequant(const uint8_t* row, const float* x, const float*, int cols) {
  static const GgmlTypeTraits& tt = ggml_traits(kType);
  constexpr int kChunk = 256;
  alignas(32) float buf[kChunk];
  __m256 acc = _mm256_setzero_ps();
  float tail = 0;
  for (int c = 0; c < cols; c += kChunk) {
    const int n = std::min(kChunk, cols - c);
    tt.to_f32(row + (size_t)(c / tt.block_elems) * tt.block_bytes, buf, n / tt.block_elems);
    int j = 0;
    for (; j + 8 <= n; j += 8) {
      acc = _mm256_fmadd_ps(_mm256_load_ps(buf + j), _mm256_loadu_ps(x + c + j), acc);
    }
    for (; j < n; ++j) tail += buf[j] * x[c + j];
  }
  return hsum256_ps(acc) + tail;
}

struct Kernel {
  GgmlType type;
  RowDot dot;
  bool needs_xsum;  // reads the per-32-element sums of x
};

const Kernel kKernels[] = {
    {GgmlType::F32, dot_f32, false},
    {GgmlType::F16, dot_dequant<GgmlType::F16>, false},
    {GgmlType::BF16, dot_dequant<GgmlType::BF16>, false},
    {GgmlType::Q4_0, dot_q4_0, false},
    {GgmlType::Q4_1, dot_q4_1, true},
    {GgmlType::Q5_0, dot_q5_0, false},
    {GgmlType::Q5_1, dot_dequant<GgmlType::Q5_1>, false},
    {GgmlType::Q8_0, dot_q8_0, false},
    {GgmlType::Q2_K, dot_dequant<GgmlType::Q2_K>, false},
    {GgmlType::Q3_K, dot_dequant<GgmlType::Q3_K>, false},
    {GgmlType::Q4_K, dot_q45_k<false>, true},
    {GgmlType::Q5_K, dot_q45_k<true>, true},
    {GgmlType::Q6_K, dot_q6_k, false},
};

const Kernel* find_kernel(GgmlType t) {
  for (const Kernel& k : kKernels) {
    if (k.type == t) return &k;
  }
  return nullptr;
}

}  // namespace

bool qgemv_supported(GgmlType t) { return find_kernel(t) != nullptr && ggml_type_supported(t); }

void qgemv(const QMatrix& w, const float* x, float* y) {
  const QMatrix* ws[1] = {&w};
  float* ys[1] = {y};
  qgemv_many(ws, ys, 1, x);
}

void qgemv_many(const QMatrix* const* ws, float* const* ys, int n, const float* x) {
  CT_ASSERT(n >= 1 && n <= kMaxMany, "qgemv_many: {} matrices", n);
  int offset[kMaxMany + 1] = {0};
  RowDot dot[kMaxMany] = {};
  bool any_xsum = false;
  for (int m = 0; m < n; ++m) {
    const QMatrix& w = *ws[m];
    const Kernel* k = find_kernel(w.type);
    CT_ASSERT(k != nullptr && w.cols % ggml_block_elems(w.type) == 0 && w.cols == ws[0]->cols,
              "type {} cols {} (first matrix: {} cols)", ggml_type_name(w.type), w.cols,
              ws[0]->cols);
    offset[m + 1] = offset[m] + w.rows;
    dot[m] = k->dot;
    any_xsum = any_xsum || k->needs_xsum;
  }
  const int cols = ws[0]->cols;
  std::vector<float> xsum;
  if (any_xsum) {  // every type that needs it has blocks of 32 or 256, so cols % 32 == 0
    xsum.resize(cols / kQK);
    for (int b = 0; b < cols / kQK; ++b) {
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
    const int r = i - offset[m];
    ys[m][r] = dot[m](ws[m]->data + (size_t)r * ws[m]->row_bytes, x, xsum.data(), cols);
  }
}

void qgemv_ref(const QMatrix& w, const float* x, float* y) {
  std::vector<float> row(w.cols);
  for (int r = 0; r < w.rows; ++r) {
    ggml_to_f32_ref(w.type, w.data + (size_t)r * w.row_bytes, row.data(), w.cols);
    double acc = 0;
    for (int c = 0; c < w.cols; ++c) acc += (double)row[c] * x[c];
    y[r] = (float)acc;
  }
}

void qmatrix_to_f32(const QMatrix& w, int r0, int r1, float* dst) {
  CT_ASSERT(0 <= r0 && r0 <= r1 && r1 <= w.rows, "rows [{}, {}) of {}", r0, r1, w.rows);
  const GgmlTypeTraits& tt = ggml_traits(w.type);
  const int64_t nb = w.cols / tt.block_elems;
#pragma omp parallel for schedule(static) if ((int64_t)(r1 - r0) * w.cols >= (1 << 16))
  for (int r = r0; r < r1; ++r) {
    tt.to_f32(w.data + (size_t)r * w.row_bytes, dst + (size_t)(r - r0) * w.cols, nb);
  }
}

}  // namespace ct::cpu
