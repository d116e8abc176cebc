// CPU operators: OpenBLAS for matrix products, AVX2 for the element-wise work, OpenMP across
// attention tiles. The *_ref functions are the plain loops the tests hold the fast ones to.
#include "backend/cpu/ops.h"

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <utility>

#include "backend/cpu/vec.h"
#include "core/error.h"

namespace ct::cpu {

void matmul_wt(const float* x, int m, int k, const float* w, int n, float* y, const float* bias,
               int ldy) {
  if (ldy == 0) ldy = n;
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, x, 1, 0.0f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f, y, ldy);
  }
  if (bias) {
    for (int i = 0; i < m; ++i) {
      float* row = y + (size_t)i * ldy;
      for (int j = 0; j < n; ++j) row[j] += bias[j];
    }
  }
}

void matmul_wt_ref(const float* x, int m, int k, const float* w, int n, float* y, const float* bias,
                   int ldy) {
  if (ldy == 0) ldy = n;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = bias ? bias[j] : 0.0;
      for (int t = 0; t < k; ++t) acc += (double)x[(size_t)i * k + t] * w[(size_t)j * k + t];
      y[(size_t)i * ldy + j] = (float)acc;
    }
  }
}

void rms_norm(const float* x, const float* w, float* y, int m, int d, float eps) {
#pragma omp parallel for if (m > 64)
  for (int i = 0; i < m; ++i) {
    const float* xi = x + (size_t)i * d;
    float* yi = y + (size_t)i * d;
    const float ss = vec_dot(xi, xi, d);
    const float s = 1.0f / std::sqrt(ss / (float)d + eps);
    for (int j = 0; j < d; ++j) yi[j] = xi[j] * s * w[j];
  }
}

void rms_norm_ref(const float* x, const float* w, float* y, int m, int d, float eps) {
  for (int i = 0; i < m; ++i) {
    double ss = 0;
    for (int j = 0; j < d; ++j) ss += (double)x[(size_t)i * d + j] * x[(size_t)i * d + j];
    const double s = 1.0 / std::sqrt(ss / d + eps);
    for (int j = 0; j < d; ++j) y[(size_t)i * d + j] = (float)(x[(size_t)i * d + j] * s * w[j]);
  }
}

Rope::Rope(int head_dim, int n_rot, float theta, RopeStyle style, float freq_scale,
           std::vector<float> freq_factors)
    : head_dim_(head_dim),
      n_rot_(n_rot),
      theta_(theta),
      style_(style),
      freq_scale_(freq_scale),
      freq_factors_(std::move(freq_factors)) {
  CT_ASSERT(n_rot > 0 && n_rot <= head_dim && n_rot % 2 == 0, "n_rot={} head_dim={}", n_rot,
            head_dim);
  CT_ASSERT(freq_factors_.empty() || (int)freq_factors_.size() == n_rot / 2,
            "{} frequency factors for n_rot={}", freq_factors_.size(), n_rot);
  inv_freq_.resize(n_rot / 2);
  for (int i = 0; i < n_rot / 2; ++i) {
    const double ff = freq_factors_.empty() ? 1.0 : freq_factors_[i];
    inv_freq_[i] = (float)(freq_scale * std::pow((double)theta, -2.0 * i / n_rot) / ff);
  }
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id.fetch_add(1);
}

