// 8-bit-activation decode kernels (qgemv_q8.h). Per 32-element block, Q4_0 and Q5_0 dot their
// unsigned quants q with the input's q8 and subtract the offset (8 or 16) times the input's
// block sums in integers; Q8_0 computes sum |w| * (sign(w) q8) (maddubs needs one unsigned
// operand; |w| <= 128 and |q8| <= 127 keep every pair sum inside int16, so it never saturates);
// Q4_1 dots its unsigned quants and adds m * d32 * sum(q8). These four sum a whole block in
// integers, then convert to float once per four blocks in the one-row-per-register form (sums4),
// once per block and eight rows in the lane form (Lanes32), with the same float steps per row.
// K-quants (Q4_K, Q5_K, Q6_K) multiply each sub-block's int16 pair sums by its integer scale
// into int32 lanes, subtract mins (Q4_K, Q5_K) or the offset 32 (Q6_K) with the input's
// 16-element sums in integers, and convert once per super-block. Kernels are templates over the
// number of input rows N (the accumulators stay in registers): more rows run in tiles (the
// K-quants 8 rows, then 4; the others 4), re-reading the weight row from L1, not memory, or
// (32-element types, kMinLaneRows rows or more) in the lane form, eight rows per register. With
// AVX-512 (BW, VNNI) the K-quants' integer sums take two sub-blocks per 512-bit register (the
// halves add up exactly to the 256-bit sums, so the bits do not change).
#include "backend/cpu/qgemv_q8.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/vec.h"
#include "core/qblock_simd.h"

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define CT_Q8_VNNI 1
#define CT_DPBUSD _mm256_dpbusd_epi32
#define CT_DPWSSD _mm256_dpwssd_epi32
#elif defined(__AVXVNNI__)
#define CT_Q8_VNNI 1
#define CT_DPBUSD _mm256_dpbusd_avx_epi32
#define CT_DPWSSD _mm256_dpwssd_avx_epi32
#else
#define CT_Q8_VNNI 0
#endif
// 512-bit integer sums for the K-quants' VNNI kernels: two sub-blocks per register.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define CT_Q8_ZMM 1
#else
#define CT_Q8_ZMM 0
#endif

// The kernels' building blocks must inline into their loops: GCC's heuristics left a group
// (several hundred instructions once unrolled) out of line for some types, which passes the
// accumulators through memory on every call.
#define CT_Q8_INLINE inline __attribute__((always_inline))

namespace ct::cpu::q8 {
using simd::half;
using simd::nibbles32;
using simd::q5_high_bits;
namespace {

// Rows per kernel call: the accumulators of a tile stay in registers. The K-quants (kWideTile)
// run tiles of 2 * kTile first: on the Xeon, 8 rows measured slower than 4 on Q4_K with the
// 256-bit VNNI sums (188 vs 141 us per row, bench/qgemv_bench.cc) but faster with the 512-bit ones
// (CT_Q8_ZMM); on the AVX2-only EPYC (Zen 3) the AVX2 kernel's 8-row tile is 1.12x (Q4_K) and
// 1.15x (Q6_K) faster than two of 4 (bench/ab_micro.py, 11 rounds, forty-second session).
constexpr int kTile = 4;

inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// acc + per int32 lane the sum of 4 adjacent products u8 * s8 (u's bytes unsigned, s's signed).
// AVX2: maddubs (pairs, int16) then madd by ones (pairs of pairs); exact while the pair sums fit
// int16, which every caller guarantees.
template <bool kVnni>
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if CT_Q8_VNNI
  if constexpr (kVnni) return CT_DPBUSD(acc, u, s);
#endif
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

// acc + per int32 lane a[2i] * b[2i] + a[2i+1] * b[2i+1] (int16 operands).
template <bool kVnni>
inline __m256i dot_s16(__m256i acc, __m256i a, __m256i b) {
#if CT_Q8_VNNI
  if constexpr (kVnni) return CT_DPWSSD(acc, a, b);
#endif
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

// Quantises 32 floats with scale 127 / amax (`inv`, 0 for an all-zero block) to int8 (round to
// nearest even, MXCSR's default), stores them in element order and returns the int32 partial sums
// of elements 0..15 (lanes 0-7 of `lo`) and 16..31 (`hi`) as 8-lane vectors.
inline void quantise32(const float* x, __m256 inv, int8_t* q, __m256i& lo, __m256i& hi) {
  const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), inv));
  const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), inv));
  const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), inv));
  const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), inv));
  // The packs interleave 128-bit lanes: bytes come out as 4-element groups 0,2,4,6,1,3,5,7.
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  const __m256i ordered = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  lo = _mm256_add_epi32(i0, i1);
  hi = _mm256_add_epi32(i2, i3);
}

inline float abs_max(const float* x, int n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8)
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

