// The prefill GEMM with quantised weights and 8-bit activations (qgemm.h).
#include "backend/cpu/qgemm.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cpu/qgemv_q8.h"
#include "core/error.h"
#include "core/qblock_simd.h"

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define CT_QGEMM_VNNI 1
#define CT_QGEMM_DPBUSD _mm256_dpbusd_epi32
#elif defined(__AVXVNNI__)
#define CT_QGEMM_VNNI 1
#define CT_QGEMM_DPBUSD _mm256_dpbusd_avx_epi32
#else
#define CT_QGEMM_VNNI 0
#endif
// With 512-bit VNNI two strips run as one: each register holds a group of both (pair_tile).
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define CT_QGEMM_PAIR 1
#else
#define CT_QGEMM_PAIR 0
#endif

namespace ct::cpu {
using simd::half;
namespace {

// Weight rows per strip: the 8 lanes of a 256-bit register of floats.
constexpr int kStrip = 8;
// Input rows per tile: their accumulators stay in registers (AVX-512VL has 32 vector registers,
// AVX2 16).
#if defined(__AVX512VL__)
constexpr int kMaxTile = 8;
#else
constexpr int kMaxTile = 4;
#endif

// --- unpacking: one row into u[cols], d[cols / 16], o[cols / 16] --------------------------------

using UnpackRow = void (*)(const uint8_t* row, int cols, uint8_t* u, float* d, float* o);

// Both halves of a 32-element block share its scale and offset.
inline void set_pair(float* d, float* o, int b, float dv, float ov) {
  d[2 * b] = d[2 * b + 1] = dv;
  o[2 * b] = o[2 * b + 1] = ov;
}

// Q4_0 (d, 16 nibble bytes; q - 8) and Q4_1 (d, m, 16 nibble bytes; d q + m).
template <bool kMin>
void unpack_q4(const uint8_t* row, int cols, uint8_t* u, float* d, float* o) {
  constexpr int kBytes = kMin ? 20 : 18;
  for (int b = 0; b < cols / 32; ++b) {
    const uint8_t* blk = row + (size_t)b * kBytes;
    const uint8_t* qs = blk + (kMin ? 4 : 2);
    for (int j = 0; j < 16; ++j) {
      u[32 * b + j] = qs[j] & 0x0f;
      u[32 * b + j + 16] = qs[j] >> 4;
    }
    const float dv = half(blk);
    set_pair(d, o, b, dv, kMin ? half(blk + 2) : -8.0f * dv);
  }
}

// Q5_0 (d, 4 bytes qh, 16 bytes qs; q - 16) and Q5_1 (d, m, qh, qs; d q + m).
template <bool kMin>
void unpack_q5(const uint8_t* row, int cols, uint8_t* u, float* d, float* o) {
  constexpr int kBytes = kMin ? 24 : 22;
  for (int b = 0; b < cols / 32; ++b) {
    const uint8_t* blk = row + (size_t)b * kBytes;
    uint32_t qh;
    std::memcpy(&qh, blk + (kMin ? 4 : 2), 4);
    const uint8_t* qs = blk + (kMin ? 8 : 6);
    for (int j = 0; j < 16; ++j) {
      u[32 * b + j] = (uint8_t)((qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
      u[32 * b + j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
    const float dv = half(blk);
    set_pair(d, o, b, dv, kMin ? half(blk + 2) : -16.0f * dv);
  }
}

// Q8_0 (d, 32 int8): u = q + 128, o = -128 d.
void unpack_q8_0(const uint8_t* row, int cols, uint8_t* u, float* d, float* o) {
  for (int b = 0; b < cols / 32; ++b) {
    const uint8_t* blk = row + (size_t)b * 34;
    for (int j = 0; j < 32; ++j) u[32 * b + j] = (uint8_t)(blk[2 + j] ^ 0x80);
    const float dv = half(blk);
    set_pair(d, o, b, dv, -128.0f * dv);
  }
}

// Q2_K: scales[16] (low nibble scale, high nibble min per 16 elements), qs[64], d, dmin. Element
// 128h + 32s + j: bits 2s of qs[32h + j].
void unpack_q2_k(const uint8_t* row, int cols, uint8_t* u, float* d, float* o) {
  for (int b = 0; b < cols / 256; ++b) {
    const uint8_t* blk = row + (size_t)b * 84;
    const uint8_t* qs = blk + 16;
    const float dv = half(blk + 80), dmin = half(blk + 82);
    uint8_t* ub = u + 256 * b;
    for (int h = 0; h < 2; ++h) {
      for (int sh = 0; sh < 4; ++sh) {
        for (int j = 0; j < 32; ++j) ub[128 * h + 32 * sh + j] = (qs[32 * h + j] >> (2 * sh)) & 3;
      }
    }
    for (int i = 0; i < 16; ++i) {
      d[16 * b + i] = dv * (float)(blk[i] & 0x0f);
      o[16 * b + i] = -(dmin * (float)(blk[i] >> 4));
    }
  }
}

// Q3_K: hmask[32], qs[64] (low 2 bits as Q2_K), scales[12] (16 6-bit scales stored + 32), d.
// Element 32i + j has its third bit in bit i of hmask[j]; the value is d * sc * (q - 4).
void unpack_q3_k(const uint8_t* row, int cols, uint8_t* u, float* d, float* o) {
  for (int b = 0; b < cols / 256; ++b) {
    const uint8_t* blk = row + (size_t)b * 110;
    const uint8_t *hm = blk, *qs = blk + 32, *s = blk + 96;
    const float dv = half(blk + 108);
    uint8_t* ub = u + 256 * b;
    for (int h = 0; h < 2; ++h) {
      for (int sh = 0; sh < 4; ++sh) {
        for (int j = 0; j < 32; ++j) {
          const int lo = (qs[32 * h + j] >> (2 * sh)) & 3;
          const int hb = (hm[j] >> (4 * h + sh)) & 1;
          ub[128 * h + 32 * sh + j] = (uint8_t)(lo | (hb << 2));
        }
      }
    }
    for (int i = 0; i < 16; ++i) {
      const int lo = i < 8 ? (s[i] & 0x0f) : (s[i - 8] >> 4);
      const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
      const float dl = dv * (float)((lo | (hi << 4)) - 32);
      d[16 * b + i] = dl;
      o[16 * b + i] = -4.0f * dl;
    }
  }
}

// Q4_K (kFive false: d, dmin, scales[12], qs[128]) and Q5_K (d, dmin, scales[12], qh[32],
// qs[128]). Element 64c + 32hi + j: nibble hi of qs[32c + j] (Q5_K: bit 2c + hi of qh[j] on top).
template <bool kFive>
void unpack_q45_k(const uint8_t* row, int cols, uint8_t* u, float* d, float* o) {
  constexpr int kBytes = kFive ? 176 : 144;
  for (int b = 0; b < cols / 256; ++b) {
    const uint8_t* blk = row + (size_t)b * kBytes;
    const uint8_t* qh = blk + 16;
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    const float dv = half(blk), dmin = half(blk + 2);
    uint8_t* ub = u + 256 * b;
    for (int c = 0; c < 4; ++c) {
      for (int j = 0; j < 32; ++j) {
        int lo = qs[32 * c + j] & 0x0f, hi = qs[32 * c + j] >> 4;
        if constexpr (kFive) {
          lo |= ((qh[j] >> (2 * c)) & 1) << 4;
          hi |= ((qh[j] >> (2 * c + 1)) & 1) << 4;
        }
        ub[64 * c + j] = (uint8_t)lo;
        ub[64 * c + 32 + j] = (uint8_t)hi;
      }
    }
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      q4_k_scale_min(blk + 4, s, sc, m);
      set_pair(d + 16 * b, o + 16 * b, s, dv * (float)sc, -(dmin * (float)m));
    }
  }
}

// Q6_K: ql[128], qh[64], scales[16] (int8), d. Element 128h + r: low nibble of ql[64h + r % 64]
// at bit 4 (r / 64), high 2 bits of qh[32h + r % 32] at bit 2 (r / 32); d * sc * (q - 32).
void unpack_q6_k(const uint8_t* row, int cols, uint8_t* u, float* d, float* o) {
  for (int b = 0; b < cols / 256; ++b) {
    const uint8_t* blk = row + (size_t)b * 210;
    const uint8_t *ql = blk, *qh = blk + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const float dv = half(blk + 208);
    uint8_t* ub = u + 256 * b;
    for (int h = 0; h < 2; ++h) {
      const uint8_t *l0 = ql + 64 * h, *l1 = ql + 64 * h + 32, *hh = qh + 32 * h;
      uint8_t* uh = ub + 128 * h;
      for (int j = 0; j < 32; ++j) {
        uh[j] = (uint8_t)((l0[j] & 0x0f) | ((hh[j] & 3) << 4));
        uh[32 + j] = (uint8_t)((l1[j] & 0x0f) | (((hh[j] >> 2) & 3) << 4));
        uh[64 + j] = (uint8_t)((l0[j] >> 4) | (((hh[j] >> 4) & 3) << 4));
        uh[96 + j] = (uint8_t)((l1[j] >> 4) | (((hh[j] >> 6) & 3) << 4));
      }
    }
    for (int i = 0; i < 16; ++i) {
      const float dl = dv * (float)sc[i];
      d[16 * b + i] = dl;
      o[16 * b + i] = -32.0f * dl;
    }
  }
}

// group: the elements that share one scale and offset, 32 for the types whose blocks or
// sub-blocks have 32 (d and o repeat in pairs), else 16. The kernel's float work is once per
// group. u_max: the largest unpacked quant; below 128, AVX2 multiplies with maddubs, whose pair
// sums (at most 2 * 127 * 128) then cannot saturate.
struct Unpacker {
  GgmlType type;
  UnpackRow fn;
  int group;
  int u_max;
};

const Unpacker kUnpackers[] = {
    {GgmlType::Q4_0, unpack_q4<false>, 32, 15},    {GgmlType::Q4_1, unpack_q4<true>, 32, 15},
    {GgmlType::Q5_0, unpack_q5<false>, 32, 31},    {GgmlType::Q5_1, unpack_q5<true>, 32, 31},
    {GgmlType::Q8_0, unpack_q8_0, 32, 255},        {GgmlType::Q2_K, unpack_q2_k, 16, 3},
    {GgmlType::Q3_K, unpack_q3_k, 16, 7},          {GgmlType::Q4_K, unpack_q45_k<false>, 32, 15},
    {GgmlType::Q5_K, unpack_q45_k<true>, 32, 31},  {GgmlType::Q6_K, unpack_q6_k, 16, 63},
};

// maddubs adds byte products in pairs into int16: exact while every quant is below 128.
bool maddubs_exact(const Unpacker& up) { return up.u_max < 128; }

// How many maddubs results (int16 lanes of at most 2 * u_max * 127 in magnitude, the input's
// quants lying in [-127, 127]) can be added in int16 before one madd widens them: the largest
// power of two F <= max_fold with F * 2 * u_max * 127 <= 32767 (Q4_0/Q4_1/Q4_K 8, Q5_* 4,
// Q6_K 2, Q2_K/Q3_K 4 with a group of 16). The sums stay exact, so the results do not change.
int maddubs_fold(const Unpacker& up, int max_fold) {
  int f = 1;
  while (2 * f <= max_fold && 2 * f * 2 * up.u_max * 127 <= 32767) f *= 2;
  return f;
}

const Unpacker* find_unpacker(GgmlType t) {
  for (const Unpacker& e : kUnpackers) {
    if (e.type == t) return &e;
  }
  return nullptr;
}

// Transposes an 8 x 8 matrix of 32-bit elements: rows at src + r * src_stride (bytes),
// written as 8 rows of 32 bytes at dst (column c of the input is row c of the output).
inline void transpose8x8_32(const uint8_t* src, size_t src_stride, uint8_t* dst) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(src + i * src_stride));
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      const __m256 a = t[4 * i + j], b = t[4 * i + j + 2];
      r[4 * i + 2 * j] = _mm256_shuffle_ps(a, b, 0x44);
      r[4 * i + 2 * j + 1] = _mm256_shuffle_ps(a, b, 0xee);
    }
  }
  // r[k] (k < 4): column k of rows 0-3 in the low half, column k + 4 in the high half; r[4 + k]
  // the same for rows 4-7.
  for (int k = 0; k < 4; ++k) {
    const __m256 lo = r[k], hi = r[4 + k];
    _mm256_storeu_ps(reinterpret_cast<float*>(dst + 32 * k), _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(reinterpret_cast<float*>(dst + 32 * (k + 4)), _mm256_permute2f128_ps(lo, hi, 0x31));
  }
}

// One strip of kStrip weight rows, interleaved: wq[32 g + 4 r + k] = u_r[4 g + k] (group g of 4
// elements), wd[8 i + r] and wo[8 i + r] the scale and offset of row r's group i (group
// elements: the type's Unpacker::group). Rows past the matrix's end are zero (scale and offset
// 0). The rows are unpacked one after another into u, d, o ([8][cols], [8][cols / 16]), the
// scales kept once per group, and then transposed 8 x 8 at a time.
struct Strip {
  int group = 16;
  bool narrow = false;  // every quant below 128 (Unpacker::u_max)
  int fold = 1;          // maddubs results added in int16 (maddubs_fold)
  std::vector<uint8_t> wq, u;
  std::vector<float> wd, wo, d, o;
  void unpack(const QMatrix& w, const Unpacker& up, int r0) {
    const int K = w.cols, nb = K / 16, step = up.group / 16, ng = K / up.group;
    group = up.group;
    narrow = maddubs_exact(up);
    fold = narrow ? maddubs_fold(up, up.group / 4) : 1;
    wq.resize((size_t)K * kStrip);
    wd.resize((size_t)ng * kStrip);
    wo.resize((size_t)ng * kStrip);
    u.resize((size_t)K * kStrip);
    d.resize((size_t)nb * kStrip);
    o.resize((size_t)nb * kStrip);
    for (int r = 0; r < kStrip; ++r) {
      uint8_t* ur = u.data() + (size_t)r * K;
      float *dr = d.data() + (size_t)r * nb, *orow = o.data() + (size_t)r * nb;
      if (r0 + r < w.rows) {
        up.fn(w.data + (size_t)(r0 + r) * w.row_bytes, K, ur, dr, orow);
      } else {
        std::fill(ur, ur + K, 0);
        std::fill(dr, dr + nb, 0.0f);
        std::fill(orow, orow + nb, 0.0f);
      }
    }
    // One scale and offset per group, rows of ng (in place: index i * step >= i).
    for (int r = 0; r < kStrip; ++r) {
      for (int i = 0; i < ng; ++i) {
        d[(size_t)r * ng + i] = d[(size_t)r * nb + (size_t)i * step];
        o[(size_t)r * ng + i] = o[(size_t)r * nb + (size_t)i * step];
      }
    }
    // 32-byte chunks of the 8 rows: 8 groups of 4 elements each.
    for (int j = 0; j < K / 32; ++j) transpose8x8_32(u.data() + 32 * j, K, wq.data() + 256 * (size_t)j);
    transpose_floats(d.data(), ng, wd.data());
    transpose_floats(o.data(), ng, wo.data());
  }
  // dst[8 i + r] = src[r * nb + i].
  static void transpose_floats(const float* src, int nb, float* dst) {
    int i = 0;
    for (; i + 8 <= nb; i += 8) {
      transpose8x8_32(reinterpret_cast<const uint8_t*>(src + i), sizeof(float) * nb,
                      reinterpret_cast<uint8_t*>(dst + 8 * i));
    }
    for (; i < nb; ++i) {
      for (int r = 0; r < kStrip; ++r) dst[8 * i + r] = src[(size_t)r * nb + i];
    }
  }
};

// --- the tile kernel ---------------------------------------------------------------------------

// How the tile multiplies bytes: dpbusd (VNNI), maddubs (AVX2, quants below 128) or the wide
// AVX2 form (any quant). All three give the same int32 sums.
enum class Dot { kVnni, kNarrow, kWide };

// acc + per int32 lane the sum of the 4 products of u's unsigned bytes with s's signed ones.
// kNarrow: maddubs adds byte products in pairs into int16, exact while u < 128 (|sum| <=
// 2 * 127 * 128 < 32768), then madd by ones widens pairs of those to int32. kWide: the even and
// the odd bytes widened to int16 and multiplied-added separately (maddubs would saturate at
// u = 255, which Q8_0's u reaches). Both exact like dpbusd.
template <Dot kDot>
inline __m256i dot4(__m256i acc, __m256i u, __m256i s) {
#if CT_QGEMM_VNNI
  if constexpr (kDot == Dot::kVnni) return CT_QGEMM_DPBUSD(acc, u, s);
#endif
  if constexpr (kDot == Dot::kNarrow) {
    const __m256i p16 = _mm256_maddubs_epi16(u, s);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
  }
  const __m256i lo8 = _mm256_set1_epi16(0x00ff);
  const __m256i ue = _mm256_and_si256(u, lo8), uo = _mm256_srli_epi16(u, 8);
  const __m256i se = _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8), so = _mm256_srai_epi16(s, 8);
  return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(ue, se), _mm256_madd_epi16(uo, so)));
}

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Per int32 lane r, the integer dot product of one group (V registers of 4 quants of each of the
// 8 rows) with input row c of a tile of NR rows. kNarrow with F > 1 adds F maddubs results in
// int16 before each madd (exact: maddubs_fold), one madd per F registers instead of one per
// register; otherwise one dot4 per register.
template <Dot kDot, int V, int F, int NR>
inline __m256i group_dot(const __m256i* w, const int8_t* q, int c) {
  static_assert(V % F == 0, "the fold divides the group");
  if constexpr (kDot == Dot::kNarrow && F > 1) {
    __m256i s = _mm256_setzero_si256();
    for (int v0 = 0; v0 < V; v0 += F) {
      __m256i p = _mm256_maddubs_epi16(w[v0], bcast4(q + 4 * (v0 * NR + c)));
      for (int f = 1; f < F; ++f) {
        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[v0 + f], bcast4(q + 4 * ((v0 + f) * NR + c))));
      }
      s = _mm256_add_epi32(s, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    }
    return s;
  } else {
    __m256i s = dot4<kDot>(_mm256_setzero_si256(), w[0], bcast4(q + 4 * c));
    for (int v = 1; v < V; ++v) s = dot4<kDot>(s, w[v], bcast4(q + 4 * (v * NR + c)));
    return s;
  }
}

