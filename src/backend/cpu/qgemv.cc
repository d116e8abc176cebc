// Matrix-vector products from GGUF blocks, one kernel per ggml type, in a table next to the
// format table (core/ggml_types.h). Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K quantise the input
// rows to 8 bits once per product and use the integer kernels of qgemv_q8.cc. The F32-activation
// AVX2 kernels here serve the other types and, for those seven, the kF32 path (the baseline):
// Q8_0 is d*sum(q*x); Q4_0/Q5_0 are d*sum((q-8|16)*x); Q4_1 is d*sum(q*x) + m*sum(x); the K-quants
// with mins (Q4_K, Q5_K) are sum over sub-blocks of d*sc*sum(q*x) - dmin*m*sum(x); Q6_K is sum of
// d*sc*sum((q-32)*x). The per-32-element sums of x that the mins need are computed once per input
// row. Q5_1 is Q4_1 with a fifth bit; Q2_K and Q3_K have a scale (and for Q2_K a min, using
// 16-element sums of x) per 16 elements; F16/BF16 convert in registers. qgemv_dequant, the generic
// path (dequantise up to 256 elements into a stack buffer with the format table's fast path, then
// dot), is kept as a second baseline. One parallel region splits the output rows of all the
// matrices of a product across OpenMP threads; each weight row is dotted with every input row.
#include "backend/cpu/qgemv.h"

#include <immintrin.h>

// The CPU backend is AVX2-only (CMakeLists.txt: -march=native, or -mavx2 -mfma -mf16c with
// CT_NATIVE=OFF); there is no scalar build of these kernels to fall back to.
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "backend/cpu/qgemv.cc needs AVX2, FMA and F16C (see CT_NATIVE in CMakeLists.txt)"
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/qgemv_q8.h"
#include "backend/cpu/vec.h"
#include "core/error.h"
#include "core/qblock_simd.h"
#include "core/fp16.h"
#include "core/ggml_types.h"