inline int hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// The 6-bit scales and mins of a Q4_K/Q5_K super-block (12 bytes at s; q4_k_scale_min's layout,
// four at a time in 32-bit words) as bytes: sc_0..sc_7, then m_0..m_7.
inline __m128i k_scales_mins(const uint8_t* s) {
  uint32_t w[3];
  std::memcpy(w, s, 12);
  const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, top2 = 0x03030303;
  const uint32_t sc_lo = w[0] & low6, m_lo = w[1] & low6;
  const uint32_t sc_hi = (w[2] & low4) | (((w[0] >> 6) & top2) << 4);
  const uint32_t m_hi = ((w[2] >> 4) & low4) | (((w[1] >> 6) & top2) << 4);
  return _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)m_lo, (int)m_hi);
}

// A shuffle_epi8 control that copies int16 lane j of each 128-bit half to every lane of it.
inline __m256i pair_index(int j) { return _mm256_set1_epi16((short)(0x0101 * 2 * j + 0x0100)); }

#if CT_Q8_ZMM
// 256-bit halves in and out of a 512-bit register. The masked (maskz) forms with every lane kept:
// GCC 12's unmasked ones pass an undefined vector that -Wmaybe-uninitialized reports.
inline __m512i zjoin(__m256i lo, __m256i hi) {
  return _mm512_maskz_inserti64x4(0xff, _mm512_castsi256_si512(lo), hi, 1);
}
inline __m512i zdup(__m256i v) { return _mm512_maskz_broadcast_i64x4(0xff, v); }
// The sum of the two halves' int32 lanes.
inline __m256i zfold(__m512i z) {
  return _mm256_add_epi32(_mm512_maskz_extracti64x4_epi64(0xff, z, 0),
                          _mm512_maskz_extracti64x4_epi64(0xff, z, 1));
}
inline __m512i zload(const void* p) { return _mm512_loadu_si512(p); }
#endif

// Runs K's kernel over n rows: tiles of kLanes rows in K's lane form where K has one and the
// caller built the tiles (at least kMinLaneRows rows in the tile), the others in tiles of
// 2 * kTile (K::kWideTile, except with the 256-bit VNNI sums), then of kTile, then the remainder
// of 1-3. Each row's arithmetic is the same in every form.
template <class K, bool kVnni>
void rows_tiled(const uint8_t* row, const Act* act, const Lanes32* lanes, int n, int cols, float* y,
                size_t ys) {
  int i = 0;
  if constexpr (K::kHasLanes) {
    if (lanes != nullptr) {
      for (; n - i >= kMinLaneRows; i += kLanes) {
        K::template run_lanes<kVnni>(row, lanes[i / kLanes], std::min(kLanes, n - i), cols,
                                     y + i * ys, ys);
      }
    }
  }
  if constexpr (K::kWideTile && (CT_Q8_ZMM || !kVnni)) {
    for (; i + 2 * kTile <= n; i += 2 * kTile) {
      K::template run<kVnni, 2 * kTile>(row, act + i, cols, y + i * ys, ys);
    }
  }
  for (; i + kTile <= n; i += kTile) {
    K::template run<kVnni, kTile>(row, act + i, cols, y + i * ys, ys);
  }
  switch (n - i) {
    case 3:
      K::template run<kVnni, 3>(row, act + i, cols, y + i * ys, ys);
      break;
    case 2:
      K::template run<kVnni, 2>(row, act + i, cols, y + i * ys, ys);
      break;
    case 1:
      K::template run<kVnni, 1>(row, act + i, cols, y + i * ys, ys);
      break;
    default:
      break;
  }
}

// The 32-element-block types (Q4_0, Q4_1, Q5_0, Q8_0) work on four blocks at a time. Per block
// and input row, the integer dot product lands in 8 int32 lanes (4 elements each); two rounds of
// hadd and one add of the 128-bit halves fold the four blocks' lanes into one 128-bit register,
// lane j holding block j's exact sum over its 32 elements (sums4). Then one conversion and one
// float multiply-add per four blocks and row, against the blocks' weight scales times the
// input's, instead of one per block: a row's float sums are four, one per block lane, folded as
// hsum128_ps does at the end.
inline __m128i sums4(const __m256i m[4]) {
  const __m256i s =
      _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
  return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

// The fp16 field at byte `off` of nv (<= 4) consecutive blocks of kBytes, as floats in lane j
// (lanes of missing blocks 0). The halves go into a register one by one (pinsrw), not through a
// stack array, whose narrow stores a 16-byte load could not forward from.
template <size_t kBytes>
inline __m128 scales4(const uint8_t* blk, int off, int nv) {
  __m128i h = _mm_setzero_si128();
  uint16_t v;
  std::memcpy(&v, blk + off, 2);
  h = _mm_insert_epi16(h, v, 0);
  if (nv > 1) {
    std::memcpy(&v, blk + kBytes + off, 2);
    h = _mm_insert_epi16(h, v, 1);
  }
  if (nv > 2) {
    std::memcpy(&v, blk + 2 * kBytes + off, 2);
    h = _mm_insert_epi16(h, v, 2);
  }
  if (nv > 3) {
    std::memcpy(&v, blk + 3 * kBytes + off, 2);
    h = _mm_insert_epi16(h, v, 3);
  }
  return _mm_cvtph_ps(h);
}

// Four 32-bit values v[0..nv) (then zeros), floats or int32, as their bits. kFull: all four,
// read in place.
template <bool kFull, class T>
inline __m128i load4(const T* v, int nv) {
  static_assert(sizeof(T) == 4);
  if constexpr (kFull) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
  } else {
    alignas(16) T t[4] = {};
    for (int j = 0; j < nv; ++j) t[j] = v[j];
    return _mm_load_si128(reinterpret_cast<const __m128i*>(t));
  }
}
template <bool kFull>
inline __m128 floats4(const float* v, int nv) {
  return _mm_castsi128_ps(load4<kFull>(v, nv));
}