// The input rows' encoding (qgemv_q8.h's quantise_blocks32x16), stored tile by tile: the rows
// [c0, c0 + nr) of a tile (nr = min(kMaxTile, n - c0)) interleaved like a strip's weights:
// q[c0 K + (g nr + c) 4 + k] = q_c[4g + k], dx[c0 K/32 + b nr + c] (scale of 32-element block b),
// sx[c0 K/16 + i nr + c] (sx16 of 16-element block i) and sx32[c0 K/32 + b nr + c] (block b's
// two sx16 added). A tile reads q, dx and one of sx and sx32 (by the strip's group).
struct Input {
  std::vector<int8_t> q;
  std::vector<float> dx, sx, sx32;
};

// y[c * ldy + r] for the NR input rows of the tile at q, dx, sx (sx16 for G = 16, sx32 for
// G = 32) and r < lanes (the strip's valid rows). G: the strip's group; F: group_dot's fold.
template <Dot kDot, int NR, int G, int F>
void tile(const uint8_t* __restrict wq, const float* __restrict wd, const float* __restrict wo,
          int K, const int8_t* __restrict q, const float* __restrict dx,
          const float* __restrict sx, float* y, int ldy, int lanes) {
  constexpr int V = G / 4;  // weight registers per group: 4 elements of each of the 8 rows
  __m256 acc[NR];
  for (int c = 0; c < NR; ++c) acc[c] = _mm256_setzero_ps();
  for (int i = 0; i < K / G; ++i) {
    __m256i w[V];
    for (int v = 0; v < V; ++v) w[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + 32 * v));
    const __m256 vd = _mm256_loadu_ps(wd), vo = _mm256_loadu_ps(wo);
    for (int c = 0; c < NR; ++c) {
      const __m256i s = group_dot<kDot, V, F, NR>(w, q, c);
      const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(s), vd);
      acc[c] = _mm256_fmadd_ps(t, _mm256_broadcast_ss(dx + c), acc[c]);
      acc[c] = _mm256_fmadd_ps(vo, _mm256_broadcast_ss(sx + c), acc[c]);
    }
    wq += 32 * V;
    wd += kStrip;
    wo += kStrip;
    q += 4 * V * NR;
    sx += NR;
    if (G == 32 || (i & 1)) dx += NR;
  }
  for (int c = 0; c < NR; ++c) {
    float* yc = y + (size_t)c * ldy;
    if (lanes == kStrip) {
      _mm256_storeu_ps(yc, acc[c]);
    } else {
      alignas(32) float tmp[kStrip];
      _mm256_store_ps(tmp, acc[c]);
      std::memcpy(yc, tmp, sizeof(float) * lanes);
    }
  }
}