namespace ct::cpu {
using simd::half;
using simd::nibbles32;
using simd::q5_high_bits;
namespace {

constexpr int kQK = 32;
constexpr int kQKK = (int)kGgmlQK_K;

// Software prefetch of the weights: before a row's product, the bytes that lie kPrefetchAhead
// past its start, one row's worth (rows of a matrix are contiguous), are requested into L1. One
// core's hardware prefetchers leave decode, which streams every weight once per token, well below
// the memory's rate: this took one-thread decode on a Xeon up by 26-36% on the three registry
// models (docs/PERFORMANCE.md, "Prefetching the weights"), where 1 and 4 KiB ahead measured
// slightly slower than 2 KiB. Prefetches do not change results. Only bytes of the matrix are
// named (its last rows prefetch less). One input row only: with more, the product is
// compute-bound, the hardware prefetchers keep up, and these prefetches stalled the core when the
// fill buffers were full (on the EPYC, Qwen2.5-0.5B's 8-sequence steps 1.16x faster without them;
// docs/PERFORMANCE.md).
constexpr size_t kPrefetchAhead = 2048;

inline void prefetch_ahead(const QMatrix& w, int r) {
  const size_t size = (size_t)w.rows * w.row_bytes;
  const size_t from = std::min(size, (size_t)r * w.row_bytes + kPrefetchAhead);
  const size_t to = std::min(size, from + w.row_bytes);
  const char* base = reinterpret_cast<const char*>(w.data);
  // As asm: GCC deletes a loop of _mm_prefetch alone (a loop without side effects may be assumed
  // to terminate, and then removed; found by its absence from the object code).
  for (size_t at = from; at < to; at += 64) asm volatile("prefetcht0 %0" : : "m"(base[at]));
}

// Sums of the input vector over aligned pieces, computed once per qgemv call for the kernels
// with a min or offset term: s32[b] = sum of x[32b, 32b + 32) and s16[b] = sum of x[16b, 16b + 16)
// (null when no kernel of the call needs them).
struct XSums {
  const float* s32 = nullptr;
  const float* s16 = nullptr;
};

// One output row: the dot product of a packed row of `cols` elements with x.
using RowDot = float (*)(const uint8_t* row, const float* x, const XSums& xs, int cols);

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

float dot_f32(const uint8_t* row, const float* x, const XSums&, int cols) {
  return vec_dot(reinterpret_cast<const float*>(row), x, cols);
}

// F16 and BF16 convert 8 elements at a time in registers (F16C; BF16 is the upper half of an F32)
// and multiply-add, with two accumulators as vec_dot. Both conversions are exact.
inline __m256 load_f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256 load_bf16x8(const uint8_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <bool kBf16>
float dot_half_row(const uint8_t* row, const float* x, const XSums&, int cols) {
  auto load = [](const uint8_t* p) { return kBf16 ? load_bf16x8(p) : load_f16x8(p); };
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= cols; i += 16) {
    acc0 = _mm256_fmadd_ps(load(row + 2 * i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(load(row + 2 * i + 16), _mm256_loadu_ps(x + i + 8), acc1);
  }
  for (; i + 8 <= cols; i += 8)
    acc0 = _mm256_fmadd_ps(load(row + 2 * i), _mm256_loadu_ps(x + i), acc0);
  float s = hsum256_ps(_mm256_add_ps(acc0, acc1));
  for (; i < cols; ++i) {
    uint16_t h;
    std::memcpy(&h, row + 2 * i, 2);
    s += (kBf16 ? bf16_to_f32(h) : _cvtsh_ss(h)) * x[i];
  }
  return s;
}

// Offset types (Q4_0, Q5_0, Q6_K) subtract the offset in the 8-bit integers, which is exact,
// rather than as offset * sum(x) afterwards, which would cancel.
float dot_q4_0(const uint8_t* row, const float* x, const XSums&, int cols) {
  const __m256i eight = _mm256_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < cols / kQK; ++b) {
    const uint8_t* blk = row + (size_t)b * 18;
    const __m256i q = _mm256_sub_epi8(nibbles32(blk + 2), eight);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(blk)), dot_i8x32(q, x + b * kQK), acc);
  }
  return hsum256_ps(acc);
}

float dot_q4_1(const uint8_t* row, const float* x, const XSums& xs, int cols) {
  __m256 acc = _mm256_setzero_ps();
  float extra = 0;
  for (int b = 0; b < cols / kQK; ++b) {
    const uint8_t* blk = row + (size_t)b * 20;
    acc =
        _mm256_fmadd_ps(_mm256_set1_ps(half(blk)), dot_u8x32(nibbles32(blk + 4), x + b * kQK), acc);
    extra += half(blk + 2) * xs.s32[b];
  }
  return hsum256_ps(acc) + extra;
}

float dot_q5_0(const uint8_t* row, const float* x, const XSums&, int cols) {
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

// Q5_1: d, m, 4 bytes qh, 16 bytes qs; element = d*q + m, so the row is d*sum(q*x) + m*sum(x).
float dot_q5_1(const uint8_t* row, const float* x, const XSums& xs, int cols) {
  __m256 acc = _mm256_setzero_ps();
  float extra = 0;
  for (int b = 0; b < cols / kQK; ++b) {
    const uint8_t* blk = row + (size_t)b * 24;
    const __m256i q = _mm256_or_si256(nibbles32(blk + 8), q5_high_bits(blk + 4));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(blk)), dot_u8x32(q, x + b * kQK), acc);
    extra += half(blk + 2) * xs.s32[b];
  }
  return hsum256_ps(acc) + extra;
}

float dot_q8_0(const uint8_t* row, const float* x, const XSums&, int cols) {
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

// Q4_K (kFive false) and Q5_K: d, dmin, 12 scale bytes, [Q5_K: 32 bytes qh], 128 bytes qs.
template <bool kFive>
float dot_q45_k(const uint8_t* row, const float* x, const XSums& xs, int cols) {
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
        mins += dmin * (float)m * xs.s32[b * 8 + s];
      }
    }
  }
  return hsum256_ps(acc) - mins;
}

// sum_j q_j * x_j for the two 16-element halves of 32 8-bit quants (unsigned or signed), which
// have their own scales in Q2_K, Q3_K and Q6_K.
template <bool kSigned>
inline void dot_halves16(__m256i q, const float* x, __m256& s0, __m256& s1) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  auto fma8 = [](__m128i b, const float* xp, __m256 acc) {
    return kSigned ? fma_i8x8(b, xp, acc) : fma_u8x8(b, xp, acc);
  };
  s0 = fma8(_mm_srli_si128(lo, 8), x + 8, fma8(lo, x, _mm256_setzero_ps()));
  s1 = fma8(_mm_srli_si128(hi, 8), x + 24, fma8(hi, x + 16, _mm256_setzero_ps()));
}

