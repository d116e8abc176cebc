// GGML type table and the float conversions for the types the engine reads: F32, F16, BF16,
// Q4_0, Q4_1 and Q8_0. The scalar code follows ggml's reference (de)quantisers bit for bit; the
// AVX2 dequantisers are checked against it in tests/unit/ggml_types_test.cc.
#include "core/ggml_types.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CT_GGML_AVX2 1
#endif

namespace ct {
namespace {

constexpr int64_t kQK = 32;  // elements per block of every quantised type handled here

// Block layouts, identical to ggml's block_q4_0 / block_q4_1 / block_q8_0 (little-endian, packed).
// Element j (j < 16) of a Q4 block sits in the low nibble of qs[j], element j + 16 in its high one.
struct BlockQ4_0 {
  uint16_t d;  // fp16 scale
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 minimum
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34);

void check_supported(GgmlType t) {
  CT_THROW_IF_NOT(ggml_type_supported(t),
                  "ggml type {} is not supported (supported: f32, f16, bf16, q4_0, q4_1, q8_0)",
                  ggml_type_name(t));
}

void check_multiple(GgmlType t, int64_t n) {
  const int64_t be = ggml_block_elems(t);
  CT_THROW_IF_NOT(n >= 0 && n % be == 0,
                  "element count {} is not a multiple of the {} block size {}", n,
                  ggml_type_name(t), be);
}

// Blocks are read through memcpy so that unaligned mappings (GGUF only aligns tensor starts, and
// a Q4_1 block is 20 bytes) never rely on aligned loads.
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

// --- reference dequantisers -------------------------------------------------------------------

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

// ggml writes q*d + m; whether that becomes one fused operation depends on the compiler's
// contraction setting. We fix it to a fused multiply-add so that the AVX2 path (which uses FMA)
// matches the reference bit for bit; the two choices differ by at most half an ulp.
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

void dequant_q8_0_ref(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto b = load_block<BlockQ8_0>(src, ib);
    const float d = fp16_to_f32(b.d);
    float* y = dst + ib * kQK;
    for (int j = 0; j < kQK; ++j) y[j] = (float)b.qs[j] * d;
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

void dequant_q4_0_avx2(const void* src, float* dst, int64_t nb) {
  const __m256i eight = _mm256_set1_epi32(8);
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto* b = static_cast<const uint8_t*>(src) + ib * sizeof(BlockQ4_0);
    uint16_t dh;
    std::memcpy(&dh, b, 2);
    const __m256 d = _mm256_set1_ps(fp16_to_f32(dh));
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
    uint16_t dh, mh;
    std::memcpy(&dh, b, 2);
    std::memcpy(&mh, b + 2, 2);
    const __m256 d = _mm256_set1_ps(fp16_to_f32(dh));
    const __m256 m = _mm256_set1_ps(fp16_to_f32(mh));
    __m256i q[4];
    unpack_nibbles(b + 4, q);
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_ps(dst + ib * kQK + 8 * k, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[k]), d, m));
    }
  }
}

void dequant_q8_0_avx2(const void* src, float* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const auto* b = static_cast<const uint8_t*>(src) + ib * sizeof(BlockQ8_0);
    uint16_t dh;
    std::memcpy(&dh, b, 2);
    const __m256 d = _mm256_set1_ps(fp16_to_f32(dh));
    for (int k = 0; k < 4; ++k) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * k));
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
      _mm256_storeu_ps(dst + ib * kQK + 8 * k, _mm256_mul_ps(v, d));
    }
  }
}
#endif  // CT_GGML_AVX2

// --- reference quantisers (ggml's quantize_row_*_ref) -----------------------------------------

void quant_q4_0(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const float* xb = x + ib * kQK;
    // The scale takes the sign of the element with the largest magnitude so that it maps to -8,
    // using the full asymmetric range [-8, 7].
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(xb[j])) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
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

void quant_q4_1(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const float* xb = x + ib * kQK;
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      min = std::min(min, xb[j]);
      max = std::max(max, xb[j]);
    }
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

void quant_q8_0(const float* x, void* dst, int64_t nb) {
  for (int64_t ib = 0; ib < nb; ++ib) {
    const float* xb = x + ib * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 b;
    b.d = f32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) b.qs[j] = (int8_t)std::round(xb[j] * id);
    store_block(dst, ib, b);
  }
}

}  // namespace