template <Dot kDot, int F, int NR>
void tile_at(const Strip& st, int K, const Input& in, int c0, float* y, int ldy, int lanes) {
  const int8_t* q = in.q.data() + (size_t)c0 * K;
  const float* dx = in.dx.data() + (size_t)c0 * (K / 32);
  if (st.group == 32) {
    tile<kDot, NR, 32, F>(st.wq.data(), st.wd.data(), st.wo.data(), K, q, dx,
                        in.sx32.data() + (size_t)c0 * (K / 32), y + (size_t)c0 * ldy, ldy, lanes);
  } else {
    // A group of 16 is 4 registers, so its fold is at most 4 (maddubs_fold); the clamp only
    // keeps the unused instantiation valid.
    tile<kDot, NR, 16, (F > 4 ? 4 : F)>(st.wq.data(), st.wd.data(), st.wo.data(), K, q, dx,
                        in.sx.data() + (size_t)c0 * (K / 16), y + (size_t)c0 * ldy, ldy, lanes);
  }
}

// Walks the input rows [c, end) in tiles: f(std::integral_constant<int, NR>{}, c0) for each tile's
// first row c0 and row count NR (kMaxTile, then the rest). c is a multiple of kMaxTile, and so
// is end unless it is n (tiles are laid out from row 0: encode_row).
template <class Tile>
inline void for_each_tile(int c, int end, Tile&& f) {
  using std::integral_constant;
  for (; c + kMaxTile <= end; c += kMaxTile) f(integral_constant<int, kMaxTile>{}, c);
  switch (end - c) {
#if defined(__AVX512VL__)
    case 7: f(integral_constant<int, 7>{}, c); break;
    case 6: f(integral_constant<int, 6>{}, c); break;
    case 5: f(integral_constant<int, 5>{}, c); break;
    case 4: f(integral_constant<int, 4>{}, c); break;
#endif
    case 3: f(integral_constant<int, 3>{}, c); break;
    case 2: f(integral_constant<int, 2>{}, c); break;
    case 1: f(integral_constant<int, 1>{}, c); break;
    default: break;
  }
}