// Zeroes lanes j < skip of v (blocks a group repeats from the one before).
inline __m128 skip_lanes(__m128 v, int skip) {
  if (skip == 0) return v;
  const __m128i j = _mm_setr_epi32(0, 1, 2, 3);
  return _mm_and_ps(v, _mm_castsi128_ps(_mm_cmpgt_epi32(j, _mm_set1_epi32(skip - 1))));
}

// Runs K's four-block group over a row: full groups, then the last 1-3 blocks. With at least four
// blocks in the row, that is the group of the last four blocks with the lanes of those already
// done zeroed through their weight scales (full loads, no copies); else a group whose missing
// blocks are zero.
template <class K, bool kVnni, int N>
CT_Q8_INLINE void blocks32_row(const uint8_t* row, const Act* a, int cols, float* y, size_t ys) {
  __m128 acc[N];
  for (int r = 0; r < N; ++r) acc[r] = _mm_setzero_ps();
  const int nb = cols / 32;
  int b = 0;
  for (; b + 4 <= nb; b += 4) {
    K::template group<kVnni, N, true>(row + (size_t)b * K::kBytes, a, b, 4, 0, acc);
  }
  if (b < nb && nb >= 4) {
    K::template group<kVnni, N, true>(row + (size_t)(nb - 4) * K::kBytes, a, nb - 4, 4, 4 - (nb - b), acc);
  } else if (b < nb) {
    K::template group<kVnni, N, false>(row + (size_t)b * K::kBytes, a, b, nb - b, 0, acc);
  }
  for (int r = 0; r < N; ++r) y[r * ys] = hsum128_ps(acc[r]);
}

// The four 32-element-block types, one group kernel with per-type hooks:
//  - Q4_0: d, 16 bytes of nibbles; element d (q - 8).
//  - Q4_1: d, m, 16 bytes of nibbles; element d q + m, so a block adds d * d32 * sum(q_w q) +
//    m * sx32 (a second multiply-add into the same lane).
//  - Q5_0: d, 4 bytes qh, 16 bytes qs; element d (q - 16).
//  - Q8_0: d, 32 int8; element d q.
// Q4_0 and Q5_0 multiply the unsigned q and subtract the offset times the input's block sums
// in integers. Q8_0 multiplies |w| by sign(w) x (maddubs needs one unsigned operand; |w| <=
// 128 and |x| <= 127 keep every pair sum inside int16).
enum class Type32 { kQ4_0, kQ4_1, kQ5_0, kQ8_0 };

