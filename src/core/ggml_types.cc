// The GGML type table and the block (de)quantisers behind it. The scalar dequantisers follow the
// formats' definitions (ggml's dequantize_row_*, gguf-py's gguf.quants, checked against the latter
// in tests/unit/ggml_types_test.cc); the AVX2 ones are checked against the scalar ones bit for bit.
// This file is compiled with -ffp-contract=off (CMakeLists.txt) so that a*b - c stays two roundings
// in both the scalar and the vector code, as in the specification; where a fused multiply-add is
// meant (Q4_1, Q5_1) it is written out.
#include "core/ggml_types.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "core/qblock_simd.h"
#define CT_GGML_AVX2 1
#endif

namespace ct {
namespace {

constexpr int64_t kQK = 32;  // elements per block of the legacy types (Q4_0 ... Q8_0)
constexpr int64_t kQKK = kGgmlQK_K;

// Block layouts, identical to ggml's block_* structs (little-endian, packed, fp16 as uint16_t).
// Legacy 4/5-bit blocks: element j (j < 16) is the low nibble of qs[j], element j + 16 its high
// nibble; the 5th bit of element j is bit j of qh.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
// K-quants: 256-element super-blocks of 16 (Q2_K, Q3_K, Q6_K) or 8 (Q4_K, Q5_K) sub-blocks, each
// with a small integer scale (and min) that the fp16 super-block scale d (and dmin) multiplies.
// y = d*sc*q - dmin*m (Q2_K, Q4_K, Q5_K) or y = d*sc*q (Q3_K, Q6_K, signed q).
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];  // low nibble: scale, high nibble: min, per 16 elements
  uint8_t qs[kQKK / 4];       // 2-bit quants: element 128h + 32s + j is bits 2s of qs[32h + j]
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];  // element 32i + j: bit i of hmask[j]; set means no -4 offset
  uint8_t qs[kQKK / 4];     // low 2 bits, laid out as in Q2_K
  uint8_t scales[12];       // 16 6-bit scales (stored +32), see q3_k_scale
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];    // 8 6-bit scales and 8 6-bit mins, see q4_k_scale_min
  uint8_t qs[kQKK / 2];  // element 64c + j: low nibble of qs[32c + j], 64c + 32 + j: high nibble
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];  // element 32i + j: bit i of qh[j] is the 5th bit
  uint8_t qs[kQKK / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];  // low 4 bits, see dequant_q6_k_ref
  uint8_t qh[kQKK / 4];  // high 2 bits
  int8_t scales[kQKK / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

// Blocks are read through memcpy: GGUF only aligns tensor starts, and blocks are 18..210 bytes.
template <typename Block>
Block load_block(const void* src, int64_t ib) {
  Block b;
  std::memcpy(&b, static_cast<const uint8_t*>(src) + ib * sizeof(Block), sizeof(Block));
  return b;
}

template <typename Block>
void store_block(void* dst, int64_t ib, const Block& b) {
  std::memcpy(static_cast<uint8_t*>(dst) + ib * sizeof(Block), &b, sizeof(Block));
}

inline int nearest_int(float x) { return (int)std::lround(x); }

inline void q4_k_pack_scales(const int* sc, const int* m, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
    s[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
  }
}

// Sub-block i (< 16) of a Q3_K super-block: low 4 bits from byte i (i < 8) or the high nibble of
// byte i - 8, top 2 bits from byte 8 + i % 4 at bit 2 * (i / 4); stored with an offset of 32.
inline int q3_k_scale(const uint8_t* s, int i) {
  const int lo = i < 8 ? (s[i] & 0x0f) : (s[i - 8] >> 4);
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// --- reference dequantisers -------------------------------------------------------------------

void f32_to_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, (size_t)n * 4); }

void f16_to_f32_ref(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    dst[i] = fp16_to_f32(h);
  }
}

void bf16_to_f32_ref(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    dst[i] = bf16_to_f32(h);
  }
}

void dequant_q4_0_ref(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ4_0>(src, ib);
    const float d = fp16_to_f32(b.d);
    float* y = dst + ib * kQK;
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = (float)((b.qs[j] & 0x0f) - 8) * d;
      y[j + kQK / 2] = (float)((b.qs[j] >> 4) - 8) * d;
    }
  }
}