namespace {

// Rotates one head given per-pair cos/sin; pair (i0, i1) indices depend on the style.
inline void rope_head(float* h, const float* cs, const float* sn, int half, int head_dim,
                      RopeStyle style) {
  if (style == RopeStyle::kNorm) {
    for (int i = 0; i < half; ++i) {
      const float x0 = h[2 * i], x1 = h[2 * i + 1];
      h[2 * i] = x0 * cs[i] - x1 * sn[i];
      h[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
    }
  } else {
    const int off = half;  // n_rot/2: rotated dims are [0, n_rot); pairs (i, i + n_rot/2)
    for (int i = 0; i < half; ++i) {
      const float x0 = h[i], x1 = h[i + off];
      h[i] = x0 * cs[i] - x1 * sn[i];
      h[i + off] = x0 * sn[i] + x1 * cs[i];
    }
  }
  (void)head_dim;
}

}  // namespace

void Rope::apply(float* x, int n, int stride, int n_heads, const int32_t* pos) const {
  std::vector<float> cos, sin;
  angle_table(pos, n, cos, sin);
  apply_table(x, n, stride, n_heads, cos.data(), sin.data());
}

void Rope::apply_table(float* x, int n, int stride, int n_heads, const float* cos,
                       const float* sin) const {
  const int half = n_rot_ / 2;
  // A prefill's rows in parallel, as before the table (apply_at_positions stays serial: it runs
  // beside the loader thread, which keeps the other core busy).
#pragma omp parallel for if (n > 16)
  for (int r = 0; r < n; ++r) {
    float* row = x + (size_t)r * stride;
    for (int h = 0; h < n_heads; ++h) {
      rope_head(row + (size_t)h * head_dim_, cos + (size_t)r * half, sin + (size_t)r * half, half,
                head_dim_, style_);
    }
  }
}

void Rope::angle_table(const int32_t* pos, int n, std::vector<float>& cos,
                       std::vector<float>& sin) const {
  const int half = n_rot_ / 2;
  cos.resize((size_t)n * half);
  sin.resize((size_t)n * half);
  float* cs = cos.data();
  float* sn = sin.data();
#pragma omp parallel for if (n > 16)
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < half; ++i) {
      const double ang = (double)pos[r] * inv_freq_[i];
      cs[(size_t)r * half + i] = (float)std::cos(ang);
      sn[(size_t)r * half + i] = (float)std::sin(ang);
    }
  }
}

void Rope::apply_at_positions(float* base, int stride, int n_heads, const int32_t* pos, int n,
                              const float* cos, const float* sin) const {
  const int half = n_rot_ / 2;
  // Deliberately serial: with the angles precomputed a layer's rotation is a fraction of a
  // millisecond, less than what an OpenMP fork/join costs the layer loop when the second core is
  // busy (the loader thread, other processes); measured in docs/PERFORMANCE.md.
  for (int r = 0; r < n; ++r) {
    float* row = base + (size_t)pos[r] * stride;
    for (int h = 0; h < n_heads; ++h) {
      rope_head(row + (size_t)h * head_dim_, cos + (size_t)r * half, sin + (size_t)r * half, half,
                head_dim_, style_);
    }
  }
}