// The input rows [c, end) of one strip.
template <Dot kDot, int F = 1>
void strip_rows_with(const Strip& st, int K, const Input& in, int c, int end, float* y, int ldy,
                     int lanes) {
  for_each_tile(c, end, [&](auto nr, int c0) {
    tile_at<kDot, F, decltype(nr)::value>(st, K, in, c0, y, ldy, lanes);
  });
}

#if CT_QGEMM_PAIR
// The 512-bit form of tile for two strips a and b of the same group: every register holds a's 8
// rows in its low half and b's in its high half, so one dpbusd covers 16 weight rows and each
// input broadcast and float step serves both strips. Per lane it runs tile's operations in
// tile's order (the integer sums are exact, the float steps the same), so the results are the
// bits tile gives for each strip alone.
template <int NR, int G>
void pair_tile(const Strip& a, const Strip& b, int K, const int8_t* __restrict q,
               const float* __restrict dx, const float* __restrict sx, float* ya, float* yb,
               int ldy, int lanes_a, int lanes_b) {
  constexpr int V = G / 4;
  const uint8_t *wqa = a.wq.data(), *wqb = b.wq.data();
  const float *wda = a.wd.data(), *wdb = b.wd.data(), *woa = a.wo.data(), *wob = b.wo.data();
  // The masked (maskz) forms with all lanes kept: GCC 12's unmasked inserts and conversion pass
  // an undefined vector that -Wmaybe-uninitialized reports.
  const auto both = [](const float* lo, const float* hi) {
    const __m512d l = _mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(lo)));
    const __m256d h = _mm256_castps_pd(_mm256_loadu_ps(hi));
    return _mm512_castpd_ps(_mm512_maskz_insertf64x4(0xff, l, h, 1));
  };
  __m512 acc[NR];
  for (int c = 0; c < NR; ++c) acc[c] = _mm512_setzero_ps();
  for (int i = 0; i < K / G; ++i) {
    // Register by register of the group, every input row's sum: NR independent dpbusd chains.
    __m512i s[NR];
    for (int c = 0; c < NR; ++c) s[c] = _mm512_setzero_si512();
    for (int v = 0; v < V; ++v) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wqa + 32 * v));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wqb + 32 * v));
      const __m512i w = _mm512_maskz_inserti64x4(0xff, _mm512_castsi256_si512(lo), hi, 1);
      for (int c = 0; c < NR; ++c) {
        int32_t qv;
        std::memcpy(&qv, q + 4 * (v * NR + c), 4);
        s[c] = _mm512_dpbusd_epi32(s[c], w, _mm512_set1_epi32(qv));
      }
    }
    const __m512 vd = both(wda, wdb), vo = both(woa, wob);
    for (int c = 0; c < NR; ++c) {
      const __m512 t = _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xffff, s[c]), vd);
      acc[c] = _mm512_fmadd_ps(t, _mm512_set1_ps(dx[c]), acc[c]);
      acc[c] = _mm512_fmadd_ps(vo, _mm512_set1_ps(sx[c]), acc[c]);
    }
    wqa += 32 * V;
    wqb += 32 * V;
    wda += kStrip;
    wdb += kStrip;
    woa += kStrip;
    wob += kStrip;
    q += 4 * V * NR;
    sx += NR;
    if (G == 32 || (i & 1)) dx += NR;
  }
  for (int c = 0; c < NR; ++c) {
    alignas(64) float tmp[2 * kStrip];
    _mm512_store_ps(tmp, acc[c]);
    std::memcpy(ya + (size_t)c * ldy, tmp, sizeof(float) * lanes_a);
    std::memcpy(yb + (size_t)c * ldy, tmp + kStrip, sizeof(float) * lanes_b);
  }
}