std::string ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return "f32";
    case GgmlType::F16:
      return "f16";
    case GgmlType::Q4_0:
      return "q4_0";
    case GgmlType::Q4_1:
      return "q4_1";
    case GgmlType::Q5_0:
      return "q5_0";
    case GgmlType::Q5_1:
      return "q5_1";
    case GgmlType::Q8_0:
      return "q8_0";
    case GgmlType::Q8_1:
      return "q8_1";
    case GgmlType::Q2_K:
      return "q2_K";
    case GgmlType::Q3_K:
      return "q3_K";
    case GgmlType::Q4_K:
      return "q4_K";
    case GgmlType::Q5_K:
      return "q5_K";
    case GgmlType::Q6_K:
      return "q6_K";
    case GgmlType::Q8_K:
      return "q8_K";
    case GgmlType::I8:
      return "i8";
    case GgmlType::I16:
      return "i16";
    case GgmlType::I32:
      return "i32";
    case GgmlType::I64:
      return "i64";
    case GgmlType::F64:
      return "f64";
    case GgmlType::BF16:
      return "bf16";
  }
  return fmt::format("unknown({})", static_cast<uint32_t>(t));
}

bool ggml_type_supported(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q8_0:
      return true;
    default:
      return false;
  }
}

int64_t ggml_block_elems(GgmlType t) {
  check_supported(t);
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q8_0:
      return kQK;
    default:
      return 1;
  }
}

size_t ggml_block_bytes(GgmlType t) {
  check_supported(t);
  switch (t) {
    case GgmlType::F32:
      return 4;
    case GgmlType::F16:
    case GgmlType::BF16:
      return 2;
    case GgmlType::Q4_0:
      return sizeof(BlockQ4_0);
    case GgmlType::Q4_1:
      return sizeof(BlockQ4_1);
    case GgmlType::Q8_0:
      return sizeof(BlockQ8_0);
    default:
      break;
  }
  CT_ASSERT(false, "ggml_block_bytes: supported type {} without a size", ggml_type_name(t));
  return 0;
}

size_t ggml_row_bytes(GgmlType t, int64_t n) {
  check_multiple(t, n);
  return (size_t)(n / ggml_block_elems(t)) * ggml_block_bytes(t);
}

void ggml_to_f32_ref(GgmlType t, const void* src, float* dst, int64_t n) {
  check_multiple(t, n);
  switch (t) {
    case GgmlType::F32:
      std::memcpy(dst, src, (size_t)n * 4);
      return;
    case GgmlType::F16:
    case GgmlType::BF16: {
      const auto* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = t == GgmlType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    }
    case GgmlType::Q4_0:
      dequant_q4_0_ref(src, dst, n / kQK);
      return;
    case GgmlType::Q4_1:
      dequant_q4_1_ref(src, dst, n / kQK);
      return;
    case GgmlType::Q8_0:
      dequant_q8_0_ref(src, dst, n / kQK);
      return;
    default:
      break;
  }
  CT_ASSERT(false, "ggml_to_f32: supported type {} without a converter", ggml_type_name(t));
}

void ggml_to_f32(GgmlType t, const void* src, float* dst, int64_t n) {
#ifdef CT_GGML_AVX2
  switch (t) {
    case GgmlType::Q4_0:
      check_multiple(t, n);
      dequant_q4_0_avx2(src, dst, n / kQK);
      return;
    case GgmlType::Q4_1:
      check_multiple(t, n);
      dequant_q4_1_avx2(src, dst, n / kQK);
      return;
    case GgmlType::Q8_0:
      check_multiple(t, n);
      dequant_q8_0_avx2(src, dst, n / kQK);
      return;
    default:
      break;
  }
#endif
  ggml_to_f32_ref(t, src, dst, n);
}

void ggml_from_f32(GgmlType t, const float* src, void* dst, int64_t n) {
  check_multiple(t, n);
  switch (t) {
    case GgmlType::F32:
      std::memcpy(dst, src, (size_t)n * 4);
      return;
    case GgmlType::F16:
    case GgmlType::BF16: {
      auto* p = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = t == GgmlType::F16 ? f32_to_fp16(src[i]) : f32_to_bf16(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      return;
    }
    case GgmlType::Q4_0:
      quant_q4_0(src, dst, n / kQK);
      return;
    case GgmlType::Q4_1:
      quant_q4_1(src, dst, n / kQK);
      return;
    case GgmlType::Q8_0:
      quant_q8_0(src, dst, n / kQK);
      return;
    default:
      break;
  }
  CT_ASSERT(false, "ggml_from_f32: supported type {} without a converter", ggml_type_name(t));
}

}  // namespace ct