void Rope::apply_ref(float* x, int n, int stride, int n_heads, const int32_t* pos) const {
  const int half = n_rot_ / 2;
  for (int r = 0; r < n; ++r) {
    for (int h = 0; h < n_heads; ++h) {
      float* hd = x + (size_t)r * stride + (size_t)h * head_dim_;
      for (int i = 0; i < half; ++i) {
        // From the definition, not from inv_freq_, so that a wrong table shows up in tests.
        const double ff = freq_factors_.empty() ? 1.0 : freq_factors_[i];
        const double ang =
            (double)pos[r] * freq_scale_ * std::pow((double)theta_, -2.0 * i / n_rot_) / ff;
        const int i0 = style_ == RopeStyle::kNorm ? 2 * i : i;
        const int i1 = style_ == RopeStyle::kNorm ? 2 * i + 1 : i + half;
        const double x0 = hd[i0], x1 = hd[i1];
        hd[i0] = (float)(x0 * std::cos(ang) - x1 * std::sin(ang));
        hd[i1] = (float)(x0 * std::sin(ang) + x1 * std::cos(ang));
      }
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, size_t n) {
  size_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp256_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void silu_mul_ref(const float* gate, const float* up, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = (float)(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void silu_mul_rows(const float* gu, int n, int n_ff, float* h) {
  // More than 16 rows (a prefill's) in parallel; up to 16 (a decode step of that many sequences,
  // a short slice) on the calling thread: the gate and up halves were computed on different
  // cores, so any split moves half the data across, and at 8 rows on 2 threads the fork measured
  // no faster on SmolLM2 and 3% slower on Qwen2.5-1.5B.
#pragma omp parallel for schedule(static) if (n > 16)
  for (int i = 0; i < n; ++i) {
    const float* g = gu + (size_t)i * 2 * n_ff;
    silu_mul(g, g + n_ff, h + (size_t)i * n_ff, n_ff);
  }
}

namespace {

constexpr int kTileQ = 32;    // query rows per tile (times n_rep heads sharing a KV head)
constexpr int kTileK = 256;   // keys per tile
constexpr float kNegBig = -1e30f;

// Row j of KV head g of a cache block (a.k or a.v) as hd floats: in place for an F32 cache, else
// unpacked into tmp. A head is whole blocks of the type (a Q8_0 cache needs hd % 32 == 0).
const float* kv_row(const AttnArgs& a, const void* base, int j, int g, float* tmp) {
  const size_t kvd = (size_t)a.n_kv_head * a.head_dim;
  if (a.kv_dtype == KvDtype::F32) {
    return static_cast<const float*>(base) + (size_t)j * kvd + (size_t)g * a.head_dim;
  }
  const size_t at = (size_t)j * kv_bytes(a.kv_dtype, kvd) + g * kv_bytes(a.kv_dtype, a.head_dim);
  kv_unpack(a.kv_dtype, static_cast<const char*>(base) + at, tmp, a.head_dim);
  return tmp;
}

// Rows [j0, j0 + n) of KV head g of a cache block as F32 [n][hd] in out (a tile for SGEMM).
void kv_tile(const AttnArgs& a, const void* base, int j0, int n, int g, float* out) {
  for (int j = 0; j < n; ++j) {
    float* o = out + (size_t)j * a.head_dim;
    const float* r = kv_row(a, base, j0 + j, g, o);
    if (r != o) std::memcpy(o, r, a.head_dim * sizeof(float));
  }
}

// Adds the attention probabilities of the selected rows (averaged over heads) into probs_accum.
// One parallel region (a barrier costs most on a loaded machine): first, per head, one SGEMM over
// all visible keys and each row's softmax (the tapped rows are few: ProphetKV's query, a chunk's
// last rows), the heads split across threads; then the sums into probs_accum, split by key: every
// key gets its additions in one order (heads, then rows, ascending) whatever the thread count, so
// the result does not depend on it.
void accumulate_probs(const AttnArgs& a) {
  const int hd = a.head_dim, n_rep = a.n_head / a.n_kv_head;
  const int qd = a.n_head * hd;
  const int qs = a.q_stride ? a.q_stride : qd;
  const int r0 = std::max(0, a.probs_from_row), nr = a.n_q - r0;
  if (nr <= 0) return;
  const int n_keys = a.q_pos[a.n_q - 1] + 1;
  const float scale = 1.0f / std::sqrt((float)hd);
  constexpr int kKeyBlock = 256;
  const int n_kb = (n_keys + kKeyBlock - 1) / kKeyBlock;
  const size_t head_cells = (size_t)nr * n_keys;
  std::vector<float> s(head_cells * a.n_head), w((size_t)nr * a.n_head);
#pragma omp parallel if (head_cells * a.n_head >= 65536)
  {
    std::vector<float> qt((size_t)nr * hd), kt(hd);
#pragma omp for schedule(static)
    for (int h = 0; h < a.n_head; ++h) {
      const int g = h / n_rep;
      for (int i = 0; i < nr; ++i) {
        for (int d = 0; d < hd; ++d) {
          qt[(size_t)i * hd + d] = a.q[(size_t)(r0 + i) * qs + (size_t)h * hd + d] * scale;
        }
      }
      float* sh = s.data() + head_cells * h;
      for (int i = 0; i < nr; ++i) {
        float* row = sh + (size_t)i * n_keys;
        const int nv = a.q_pos[r0 + i] + 1;
        for (int j = 0; j < nv; ++j) {
          row[j] = vec_dot(qt.data() + (size_t)i * hd, kv_row(a, a.k, j, g, kt.data()), hd);
        }
        const float mx = vec_max(row + 1, nv - 1, row[0]);
        const float sum = vec_exp_sub_sum(row, nv, mx);
        w[(size_t)h * nr + i] = 1.0f / (sum * a.n_head);
      }
    }
#pragma omp for schedule(static)
    for (int kb = 0; kb < n_kb; ++kb) {
      const int j0 = kb * kKeyBlock, j1 = std::min(n_keys, j0 + kKeyBlock);
      for (int h = 0; h < a.n_head; ++h) {
        for (int i = 0; i < nr; ++i) {
          const float* row = s.data() + head_cells * h + (size_t)i * n_keys;
          const float wi = w[(size_t)h * nr + i];
          const int je = std::min(j1, a.q_pos[r0 + i] + 1);
          for (int j = j0; j < je; ++j) a.probs_accum[j] += row[j] * wi;
        }
      }
    }
  }
}

}  // namespace

namespace {

// The buffers of attention tasks, one set per thread, kept between calls.
struct AttnScratch {
  std::vector<float> qt, st, ot, mt, lt;
  std::vector<float> kt, vt;  // a non-F32 cache's key and value tiles as F32
};

// One task of attention(): query tile qb (kTileQ rows) of a's rows times the n_rep heads sharing KV
// head g, over every key visible to them, with the calling thread's buffers.
void attention_task(const AttnArgs& a, int g, int qb, AttnScratch& t) {
  const int hd = a.head_dim, n_rep = a.n_head / a.n_kv_head;
  const int kvd = a.n_kv_head * hd, qd = a.n_head * hd;
  const int qs = a.q_stride ? a.q_stride : qd;
  const float scale = 1.0f / std::sqrt((float)hd);
  const int max_rows = kTileQ * n_rep;
  if (t.qt.size() < (size_t)max_rows * hd) {
    t.qt.resize((size_t)max_rows * hd);
    t.ot.resize((size_t)max_rows * hd);
  }
  if (t.st.size() < (size_t)max_rows * kTileK) t.st.resize((size_t)max_rows * kTileK);
  if (t.mt.size() < (size_t)max_rows) {
    t.mt.resize(max_rows);
    t.lt.resize(max_rows);
  }
  float *qt = t.qt.data(), *st = t.st.data(), *ot = t.ot.data(), *mt = t.mt.data(),
        *lt = t.lt.data();
  const int r0 = qb * kTileQ, nr = std::min(kTileQ, a.n_q - r0), m = nr * n_rep;
  for (int hl = 0; hl < n_rep; ++hl) {
    const int h = g * n_rep + hl;
    for (int i = 0; i < nr; ++i) {
      const float* src = a.q + (size_t)(r0 + i) * qs + (size_t)h * hd;
      float* dst = qt + (size_t)(hl * nr + i) * hd;
      for (int d = 0; d < hd; ++d) dst[d] = src[d] * scale;
    }
  }
  std::fill(ot, ot + (size_t)m * hd, 0.0f);
  std::fill(mt, mt + m, kNegBig);
  std::fill(lt, lt + m, 0.0f);
  const int kend = a.q_pos[r0 + nr - 1] + 1;  // keys [0, kend) are visible to some row
  // An F32 cache is multiplied in place; the others tile by tile from F32 copies.
  const bool f32 = a.kv_dtype == KvDtype::F32;
  if (!f32 && t.kt.size() < (size_t)kTileK * hd) t.kt.resize((size_t)kTileK * hd);
  if (!f32 && t.vt.size() < (size_t)kTileK * hd) t.vt.resize((size_t)kTileK * hd);
  for (int k0 = 0; k0 < kend; k0 += kTileK) {
    const int nk = std::min(kTileK, kend - k0);
    const float *kt = t.kt.data(), *vt = t.vt.data();
    int ld = hd;
    if (f32) {
      kt = static_cast<const float*>(a.k) + (size_t)k0 * kvd + (size_t)g * hd;
      vt = static_cast<const float*>(a.v) + (size_t)k0 * kvd + (size_t)g * hd;
      ld = kvd;
    } else {
      kv_tile(a, a.k, k0, nk, g, t.kt.data());
      kv_tile(a, a.v, k0, nk, g, t.vt.data());
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, hd, 1.0f, qt, hd, kt, ld, 0.0f, st,
                kTileK);
    for (int row = 0; row < m; ++row) {
      float* s = st + (size_t)row * kTileK;
      const int lim = a.q_pos[r0 + row % nr] - k0 + 1;  // visible keys in this tile
      const int nv = std::clamp(lim, 0, nk);
      if (nv == 0) {
        std::fill(s, s + nk, 0.0f);
        continue;
      }
      const float mx = vec_max(s, nv, mt[row]);
      const float corr = std::exp(mt[row] - mx);
      const float sum = vec_exp_sub_sum(s, nv, mx);
      std::fill(s + nv, s + nk, 0.0f);
      lt[row] = lt[row] * corr + sum;
      mt[row] = mx;
      if (corr != 1.0f) vec_scale(ot + (size_t)row * hd, hd, corr);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hd, nk, 1.0f, st, kTileK, vt, ld, 1.0f,
                ot, hd);
  }
  for (int hl = 0; hl < n_rep; ++hl) {
    const int h = g * n_rep + hl;
    for (int i = 0; i < nr; ++i) {
      const int row = hl * nr + i;
      const float inv = 1.0f / lt[row];
      const float* src = ot + (size_t)row * hd;
      float* dst = a.out + (size_t)(r0 + i) * qd + (size_t)h * hd;
      for (int d = 0; d < hd; ++d) dst[d] = src[d] * inv;
    }
  }
}

// The eight horizontal sums of a[0..7] in one vector (lane i: the sum of a[i]'s lanes), by a
// fixed tree, so each sum's bits depend only on its own vector.
inline __m256 hsum8x8(const __m256* a) {
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// How the one-row kernel reads the cache's type: the bytes of n elements; kGroup, the elements
// that share a scale (a multiple of 16); scale(row, d), that scale for the group holding element
// d; load8(row, d, scale), elements [d, d + 8) (d a multiple of 8) as floats; kStageKeys, whether
// a block of keys is converted to F32 once for all the heads sharing it. Each element
// converts exactly (an F16 element is a float; a Q8_0 element is its block's F16 scale times a
// byte, at most 18 significant bits), so every type's kernel computes bit for bit what the F32
// kernel computes on the unpacked rows.
struct F32Elems {
  static constexpr bool kStageKeys = false;
  static constexpr int kGroup = 16;
  static size_t bytes(int n) { return (size_t)n * 4; }
  static __m256 scale(const uint8_t*, int) { return _mm256_setzero_ps(); }
  static __m256 load8(const uint8_t* row, int d, __m256) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + d);
  }
};
struct F16Elems {
  static constexpr bool kStageKeys = false;
  static constexpr int kGroup = 16;
  static size_t bytes(int n) { return (size_t)n * 2; }
  static __m256 scale(const uint8_t*, int) { return _mm256_setzero_ps(); }
  static __m256 load8(const uint8_t* row, int d, __m256) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * d)));
  }
};
struct Q8Elems {  // blocks of 32: an F16 scale, 32 signed bytes
  static constexpr bool kStageKeys = true;  // conversion costs more than a reload: stage the keys
  static constexpr int kGroup = 32;
  static size_t bytes(int n) { return (size_t)n / 32 * 34; }
  static __m256 scale(const uint8_t* row, int d) {
    uint16_t h;
    std::memcpy(&h, row + (size_t)(d >> 5) * 34, 2);
    return _mm256_set1_ps(_cvtsh_ss(h));
  }
  static __m256 load8(const uint8_t* row, int d, __m256 scale) {
    const uint8_t* q = row + (size_t)(d >> 5) * 34 + 2 + (d & 31);
    const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), scale);
  }
};