template <int NR>
void pair_tile_at(const Strip& a, const Strip& b, int K, const Input& in, int c0, float* ya,
                  float* yb, int ldy, int lanes_a, int lanes_b) {
  const int8_t* q = in.q.data() + (size_t)c0 * K;
  const float* dx = in.dx.data() + (size_t)c0 * (K / 32);
  ya += (size_t)c0 * ldy;
  yb += (size_t)c0 * ldy;
  if (a.group == 32) {
    const float* sx = in.sx32.data() + (size_t)c0 * (K / 32);
    pair_tile<NR, 32>(a, b, K, q, dx, sx, ya, yb, ldy, lanes_a, lanes_b);
  } else {
    const float* sx = in.sx.data() + (size_t)c0 * (K / 16);
    pair_tile<NR, 16>(a, b, K, q, dx, sx, ya, yb, ldy, lanes_a, lanes_b);
  }
}

// strip_rows for two strips of the same group at once (pair_tile).
void pair_rows(const Strip& a, const Strip& b, int K, const Input& in, int c, int end, float* ya,
               float* yb, int ldy, int lanes_a, int lanes_b) {
  for_each_tile(c, end, [&](auto nr, int c0) {
    pair_tile_at<decltype(nr)::value>(a, b, K, in, c0, ya, yb, ldy, lanes_a, lanes_b);
  });
}
#endif