// ggml writes q*d + m and leaves fusing to the compiler's contraction setting. We fix it to one
// fused multiply-add so that the AVX2 path matches bit for bit; the two choices differ by at most
// half an ulp of q*d (gguf-py rounds twice; the fixture test allows for that).
void dequant_q4_1_ref(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ4_1>(src, ib);
    const float d = fp16_to_f32(b.d);
    const float m = fp16_to_f32(b.m);
    float* y = dst + ib * kQK;
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = std::fma((float)(b.qs[j] & 0x0f), d, m);
      y[j + kQK / 2] = std::fma((float)(b.qs[j] >> 4), d, m);
    }
  }
}

void dequant_q5_0_ref(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ5_0>(src, ib);
    const float d = fp16_to_f32(b.d);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    float* y = dst + ib * kQK;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (b.qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
      const int q1 = (b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = (float)(q0 - 16) * d;
      y[j + kQK / 2] = (float)(q1 - 16) * d;
    }
  }
}

void dequant_q5_1_ref(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ5_1>(src, ib);
    const float d = fp16_to_f32(b.d);
    const float m = fp16_to_f32(b.m);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    float* y = dst + ib * kQK;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (b.qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
      const int q1 = (b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = std::fma((float)q0, d, m);  // fused, as in Q4_1
      y[j + kQK / 2] = std::fma((float)q1, d, m);
    }
  }
}

void dequant_q8_0_ref(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ8_0>(src, ib);
    const float d = fp16_to_f32(b.d);
    float* y = dst + ib * kQK;
    for (int j = 0; j < kQK; ++j) y[j] = (float)b.qs[j] * d;
  }
}

void dequant_q2_k_ref(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ2_K>(src, ib);
    const float d = fp16_to_f32(b.d);
    const float dmin = fp16_to_f32(b.dmin);
    float* y = dst + ib * kQKK;
    for (int e = 0; e < kQKK; ++e) {
      const int h = e / 128, s = (e / 32) % 4, j = e % 32;
      const int q = (b.qs[32 * h + j] >> (2 * s)) & 3;
      const uint8_t sc = b.scales[e / 16];
      const float dl = d * (float)(sc & 0x0f);
      const float ml = dmin * (float)(sc >> 4);
      y[e] = dl * (float)q - ml;
    }
  }
}

void dequant_q3_k_ref(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ3_K>(src, ib);
    const float d = fp16_to_f32(b.d);
    float* y = dst + ib * kQKK;
    for (int e = 0; e < kQKK; ++e) {
      const int h = e / 128, s = (e / 32) % 4, j = e % 32;
      const int lo = (b.qs[32 * h + j] >> (2 * s)) & 3;
      const int hbit = (b.hmask[j] >> (e / 32)) & 1;
      const float dl = d * (float)q3_k_scale(b.scales, e / 16);
      y[e] = dl * (float)(lo - (hbit ? 0 : 4));
    }
  }
}

void dequant_q4_k_ref(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ4_K>(src, ib);
    const float d = fp16_to_f32(b.d);
    const float dmin = fp16_to_f32(b.dmin);
    float* y = dst + ib * kQKK;
    for (int e = 0; e < kQKK; ++e) {
      const int c = e / 64, hi = (e / 32) % 2, j = e % 32;
      const int q = (b.qs[32 * c + j] >> (4 * hi)) & 0x0f;
      int sc, m;
      q4_k_scale_min(b.scales, e / 32, sc, m);
      const float dl = d * (float)sc;
      const float ml = dmin * (float)m;
      y[e] = dl * (float)q - ml;
    }
  }
}

void dequant_q5_k_ref(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ5_K>(src, ib);
    const float d = fp16_to_f32(b.d);
    const float dmin = fp16_to_f32(b.dmin);
    float* y = dst + ib * kQKK;
    for (int e = 0; e < kQKK; ++e) {
      const int c = e / 64, hi = (e / 32) % 2, j = e % 32;
      const int q = ((b.qs[32 * c + j] >> (4 * hi)) & 0x0f) | (((b.qh[j] >> (e / 32)) & 1) << 4);
      int sc, m;
      q4_k_scale_min(b.scales, e / 32, sc, m);
      const float dl = d * (float)sc;
      const float ml = dmin * (float)m;
      y[e] = dl * (float)q - ml;
    }
  }
}