// out[h] = sum over the n keys of p[h][j] * v_j, for G heads at once, 16 elements of the head at
// a time (2G accumulators), keys in ascending order; then times inv[h]. E: the cache's type (v's
// rows are `stride` bytes apart).
template <int G, class E>
void value_sums(const float* p, int ld_p, const uint8_t* v, size_t stride, int n, int hd,
                const float* inv, float* out, int ld_out) {
  for (int d = 0; d < hd; d += 16) {
    __m256 acc[G][2];
    for (int h = 0; h < G; ++h) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
    for (int j = 0; j < n; ++j) {
      const uint8_t* vj = v + (size_t)j * stride;
      const __m256 s = E::scale(vj, d);  // [d, d + 16) lies in one group
      const __m256 v0 = E::load8(vj, d, s), v1 = E::load8(vj, d + 8, s);
      for (int h = 0; h < G; ++h) {
        const __m256 pj = _mm256_broadcast_ss(p + (size_t)h * ld_p + j);
        acc[h][0] = _mm256_fmadd_ps(pj, v0, acc[h][0]);
        acc[h][1] = _mm256_fmadd_ps(pj, v1, acc[h][1]);
      }
    }
    for (int h = 0; h < G; ++h) {
      const __m256 s = _mm256_set1_ps(inv[h]);
      _mm256_storeu_ps(out + (size_t)h * ld_out + d, _mm256_mul_ps(acc[h][0], s));
      _mm256_storeu_ps(out + (size_t)h * ld_out + d + 8, _mm256_mul_ps(acc[h][1], s));
    }
  }
}