// The strip's multiply: VNNI where the path has it, else maddubs for a narrow strip (with its
// int16 fold) unless the path asks for the wide form.
void strip_rows(const Strip& st, int K, const Input& in, int c, int end, float* y, int ldy,
                int lanes, bool vnni, bool wide) {
  if (vnni) {
    strip_rows_with<Dot::kVnni>(st, K, in, c, end, y, ldy, lanes);
  } else if (st.narrow && !wide) {
    switch (st.fold) {
      case 8: strip_rows_with<Dot::kNarrow, 8>(st, K, in, c, end, y, ldy, lanes); break;
      case 4: strip_rows_with<Dot::kNarrow, 4>(st, K, in, c, end, y, ldy, lanes); break;
      case 2: strip_rows_with<Dot::kNarrow, 2>(st, K, in, c, end, y, ldy, lanes); break;
      default: strip_rows_with<Dot::kNarrow, 1>(st, K, in, c, end, y, ldy, lanes); break;
    }
  } else {
    strip_rows_with<Dot::kWide>(st, K, in, c, end, y, ldy, lanes);
  }
}

// Quantises input row c (of n) into its tile's place.
void encode_row(const float* x, int K, int c, int n, Input& in, int8_t* row_q, float* row_d,
                float* row_s) {
  q8::quantise_blocks32x16(x, K, row_q, row_d, row_s);
  const int c0 = c - c % kMaxTile, nr = std::min(kMaxTile, n - c0), j = c - c0;
  int8_t* q = in.q.data() + (size_t)c0 * K;
  float* dx = in.dx.data() + (size_t)c0 * (K / 32);
  float* sx = in.sx.data() + (size_t)c0 * (K / 16);
  float* sx32 = in.sx32.data() + (size_t)c0 * (K / 32);
  for (int g = 0; g < K / 4; ++g) std::memcpy(q + 4 * ((size_t)g * nr + j), row_q + 4 * g, 4);
  for (int b = 0; b < K / 32; ++b) {
    dx[(size_t)b * nr + j] = row_d[b];
    sx32[(size_t)b * nr + j] = row_s[2 * b] + row_s[2 * b + 1];
  }
  for (int i = 0; i < K / 16; ++i) sx[(size_t)i * nr + j] = row_s[i];
}

}  // namespace