// Element 128h + r (r < 128): low 4 bits from ql[64h + r % 64] at bit 4 * (r / 64), high 2 bits
// from qh[32h + r % 32] at bit 2 * (r / 32); q - 32 times d * scales[e / 16].
void dequant_q6_k_ref(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ6_K>(src, ib);
    const float d = fp16_to_f32(b.d);
    float* y = dst + ib * kQKK;
    for (int e = 0; e < kQKK; ++e) {
      const int h = e / 128, r = e % 128;
      const int lo = (b.ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
      const int hi = (b.qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
      const float dl = d * (float)b.scales[e / 16];
      y[e] = dl * (float)((lo | (hi << 4)) - 32);
    }
  }
}

// --- AVX2 dequantisers ------------------------------------------------------------------------

#ifdef CT_GGML_AVX2
// 16 bytes of packed nibbles -> elements 0..15 (low nibbles) and 16..31 (high nibbles) as int32
// vectors of 8, in element order.
inline void unpack_nibbles(const uint8_t* qs, __m256i out[4]) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  out[0] = _mm256_cvtepu8_epi32(lo);
  out[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8));
  out[2] = _mm256_cvtepu8_epi32(hi);
  out[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8));
}

// Low 8 bytes of b (unsigned) -> 8 floats.
inline __m256 u8x8_to_ps(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); }

void dequant_q4_0_avx2(const void* src, float* dst, int64_t nb) {
  const __m256i eight = _mm256_set1_epi32(8);
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto* b = static_cast<const uint8_t*>(src) + ib * sizeof(BlockQ4_0);
    const __m256 d = _mm256_set1_ps(simd::half(b));
    __m256i q[4];
    unpack_nibbles(b + 2, q);
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(q[k], eight));
      _mm256_storeu_ps(dst + ib * kQK + 8 * k, _mm256_mul_ps(v, d));
    }
  }
}

void dequant_q4_1_avx2(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto* b = static_cast<const uint8_t*>(src) + ib * sizeof(BlockQ4_1);
    const __m256 d = _mm256_set1_ps(simd::half(b));
    const __m256 m = _mm256_set1_ps(simd::half(b + 2));
    __m256i q[4];
    unpack_nibbles(b + 4, q);
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_ps(dst + ib * kQK + 8 * k, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[k]), d, m));
    }
  }
}

void dequant_q5_0_avx2(const void* src, float* dst, int64_t nb) {
  const __m256i sixteen = _mm256_set1_epi32(16);
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto* b = static_cast<const uint8_t*>(src) + ib * sizeof(BlockQ5_0);
    const __m256 d = _mm256_set1_ps(simd::half(b));
    const __m256i q =
        _mm256_or_si256(simd::nibbles32(b + 6), simd::q5_high_bits(b + 2));  // 32 bytes 0..31
    alignas(32) uint8_t qb[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(qb), q);
    for (int k = 0; k < 4; ++k) {
      const __m128i b8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qb + 8 * k));
      const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(b8), sixteen));
      _mm256_storeu_ps(dst + ib * kQK + 8 * k, _mm256_mul_ps(v, d));
    }
  }
}

void dequant_q8_0_avx2(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto* b = static_cast<const uint8_t*>(src) + ib * sizeof(BlockQ8_0);
    const __m256 d = _mm256_set1_ps(simd::half(b));
    for (int k = 0; k < 4; ++k) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * k));
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
      _mm256_storeu_ps(dst + ib * kQK + 8 * k, _mm256_mul_ps(v, d));
    }
  }
}

