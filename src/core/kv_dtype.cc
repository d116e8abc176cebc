// Conversions between F32 and the KV element types.
#include "core/kv_dtype.h"

#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/fp16.h"

namespace ct {

const char* kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::F32:
      return "f32";
    case KvDtype::F16:
      return "f16";
    case KvDtype::BF16:
      return "bf16";
  }
  return "unknown";
}

size_t kv_dtype_size(KvDtype t) { return t == KvDtype::F32 ? 4 : 2; }

KvDtype parse_kv_dtype(const std::string& s) {
  if (s == "f32") return KvDtype::F32;
  if (s == "f16") return KvDtype::F16;
  if (s == "bf16") return KvDtype::BF16;
  CT_THROW("KV dtype '{}' is not supported, expected f16, bf16 or f32", s);
}

void kv_pack(KvDtype t, const float* src, void* dst, size_t n) {
  if (t == KvDtype::F32) {
    std::memcpy(dst, src, n * 4);
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