// The scores of 8 keys (rows kj[u] of type E, one head's hd elements each) for n_rep query heads
// (qt [n_rep][hd], pre-scaled): st[h * ld + u] = q_h . k_u, each an 8-lane accumulation over the
// head in ascending order folded by hsum8x8's fixed tree.
template <class E>
void score_keys(const float* qt, int n_rep, int hd, const uint8_t* const* kj, float* st, int ld) {
  for (int h = 0; h < n_rep; ++h) {
    const float* qh = qt + (size_t)h * hd;
    __m256 acc[8];
    for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 8) {
      const __m256 qv = _mm256_loadu_ps(qh + d);
      for (int u = 0; u < 8; ++u) {
        acc[u] = _mm256_fmadd_ps(qv, E::load8(kj[u], d, E::scale(kj[u], d)), acc[u]);
      }
    }
    _mm256_storeu_ps(st + (size_t)h * ld, hsum8x8(acc));
  }
}

// Whether a task of one query row takes attention_row(): its head size must be whole groups of
// the type (16 elements; Q8_0's 32, which attention() asserts) (64 and 128 in the models served).
bool row_kernel_fits(const AttnArgs& a) { return a.head_dim % 16 == 0; }

// A task of one query row (row r; a decode step's row, or a tile's single row): the n_rep heads
// sharing KV head g, scored against every visible key directly, one softmax over the whole row,
// then the value sums. At one row the two SGEMMs of attention_task cost mostly their fixed
// overhead. Each score is one 8-lane accumulation over the head folded by a fixed tree, and each
// output element adds the keys in ascending order, so the result depends on the row alone.
// E: the cache's type (its elements converted as they are loaded).
template <class E>
void attention_row(const AttnArgs& a, int g, int r, AttnScratch& t) {
  const int hd = a.head_dim, n_rep = a.n_head / a.n_kv_head;
  const int kvd = a.n_kv_head * hd, qd = a.n_head * hd;
  const int qs = a.q_stride ? a.q_stride : qd;
  const float scale = 1.0f / std::sqrt((float)hd);
  const int n = a.q_pos[r] + 1, ld = (n + 7) / 8 * 8;
  if (t.qt.size() < (size_t)n_rep * hd) t.qt.resize((size_t)n_rep * hd);
  if (t.st.size() < (size_t)n_rep * ld) t.st.resize((size_t)n_rep * ld);
  if (t.lt.size() < (size_t)n_rep) t.lt.resize(n_rep);
  if (E::kStageKeys && t.kt.size() < (size_t)8 * hd) t.kt.resize((size_t)8 * hd);
  float *qt = t.qt.data(), *st = t.st.data(), *inv = t.lt.data();
  const float* q = a.q + (size_t)r * qs + (size_t)g * n_rep * hd;
  for (int i = 0; i < n_rep * hd; ++i) qt[i] = q[i] * scale;
  const size_t stride = E::bytes(kvd), head_bytes = E::bytes(hd);
  const uint8_t* kg = static_cast<const uint8_t*>(a.k) + g * head_bytes;
  const uint8_t* vg = static_cast<const uint8_t*>(a.v) + g * head_bytes;
  for (int j0 = 0; j0 < n; j0 += 8) {
    const uint8_t* kj[8];
    for (int u = 0; u < 8; ++u) kj[u] = kg + (size_t)std::min(j0 + u, n - 1) * stride;
    // The rows are kvd elements apart, so the hardware prefetchers see short runs: fetch the next
    // block's keys into L1 and this block's values into L2 for the value sums.
    for (int u = 0; u < 8 && j0 + 8 + u < n; ++u) {
      const char* kn = (const char*)(kg + (size_t)(j0 + 8 + u) * stride);
      for (size_t b = 0; b < head_bytes; b += 64) _mm_prefetch(kn + b, _MM_HINT_T0);
    }
    for (int u = 0; u < 8 && j0 + u < n; ++u) {
      const char* vn = (const char*)(vg + (size_t)(j0 + u) * stride);
      for (size_t b = 0; b < head_bytes; b += 64) _mm_prefetch(vn + b, _MM_HINT_T1);
    }
    if constexpr (E::kStageKeys) {
      // The 8 keys converted once into F32 (exactly), then scored by the F32 loop for every head
      // sharing them, instead of converting them again for each head.
      float* ks = t.kt.data();
      const uint8_t* kf[8];
      for (int u = 0; u < 8; ++u) {
        for (int d = 0; d < hd; d += E::kGroup) {
          const __m256 s = E::scale(kj[u], d);
          for (int c = 0; c < E::kGroup; c += 8) {
            _mm256_storeu_ps(ks + (size_t)u * hd + d + c, E::load8(kj[u], d + c, s));
          }
        }
        kf[u] = reinterpret_cast<const uint8_t*>(ks + (size_t)u * hd);
      }
      score_keys<F32Elems>(qt, n_rep, hd, kf, st + j0, ld);
    } else {
      score_keys<E>(qt, n_rep, hd, kj, st + j0, ld);
    }
  }
  for (int h = 0; h < n_rep; ++h) {
    float* s = st + (size_t)h * ld;
    const float mx = vec_max(s + 1, n - 1, s[0]);
    inv[h] = 1.0f / vec_exp_sub_sum(s, n, mx);
  }
  float* out = a.out + (size_t)r * qd + (size_t)g * n_rep * hd;
  for (int h0 = 0; h0 < n_rep; h0 += 4) {
    const float* p = st + (size_t)h0 * ld;
    float* o = out + (size_t)h0 * hd;
    switch (std::min(4, n_rep - h0)) {
      case 4: value_sums<4, E>(p, ld, vg, stride, n, hd, inv + h0, o, hd); break;
      case 3: value_sums<3, E>(p, ld, vg, stride, n, hd, inv + h0, o, hd); break;
      case 2: value_sums<2, E>(p, ld, vg, stride, n, hd, inv + h0, o, hd); break;
      default: value_sums<1, E>(p, ld, vg, stride, n, hd, inv + h0, o, hd); break;
    }
  }
}

}  // namespace