// 32 unsigned quants in qb (bytes) -> y[32] = dl*q - ml, two roundings like the reference.
inline void store_sub32(const uint8_t* qb, float dl, float ml, float* y) {
  const __m256 vd = _mm256_set1_ps(dl), vm = _mm256_set1_ps(ml);
  for (int k = 0; k < 4; ++k) {
    const __m256 v = u8x8_to_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qb + 8 * k)));
    _mm256_storeu_ps(y + 8 * k, _mm256_sub_ps(_mm256_mul_ps(v, vd), vm));
  }
}

void dequant_q4_k_avx2(const void* src, float* dst, int64_t nb) {
  const __m256i mask = _mm256_set1_epi8(0x0f);
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ4_K>(src, ib);
    const float d = _cvtsh_ss(b.d), dmin = _cvtsh_ss(b.dmin);
    float* y = dst + ib * kQKK;
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * c));
      alignas(32) uint8_t qb[64];
      _mm256_store_si256(reinterpret_cast<__m256i*>(qb), _mm256_and_si256(raw, mask));
      _mm256_store_si256(reinterpret_cast<__m256i*>(qb + 32),
                         _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask));
      for (int hi = 0; hi < 2; ++hi) {
        int sc, m;
        q4_k_scale_min(b.scales, 2 * c + hi, sc, m);
        store_sub32(qb + 32 * hi, d * (float)sc, dmin * (float)m, y + 64 * c + 32 * hi);
      }
    }
  }
}

void dequant_q5_k_avx2(const void* src, float* dst, int64_t nb) {
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i one = _mm256_set1_epi8(1);
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ5_K>(src, ib);
    const float d = _cvtsh_ss(b.d), dmin = _cvtsh_ss(b.dmin);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
    float* y = dst + ib * kQKK;
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * c));
      const __m256i nib[2] = {_mm256_and_si256(raw, mask),
                              _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask)};
      for (int hi = 0; hi < 2; ++hi) {
        const int s = 2 * c + hi;
        // Bit s of every qh byte, moved to bit 4; the 16-bit shifts cannot carry between bytes
        // once masked to one bit.
        const __m256i h5 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, s), one), 4);
        alignas(32) uint8_t qb[32];
        _mm256_store_si256(reinterpret_cast<__m256i*>(qb), _mm256_or_si256(nib[hi], h5));
        int sc, m;
        q4_k_scale_min(b.scales, s, sc, m);
        store_sub32(qb, d * (float)sc, dmin * (float)m, y + 32 * s);
      }
    }
  }
}

void dequant_q6_k_avx2(const void* src, float* dst, int64_t nb) {
  const __m256i mask4 = _mm256_set1_epi8(0x0f), mask2 = _mm256_set1_epi8(3);
  const __m256i off = _mm256_set1_epi32(32);
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ6_K>(src, ib);
    const float d = _cvtsh_ss(b.d);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
      // Quarter k of the half: elements 128h + 32k + l, l < 32.
      const __m256i lo[4] = {_mm256_and_si256(ql0, mask4), _mm256_and_si256(ql1, mask4),
                             _mm256_and_si256(_mm256_srli_epi16(ql0, 4), mask4),
                             _mm256_and_si256(_mm256_srli_epi16(ql1, 4), mask4)};
      for (int k = 0; k < 4; ++k) {
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), mask2);
        alignas(32) uint8_t qb[32];
        _mm256_store_si256(reinterpret_cast<__m256i*>(qb),
                           _mm256_or_si256(lo[k], _mm256_slli_epi16(hi, 4)));
        float* y = dst + ib * kQKK + 128 * h + 32 * k;
        for (int g = 0; g < 4; ++g) {
          const __m256 dl = _mm256_set1_ps(d * (float)b.scales[8 * h + 2 * k + g / 2]);
          const __m128i b8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qb + 8 * g));
          const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(b8), off));
          _mm256_storeu_ps(y + 8 * g, _mm256_mul_ps(dl, v));
        }
      }
    }
  }
}

void f16_to_f32_f16c(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  f16_to_f32_ref(p + 2 * i, dst + i, n - i);
}
#endif  // CT_GGML_AVX2

// --- encoders ---------------------------------------------------------------------------------

void f32_from_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, (size_t)n * 4); }