template <Type32 kT>
struct KBlocks32 {
  static constexpr size_t kBytes = kT == Type32::kQ4_0   ? 18
                                   : kT == Type32::kQ4_1 ? 20
                                   : kT == Type32::kQ5_0 ? 22
                                                         : 34;
  static constexpr int kOffsetShift = kT == Type32::kQ4_0 ? 3 : kT == Type32::kQ5_0 ? 4 : 0;
  static constexpr bool kSigned = kT == Type32::kQ8_0;  // int8 quants: the sign trick
  static constexpr bool kMin = kT == Type32::kQ4_1;     // the d q + m form
  static constexpr bool kWideTile = false;
  // Every type has the lane form, in both kernels (Q8_0's differs between them: lanes_block).
  static constexpr bool kHasLanes = true;
  static constexpr int kQ5Span = 32;  // blocks unpacked ahead (a multiple of 4)
  static __m256i quants(const uint8_t* blk) {
    if constexpr (kT == Type32::kQ4_0) {
      return nibbles32(blk + 2);
    } else if constexpr (kT == Type32::kQ4_1) {
      return nibbles32(blk + 4);
    } else if constexpr (kT == Type32::kQ5_0) {
      return _mm256_or_si256(nibbles32(blk + 6), q5_high_bits(blk + 2));
    } else {
      return load256(blk + 2);
    }
  }
  template <bool kVnni, int N, bool kFull>
  CT_Q8_INLINE static void group(const uint8_t* blk, const Act* a, int b, int nv, int skip,
                                 __m128* acc) {
    __m256i w[4], u[4];
    for (int j = 0; j < 4; ++j) {
      w[j] = kFull || j < nv ? quants(blk + j * kBytes) : _mm256_setzero_si256();
      u[j] = kSigned ? _mm256_sign_epi8(w[j], w[j]) : w[j];  // Q8_0: |w|, -128 -> 128
    }
    const __m128 dw = skip_lanes(scales4<kBytes>(blk, 0, kFull ? 4 : nv), skip);
    __m128 mw = _mm_setzero_ps();
    if constexpr (kMin) mw = skip_lanes(scales4<kBytes>(blk, 2, kFull ? 4 : nv), skip);
    for (int r = 0; r < N; ++r) {
      __m256i m[4];
      for (int j = 0; j < 4; ++j) {
        if (!kFull && j >= nv) {
          m[j] = _mm256_setzero_si256();
          continue;
        }
        const __m256i x = load256(a[r].q32 + 32 * (b + j));
        m[j] = dot_u8s8<kVnni>(_mm256_setzero_si256(), u[j], kSigned ? _mm256_sign_epi8(x, w[j]) : x);
      }
      __m128i s = sums4(m);
      if constexpr (kOffsetShift > 0) {
        s = _mm_sub_epi32(s, _mm_slli_epi32(load4<kFull>(a[r].h32 + b, nv), kOffsetShift));
      }
      const __m128 dx = floats4<kFull>(a[r].d32 + b, nv);
      acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(s), _mm_mul_ps(dw, dx), acc[r]);
      if constexpr (kMin) acc[r] = _mm_fmadd_ps(mw, floats4<kFull>(a[r].sx32 + b, nv), acc[r]);
    }
  }
  template <bool kVnni, int N>
  static void run(const uint8_t* row, const Act* a, int cols, float* y, size_t ys) {
    blocks32_row<KBlocks32, kVnni, N>(row, a, cols, y, ys);
  }

  // The lane form keeps what the register of the one-row form keeps, per row: partial sums s[j]
  // (its lane j: the terms of the blocks in lane j, Q4_1's min terms included), and folds them as
  // hsum128_ps does. Block b lies in lane b mod 4, except the blocks of the last group of a row
  // whose block count is not a multiple of 4: that group is the row's last four blocks, so block b
  // lies in lane b - (nb - 4).
  struct LaneSums {
    __m256 s[4];
  };
  // Group g (elements 4g..4g+3) of a block's weight quants, broadcast to every lane, as the
  // unsigned operand of dot_u8s8: nibbles masked from the block (group g < 4: the low halves of
  // bytes 4g..4g+3, 4 + g their high halves), Q8_0's bytes plus 128 (VNNI only: the AVX2 form
  // reads them signed), Q5_0's from the block's unpacked quants wq (run_lanes's buffer).
  CT_Q8_INLINE static __m256i lane_group(const uint8_t* blk, const uint8_t* wq, int g) {
    int32_t w4;
    if constexpr (kT == Type32::kQ4_0 || kT == Type32::kQ4_1) {
      std::memcpy(&w4, blk + (kT == Type32::kQ4_0 ? 2 : 4) + 4 * (g & 3), 4);
      const __m256i raw = _mm256_set1_epi32(w4);
      return _mm256_and_si256(g < 4 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0f));
    } else if constexpr (kT == Type32::kQ8_0) {
      std::memcpy(&w4, blk + 2 + 4 * g, 4);
      return _mm256_xor_si256(_mm256_set1_epi32(w4), _mm256_set1_epi8((char)0x80));
    } else {
      std::memcpy(&w4, wq + 4 * g, 4);
      return _mm256_set1_epi32(w4);
    }
  }
  // One block's terms in the lane form (eight rows, one per lane) into lane j of the sums. Each
  // 4-byte group of weight quants is broadcast by a load (broadcasts from a register are
  // shuffles, which all queue on one port): Q4_0, Q4_1 and Q8_0 load it from the block and mask
  // or bias it, which measured 11-25% faster at 8 rows than a buffer; Q5_0's fifth bits would
  // cost more than that, so it reads the span that run_lanes unpacked (wq: this block's 32 bytes).
  template <bool kVnni>
  CT_Q8_INLINE static void lanes_block(const uint8_t* blk, const uint8_t* wq, const Lanes32& t,
                                       int b, int j, LaneSums& p) {
    const int8_t* xq = t.q + (size_t)b * 32 * kLanes;
    __m256i sum;  // per lane (row), the block's exact integer dot product
    if constexpr (kVnni && CT_Q8_VNNI) {
      // Elements 0..15 (groups 0-3) and 16..31 (4-7), each in two chains of two dot products.
      __m256i c[4];
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const int k = g >> 1;
        c[k] = dot_u8s8<kVnni>(g & 1 ? c[k] : _mm256_setzero_si256(), lane_group(blk, wq, g),
                               load256(xq + 32 * g));
      }
      sum = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
    } else if constexpr (kSigned) {
      // AVX2 Q8_0: maddubs's pair sums of w + 128 (up to 255) would overflow int16, so the
      // one-row form's trick: |w| times sign(w) x (pair sums up to 2 * 128 * 127 = 32,512),
      // widened by a madd per group. The broadcast is the block's own bytes, not lane_group's.
      const __m256i ones = _mm256_set1_epi16(1);
      __m256i c[4];
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        int32_t w4;
        std::memcpy(&w4, blk + 2 + 4 * g, 4);
        const __m256i w = _mm256_set1_epi32(w4);
        const __m256i m = _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(load256(xq + 32 * g), w)),
            ones);
        c[g >> 1] = g & 1 ? _mm256_add_epi32(c[g >> 1], m) : m;
      }
      sum = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
    } else {
      // AVX2: the int16 pair sums of several groups add up in int16 before a madd widens them
      // (one widening per 16 or 32 elements, not per 4). Exact: a pair sum is at most
      // 2 * 127 * the largest unsigned weight, so the four groups of Q5_0 (weights up to 31) stay
      // within 31,496 and the eight of Q4_0 and Q4_1 (up to 15) within 30,480.
      __m256i p[8];
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        p[g] = _mm256_maddubs_epi16(lane_group(blk, wq, g), load256(xq + 32 * g));
      }
      const __m256i ones = _mm256_set1_epi16(1);
      const __m256i lo16 =
          _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
      const __m256i hi16 =
          _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
      if constexpr (kT == Type32::kQ5_0) {
        sum = _mm256_add_epi32(_mm256_madd_epi16(lo16, ones), _mm256_madd_epi16(hi16, ones));
      } else {
        sum = _mm256_madd_epi16(_mm256_add_epi16(lo16, hi16), ones);
      }
    }
    constexpr int kShift = kSigned ? (kVnni && CT_Q8_VNNI ? 7 : 0) : kOffsetShift;
    if constexpr (kShift > 0) {
      sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(load256(t.h32 + (size_t)b * kLanes), kShift));
    }
    const __m256 dd =
        _mm256_mul_ps(_mm256_set1_ps(half(blk)), _mm256_loadu_ps(t.d + (size_t)b * kLanes));
    p.s[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), dd, p.s[j]);
    if constexpr (kMin) {
      p.s[j] = _mm256_fmadd_ps(_mm256_set1_ps(half(blk + 2)),
                               _mm256_loadu_ps(t.sx + (size_t)b * kLanes), p.s[j]);
    }
  }
  // The lane form on one tile (n <= kLanes rows valid).
  template <bool kVnni>
  static void run_lanes(const uint8_t* row, const Lanes32& t, int n, int cols, float* y,
                        size_t ys) {
    LaneSums p;
    for (int j = 0; j < 4; ++j) p.s[j] = _mm256_setzero_ps();
    const int nb = cols / 32, full = nb / 4 * 4;
    // Q5_0's quants (nibbles and fifth bits) are unpacked into a buffer for a span of blocks
    // first, and the lane loop broadcasts them from L1 like the other types' bytes (unpacked
    // block by block, each block's broadcasts waited on the store just before them).
    alignas(32) uint8_t wq[kQ5Span * 32];
    auto unpack = [&](int b0, int b1) {
      if constexpr (kT == Type32::kQ5_0) {
        for (int b = b0; b < b1; ++b) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(wq + (b % kQ5Span) * 32),
                             quants(row + (size_t)b * kBytes));
        }
      }
    };
    auto wq_of = [&](int b) { return wq + (b % kQ5Span) * 32; };
    for (int b = 0; b < full; b += 4) {
      if (b % kQ5Span == 0) unpack(b, std::min(full, b + kQ5Span));
      const uint8_t* blk = row + (size_t)b * kBytes;
      // Unrolled, so that the sums stay in registers (a rolled loop indexes them in memory).
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        lanes_block<kVnni>(blk + j * kBytes, wq_of(b + j), t, b + j, j, p);
      }
    }
    unpack(full, nb);
    const int shift = nb >= 4 ? nb - 4 : 0;  // lane of a last-group block: b - shift
    for (int b = full; b < nb; ++b) {
      lanes_block<kVnni>(row + (size_t)b * kBytes, wq_of(b), t, b, b - shift, p);
    }
    // hsum128_ps's order: (s0 + s1) + (s2 + s3).
    alignas(32) float out[kLanes];
    _mm256_store_ps(out,
                    _mm256_add_ps(_mm256_add_ps(p.s[0], p.s[1]), _mm256_add_ps(p.s[2], p.s[3])));
    for (int i = 0; i < n; ++i) y[i * ys] = out[i];
  }
};