void attention(const AttnArgs* args, int n_args) {
  // The tasks of every call in one parallel region: (call, query tile, KV head), each computed
  // exactly as the call alone would compute it.
  std::vector<int> first(n_args + 1, 0);
  for (int c = 0; c < n_args; ++c) {
    const AttnArgs& a = args[c];
    CT_ASSERT(kv_cache_type(a.kv_dtype) && a.head_dim % kv_block_elems(a.kv_dtype) == 0,
              "attention over a {} K/V cache with heads of {}", kv_dtype_name(a.kv_dtype),
              a.head_dim);
    first[c + 1] = first[c] + (a.n_q + kTileQ - 1) / kTileQ * a.n_kv_head;
  }
  const int n_task = first[n_args];
#pragma omp parallel if (n_task > 1)
  {
    thread_local AttnScratch scratch;
#pragma omp for schedule(dynamic)
    for (int task = 0; task < n_task; ++task) {
      const int c = (int)(std::upper_bound(first.begin(), first.end(), task) - first.begin()) - 1;
      const AttnArgs& a = args[c];
      const int local = task - first[c];
      const int g = local % a.n_kv_head, qb = local / a.n_kv_head;
      // A tile of one row (every decode task) by the direct kernel: the choice depends on the
      // row's own call, never on which other calls share the region.
      if (qb * kTileQ + 1 == a.n_q && row_kernel_fits(a)) {
        switch (a.kv_dtype) {
          case KvDtype::F16: attention_row<F16Elems>(a, g, qb * kTileQ, scratch); break;
          case KvDtype::Q8_0: attention_row<Q8Elems>(a, g, qb * kTileQ, scratch); break;
          default: attention_row<F32Elems>(a, g, qb * kTileQ, scratch); break;
        }
      } else {
        attention_task(a, g, qb, scratch);
      }
    }
  }
  for (int c = 0; c < n_args; ++c) {
    if (args[c].probs_accum) accumulate_probs(args[c]);
  }
}