bool qgemm_supported(GgmlType t) { return find_unpacker(t) != nullptr; }

bool qgemm_prefers(GgmlType t) {
  const Unpacker* up = find_unpacker(t);
  return up != nullptr && (CT_QGEMM_VNNI || maddubs_exact(*up));
}

int qgemm_max_quant(GgmlType t) {
  const Unpacker* up = find_unpacker(t);
  CT_ASSERT(up != nullptr, "qgemm: no unpacker for type {}", ggml_type_name(t));
  return up->u_max;
}

const char* prefill_kernel_name(PrefillKernel k) {
  switch (k) {
    case PrefillKernel::kQgemm: return "qgemm";
    case PrefillKernel::kQgemmAvx2: return "qgemm-avx2";
    case PrefillKernel::kSgemm: return "sgemm";
  }
  return "?";
}

PrefillKernel default_prefill_kernel() {
  const char* env = std::getenv("CT_PREFILL_KERNEL");
  if (env == nullptr || *env == '\0') {
    return PrefillKernel::kQgemm;
  }
  const std::string v = env;
  for (PrefillKernel k : {PrefillKernel::kQgemm, PrefillKernel::kQgemmAvx2, PrefillKernel::kSgemm}) {
    if (v == prefill_kernel_name(k)) return k;
  }
  CT_THROW("CT_PREFILL_KERNEL is '{}', expected qgemm, qgemm-avx2 or sgemm", v);
}

void qgemm_unpack_row(GgmlType t, const uint8_t* row, int cols, uint8_t* u, float* d, float* o) {
  const Unpacker* up = find_unpacker(t);
  CT_ASSERT(up != nullptr, "qgemm: no unpacker for type {}", ggml_type_name(t));
  up->fn(row, cols, u, d, o);
}

void qgemm_input(const float* x, int cols, float* x_used) {
  CT_ASSERT(cols % 32 == 0, "qgemm_input: {} columns", cols);
  std::vector<int8_t> q(cols);
  std::vector<float> d(cols / 32), sx(cols / 16);
  q8::quantise_blocks32x16(x, cols, q.data(), d.data(), sx.data());
  for (int c = 0; c < cols; ++c) x_used[c] = d[c / 32] * (float)q[c];
}

int qgemm_tile_rows() { return kMaxTile; }

QgemmBlocking qgemm_blocking(int cols, int total_strips) {
  // About 192 KiB of weight quants and 256 KiB of input quants. With their scales (12-25% more
  // for the weights, 25-38% for the input) that is about 0.55-0.65 MiB: inside the 1-2 MiB L2
  // of the cores measured (Zen 4, the Xeon of docs/PERFORMANCE.md), not a 512 KiB one.
  constexpr size_t kWeightBytes = 192 << 10, kInputBytes = 256 << 10;
  const size_t K = (size_t)std::max(cols, 1);
  QgemmBlocking b;
  b.strips = (int)std::clamp<size_t>(kWeightBytes / (K * kStrip), 1, kQgemmMaxBlockStrips);
  b.rows = (int)std::max<size_t>(kMaxTile, kInputBytes / K / kMaxTile * kMaxTile);
  // Aim at 4 blocks per thread, so that a small matrix still spreads over every core.
  const int per = 4 * omp_get_max_threads();
  b.strips = std::max(1, std::min(b.strips, (total_strips + per - 1) / per));
  // With 512-bit VNNI strips run in pairs (pair_tile): an even count leaves none alone.
  if (CT_QGEMM_PAIR && b.strips > 1) b.strips &= ~1;
  return b;
}