void f16_from_f32(const float* src, void* dst, int64_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_fp16(src[i]);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

void bf16_from_f32(const float* src, void* dst, int64_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_bf16(src[i]);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

// The element of largest magnitude (the first one on ties), with its sign.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void quant_q4_0(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const float* xb = x + ib * kQK;
    // The scale takes the sign of the element with the largest magnitude so that it maps to -8,
    // using the full asymmetric range [-8, 7].
    const float d = signed_absmax(xb, kQK) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_0 b;
    b.d = f32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      // Truncation after +8.5 rounds to nearest; the argument lies in [0.5, 16.5].
      const int q0 = std::min(15, (int)(xb[j] * id + 8.5f));
      const int q1 = std::min(15, (int)(xb[j + kQK / 2] * id + 8.5f));
      b.qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
    store_block(dst, ib, b);
  }
}

void block_min_max(const float* x, int n, float& min, float& max) {
  min = FLT_MAX;
  max = -FLT_MAX;
  for (int j = 0; j < n; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
}

void quant_q4_1(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const float* xb = x + ib * kQK;
    float min, max;
    block_min_max(xb, kQK, min, max);
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_1 b;
    b.d = f32_to_fp16(d);
    b.m = f32_to_fp16(min);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, (int)((xb[j] - min) * id + 0.5f));
      const int q1 = std::min(15, (int)((xb[j + kQK / 2] - min) * id + 0.5f));
      b.qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
    store_block(dst, ib, b);
  }
}

// Q5_0: like Q4_0 with the range [-16, 15].
void quant_q5_0(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const float* xb = x + ib * kQK;
    const float d = signed_absmax(xb, kQK) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ5_0 b;
    b.d = f32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(31, (int)(xb[j] * id + 16.5f));
      const int q1 = std::min(31, (int)(xb[j + kQK / 2] * id + 16.5f));
      b.qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      qh |= (uint32_t)(q0 >> 4) << j;
      qh |= (uint32_t)(q1 >> 4) << (j + kQK / 2);
    }
    std::memcpy(b.qh, &qh, 4);
    store_block(dst, ib, b);
  }
}

void quant_q5_1(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const float* xb = x + ib * kQK;
    float min, max;
    block_min_max(xb, kQK, min, max);
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ5_1 b;
    b.d = f32_to_fp16(d);
    b.m = f32_to_fp16(min);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(31, (int)((xb[j] - min) * id + 0.5f));
      const int q1 = std::min(31, (int)((xb[j + kQK / 2] - min) * id + 0.5f));
      b.qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      qh |= (uint32_t)(q0 >> 4) << j;
      qh |= (uint32_t)(q1 >> 4) << (j + kQK / 2);
    }
    std::memcpy(b.qh, &qh, 4);
    store_block(dst, ib, b);
  }
}

void quant_q8_0(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const float* xb = x + ib * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    // Where 1 / d overflows (amax below about 3.7e-37) the F16 scale is 0 and every element
    // decodes to 0 whatever its quant; the quants are then 0 (gguf-py, dividing by d, writes
    // others), not the undefined conversion of an infinity.
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (!std::isfinite(id)) id = 0.0f;
    BlockQ8_0 b;
    b.d = f32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) b.qs[j] = (int8_t)std::round(xb[j] * id);
    store_block(dst, ib, b);
  }
}

// K-quant encoders. Plain and predictable rather than ggml's iterative scale search: each
// sub-block's scale (and min) comes from its range, the super-block scale from the largest of
// those, and the quants are rounded against the scales as they will be decoded (fp16 super-block
// scale times the integer sub-block scale), so the only error is the rounding itself.

