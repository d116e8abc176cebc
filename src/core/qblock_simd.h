// AVX2 helpers that unpack GGUF block fields, shared by the AVX2 dequantisers (core/ggml_types.cc)
// and the F32 and 8-bit decode kernels (backend/cpu/qgemv.cc, qgemv_q8.cc): the fp16 block
// scale, 4-bit quants, and Q5's fifth bits. Include only where AVX2, FMA and F16C are enabled.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace ct::simd {

// The block scale, converted by the F16C instruction: exact like fp16_to_f32, which does it in
// software with branches and was a visible part of decode time (two conversions per Q4_1 block).
inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
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

}  // namespace ct::simd