// Q4_K (kFive false) and Q5_K: d, dmin, 12 scale bytes, [Q5_K: 32 bytes qh], 128 bytes qs; element
// 32s + j is d * sc_s * q - dmin * m_s. Per super-block and row: the int32 lanes of
// sum_s sc_s * sum(q_w q) and of sum_s m_s * sum(q), then two float multiply-adds.
template <bool kFive>
struct KQ45K {
  static constexpr bool kHasLanes = false;
  static constexpr bool kWideTile = true;
  template <bool kVnni, int N>
  static void run(const uint8_t* row, const Act* a, int cols, float* y, size_t ys) {
    constexpr size_t kBytes = kFive ? 176 : 144;
    const __m256i mask = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    __m256 acc[N];
    for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < cols / 256; ++b) {
      const uint8_t* blk = row + (size_t)b * kBytes;
      const uint8_t* qs = blk + (kFive ? 48 : 16);
      const __m256i qh = kFive ? load256(blk + 16) : _mm256_setzero_si256();
      // scales16: int16 sc_0..sc_7 in both 128-bit lanes; mv: int16 m_0, m_0, m_1, ..., m_7, m_7
      // (each min twice, to pair with the 16-element sums).
      const __m128i sm = k_scales_mins(blk + 4);
      const __m256i scales16 = _mm256_cvtepu8_epi16(
          _mm_shuffle_epi8(sm, _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7)));
      const __m256i mv = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
          sm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
      __m256i isum[N];
#if CT_Q8_ZMM
      if constexpr (kVnni) {
        zmm_sums<N>(qs, qh, scales16, a, 256 * b, isum);
      } else
#endif
      {
        for (int r = 0; r < N; ++r) isum[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
          const __m256i raw = load256(qs + 32 * c);
          const __m256i nib[2] = {_mm256_and_si256(raw, mask),
                                  _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask)};
          for (int hi = 0; hi < 2; ++hi) {
            const int s = 2 * c + hi;
            __m256i q = nib[hi];
            if constexpr (kFive) {
              // Bit s of each qh byte moved to bit 4; masked to one bit, 16-bit shifts cannot
              // carry.
              q = _mm256_or_si256(
                  q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, s), one), 4));
            }
            const __m256i scv = _mm256_shuffle_epi8(scales16, pair_index(s));
            for (int r = 0; r < N; ++r) {
              // Pair sums <= 2 * 31 * 127: no saturation.
              const __m256i p = _mm256_maddubs_epi16(q, load256(a[r].qk + 256 * b + 32 * s));
              isum[r] = dot_s16<kVnni>(isum[r], p, scv);
            }
          }
        }
      }
      const __m256 vd = _mm256_set1_ps(half(blk)), vmin = _mm256_set1_ps(half(blk + 2));
      for (int r = 0; r < N; ++r) {
        const __m256 dx = _mm256_broadcast_ss(a[r].dk + b);
        const __m256i im = _mm256_madd_epi16(mv, load256(a[r].s16 + 16 * b));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(vd, dx), acc[r]);
        acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(vmin, dx), acc[r]);
      }
    }
    for (int r = 0; r < N; ++r) y[r * ys] = hsum256_ps(acc[r]);
  }