// Asymmetric (scale, min) per sub-block of n_sub elements with q in [0, qmax], the integer scale
// and min in [0, smax]. Writes d, dmin, the integer scales and mins and q per element.
void quant_k_asym(const float* x, int n_sub_blocks, int n_sub, int qmax, int smax, uint16_t& d16,
                  uint16_t& dmin16, int* sc, int* m, uint8_t* q) {
  float scale[16], minv[16];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < n_sub_blocks; ++s) {
    float mn, mx;
    block_min_max(x + s * n_sub, n_sub, mn, mx);
    mn = std::min(mn, 0.0f);  // the stored min is subtracted and non-negative
    scale[s] = (mx - mn) / (float)qmax;
    minv[s] = -mn;
    max_scale = std::max(max_scale, scale[s]);
    max_min = std::max(max_min, minv[s]);
  }
  d16 = f32_to_fp16(max_scale / (float)smax);
  dmin16 = f32_to_fp16(max_min / (float)smax);
  const float d = fp16_to_f32(d16), dmin = fp16_to_f32(dmin16);
  for (int s = 0; s < n_sub_blocks; ++s) {
    // Round the min up so that x + ml >= 0 stays true after rounding.
    sc[s] = d > 0.0f ? std::clamp(nearest_int(scale[s] / d), 0, smax) : 0;
    m[s] = dmin > 0.0f ? std::clamp((int)std::ceil(minv[s] / dmin), 0, smax) : 0;
    const float dl = d * (float)sc[s], ml = dmin * (float)m[s];
    for (int j = 0; j < n_sub; ++j) {
      const float v = x[s * n_sub + j];
      q[s * n_sub + j] = (uint8_t)(dl > 0.0f ? std::clamp(nearest_int((v + ml) / dl), 0, qmax) : 0);
    }
  }
}

// Symmetric signed scale per sub-block of n_sub elements with q in [-qneg, qneg - 1] and the
// integer scale in [-sneg, sneg - 1]; the element of largest magnitude maps to -qneg.
void quant_k_sym(const float* x, int n_sub_blocks, int n_sub, int qneg, int sneg, uint16_t& d16,
                 int* sc, int* q) {
  float scale[16];
  float amax_scale = 0.0f, max_scale = 0.0f;
  for (int s = 0; s < n_sub_blocks; ++s) {
    scale[s] = signed_absmax(x + s * n_sub, n_sub) / -(float)qneg;
    if (std::fabs(scale[s]) > amax_scale) {
      amax_scale = std::fabs(scale[s]);
      max_scale = scale[s];
    }
  }
  d16 = f32_to_fp16(max_scale / -(float)sneg);
  const float d = fp16_to_f32(d16);
  for (int s = 0; s < n_sub_blocks; ++s) {
    sc[s] = d != 0.0f ? std::clamp(nearest_int(scale[s] / d), -sneg, sneg - 1) : 0;
    const float dl = d * (float)sc[s];
    for (int j = 0; j < n_sub; ++j) {
      const float v = x[s * n_sub + j];
      q[s * n_sub + j] = dl != 0.0f ? std::clamp(nearest_int(v / dl), -qneg, qneg - 1) : 0;
    }
  }
}

void quant_q2_k(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    BlockQ2_K b{};
    int sc[16], m[16];
    uint8_t q[kQKK];
    quant_k_asym(x + ib * kQKK, 16, 16, 3, 15, b.d, b.dmin, sc, m, q);
    for (int s = 0; s < 16; ++s) b.scales[s] = (uint8_t)(sc[s] | (m[s] << 4));
    for (int e = 0; e < kQKK; ++e) {
      b.qs[32 * (e / 128) + e % 32] |= (uint8_t)(q[e] << (2 * ((e / 32) % 4)));
    }
    store_block(dst, ib, b);
  }
}

void quant_q3_k(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    BlockQ3_K b{};
    int sc[16], q[kQKK];
    quant_k_sym(x + ib * kQKK, 16, 16, 4, 32, b.d, sc, q);
    for (int i = 0; i < 16; ++i) {
      const int v = sc[i] + 32;  // 0..63
      b.scales[i % 8] |= (uint8_t)((v & 0x0f) << (i < 8 ? 0 : 4));
      b.scales[8 + i % 4] |= (uint8_t)((v >> 4) << (2 * (i / 4)));
    }
    for (int e = 0; e < kQKK; ++e) {
      const int v = q[e] + 4;  // 0..7: low 2 bits in qs, bit 2 in hmask
      b.qs[32 * (e / 128) + e % 32] |= (uint8_t)((v & 3) << (2 * ((e / 32) % 4)));
      b.hmask[e % 32] |= (uint8_t)((v >> 2) << (e / 32));
    }
    store_block(dst, ib, b);
  }
}