void qgemm(const QMatrix* const* ws, int n_mats, const float* x, int n, float* y, int ldy,
           QgemmPath path, const QgemmBlocking* blocking) {
  CT_ASSERT(n_mats >= 1 && n_mats <= kMaxMany && n >= 1, "qgemm: {} matrices, {} rows", n_mats, n);
  const int K = ws[0]->cols;
  const Unpacker* ups[kMaxMany];
  int first_strip[kMaxMany + 1] = {0}, offset[kMaxMany + 1] = {0};
  for (int m = 0; m < n_mats; ++m) {
    ups[m] = find_unpacker(ws[m]->type);
    CT_ASSERT(ups[m] != nullptr && ws[m]->cols == K && K % 32 == 0 &&
                  K % ggml_block_elems(ws[m]->type) == 0,
              "qgemm: type {} with {} cols (first matrix: {} cols)",
              ggml_type_name(ws[m]->type), ws[m]->cols, K);
    offset[m + 1] = offset[m] + ws[m]->rows;
    first_strip[m + 1] = first_strip[m] + (ws[m]->rows + kStrip - 1) / kStrip;
  }
  CT_ASSERT(offset[n_mats] <= ldy, "qgemm: {} output columns in a stride of {}", offset[n_mats], ldy);

  // The calling thread's buffer, shared with the team through this reference (inside the
  // parallel regions `in` would name each worker's own thread_local).
  thread_local Input in;
  Input& input = in;
  input.q.resize((size_t)n * K);
  input.dx.resize((size_t)n * (K / 32));
  input.sx.resize((size_t)n * (K / 16));
  input.sx32.resize((size_t)n * (K / 32));
#pragma omp parallel if ((int64_t)n * K >= (1 << 16))
  {
    thread_local std::vector<int8_t> row_q;
    thread_local std::vector<float> row_d, row_s;
    row_q.resize(K);
    row_d.resize(K / 32);
    row_s.resize(K / 16);
#pragma omp for schedule(static)
    for (int c = 0; c < n; ++c) {
      encode_row(x + (size_t)c * K, K, c, n, input, row_q.data(), row_d.data(), row_s.data());
    }
  }
  const bool vnni = path == QgemmPath::kNative && CT_QGEMM_VNNI;
  const bool wide = path == QgemmPath::kAvx2Wide;
  const int total = first_strip[n_mats];
  const QgemmBlocking blk = blocking != nullptr ? *blocking : qgemm_blocking(K, total);
  CT_ASSERT(blk.strips >= 1 && blk.strips <= kQgemmMaxBlockStrips && blk.rows >= kMaxTile &&
                blk.rows % kMaxTile == 0,
            "qgemm: blocks of {} strips and {} rows", blk.strips, blk.rows);
  const int n_blocks = (total + blk.strips - 1) / blk.strips;
  // Each thread unpacks a block of strips once and walks the input in chunks of blk.rows rows,
  // every strip of the block over one chunk before the next: the block's weights and the chunk's
  // input rows stay in the core's cache (a large prompt's rows would not).
#pragma omp parallel for schedule(static) if (n_blocks >= 2)
  for (int b = 0; b < n_blocks; ++b) {
    const int s0 = b * blk.strips, s1 = std::min(total, s0 + blk.strips);
    thread_local std::vector<Strip> strips;
    if ((int)strips.size() < blk.strips) strips.resize(blk.strips);
    int mat[kQgemmMaxBlockStrips], r0[kQgemmMaxBlockStrips];
    for (int s = s0; s < s1; ++s) {
      int m = 0;
      while (s >= first_strip[m + 1]) ++m;
      mat[s - s0] = m;
      r0[s - s0] = (s - first_strip[m]) * kStrip;
      strips[s - s0].unpack(*ws[m], *ups[m], r0[s - s0]);
    }
    for (int c = 0; c < n; c += blk.rows) {
      const int end = std::min(n, c + blk.rows);
      for (int j = 0; j < s1 - s0; ++j) {
        const int m = mat[j], lanes = std::min(kStrip, ws[m]->rows - r0[j]);
        float* ys = y + offset[m] + r0[j];
#if CT_QGEMM_PAIR
        if (vnni && j + 1 < s1 - s0 && strips[j + 1].group == strips[j].group) {
          const int m1 = mat[j + 1], lanes1 = std::min(kStrip, ws[m1]->rows - r0[j + 1]);
          float* ys1 = y + offset[m1] + r0[j + 1];
          pair_rows(strips[j], strips[j + 1], K, input, c, end, ys, ys1, ldy, lanes, lanes1);
          ++j;
          continue;
        }
#endif
        strip_rows(strips[j], K, input, c, end, ys, ldy, lanes, vnni, wide);
      }
    }
  }
}

}  // namespace ct::cpu