// Q2_K: 16 scale bytes (low nibble scale, high nibble min, per 16 elements), 64 bytes qs, d, dmin.
// Element 128h + 32s + j is bits 2s..2s+1 of qs[32h + j]; element = d*sc*q - dmin*m, so a
// sub-block contributes d*sc*sum(q*x) - dmin*m*sum(x) with the 16-element sums of x.
float dot_q2_k(const uint8_t* row, const float* x, const XSums& xs, int cols) {
  const __m256i mask = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int b = 0; b < cols / kQKK; ++b) {
    const uint8_t* blk = row + (size_t)b * 84;
    const uint8_t* scales = blk;
    const float d = half(blk + 80), dmin = half(blk + 82);
    const float* xb = x + b * kQKK;
    const float* s16 = xs.s16 + b * 16;
    float m = 0;
    for (int i = 0; i < 16; ++i) m += (float)(scales[i] >> 4) * s16[i];
    mins += dmin * m;
    for (int h = 0; h < 2; ++h) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * h));
      for (int s = 0; s < 4; ++s) {
        // 2-bit fields stay inside their byte after a 16-bit shift by < 8 and the mask.
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * s), mask);
        __m256 s0, s1;
        dot_halves16<false>(q, xb + 128 * h + 32 * s, s0, s1);
        const int sub = 8 * h + 2 * s;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)(scales[sub] & 0x0f)), s0, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)(scales[sub + 1] & 0x0f)), s1, acc);
      }
    }
  }
  return hsum256_ps(acc) - mins;
}

// Sub-block i (< 16) scale of a Q3_K super-block, as core/ggml_types.cc's q3_k_scale: low 4 bits
// from byte i (i < 8) or the high nibble of byte i - 8, top 2 bits from byte 8 + i % 4 at bit
// 2 * (i / 4), minus 32.
inline int q3_k_scale(const uint8_t* s, int i) {
  const int lo = i < 8 ? (s[i] & 0x0f) : (s[i - 8] >> 4);
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// Q3_K: 32 bytes hmask, 64 bytes qs (low 2 bits, laid out as Q2_K), 12 scale bytes, d. Element
// 128h + 32s + j: q = low bits + 4 * (bit 4h + s of hmask[j]) - 4, signed in [-4, 3]; element =
// d*sc*q with the scale of its 16 elements.
float dot_q3_k(const uint8_t* row, const float* x, const XSums&, int cols) {
  const __m256i mask = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < cols / kQKK; ++b) {
    const uint8_t* blk = row + (size_t)b * 110;
    const __m256i hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
    const float d = half(blk + 108);
    float dl[16];
    for (int i = 0; i < 16; ++i) dl[i] = d * (float)q3_k_scale(blk + 96, i);
    const float* xb = x + b * kQKK;
    for (int h = 0; h < 2; ++h) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 32 * h));
      for (int s = 0; s < 4; ++s) {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * s), mask);
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hmask, 4 * h + s), one);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)), four);
        __m256 s0, s1;
        dot_halves16<true>(q, xb + 128 * h + 32 * s, s0, s1);
        const int sub = 8 * h + 2 * s;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dl[sub]), s0, acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dl[sub + 1]), s1, acc);
      }
    }
  }
  return hsum256_ps(acc);
}

// Q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales, d. Element 128h + 32k + l (k < 4, l < 32):
// low nibble (k odd: of ql[64h + 32 + l], k >= 2: the high nibble) and 2 bits of qh[32h + l] at
// bit 2k; minus 32, times d * scales[8h + 2k + l / 16].
float dot_q6_k(const uint8_t* row, const float* x, const XSums&, int cols) {
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
// table's fast path into a stack buffer that stays in L1, then dot. The generic path behind
// qgemv_dequant, the baseline the dedicated kernels are measured and tested against.
float dot_dequant(const GgmlTypeTraits& tt, const uint8_t* row, const float* x, int cols) {
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
  bool needs_s32, needs_s16;  // reads the 32- / 16-element sums of x
};

// Every type has a dedicated kernel; dot_dequant (qgemv_dequant) is their common baseline.
const Kernel kKernels[] = {
    {GgmlType::F32, dot_f32, false, false},
    {GgmlType::F16, dot_half_row<false>, false, false},
    {GgmlType::BF16, dot_half_row<true>, false, false},
    {GgmlType::Q4_0, dot_q4_0, false, false},
    {GgmlType::Q4_1, dot_q4_1, true, false},
    {GgmlType::Q5_0, dot_q5_0, false, false},
    {GgmlType::Q5_1, dot_q5_1, true, false},
    {GgmlType::Q8_0, dot_q8_0, false, false},
    {GgmlType::Q2_K, dot_q2_k, false, true},
    {GgmlType::Q3_K, dot_q3_k, false, false},
    {GgmlType::Q4_K, dot_q45_k<false>, true, false},
    {GgmlType::Q5_K, dot_q45_k<true>, true, false},
    {GgmlType::Q6_K, dot_q6_k, false, false},
};

const Kernel* find_kernel(GgmlType t) {
  for (const Kernel& k : kKernels) {
    if (k.type == t) return &k;
  }
  return nullptr;
}

}  // namespace