#if CT_Q8_ZMM
  // The integer sums of one super-block (input elements from `at` on) in 512-bit registers:
  // sub-blocks 2c and 2c + 1 (chunk c's low and high nibbles, adjacent in the input) side by
  // side, each half accumulating what the 256-bit loop puts in the same lanes, so the halves'
  // exact sum is that loop's isum.
  template <int N>
  CT_Q8_INLINE static void zmm_sums(const uint8_t* qs, __m256i qh, __m256i scales16, const Act* a,
                                    size_t at, __m256i* isum) {
    const __m512i mask = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
    const __m512i nib_shift = zjoin(_mm256_setzero_si256(), _mm256_set1_epi16(4));
    const __m512i sc = zdup(scales16);
    const __m512i qh2 = zdup(qh);
    __m512i z[N];
    for (int r = 0; r < N; ++r) z[r] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m512i raw = zdup(load256(qs + 32 * c));
      __m512i q = _mm512_and_si512(_mm512_srlv_epi16(raw, nib_shift), mask);
      if constexpr (kFive) {
        const __m512i bit =
            zjoin(_mm256_set1_epi16((short)(2 * c)), _mm256_set1_epi16((short)(2 * c + 1)));
        q = _mm512_or_si512(
            q, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh2, bit), one), 4));
      }
      const __m512i scv = _mm512_shuffle_epi8(
          sc, zjoin(pair_index(2 * c), pair_index(2 * c + 1)));
      for (int r = 0; r < N; ++r) {
        const __m512i p = _mm512_maddubs_epi16(q, zload(a[r].qk + at + 64 * c));
        z[r] = _mm512_dpwssd_epi32(z[r], p, scv);
      }
    }
    for (int r = 0; r < N; ++r) {
      isum[r] = zfold(z[r]);
    }
  }
#endif
};