void quant_q4_k(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    BlockQ4_K b{};
    int sc[8], m[8];
    uint8_t q[kQKK];
    quant_k_asym(x + ib * kQKK, 8, 32, 15, 63, b.d, b.dmin, sc, m, q);
    q4_k_pack_scales(sc, m, b.scales);
    for (int e = 0; e < kQKK; ++e) {
      b.qs[32 * (e / 64) + e % 32] |= (uint8_t)(q[e] << (4 * ((e / 32) % 2)));
    }
    store_block(dst, ib, b);
  }
}

void quant_q5_k(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    BlockQ5_K b{};
    int sc[8], m[8];
    uint8_t q[kQKK];
    quant_k_asym(x + ib * kQKK, 8, 32, 31, 63, b.d, b.dmin, sc, m, q);
    q4_k_pack_scales(sc, m, b.scales);
    for (int e = 0; e < kQKK; ++e) {
      b.qs[32 * (e / 64) + e % 32] |= (uint8_t)((q[e] & 0x0f) << (4 * ((e / 32) % 2)));
      b.qh[e % 32] |= (uint8_t)((q[e] >> 4) << (e / 32));
    }
    store_block(dst, ib, b);
  }
}

void quant_q6_k(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    BlockQ6_K b{};
    int sc[16], q[kQKK];
    quant_k_sym(x + ib * kQKK, 16, 16, 32, 128, b.d, sc, q);
    for (int s = 0; s < 16; ++s) b.scales[s] = (int8_t)sc[s];
    for (int e = 0; e < kQKK; ++e) {
      const int v = q[e] + 32, h = e / 128, r = e % 128;
      b.ql[64 * h + r % 64] |= (uint8_t)((v & 0x0f) << (4 * (r / 64)));
      b.qh[32 * h + r % 32] |= (uint8_t)((v >> 4) << (2 * (r / 32)));
    }
    store_block(dst, ib, b);
  }
}

// --- the table ----------------------------------------------------------------------------------

#ifdef CT_GGML_AVX2
#define CT_FAST(avx2, ref) avx2
#else
#define CT_FAST(avx2, ref) ref
#endif

constexpr GgmlTypeTraits kTraits[] = {
    {GgmlType::F32, "f32", 1, 4, f32_to_f32, f32_to_f32, f32_from_f32},
    {GgmlType::F16, "f16", 1, 2, f16_to_f32_ref, CT_FAST(f16_to_f32_f16c, f16_to_f32_ref),
     f16_from_f32},
    {GgmlType::BF16, "bf16", 1, 2, bf16_to_f32_ref, bf16_to_f32_ref, bf16_from_f32},
    {GgmlType::Q4_0, "q4_0", kQK, sizeof(BlockQ4_0), dequant_q4_0_ref,
     CT_FAST(dequant_q4_0_avx2, dequant_q4_0_ref), quant_q4_0},
    {GgmlType::Q4_1, "q4_1", kQK, sizeof(BlockQ4_1), dequant_q4_1_ref,
     CT_FAST(dequant_q4_1_avx2, dequant_q4_1_ref), quant_q4_1},
    {GgmlType::Q5_0, "q5_0", kQK, sizeof(BlockQ5_0), dequant_q5_0_ref,
     CT_FAST(dequant_q5_0_avx2, dequant_q5_0_ref), quant_q5_0},
    {GgmlType::Q5_1, "q5_1", kQK, sizeof(BlockQ5_1), dequant_q5_1_ref, dequant_q5_1_ref,
     quant_q5_1},
    {GgmlType::Q8_0, "q8_0", kQK, sizeof(BlockQ8_0), dequant_q8_0_ref,
     CT_FAST(dequant_q8_0_avx2, dequant_q8_0_ref), quant_q8_0},
    {GgmlType::Q2_K, "q2_K", kQKK, sizeof(BlockQ2_K), dequant_q2_k_ref, dequant_q2_k_ref,
     quant_q2_k},
    {GgmlType::Q3_K, "q3_K", kQKK, sizeof(BlockQ3_K), dequant_q3_k_ref, dequant_q3_k_ref,
     quant_q3_k},
    {GgmlType::Q4_K, "q4_K", kQKK, sizeof(BlockQ4_K), dequant_q4_k_ref,
     CT_FAST(dequant_q4_k_avx2, dequant_q4_k_ref), quant_q4_k},
    {GgmlType::Q5_K, "q5_K", kQKK, sizeof(BlockQ5_K), dequant_q5_k_ref,
     CT_FAST(dequant_q5_k_avx2, dequant_q5_k_ref), quant_q5_k},
    {GgmlType::Q6_K, "q6_K", kQKK, sizeof(BlockQ6_K), dequant_q6_k_ref,
     CT_FAST(dequant_q6_k_avx2, dequant_q6_k_ref), quant_q6_k},
};