bool qgemv_supported(GgmlType t) { return find_kernel(t) != nullptr && ggml_type_supported(t); }

bool qgemv_has_vnni() { return q8::have_vnni(); }

bool qgemv_uses_8bit_input(GgmlType t) { return q8::format_of(t) != q8::kNone; }

namespace {

// The input rows of one product in every form its kernels read (the calling thread's buffers,
// reused across calls and sized before the parallel region; with several input rows the team
// fills them, each row and tile part by one thread, then reads them).
struct Inputs {
  std::vector<int8_t> q32, qk, lq;
  std::vector<float> d32, sx32, dk, s32, s16f, ld, lsx;
  std::vector<int16_t> s16;
  std::vector<int32_t> h32, lh32;
  std::vector<q8::Act> act;
  std::vector<q8::Lanes32> lanes;
  std::vector<XSums> sums;
};

// y0[m][r + i * y_stride] = (W_m x_i)[r] for i < n_rows: the one implementation behind qgemv,
// qgemv_many and qgemv_batch. Each output row's arithmetic depends only on its own input row.
void qgemv_rows(const QMatrix* const* ws, int n_mats, const float* x, int n_rows, float* const* y0,
                size_t y_stride, QgemvPath path, const SidePrefetch* side) {
  CT_ASSERT(n_mats >= 1 && n_mats <= kMaxMany && n_rows >= 1 && n_rows <= kMaxBatchRows,
            "qgemv: {} matrices, {} rows", n_mats, n_rows);
  int offset[kMaxMany + 1] = {0};
  RowDot dot[kMaxMany] = {};
  q8::RowsDot dot8[kMaxMany] = {};
  bool any_s32 = false, any_s16 = false, any_lanes = false;
  unsigned formats = q8::kNone;
  for (int m = 0; m < n_mats; ++m) {
    const QMatrix& w = *ws[m];
    const Kernel* k = find_kernel(w.type);
    CT_ASSERT(k != nullptr && w.cols % ggml_block_elems(w.type) == 0 && w.cols == ws[0]->cols,
              "type {} cols {} (first matrix: {} cols)", ggml_type_name(w.type), w.cols,
              ws[0]->cols);
    offset[m + 1] = offset[m] + w.rows;
    if (path != QgemvPath::kF32) dot8[m] = q8::find(w.type, path == QgemvPath::kNative);
    if (dot8[m] != nullptr) {
      formats |= q8::format_of(w.type);
      any_lanes = any_lanes || q8::wants_lanes(w.type, n_rows);
    } else {
      dot[m] = k->dot;
      any_s32 = any_s32 || k->needs_s32;
      any_s16 = any_s16 || k->needs_s16;
    }
  }
  const int cols = ws[0]->cols;
  const size_t n_el = (size_t)n_rows * cols;
  thread_local Inputs in;
  in.act.assign(n_rows, q8::Act{});
  in.sums.assign(n_rows, XSums{});
  // Every type with an 8-bit kernel or that needs the sums has blocks of 32 or 256, so
  // cols % 32 == 0 (and cols % 256 == 0 for kBlocks256).
  if (formats & q8::kBlocks32) {
    in.q32.resize(n_el);
    in.d32.resize(n_el / 32);
    in.sx32.resize(n_el / 32);
    in.h32.resize(n_el / 32);
  }
  if (formats & q8::kBlocks256) {
    in.qk.resize(n_el);
    in.dk.resize(n_el / 256);
    in.s16.resize(n_el / 16);
  }
  if (any_s32) in.s32.resize(n_el / kQK);
  if (any_s16) in.s16f.resize(n_el / 16);
  // The inputs of row i, in 8-bit form and the sums the float kernels need. `in` is this
  // thread's: the team reaches it through this reference (inside the region the name would be
  // each thread's own).
  Inputs& inr = in;
  auto prepare_row = [&](int i) {
    const float* xi = x + (size_t)i * cols;
    const size_t e = (size_t)i * cols;
    q8::Act& a = inr.act[i];
    if (formats & q8::kBlocks32) {
      q8::quantise_blocks32(xi, cols, &inr.q32[e], &inr.d32[e / 32], &inr.sx32[e / 32],
                            &inr.h32[e / 32]);
      a.q32 = &inr.q32[e];
      a.h32 = &inr.h32[e / 32];
      a.d32 = &inr.d32[e / 32];
      a.sx32 = &inr.sx32[e / 32];
    }
    if (formats & q8::kBlocks256) {
      q8::quantise_blocks256(xi, cols, &inr.qk[e], &inr.dk[e / 256], &inr.s16[e / 16]);
      a.qk = &inr.qk[e];
      a.dk = &inr.dk[e / 256];
      a.s16 = &inr.s16[e / 16];
    }
    if (any_s32) {
      float* s32 = &inr.s32[e / kQK];
      for (int b = 0; b < cols / kQK; ++b) {
        float s = 0;
        for (int j = 0; j < kQK; ++j) s += xi[b * kQK + j];
        s32[b] = s;
      }
      inr.sums[i].s32 = s32;
    }
    if (any_s16) {
      float* s16 = &inr.s16f[e / 16];
      for (int b = 0; b < cols / 16; ++b) {
        float s = 0;
        for (int j = 0; j < 16; ++j) s += xi[b * 16 + j];
        s16[b] = s;
      }
      inr.sums[i].s16 = s16;
    }
  };
  const q8::Act* act = in.act.data();
  const XSums* sums = in.sums.data();
  // The 32-element types' lane form: the rows again, eight to a tile, interleaved; part p of
  // tile t holds blocks [p nb / kParts, (p + 1) nb / kParts).
  const q8::Lanes32* lanes = nullptr;
  const int tiles = any_lanes ? (n_rows + q8::kLanes - 1) / q8::kLanes : 0;
  const int nb = cols / 32;
  constexpr int kParts = 4;
  const size_t per_tile = (size_t)nb * q8::kLanes;
  if (any_lanes) {
    in.lq.resize(tiles * per_tile * 32);
    in.ld.resize(tiles * per_tile);
    in.lh32.resize(tiles * per_tile);
    in.lsx.resize(tiles * per_tile);
    in.lanes.resize(tiles);
    for (int t = 0; t < tiles; ++t) {
      const size_t o = t * per_tile;
      in.lanes[t] = q8::Lanes32{&in.lq[o * 32], &in.ld[o], &in.lh32[o], &in.lsx[o]};
    }
    lanes = in.lanes.data();
  }
  auto interleave_part = [&](int u) {
    const int t = u / kParts, p = u % kParts;
    const size_t o = t * per_tile;
    q8::interleave_blocks32(act + t * q8::kLanes, std::min(q8::kLanes, n_rows - t * q8::kLanes),
                            p * nb / kParts, (p + 1) * nb / kParts, &inr.lq[o * 32], &inr.ld[o],
                            &inr.lh32[o], &inr.lsx[o]);
  };
  const int total = offset[n_mats];
  // The side spans' lines; output row t fetches its share (SideLines). `lines` is this thread's:
  // the team reaches it through this reference.
  thread_local SideLines side_lines;
  side_lines.reset(side);
  const SideLines& lines = side_lines;
  auto one_row = [&](int t) {
    if (lines.size() > 0) {
      lines.each_of_row(t, total, [](const char* line) {
        asm volatile("prefetcht1 %0" : : "m"(*line));  // as asm: see prefetch_ahead
      });
    }
    int m = 0;
    while (t >= offset[m + 1]) ++m;
    const int r = t - offset[m];
    const uint8_t* row = ws[m]->data + (size_t)r * ws[m]->row_bytes;
    if (n_rows == 1) prefetch_ahead(*ws[m], r);
    float* y = y0[m] + r;
    if (dot8[m] != nullptr) {
      dot8[m](row, act, lanes, n_rows, cols, y, y_stride);
    } else {
      for (int i = 0; i < n_rows; ++i) {
        y[i * y_stride] = dot[m](row, x + (size_t)i * cols, sums[i], cols);
      }
    }
  };
  // One parallel region over the rows of all the matrices: one fork/join instead of n, and each
  // weight row is read from memory once for all the input rows. With several input rows (a
  // batched decode step) the team also prepares them, row by row and then the tiles in parts,
  // instead of the calling thread alone while the others wait.
  const bool team = total >= 64;
  const bool team_prepares = team && n_rows > 1;
  if (!team_prepares) {
    for (int i = 0; i < n_rows; ++i) prepare_row(i);
    for (int u = 0; u < tiles * kParts; ++u) interleave_part(u);
  }
#pragma omp parallel if (team)
  {
    if (team_prepares) {
#pragma omp for schedule(static)
      for (int i = 0; i < n_rows; ++i) prepare_row(i);
#pragma omp for schedule(static)
      for (int u = 0; u < tiles * kParts; ++u) interleave_part(u);
    }
    // nowait: the region's end is the one barrier (a combined `parallel for` has just that one).
    // One input row: each thread streams a contiguous half of the weights (memory-bound, static).
    // Several (compute-bound): guided shares, so that a thread the shared host slows down does not
    // keep the others waiting at the barrier; a row's result does not depend on its thread.
    if (n_rows == 1) {
#pragma omp for schedule(static) nowait
      for (int t = 0; t < total; ++t) one_row(t);
    } else {
#pragma omp for schedule(guided, 16) nowait
      for (int t = 0; t < total; ++t) one_row(t);
    }
  }
}

}  // namespace