// Q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales, d. Element 128h + 32k + l (k < 4, l < 32):
// low nibble (k odd: of ql[64h + 32 + l], k >= 2: the high nibble) and 2 bits of qh[32h + l] at
// bit 2k make q in [0, 64); the element is d * scales[8h + 2k + l / 16] * (q - 32). The offset is
// subtracted in integers as 32 * sum_g scales[g] * s16[g].
struct KQ6K {
  static constexpr bool kHasLanes = false;
  static constexpr bool kWideTile = true;
  template <bool kVnni, int N>
  static void run(const uint8_t* row, const Act* a, int cols, float* y, size_t ys) {
    const __m256i mask4 = _mm256_set1_epi8(0x0f), mask2 = _mm256_set1_epi8(3);
    __m256 acc[N];
    for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < cols / 256; ++b) {
      const uint8_t* blk = row + (size_t)b * 210;
      const auto* scales = reinterpret_cast<const int8_t*>(blk + 192);
      // pairs16[h]: int16 scales 8h..8h+7 in the low 128-bit half, 8h+1..8h+8 in the high one
      // (the 17th, past the end, is never selected).
      const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
      const __m256i pairs16[2] = {
          _mm256_cvtepi8_epi16(
              _mm_shuffle_epi8(sc8, _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 8))),
          _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
              sc8, _mm_setr_epi8(8, 9, 10, 11, 12, 13, 14, 15, 9, 10, 11, 12, 13, 14, 15, 15)))};
      __m256i isum[N];
#if CT_Q8_ZMM
      if constexpr (kVnni) {
        zmm_sums<N>(blk, pairs16, a, 256 * b, isum);
      } else
#endif
      {
        for (int r = 0; r < N; ++r) isum[r] = _mm256_setzero_si256();
        for (int h = 0; h < 2; ++h) {
          const __m256i ql0 = load256(blk + 64 * h), ql1 = load256(blk + 64 * h + 32);
          const __m256i qh = load256(blk + 128 + 32 * h);
          const __m256i lo[4] = {_mm256_and_si256(ql0, mask4), _mm256_and_si256(ql1, mask4),
                                 _mm256_and_si256(_mm256_srli_epi16(ql0, 4), mask4),
                                 _mm256_and_si256(_mm256_srli_epi16(ql1, 4), mask4)};
          for (int k = 0; k < 4; ++k) {
            const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), mask2);
            const __m256i q = _mm256_or_si256(lo[k], _mm256_slli_epi16(hb, 4));
            // int16 lanes 0-7 hold elements 0..15 (scale 8h + 2k), lanes 8-15 elements 16..31
            // (scale 8h + 2k + 1): lane 2k of each half of pairs16[h].
            const __m256i scv = _mm256_shuffle_epi8(pairs16[h], pair_index(2 * k));
            for (int r = 0; r < N; ++r) {
              // Pair sums <= 2 * 63 * 127: no saturation.
              const __m256i p =
                  _mm256_maddubs_epi16(q, load256(a[r].qk + 256 * b + 128 * h + 32 * k));
              isum[r] = dot_s16<kVnni>(isum[r], p, scv);
            }
          }
        }
      }
      const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
      const __m256 vd = _mm256_set1_ps(half(blk + 208));
      for (int r = 0; r < N; ++r) {
        const __m256i off =
            _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(a[r].s16 + 16 * b)), 5);
        const __m256i is = _mm256_sub_epi32(isum[r], off);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is),
                                 _mm256_mul_ps(vd, _mm256_broadcast_ss(a[r].dk + b)), acc[r]);
      }
    }
    for (int r = 0; r < N; ++r) y[r * ys] = hsum256_ps(acc[r]);
  }
#if CT_Q8_ZMM
  // The integer sums of one super-block in 512-bit registers, as KQ45K::zmm_sums: k = 2j and
  // 2j + 1 side by side (their ql bytes and their input elements are adjacent).
  template <int N>
  CT_Q8_INLINE static void zmm_sums(const uint8_t* blk, const __m256i* pairs16, const Act* a,
                                    size_t at, __m256i* isum) {
    const __m512i mask4 = _mm512_set1_epi8(0x0f), mask2 = _mm512_set1_epi8(3);
    __m512i z[N];
    for (int r = 0; r < N; ++r) z[r] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = zload(blk + 64 * h);
      const __m512i qh = zdup(load256(blk + 128 + 32 * h));
      const __m512i lo[2] = {_mm512_and_si512(ql, mask4),
                             _mm512_and_si512(_mm512_srli_epi16(ql, 4), mask4)};
      const __m512i pairs = zdup(pairs16[h]);
      for (int j = 0; j < 2; ++j) {
        const __m512i shift =
            zjoin(_mm256_set1_epi16((short)(4 * j)), _mm256_set1_epi16((short)(4 * j + 2)));
        const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, shift), mask2);
        const __m512i q = _mm512_or_si512(lo[j], _mm512_slli_epi16(hb, 4));
        const __m512i scv = _mm512_shuffle_epi8(
            pairs, zjoin(pair_index(4 * j), pair_index(4 * j + 2)));
        for (int r = 0; r < N; ++r) {
          const __m512i p =
              _mm512_maddubs_epi16(q, zload(a[r].qk + at + 128 * h + 64 * j));
          z[r] = _mm512_dpwssd_epi32(z[r], p, scv);
        }
      }
    }
    for (int r = 0; r < N; ++r) {
      isum[r] = zfold(z[r]);
    }
  }
#endif
};

struct Entry {
  GgmlType type;
  Format format;
  RowsDot avx2, vnni;
  bool lanes;  // whether K has the lane form (then in both kernels)
};