void attention(const AttnArgs& a) { attention(&a, 1); }

void attention_ref(const AttnArgs& a) {
  const int hd = a.head_dim, n_rep = a.n_head / a.n_kv_head;
  const int qd = a.n_head * hd;
  const int qs = a.q_stride ? a.q_stride : qd;
  const double scale = 1.0 / std::sqrt((double)hd);
  std::vector<double> s, o(hd);
  std::vector<float> row(hd);
  for (int r = 0; r < a.n_q; ++r) {
    const int p = a.q_pos[r];
    s.resize(p + 1);
    for (int h = 0; h < a.n_head; ++h) {
      const int g = h / n_rep;
      const float* q = a.q + (size_t)r * qs + (size_t)h * hd;
      double mx = -1e300;
      for (int j = 0; j <= p; ++j) {
        double acc = 0;
        const float* k = kv_row(a, a.k, j, g, row.data());
        for (int d = 0; d < hd; ++d) acc += (double)q[d] * k[d];
        s[j] = acc * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int j = 0; j <= p; ++j) sum += (s[j] = std::exp(s[j] - mx));
      std::fill(o.begin(), o.end(), 0.0);
      for (int j = 0; j <= p; ++j) {
        const float* v = kv_row(a, a.v, j, g, row.data());
        for (int d = 0; d < hd; ++d) o[d] += s[j] / sum * v[d];
      }
      for (int d = 0; d < hd; ++d) a.out[(size_t)r * qd + (size_t)h * hd + d] = (float)o[d];
      if (a.probs_accum && r >= a.probs_from_row) {
        for (int j = 0; j <= p; ++j) a.probs_accum[j] += (float)(s[j] / sum / a.n_head);
      }
    }
  }
}

}  // namespace ct::cpu