// Names of the types GGUF files may carry that we cannot read.
constexpr std::pair<GgmlType, const char*> kOtherNames[] = {
    {GgmlType::Q8_1, "q8_1"}, {GgmlType::Q8_K, "q8_K"}, {GgmlType::I8, "i8"},
    {GgmlType::I16, "i16"},   {GgmlType::I32, "i32"},   {GgmlType::I64, "i64"},
    {GgmlType::F64, "f64"},
};

void check_multiple(const GgmlTypeTraits& tt, int64_t n) {
  CT_THROW_IF_NOT(n >= 0 && n % tt.block_elems == 0,
                  "element count {} is not a multiple of the {} block size {}", n, tt.name,
                  tt.block_elems);
}

}  // namespace

const GgmlTypeTraits* ggml_type_traits(GgmlType t) {
  for (const GgmlTypeTraits& tt : kTraits) {
    if (tt.type == t) return &tt;
  }
  return nullptr;
}

std::string ggml_supported_type_names() {
  std::string s;
  for (const GgmlTypeTraits& tt : kTraits) s += (s.empty() ? "" : ", ") + std::string(tt.name);
  return s;
}

const GgmlTypeTraits& ggml_traits(GgmlType t) {
  const GgmlTypeTraits* tt = ggml_type_traits(t);
  CT_THROW_IF_NOT(tt != nullptr, "ggml type {} is not supported (supported: {})", ggml_type_name(t),
                  ggml_supported_type_names());
  return *tt;
}

std::string ggml_type_name(GgmlType t) {
  if (const GgmlTypeTraits* tt = ggml_type_traits(t)) return tt->name;
  for (const auto& [type, name] : kOtherNames) {
    if (type == t) return name;
  }
  return fmt::format("unknown({})", static_cast<uint32_t>(t));
}

bool ggml_type_supported(GgmlType t) { return ggml_type_traits(t) != nullptr; }

int64_t ggml_block_elems(GgmlType t) { return ggml_traits(t).block_elems; }

size_t ggml_block_bytes(GgmlType t) { return ggml_traits(t).block_bytes; }

size_t ggml_row_bytes(GgmlType t, int64_t n) {
  const GgmlTypeTraits& tt = ggml_traits(t);
  check_multiple(tt, n);
  return (size_t)(n / tt.block_elems) * tt.block_bytes;
}

void ggml_to_f32_ref(GgmlType t, const void* src, float* dst, int64_t n) {
  const GgmlTypeTraits& tt = ggml_traits(t);
  check_multiple(tt, n);
  tt.to_f32_ref(src, dst, n / tt.block_elems);
}

void ggml_to_f32(GgmlType t, const void* src, float* dst, int64_t n) {
  const GgmlTypeTraits& tt = ggml_traits(t);
  check_multiple(tt, n);
  tt.to_f32(src, dst, n / tt.block_elems);
}

void ggml_from_f32(GgmlType t, const float* src, void* dst, int64_t n) {
  const GgmlTypeTraits& tt = ggml_traits(t);
  check_multiple(tt, n);
  CT_THROW_IF_NOT(tt.from_f32 != nullptr, "ggml type {} has no encoder", tt.name);
  tt.from_f32(src, dst, n / tt.block_elems);
}

}  // namespace ct