template <class K>
constexpr Entry entry(GgmlType t, Format f) {
  constexpr bool kV = CT_Q8_VNNI != 0;
  return {t,
          f,
          rows_tiled<K, false>,
          rows_tiled<K, kV>,
          K::kHasLanes};
}

const Entry kEntries[] = {
    entry<KBlocks32<Type32::kQ4_0>>(GgmlType::Q4_0, kBlocks32),
    entry<KBlocks32<Type32::kQ4_1>>(GgmlType::Q4_1, kBlocks32),
    entry<KBlocks32<Type32::kQ5_0>>(GgmlType::Q5_0, kBlocks32),
    entry<KBlocks32<Type32::kQ8_0>>(GgmlType::Q8_0, kBlocks32),
    entry<KQ45K<false>>(GgmlType::Q4_K, kBlocks256),
    entry<KQ45K<true>>(GgmlType::Q5_K, kBlocks256),
    entry<KQ6K>(GgmlType::Q6_K, kBlocks256),
};

const Entry* find_entry(GgmlType t) {
  for (const Entry& e : kEntries) {
    if (e.type == t) return &e;
  }
  return nullptr;
}

}  // namespace

Format format_of(GgmlType t) {
  const Entry* e = find_entry(t);
  return e ? e->format : kNone;
}

bool have_vnni() { return CT_Q8_VNNI != 0; }

bool wants_lanes(GgmlType t, int n) {
  const Entry* e = find_entry(t);
  return e != nullptr && n >= kMinLaneRows && e->lanes;
}

RowsDot find(GgmlType t, bool vnni) {
  const Entry* e = find_entry(t);
  if (!e) return nullptr;
  return vnni ? e->vnni : e->avx2;
}

// Quantises x in blocks of 32 (scale d[b] = max|x| / 127) and hands each block's scale and its
// int32 partial sums of elements 0..15 and 16..31 to sums(b, scale, lo, hi).
template <class Sums>
void quantise_32(const float* x, int cols, int8_t* q, float* d, Sums sums) {
  for (int b = 0; b < cols / 32; ++b) {
    const float amax = abs_max(x + 32 * b, 32);
    const float scale = amax / 127.0f;
    const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    __m256i lo, hi;
    quantise32(x + 32 * b, inv, q + 32 * b, lo, hi);
    d[b] = scale;
    sums(b, scale, lo, hi);
  }
}

void quantise_blocks32(const float* x, int cols, int8_t* q, float* d, float* sx, int32_t* h32) {
  quantise_32(x, cols, q, d, [sx, h32](int b, float scale, __m256i lo, __m256i hi) {
    const int s = hsum_epi32(lo) + hsum_epi32(hi);
    h32[b] = s;
    sx[b] = scale * (float)s;
  });
}

void interleave_blocks32(const Act* act, int n, int b0, int b1, int8_t* q, float* d, int32_t* h32,
                         float* sx) {
  if (n < kLanes) {
    std::memset(q + (size_t)b0 * 32 * kLanes, 0, (size_t)(b1 - b0) * 32 * kLanes);
    std::fill(d + (size_t)b0 * kLanes, d + (size_t)b1 * kLanes, 0.0f);
    std::fill(h32 + (size_t)b0 * kLanes, h32 + (size_t)b1 * kLanes, 0);
    std::fill(sx + (size_t)b0 * kLanes, sx + (size_t)b1 * kLanes, 0.0f);
  }
  for (int i = 0; i < n; ++i) {
    const Act& a = act[i];
    for (int b = b0; b < b1; ++b) {
      for (int g = 0; g < 8; ++g) {
        std::memcpy(q + (((size_t)b * 8 + g) * kLanes + i) * 4, a.q32 + 32 * b + 4 * g, 4);
      }
      d[(size_t)b * kLanes + i] = a.d32[b];
      h32[(size_t)b * kLanes + i] = a.h32[b];
      sx[(size_t)b * kLanes + i] = a.sx32[b];
    }
  }
}

void quantise_blocks32x16(const float* x, int cols, int8_t* q, float* d, float* sx16) {
  quantise_32(x, cols, q, d, [sx16](int b, float scale, __m256i lo, __m256i hi) {
    sx16[2 * b] = scale * (float)hsum_epi32(lo);
    sx16[2 * b + 1] = scale * (float)hsum_epi32(hi);
  });
}

void quantise_blocks256(const float* x, int cols, int8_t* q, float* d, int16_t* s16) {
  for (int b = 0; b < cols / 256; ++b) {
    const float amax = abs_max(x + 256 * b, 256);
    d[b] = amax / 127.0f;
    const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    for (int j = 0; j < 8; ++j) {
      const int e = 256 * b + 32 * j;
      __m256i lo, hi;
      quantise32(x + e, inv, q + e, lo, hi);
      s16[e / 16] = (int16_t)hsum_epi32(lo);
      s16[e / 16 + 1] = (int16_t)hsum_epi32(hi);
    }
  }
}

}  // namespace ct::cpu::q8