void SideLines::reset(const SidePrefetch* side) {
  const int n = side != nullptr ? side->n : 0;
  spans_ = n > 0 ? side->spans : nullptr;
  first_.assign(n + 1, 0);
  for (int k = 0; k < n; ++k) first_[k + 1] = first_[k] + (side->spans[k].bytes + 63) / 64;
}

size_t SideLines::first_span(size_t line) const {
  return (size_t)(std::upper_bound(first_.begin(), first_.end(), line) - first_.begin()) - 1;
}

void qgemv(const QMatrix& w, const float* x, float* y, QgemvPath path) {
  const QMatrix* ws[1] = {&w};
  float* ys[1] = {y};
  qgemv_rows(ws, 1, x, 1, ys, 0, path, nullptr);
}

void qgemv_many(const QMatrix* const* ws, float* const* ys, int n, const float* x, QgemvPath path,
                const SidePrefetch* side) {
  qgemv_rows(ws, n, x, 1, ys, 0, path, side);
}

void qgemv_batch(const QMatrix* const* ws, int n_mats, const float* x, int n_rows, float* y,
                 int y_stride, QgemvPath path, const SidePrefetch* side) {
  CT_ASSERT(n_mats >= 1 && n_mats <= kMaxMany, "qgemv_batch: {} matrices", n_mats);
  float* y0[kMaxMany];
  int off = 0;
  for (int m = 0; m < n_mats; ++m) {
    y0[m] = y + off;
    off += ws[m]->rows;
  }
  CT_ASSERT(off <= y_stride, "qgemv_batch: {} output columns in a stride of {}", off, y_stride);
  qgemv_rows(ws, n_mats, x, n_rows, y0, (size_t)y_stride, path, side);
}

