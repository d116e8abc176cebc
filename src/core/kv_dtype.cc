// Conversions between F32 and the KV element types.
#include "core/kv_dtype.h"

#include <cmath>
#include <cstring>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/fp16.h"
#include "core/ggml_types.h"

namespace ct {

const char* kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::F32:
      return "f32";
    case KvDtype::F16:
      return "f16";
    case KvDtype::BF16:
      return "bf16";
    case KvDtype::Q8_0:
      return "q8_0";
  }
  return "unknown";
}

namespace {

constexpr int kQ8Block = 32;        // elements of a Q8_0 block
constexpr size_t kQ8BlockBytes = 34;  // its F16 scale and 32 quants

}  // namespace

bool kv_record_type(KvDtype t) {
  return t == KvDtype::F32 || t == KvDtype::F16 || t == KvDtype::BF16;
}
bool kv_cache_type(KvDtype t) {
  return t == KvDtype::F32 || t == KvDtype::F16 || t == KvDtype::Q8_0;
}

int kv_block_elems(KvDtype t) { return t == KvDtype::Q8_0 ? kQ8Block : 1; }

size_t kv_bytes(KvDtype t, size_t n) {
  switch (t) {
    case KvDtype::F32:
      return n * 4;
    case KvDtype::F16:
    case KvDtype::BF16:
      return n * 2;
    case KvDtype::Q8_0:
      CT_ASSERT(n % kQ8Block == 0, "{} q8_0 elements: not whole blocks of {}", n, kQ8Block);
      return n / kQ8Block * kQ8BlockBytes;
  }
  CT_ASSERT(false, "KV dtype {}", (int)t);
  return 0;
}

KvDtype parse_kv_dtype(const std::string& s) {
  if (s == "f32") return KvDtype::F32;
  if (s == "f16") return KvDtype::F16;
  if (s == "bf16") return KvDtype::BF16;
  if (s == "q8_0") return KvDtype::Q8_0;
  CT_THROW("KV dtype '{}' is not supported, expected f16, bf16, f32 or q8_0", s);
}

namespace {

// 1 / d, or 0 where d is 0 or so small (below 2^-128) that 1 / d overflows: such a block's F16
// scale is 0 anyway, and its quants are then 0 instead of the conversion of an infinity.
inline float q8_inverse_scale(float d) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  return std::isfinite(id) ? id : 0.0f;
}

// Q8_0 blocks as ggml's reference quantiser (core/ggml_types.cc quant_q8_0) writes them, eight
// lanes at a time: the same scale (max|x| / 127, one division), the same products x * (1 / d),
// and std::round's half-away-from-zero rounding built from exact steps (truncate, compare the
// exact remainder with one half).
void pack_q8_0(const float* src, uint8_t* dst, size_t n) {
  CT_ASSERT(n % kQ8Block == 0, "{} q8_0 elements: not whole blocks of {}", n, kQ8Block);
#if defined(__AVX2__)
  const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f),
               one = _mm256_set1_ps(1.0f);
  for (size_t b = 0; b < n / kQ8Block; ++b) {
    const float* x = src + b * kQ8Block;
    uint8_t* o = dst + b * kQ8BlockBytes;
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), amax);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.0f;
    const float id = q8_inverse_scale(d);
    const uint16_t d16 = f32_to_fp16(d);
    std::memcpy(o, &d16, 2);
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 p = _mm256_mul_ps(v[k], vid);
      const __m256 a = _mm256_andnot_ps(sign, p);
      const __m256 t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m256 up = _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(a, t), half, _CMP_GE_OQ), one);
      const __m256 r = _mm256_or_ps(_mm256_add_ps(t, up), _mm256_and_ps(sign, p));
      q[k] = _mm256_cvttps_epi32(r);
    }
    // int32 -> int8 with saturation (the values are within [-127, 127]); packs interleave the
    // 128-bit lanes, the permute puts the 32 bytes back in order.
    const __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
    const __m256i b8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 2), b8);
  }
#else
  ggml_from_f32(GgmlType::Q8_0, src, dst, (int64_t)n);
#endif
}

}  // namespace

void kv_pack(KvDtype t, const float* src, void* dst, size_t n) {
  if (t == KvDtype::F32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  if (t == KvDtype::Q8_0) {
    pack_q8_0(src, static_cast<uint8_t*>(dst), n);
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (t == KvDtype::F16) {
    size_t i = 0;
#if defined(__F16C__)
    // The live cache packs every new row of every layer. The hardware conversion rounds to
    // nearest even like the scalar one (it ignores MXCSR's flush-to-zero; an F32 subnormal is
    // below the smallest half subnormal either way).
    for (; i + 8 <= n; i += 8) {
      const __m128i h =
          _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
    }
#endif
    for (; i < n; ++i) d[i] = f32_to_fp16(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
  }
}

void kv_unpack(KvDtype t, const void* src, float* dst, size_t n) {
  if (t == KvDtype::F32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  if (t == KvDtype::Q8_0) {  // the weight table's dequantiser (exact: an F16 scale times a byte)
    // Looked up once: attention's tiles unpack one head of one row per call.
    static const GgmlToF32 to_f32 = ggml_traits(GgmlType::Q8_0).to_f32;
    CT_ASSERT(n % kQ8Block == 0, "{} q8_0 elements: not whole blocks of {}", n, kQ8Block);
    to_f32(src, dst, (int64_t)(n / kQ8Block));
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (t == KvDtype::F16) {
    size_t i = 0;
#if defined(__F16C__)
    // The layer loader unpacks every reused row of every layer; the hardware conversion is
    // exact, like the scalar one (every half value is a float), and several times faster.
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; ++i) dst[i] = fp16_to_f32(s[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  }
}

}  // namespace ct