void qgemv_input(GgmlType t, const float* x, int cols, float* x_used, QgemvPath path) {
  const q8::Format f = path == QgemvPath::kF32 ? q8::kNone : q8::format_of(t);
  if (f == q8::kNone) {
    std::memcpy(x_used, x, (size_t)cols * sizeof(float));
    return;
  }
  std::vector<int8_t> q(cols);
  if (f == q8::kBlocks32) {
    std::vector<float> d(cols / 32), sx(cols / 32);
    std::vector<int32_t> h32(cols / 32);
    q8::quantise_blocks32(x, cols, q.data(), d.data(), sx.data(), h32.data());
    for (int c = 0; c < cols; ++c) x_used[c] = d[c / 32] * (float)q[c];
  } else {
    std::vector<float> d(cols / 256);
    std::vector<int16_t> s16(cols / 16);
    q8::quantise_blocks256(x, cols, q.data(), d.data(), s16.data());
    for (int c = 0; c < cols; ++c) x_used[c] = d[c / 256] * (float)q[c];
  }
}

void qgemv_dequant(const QMatrix& w, const float* x, float* y) {
  const GgmlTypeTraits& tt = ggml_traits(w.type);
  CT_ASSERT(w.cols % tt.block_elems == 0, "type {} cols {}", tt.name, w.cols);
#pragma omp parallel for schedule(static) if (w.rows >= 64)
  for (int r = 0; r < w.rows; ++r) {
    y[r] = dot_dequant(tt, w.data + (size_t)r * w.row_bytes, x, w.cols);
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
