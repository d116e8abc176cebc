// CPU operators against their plain-loop references: SGEMM, RMSNorm, RoPE, SiLU, tiled attention
// (odd sizes, GQA, sparse query positions, probability taps).
#include "backend/cpu/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/qgemm.h"
#include "backend/cpu/qgemv.h"
#include "backend/cpu/vec.h"
#include "core/fp16.h"
#include "core/ggml_types.h"
#include "support/quant_fixture.h"
#include "support/random_data.h"

namespace ct::cpu {
namespace {

using test::max_abs_diff;
using test::randn;

TEST(Ops, MatmulMatchesReference) {
  for (int m : {1, 3, 37}) {
    const int k = 45, n = 29;
    auto x = randn((size_t)m * k, 1), w = randn((size_t)n * k, 2), b = randn(n, 3);
    std::vector<float> y(m * n), yr(m * n);
    matmul_wt(x.data(), m, k, w.data(), n, y.data(), b.data());
    matmul_wt_ref(x.data(), m, k, w.data(), n, yr.data(), b.data());
    EXPECT_LT(max_abs_diff(y, yr), 1e-4f) << "m=" << m;
  }
}

TEST(Ops, MatmulWithRowStrideFillsAColumnBlock) {
  // The output head is multiplied in slices of its rows: each slice fills columns [c0, c0 + n)
  // of rows ldy floats apart and leaves the other columns alone.
  const int m = 6, k = 40, n = 9, ldy = 25, c0 = 11;
  auto x = randn((size_t)m * k, 60), w = randn((size_t)n * k, 61), b = randn(n, 62);
  std::vector<float> dense(m * n);
  matmul_wt_ref(x.data(), m, k, w.data(), n, dense.data(), b.data());
  for (bool ref : {false, true}) {
    std::vector<float> y((size_t)m * ldy, -7.0f);
    (ref ? matmul_wt_ref : matmul_wt)(x.data(), m, k, w.data(), n, y.data() + c0, b.data(), ldy);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < ldy; ++j) {
        const float got = y[(size_t)i * ldy + j];
        if (j < c0 || j >= c0 + n) {
          ASSERT_EQ(got, -7.0f) << "row " << i << " column " << j << (ref ? " (ref)" : "");
        } else {
          ASSERT_NEAR(got, dense[(size_t)i * n + j - c0], 1e-4f) << "row " << i << " col " << j;
        }
      }
    }
  }
}

TEST(Ops, RmsNormMatchesReference) {
  const int m = 7, d = 33;
  auto x = randn(m * d, 4), w = randn(d, 5);
  std::vector<float> y(m * d), yr(m * d);
  rms_norm(x.data(), w.data(), y.data(), m, d, 1e-5f);
  rms_norm_ref(x.data(), w.data(), yr.data(), m, d, 1e-5f);
  EXPECT_LT(max_abs_diff(y, yr), 1e-5f);
}

TEST(Ops, SiluMulMatchesReference) {
  auto g = randn(1000, 6, 4.0f), u = randn(1000, 7);
  auto gr = g;
  std::vector<float> out(g.size());
  silu_mul(g.data(), u.data(), out.data(), g.size());
  silu_mul_ref(gr.data(), u.data(), gr.data(), gr.size());
  EXPECT_LT(max_abs_diff(out, gr), 1e-5f);
  // The row form: the same bits as the one-row kernel, row by row, serial (decode rows) or
  // parallel (more than 16 rows).
  for (int n : {1, 3, 9, 20}) {
    const int F = 1000 / 2;
    std::vector<float> gu(g.begin(), g.begin() + 2 * F), stacked, rows((size_t)n * F);
    for (int i = 0; i < n; ++i) stacked.insert(stacked.end(), gu.begin(), gu.end());
    for (int i = 0; i < n; ++i) std::rotate(stacked.begin() + (size_t)i * 2 * F,
                                            stacked.begin() + (size_t)i * 2 * F + i,
                                            stacked.begin() + (size_t)(i + 1) * 2 * F);
    silu_mul_rows(stacked.data(), n, F, rows.data());
    for (int i = 0; i < n; ++i) {
      std::vector<float> one(F);
      const float* r = stacked.data() + (size_t)i * 2 * F;
      silu_mul(r, r + F, one.data(), F);
      for (int j = 0; j < F; ++j) ASSERT_EQ(rows[(size_t)i * F + j], one[j]) << n << " " << i;
    }
  }
}

TEST(Ops, Exp256IsAccurate) {
  for (float x = -80.0f; x < 80.0f; x += 0.37f) {
    alignas(32) float in[8], out[8];
    for (int i = 0; i < 8; ++i) in[i] = x + i * 0.01f;
    _mm256_store_ps(out, exp256_ps(_mm256_load_ps(in)));
    for (int i = 0; i < 8; ++i) {
      const double ref = std::exp((double)in[i]);
      EXPECT_NEAR(out[i] / ref, 1.0, 2e-6) << in[i];
    }
  }
}

TEST(Ops, VecMaxEqualsTheScalarLoop) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 30.0f);
  for (int n = 0; n <= 70; ++n) {
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<float> s(n);
      for (float& x : s) x = nd(rng);
      // The largest element anywhere: first, inside a vector, in the tail; or the start value.
      if (n > 0 && rep < 3) s[rep == 0 ? 0 : rep == 1 ? n / 2 : n - 1] = 1e3f + (float)rep;
      const float start = rep == 3 ? 2e3f : -1e30f;
      if (rep == 2) {  // every score negative but zeros of both signs: the maximum is a zero
        for (float& x : s) x = -std::fabs(x) - 1.0f;
        for (int i = 0; i < n; i += 5) s[i] = i % 2 ? -0.0f : 0.0f;
      }
      float want = start;
      for (float x : s) want = std::max(want, x);
      ASSERT_EQ(vec_max(s.data(), n, start), want) << n << " " << rep;
    }
  }
}

TEST(Ops, RopeMatchesReferenceBothStyles) {
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    Rope rope(16, 16, 10000.0f, style);
    const int n = 5, heads = 3, stride = 16 * heads + 7;
    auto x = randn((size_t)n * stride, 8);
    auto xr = x;
    std::vector<int32_t> pos = {0, 1, 17, 300, 4095};
    rope.apply(x.data(), n, stride, heads, pos.data());
    rope.apply_ref(xr.data(), n, stride, heads, pos.data());
    EXPECT_LT(max_abs_diff(x, xr), 1e-4f);
  }
}

TEST(Ops, RopeAtPositionsMatchesReferenceBothStyles) {
  // Deferred RoPE: rows scattered over a position-indexed buffer, rotated in place with a
  // precomputed angle table; rows between them stay untouched.
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    Rope rope(16, 12, 10000.0f, style);  // partial rotation: dims [12, 16) are not rotated
    const int n_ctx = 900, n = 200, heads = 3, stride = 16 * heads;
    std::vector<int32_t> pos;
    for (int i = 0; i < n; ++i) pos.push_back(3 + 4 * i + (i % 3));  // increasing, gapped
    const auto x = randn((size_t)n_ctx * stride, 10);
    auto got = x;
    std::vector<float> cs, sn;
    rope.angle_table(pos.data(), n, cs, sn);
    rope.apply_at_positions(got.data(), stride, heads, pos.data(), n, cs.data(), sn.data());
    std::vector<float> rows((size_t)n * stride);
    for (int r = 0; r < n; ++r) {
      std::copy_n(x.begin() + (size_t)pos[r] * stride, stride, rows.begin() + (size_t)r * stride);
    }
    rope.apply_ref(rows.data(), n, stride, heads, pos.data());
    auto want = x;
    for (int r = 0; r < n; ++r) {
      std::copy_n(rows.begin() + (size_t)r * stride, stride,
                  want.begin() + (size_t)pos[r] * stride);
    }
    EXPECT_LT(max_abs_diff(got, want), 1e-4f) << (style == RopeStyle::kNorm ? "norm" : "neox");
  }
}

TEST(Ops, RopeIsARotationComposingOverPositions) {
  // Rotating by p then by q equals rotating by p + q: the property deferred RoPE relies on.
  Rope rope(8, 8, 10000.0f, RopeStyle::kNorm);
  auto x = randn(8, 9);
  auto a = x, b = x;
  int32_t p = 100, q = 23, pq = 123;
  rope.apply(a.data(), 1, 8, 1, &p);
  rope.apply(a.data(), 1, 8, 1, &q);
  rope.apply(b.data(), 1, 8, 1, &pq);
  EXPECT_LT(max_abs_diff(a, b), 1e-4f);
}

struct AttnCase {
  int n_ctx, n_q, n_head, n_kv, hd;
  bool sparse;
};

class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, TiledMatchesReference) {
  const AttnCase c = GetParam();
  const int kvd = c.n_kv * c.hd, qd = c.n_head * c.hd;
  auto k = randn((size_t)c.n_ctx * kvd, 10), v = randn((size_t)c.n_ctx * kvd, 11);
  auto q = randn((size_t)c.n_q * qd, 12, 2.0f);
  std::vector<int32_t> pos(c.n_q);
  std::mt19937 rng(13);
  if (c.sparse) {  // increasing, irregular positions ending at the last cache row
    std::vector<int32_t> all(c.n_ctx);
    for (int i = 0; i < c.n_ctx; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end() - 1, rng);
    all.resize(c.n_q - 1);
    all.push_back(c.n_ctx - 1);
    std::sort(all.begin(), all.end());
    pos = all;
  } else {
    for (int i = 0; i < c.n_q; ++i) pos[i] = c.n_ctx - c.n_q + i;
  }
  // The live cache's types: an F16 or Q8_0 cache's rows are read as stored (tiles converted for
  // SGEMM, the direct kernel converting as it loads, the reference element by element). Q8_0
  // blocks must not straddle heads: head sizes of whole 32-element blocks only.
  for (KvDtype t : {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0}) {
    if (c.hd % kv_block_elems(t) != 0) continue;
    SCOPED_TRACE(kv_dtype_name(t));
    std::vector<uint8_t> kt(kv_bytes(t, k.size())), vt(kv_bytes(t, v.size()));
    kv_pack(t, k.data(), kt.data(), k.size());
    kv_pack(t, v.data(), vt.data(), v.size());
    std::vector<float> out(c.n_q * qd), outr(c.n_q * qd), pa(c.n_ctx, 0.f), par(c.n_ctx, 0.f);
    AttnArgs a;
    a.q = q.data();
    a.q_pos = pos.data();
    a.n_q = c.n_q;
    a.k = kt.data();
    a.v = vt.data();
    a.kv_dtype = t;
    a.n_head = c.n_head;
    a.n_kv_head = c.n_kv;
    a.head_dim = c.hd;
    a.out = out.data();
    a.probs_accum = pa.data();
    a.probs_from_row = c.n_q - 2;
    attention(a);
    a.out = outr.data();
    a.probs_accum = par.data();
    attention_ref(a);
    EXPECT_LT(max_abs_diff(out, outr), 2e-5f);
    EXPECT_LT(max_abs_diff(pa, par), 1e-5f);
    double total = 0;
    for (float p : pa) total += p;
    EXPECT_NEAR(total, std::min(2, c.n_q), 1e-4);  // each tapped row adds a distribution
    if (t != KvDtype::F32) {
      // Every element converts exactly, so the kernels give the F32 kernels' bits on the
      // unpacked rows: bit for bit in our one-row kernel; through the BLAS SGEMM of a tile
      // (converted tiles have another leading dimension than the F32 cache, which a BLAS may
      // block differently) to its rounding.
      std::vector<float> ku(k.size()), vu(v.size()), outu(c.n_q * qd), out32(c.n_q * qd);
      kv_unpack(t, kt.data(), ku.data(), k.size());
      kv_unpack(t, vt.data(), vu.data(), v.size());
      a.k = ku.data();
      a.v = vu.data();
      a.kv_dtype = KvDtype::F32;
      a.out = outu.data();
      a.probs_accum = nullptr;
      attention(a);
      if (c.n_q == 1) {
        EXPECT_EQ(0, std::memcmp(out.data(), outu.data(), out.size() * sizeof(float)));
      } else {
        EXPECT_LT(max_abs_diff(out, outu), 1e-6f);
      }
      // The rounding of K and V moves the result by about the type's precision, no more.
      a.k = k.data();
      a.v = v.data();
      a.out = out32.data();
      attention_ref(a);
      EXPECT_LT(max_abs_diff(outr, out32), t == KvDtype::F16 ? 5e-3f : 6e-2f);
      EXPECT_GT(max_abs_diff(outr, out32), 0.0f);  // the stored rows were read, not the F32 ones
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(AttnCase{1, 1, 2, 1, 8, false},
                                           AttnCase{70, 70, 4, 2, 16, false},
                                           AttnCase{300, 33, 6, 2, 12, false},
                                           AttnCase{600, 45, 9, 3, 64, true},
                                           AttnCase{530, 530, 3, 3, 8, false},
                                           // one-row tasks (the direct kernel): decode rows, a
                                           // prefill's last single-row tile, head sizes 16/64/128,
                                           // 1 to 7 heads per KV head, fewer keys than 8
                                           AttnCase{5, 1, 7, 1, 64, false},
                                           AttnCase{300, 1, 9, 3, 64, false},
                                           AttnCase{1000, 1, 14, 2, 64, false},
                                           AttnCase{77, 1, 4, 4, 128, false},
                                           AttnCase{90, 33, 6, 2, 16, false},
                                           AttnCase{700, 65, 12, 2, 128, true}));

// The direct one-row kernel against the tiled SGEMM path it replaces for one-row tasks: a row at
// the end of a 32-row tile (tiled) and the same row as a call of its own (direct) agree to float
// rounding, and a batch of one-row calls gives each call's bits alone.
TEST(Attention, OneRowKernelMatchesTiledPathAndIsBatchIndependent) {
  const int n_ctx = 400, n_head = 9, n_kv = 3, hd = 64, kvd = n_kv * hd, qd = n_head * hd;
  auto k = randn((size_t)n_ctx * kvd, 20), v = randn((size_t)n_ctx * kvd, 21);
  auto q = randn((size_t)32 * qd, 22, 2.0f);
  std::vector<int32_t> pos(32);
  for (int i = 0; i < 32; ++i) pos[i] = n_ctx - 32 + i;
  auto args = [&](int row0, int nq, float* out) {
    AttnArgs a;
    a.q = q.data() + (size_t)row0 * qd;
    a.q_pos = pos.data() + row0;
    a.n_q = nq;
    a.k = k.data();
    a.v = v.data();
    a.n_head = n_head;
    a.n_kv_head = n_kv;
    a.head_dim = hd;
    a.out = out;
    return a;
  };
  for (KvDtype t : {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0}) {
    SCOPED_TRACE(kv_dtype_name(t));
    std::vector<uint8_t> kt(kv_bytes(t, k.size())), vt(kv_bytes(t, v.size()));
    kv_pack(t, k.data(), kt.data(), k.size());
    kv_pack(t, v.data(), vt.data(), v.size());
    auto typed = [&](AttnArgs a) {
      a.k = kt.data();
      a.v = vt.data();
      a.kv_dtype = t;
      return a;
    };
    std::vector<float> tiled((size_t)32 * qd), alone((size_t)32 * qd), batched((size_t)32 * qd);
    attention(typed(args(0, 32, tiled.data())));
    std::vector<AttnArgs> calls;
    for (int i = 0; i < 32; ++i) {
      attention(typed(args(i, 1, alone.data() + (size_t)i * qd)));
      calls.push_back(typed(args(i, 1, batched.data() + (size_t)i * qd)));
    }
    attention(calls.data(), (int)calls.size());
    EXPECT_LT(max_abs_diff(tiled, alone), 2e-5f);
    EXPECT_EQ(0, std::memcmp(alone.data(), batched.data(), alone.size() * sizeof(float)));
  }
}

// kv_pack's vector path (8 at a time) gives f32_to_fp16's bits on every value but NaN payloads:
// normals, ties, subnormal results, overflow to infinity, signed zeros; and kv_unpack undoes it.
TEST(KvPack, F16VectorPathEqualsScalarConversion) {
  std::mt19937 rng(5);
  // The special values first, so that they take the vector path (the last n % 8 go scalar).
  std::vector<float> x = {0.0f,       -0.0f,      65519.99f,     65520.0f,     -65520.0f,
                          1.0f + 1.0f / 2048,     INFINITY,      -INFINITY,    5.9604645e-8f,
                          2.9802322e-8f, 2.9802326e-8f, -8.940697e-8f, 6.1035156e-5f,
                          6.1035152e-5f, 1.0f + 3.0f / 4096, 1.0f + 1.0f / 4096};
  for (float e : {1e-9f, 3e-8f, 6e-5f, 1e-3f, 1.0f, 300.0f, 65504.0f, 70000.0f}) {
    std::uniform_real_distribution<float> u(-e, e);
    for (int i = 0; i < 203; ++i) x.push_back(u(rng));
  }
  std::vector<uint16_t> h(x.size());
  kv_pack(KvDtype::F16, x.data(), h.data(), x.size());
  std::vector<float> back(x.size());
  kv_unpack(KvDtype::F16, h.data(), back.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i], f32_to_fp16(x[i])) << "x[" << i << "] = " << x[i];
    const float want = fp16_to_f32(h[i]);
    ASSERT_EQ(std::memcmp(&back[i], &want, 4), 0) << "unpacking x[" << i << "]";
  }
}

// kv_pack's Q8_0 vector path gives ggml's reference quantiser's bytes (core/ggml_types.cc, itself
// checked against gguf-py in ggml_types_test.cc): one scale max|x| / 127 per block of 32, quants
// rounded half away from zero (ties built exactly: a block whose largest value is 127 has scale
// 1, so x.5 is a tie), zero blocks, tiny and huge scales; kv_unpack gives the reference's floats.
TEST(KvPack, Q8VectorPathEqualsReferenceQuantiser) {
  std::vector<float> x = {127.0f, 2.5f, -2.5f, 0.5f,  -0.5f, 1.5f, 126.5f, -126.5f,
                          3.5f,   -3.5f, 0.49999997f, 64.5f, -64.5f, 0.0f, -0.0f, 100.5f};
  for (int i = 0; i < 16; ++i) x.push_back(-(float)i - 0.5f);  // the rest of the tie block
  for (int i = 0; i < 32; ++i) x.push_back(0.0f);              // a zero block: scale 0
  for (int i = 0; i < 32; ++i) x.push_back(i % 2 ? 1e-38f : -3e-39f);  // 1 / scale overflows
  std::mt19937 rng(8);
  for (float e : {1e-30f, 1e-6f, 1e-2f, 1.0f, 3.0f, 1e4f, 6e5f}) {
    std::uniform_real_distribution<float> u(-e, e);
    for (int i = 0; i < 32 * 7; ++i) x.push_back(u(rng));
  }
  ASSERT_EQ(x.size() % 32, 0u);
  std::vector<uint8_t> got(kv_bytes(KvDtype::Q8_0, x.size())), want(got.size());
  ASSERT_EQ(got.size(), x.size() / 32 * 34);
  kv_pack(KvDtype::Q8_0, x.data(), got.data(), x.size());
  ggml_from_f32(GgmlType::Q8_0, x.data(), want.data(), (int64_t)x.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "byte " << i << " (block " << i / 34 << ")";
  }
  EXPECT_EQ(static_cast<int8_t>(got[2 + 1]), 3);    // 2.5 -> 3, not the even 2
  EXPECT_EQ(static_cast<int8_t>(got[2 + 2]), -3);   // -2.5 -> -3
  EXPECT_EQ(static_cast<int8_t>(got[2 + 10]), 0);   // 0.49999997 stays below the tie
  std::vector<float> back(x.size()), ref(x.size());
  kv_unpack(KvDtype::Q8_0, got.data(), back.data(), x.size());
  ggml_to_f32_ref(GgmlType::Q8_0, want.data(), ref.data(), (int64_t)x.size());
  EXPECT_EQ(0, std::memcmp(back.data(), ref.data(), back.size() * sizeof(float)));
}

}  // namespace
}  // namespace ct::cpu

namespace ct::cpu {
namespace {

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                              GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                              GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                              GgmlType::Q6_K};

// Byte offsets of the fp16 fields in one block: the scale d, then the min where the type has one.
std::vector<int> fp16_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q8_0:
      return {0};
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
      return {0, 2};
    case GgmlType::Q2_K:
      return {80, 82};
    case GgmlType::Q3_K:
      return {108};
    case GgmlType::Q6_K:
      return {208};
    default:
      return {};
  }
}

std::vector<uint8_t> encode_matrix(GgmlType t, const std::vector<float>& wf, int rows, int cols) {
  const size_t rb = ggml_row_bytes(t, cols);
  std::vector<uint8_t> packed(rb * rows);
  for (int r = 0; r < rows; ++r) {
    ggml_from_f32(t, wf.data() + (size_t)r * cols, packed.data() + r * rb, cols);
  }
  return packed;
}

// The scale the kernels' float rounding is relative to, per row: sum_c |w_rc x_c| with w the
// dequantised row; for types with a min (element d*q + m or d*sc*q - dmin*m, computed by the
// kernels as d*sum(q*x) + m*sum(x)) the two terms count separately, sum_c (|d q| + |m|) |x_c|,
// found by dequantising the row with the min, then the scale, set to zero.
std::vector<double> term_magnitudes(const QMatrix& w, const float* x) {
  const std::vector<int> fields = fp16_fields(w.type);
  const size_t bb = ggml_block_bytes(w.type);
  std::vector<double> mag(w.rows);
  std::vector<float> a(w.cols), b(w.cols);
  for (int r = 0; r < w.rows; ++r) {
    const uint8_t* row = w.data + (size_t)r * w.row_bytes;
    if (fields.size() < 2) {
      ggml_to_f32_ref(w.type, row, a.data(), w.cols);
      std::fill(b.begin(), b.end(), 0.0f);
    } else {
      std::vector<uint8_t> only_d(row, row + w.row_bytes), only_m = only_d;
      for (size_t blk = 0; blk < w.row_bytes / bb; ++blk) {
        std::memset(&only_d[blk * bb + fields[1]], 0, 2);
        std::memset(&only_m[blk * bb + fields[0]], 0, 2);
      }
      ggml_to_f32_ref(w.type, only_d.data(), a.data(), w.cols);
      ggml_to_f32_ref(w.type, only_m.data(), b.data(), w.cols);
    }
    for (int c = 0; c < w.cols; ++c) {
      mag[r] += (std::fabs((double)a[c]) + std::fabs((double)b[c])) * std::fabs((double)x[c]);
    }
  }
  return mag;
}

// The activation blocks of the 8-bit kernels (qgemv_input): 32 elements for the types with
// 32-element blocks, 256 for the K-quants; 0 for the types on F32 kernels.
int activation_block(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q8_0:
      return 32;
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return 256;
    default:
      return 0;
  }
}

// Per row, sum_c |w_rc| * |x_c - x_used_c| (w dequantised): how far the product with the rounded
// input can be from the product with x.
std::vector<double> rounding_bound(const QMatrix& w, const float* x, const float* x_used) {
  std::vector<double> bound(w.rows, 0.0);
  std::vector<float> row(w.cols);
  for (int r = 0; r < w.rows; ++r) {
    ggml_to_f32_ref(w.type, w.data + (size_t)r * w.row_bytes, row.data(), w.cols);
    for (int c = 0; c < w.cols; ++c) {
      bound[r] += std::fabs((double)row[c]) * std::fabs((double)x[c] - x_used[c]);
    }
  }
  return bound;
}

// Every decode path (qgemv under kNative, kAvx2, kF32) and the generic dequantise-and-dot path
// (qgemv_dequant) against the double-precision reference (qgemv_ref) and, where given, against
// expected values computed elsewhere (`expected` with x, `expected_of` recomputing them for
// another input). The kernels sum in float, in another order than the reference, so a relative
// bound of 2e-6 (about 16 float ulps) is float rounding; a layout mistake is an error of the order
// of the magnitude itself. With 8-bit activations, for every row:
//   |y - ref(W, x_used)| <= kRelTol * magnitude(x_used) + abs_tol       (the kernel's arithmetic)
//   |y - ref(W, x)|      <= the same + sum_c |w_c| |x_c - x_used_c|     (the input's rounding)
// where x_used (qgemv_input) is x rounded to 8 bits per block of 32 or 256 elements, each
// element within half a step (max|x| over its block / 254) of x, which is checked too. kAvx2
// must equal kNative bit for bit (VNNI only changes how exact integer sums are formed).
constexpr double kRelTol = 2e-6;
void expect_kernels_match_reference(
    const QMatrix& w, const float* x, double abs_tol, const std::string& what,
    const std::vector<double>* expected = nullptr,
    const std::function<std::vector<double>(const float*)>& expected_of = nullptr) {
  std::vector<float> yd(w.rows), yr(w.rows);
  qgemv_dequant(w, x, yd.data());
  qgemv_ref(w, x, yr.data());
  const auto mag = term_magnitudes(w, x);
  for (int r = 0; r < w.rows; ++r) {
    ASSERT_LE(std::fabs((double)yd[r] - yr[r]), kRelTol * mag[r] + abs_tol)
        << what << " row " << r << ": dequant path " << yd[r] << " vs reference " << yr[r];
  }
  std::vector<float> y_native;
  for (QgemvPath path : {QgemvPath::kNative, QgemvPath::kAvx2, QgemvPath::kF32}) {
    const std::string p = what + (path == QgemvPath::kNative ? " native"
                                  : path == QgemvPath::kAvx2 ? " avx2"
                                                             : " f32");
    std::vector<float> y(w.rows), x_used(w.cols), yu(w.rows);
    qgemv(w, x, y.data(), path);
    qgemv_input(w.type, x, w.cols, x_used.data(), path);
    const int blk = path == QgemvPath::kF32 ? 0 : activation_block(w.type);
    for (int c0 = 0; blk > 0 && c0 < w.cols; c0 += blk) {
      double amax = 0;
      for (int c = c0; c < c0 + blk; ++c) amax = std::max(amax, std::fabs((double)x[c]));
      for (int c = c0; c < c0 + blk; ++c) {
        ASSERT_LE(std::fabs((double)x[c] - x_used[c]), amax / 254 * (1 + 1e-6))
            << p << " element " << c << ": " << x[c] << " rounded to " << x_used[c];
      }
    }
    if (blk == 0) {
      for (int c = 0; c < w.cols; ++c) ASSERT_EQ(x_used[c], x[c]) << p;
    }
    qgemv_ref(w, x_used.data(), yu.data());
    const auto mag_u = term_magnitudes(w, x_used.data());
    const auto bound = rounding_bound(w, x, x_used.data());
    std::vector<double> expected_u;
    if (expected_of) expected_u = expected_of(x_used.data());
    for (int r = 0; r < w.rows; ++r) {
      const double tol = kRelTol * mag_u[r] + abs_tol;
      ASSERT_LE(std::fabs((double)y[r] - yu[r]), tol)
          << p << " row " << r << ": kernel " << y[r] << " vs reference on its input " << yu[r];
      ASSERT_LE(std::fabs((double)y[r] - yr[r]), tol + bound[r])
          << p << " row " << r << ": kernel " << y[r] << " vs reference " << yr[r];
      if (expected != nullptr) {
        ASSERT_LE(std::fabs((double)y[r] - (*expected)[r]), tol + bound[r])
            << p << " row " << r << ": kernel " << y[r] << " vs expected " << (*expected)[r];
      }
      if (expected_of) {
        ASSERT_LE(std::fabs((double)y[r] - expected_u[r]), tol)
            << p << " row " << r << ": kernel " << y[r] << " vs expected on its input "
            << expected_u[r];
      }
    }
    if (path == QgemvPath::kNative) y_native = y;
    if (path == QgemvPath::kAvx2) {
      for (int r = 0; r < w.rows; ++r) ASSERT_EQ(y[r], y_native[r]) << p << " row " << r;
    }
  }
}

TEST(QGemv, MatchesDequantisedReferenceForEveryType) {
  // 512 columns: two K-quant super-blocks, sixteen 32-element blocks (the 32-element kernels work
  // on four blocks at a time); for those types also 608 columns (19 blocks: the last group
  // overlaps the one before) and 96 (3 blocks: one short group).
  const int rows = 70;
  for (GgmlType t : kAllTypes)
  for (int cols : ggml_block_elems(t) == 32 ? std::vector<int>{512, 608, 96} : std::vector<int>{512}) {
    const auto wf = randn((size_t)rows * cols, 30, 0.5f);
    const auto packed = encode_matrix(t, wf, rows, cols);
    QMatrix w{t, packed.data(), rows, cols, ggml_row_bytes(t, cols)};
    ASSERT_TRUE(qgemv_supported(t)) << ggml_type_name(t);
    auto x = randn(cols, 31);
    expect_kernels_match_reference(w, x.data(), 1e-6, ggml_type_name(t) + " cols " + std::to_string(cols));
    // The quantised product stays close to the F32 one (catches a kernel and reference that
    // agree on a wrong layout only if the encoder shares the mistake; the fixture tests rule
    // that out).
    std::vector<float> y(rows), yf(rows);
    qgemv(w, x.data(), y.data());
    matmul_wt_ref(x.data(), 1, cols, wf.data(), rows, yf.data());
    double err = 0, sig = 0;
    for (int r = 0; r < rows; ++r) {
      err += (double)(y[r] - yf[r]) * (y[r] - yf[r]);
      sig += (double)yf[r] * yf[r];
    }
    EXPECT_LT(err / sig, t == GgmlType::Q2_K ? 0.25 : 0.05) << ggml_type_name(t);
  }
}

TEST(QGemv, MatchesReferenceOnRandomBlocks) {
  // Random bytes reach every quant, scale and min pattern (negative Q6_K and Q3_K scales, the
  // largest 6-bit scales, set and clear high bits) that an encoder may never produce; only the
  // fp16 fields (byte offsets per block) are set to finite values in [-1, 1]. F16/BF16 rows are
  // random bit patterns without inf/nan (and for BF16 below 2^64), at a width that is a multiple of
  // 16 and at one that leaves a tail of 13 elements.
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> scale(-1.0f, 1.0f);
  for (GgmlType t : kAllTypes) {
    if (t == GgmlType::F32) continue;
    const bool plain = ggml_block_elems(t) == 1;
    for (int cols : plain ? std::vector<int>{768, 781} : std::vector<int>{768}) {
      const int rows = 40;
      const size_t rb = ggml_row_bytes(t, cols), bb = ggml_block_bytes(t);
      std::vector<uint8_t> packed(rb * rows);
      for (uint8_t& v : packed) v = (uint8_t)rng();
      if (plain) {
        for (size_t i = 0; i + 1 < packed.size(); i += 2) {
          uint16_t h;
          std::memcpy(&h, &packed[i], 2);
          if (t == GgmlType::F16 && (h & 0x7c00) == 0x7c00) h &= (uint16_t)~0x4000;
          // BF16: exponents up to 2^64 (not 2^127), so that sums of 781 products stay finite.
          if (t == GgmlType::BF16 && (h & 0x4000) != 0) h &= (uint16_t)~0x2000;
          std::memcpy(&packed[i], &h, 2);
        }
      }
      for (size_t blk = 0; blk < packed.size() / bb; ++blk) {
        for (int off : fp16_fields(t)) {
          const uint16_t h = f32_to_fp16(scale(rng));
          std::memcpy(&packed[blk * bb + off], &h, 2);
        }
      }
      QMatrix w{t, packed.data(), rows, cols, rb};
      const auto x = randn(cols, 78);
      // F16/BF16 values reach down to subnormals: the relative bound only.
      expect_kernels_match_reference(w, x.data(), plain ? 0.0 : 1e-6,
                                     ggml_type_name(t) + " cols " + std::to_string(cols));
    }
  }
}

TEST(QGemv, MatchesGgufPyOnFixtureBlocks) {
  // The gguf-py fixture's decode records (random bytes with fp16 scales from 2^-20 to 2^3, both
  // signs; F16/BF16 random bit patterns) as matrices of one block per row (64-element rows for
  // F16/BF16, 32 for F32), against gguf.quants' own dequantised floats dotted in double: an
  // expectation independent of our dequantisers. Only relative bounds, as the scales are tiny.
  std::set<GgmlType> seen;
  for (const test::QuantFixtureRecord& rec : test::read_quant_fixture()) {
    if (rec.kind != 0) continue;
    const GgmlType t = rec.type;
    const int be = (int)ggml_block_elems(t);
    const int n = (int)rec.floats.size();
    const int cols = be > 1 ? be : (t == GgmlType::F32 ? 32 : 64);
    ASSERT_EQ(n % cols, 0) << ggml_type_name(t);
    const int rows = n / cols;
    ASSERT_EQ(rec.bytes.size(), ggml_row_bytes(t, cols) * rows) << ggml_type_name(t);
    seen.insert(t);
    QMatrix w{t, rec.bytes.data(), rows, cols, ggml_row_bytes(t, cols)};
    const auto x = randn(cols, 90 + (uint32_t)t, 0.5f);  // BF16 blocks reach 1.3e37
    auto expected_of = [&](const float* xv) {
      std::vector<double> e(rows, 0.0);
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < cols; ++c) e[r] += (double)rec.floats[(size_t)r * cols + c] * xv[c];
      }
      return e;
    };
    const std::vector<double> expected = expected_of(x.data());
    expect_kernels_match_reference(w, x.data(), 0.0, ggml_type_name(t) + " (gguf-py fixture)",
                                   &expected, expected_of);
  }
  for (GgmlType t : kAllTypes) {
    EXPECT_TRUE(seen.count(t)) << "no fixture blocks for " << ggml_type_name(t);
  }
}

TEST(QGemv, EightBitInputHandlesZeroAndOutlierBlocks) {
  // Inputs the rounding must survive: an all-zero block (scale 0), a block that is one spike
  // (every other element rounds to 0), tiny values (1e-30) and large ones (1e30 would overflow the
  // products, so 1e15), at 512 columns (two K-quant super-blocks, sixteen 32-element blocks).
  const int rows = 24, cols = 512;
  auto x = randn(cols, 91);
  for (int c = 0; c < 32; ++c) x[c] = 0.0f;
  x[40] = 3000.0f;
  for (int c = 64; c < 96; ++c) x[c] *= 1e-30f;
  for (int c = 256; c < 288; ++c) x[c] *= 1e15f;
  for (GgmlType t : kAllTypes) {
    if (activation_block(t) == 0) continue;
    const auto wf = randn((size_t)rows * cols, 92, 0.5f);
    const auto packed = encode_matrix(t, wf, rows, cols);
    QMatrix w{t, packed.data(), rows, cols, ggml_row_bytes(t, cols)};
    expect_kernels_match_reference(w, x.data(), 0.0, ggml_type_name(t) + " zero/outlier input");
  }
}

TEST(QGemv, ManyEqualsSeparateCallsBitForBit) {
  // Matrices of different types and heights sharing one input, as Q/K/V or gate/up do.
  const int cols = 256;
  const GgmlType types[3] = {GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q6_K};
  const int rows[3] = {70, 33, 5};
  std::vector<std::vector<uint8_t>> packed(3);
  QMatrix w[3];
  for (int m = 0; m < 3; ++m) {
    const auto wf = randn((size_t)rows[m] * cols, 40 + m, 0.5f);
    const size_t rb = ggml_row_bytes(types[m], cols);
    packed[m].resize(rb * rows[m]);
    for (int r = 0; r < rows[m]; ++r) {
      ggml_from_f32(types[m], wf.data() + (size_t)r * cols, packed[m].data() + r * rb, cols);
    }
    w[m] = QMatrix{types[m], packed[m].data(), rows[m], cols, rb};
  }
  const auto x = randn(cols, 50);
  std::vector<float> sep[3], many[3];
  for (int m = 0; m < 3; ++m) {
    sep[m].resize(rows[m]);
    many[m].resize(rows[m]);
    qgemv(w[m], x.data(), sep[m].data());
  }
  const QMatrix* ws[3] = {&w[0], &w[1], &w[2]};
  float* ys[3] = {many[0].data(), many[1].data(), many[2].data()};
  qgemv_many(ws, ys, 3, x.data());
  for (int m = 0; m < 3; ++m) EXPECT_EQ(many[m], sep[m]) << ggml_type_name(types[m]);
}

// A decode step over several sequences: two stacked matrices of types t0 and t1 (76 weight rows:
// the OpenMP team quantises the inputs and builds the lane tiles inside the product's region),
// row counts up to kMaxBatchRows, each output row equal to qgemv_many on that input row alone,
// and the AVX2 path's bits equal to the native one's.
void check_batch_rows(GgmlType t0, GgmlType t1, int cols) {
  const GgmlType types[2] = {t0, t1};
  const int rows[2] = {67, 9};
  std::vector<std::vector<uint8_t>> packed(2);
  QMatrix w[2];
  for (int m = 0; m < 2; ++m) {
    const GgmlType t = types[m];
    const auto wf = randn((size_t)rows[m] * cols, 70 + m, 0.5f);
    const size_t rb = ggml_row_bytes(t, cols);
    packed[m].resize(rb * rows[m]);
    for (int r = 0; r < rows[m]; ++r) {
      ggml_from_f32(t, wf.data() + (size_t)r * cols, packed[m].data() + r * rb, cols);
    }
    w[m] = QMatrix{t, packed[m].data(), rows[m], cols, rb};
  }
  const QMatrix* ws[2] = {&w[0], &w[1]};
  for (int n : {1, 2, 3, 4, 5, 7, 8, 13, kMaxBatchRows}) {
    const auto x = randn((size_t)n * cols, 80 + n);
    const int stride = rows[0] + rows[1] + 3;  // padded rows stay untouched
    std::vector<float> y((size_t)n * stride, -7.0f), y_avx2((size_t)n * stride, -7.0f);
    qgemv_batch(ws, 2, x.data(), n, y.data(), stride);
    // The AVX2 path (the only one on an AVX2-only machine) gives the same bits.
    qgemv_batch(ws, 2, x.data(), n, y_avx2.data(), stride, QgemvPath::kAvx2);
    ASSERT_EQ(y_avx2, y) << " n=" << n;
    for (int i = 0; i < n; ++i) {
      std::vector<float> a(rows[0]), b(rows[1]);
      float* ys[2] = {a.data(), b.data()};
      qgemv_many(ws, ys, 2, x.data() + (size_t)i * cols);
      for (int r = 0; r < rows[0]; ++r) {
        ASSERT_EQ(y[(size_t)i * stride + r], a[r]) << " n=" << n;
      }
      for (int r = 0; r < rows[1]; ++r) {
        ASSERT_EQ(y[(size_t)i * stride + rows[0] + r], b[r]) << " n=" << n;
      }
      for (int r = rows[0] + rows[1]; r < stride; ++r) {
        ASSERT_EQ(y[(size_t)i * stride + r], -7.0f);
      }
    }
  }
}

TEST(QGemv, BatchRowsEqualSingleRowCallsBitForBit) {
  // Every type; the 32-element types also at 544 columns (17 blocks: four full groups of four and
  // a last block alone) and at 64 (2 blocks: fewer than the lane tiles' four build parts).
  for (GgmlType t : kAllTypes) {
    const bool b32 = ggml_block_elems(t) == 32;
    for (int cols : b32 ? std::vector<int>{512, 544, 64} : std::vector<int>{512}) {
      SCOPED_TRACE(std::string(ggml_type_name(t)) + " cols=" + std::to_string(cols));
      check_batch_rows(t, t, cols);
      if (HasFatalFailure()) return;
    }
  }
  // Stacks of different input formats in one call: 32- and 256-element 8-bit kernels, and a
  // kernel on float inputs with their sums (Q2_K, Q5_1).
  const GgmlType pairs[][2] = {{GgmlType::Q4_1, GgmlType::Q4_K},
                               {GgmlType::Q8_0, GgmlType::Q6_K},
                               {GgmlType::Q5_0, GgmlType::Q2_K},
                               {GgmlType::Q5_1, GgmlType::Q4_0}};
  for (const auto& p : pairs) {
    SCOPED_TRACE(std::string(ggml_type_name(p[0])) + "+" + ggml_type_name(p[1]));
    check_batch_rows(p[0], p[1], 512);
    if (HasFatalFailure()) return;
  }
}

// Random blocks of type t (every quant, scale and min pattern; fp16 fields finite in [-1, 1]).
std::vector<uint8_t> random_blocks(GgmlType t, int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(-1.0f, 1.0f);
  const size_t rb = ggml_row_bytes(t, cols), bb = ggml_block_bytes(t);
  std::vector<uint8_t> packed(rb * rows);
  for (uint8_t& v : packed) v = (uint8_t)rng();
  for (size_t blk = 0; blk < packed.size() / bb; ++blk) {
    for (int off : fp16_fields(t)) {
      const uint16_t h = f32_to_fp16(scale(rng));
      std::memcpy(&packed[blk * bb + off], &h, 2);
    }
  }
  return packed;
}

TEST(QGemv, SideLinesGiveEveryLineOnceInOrder) {
  // The rows of a product, taken in order, fetch each line of each span exactly once (the spans'
  // lines from their own start, an empty span none), whether the rows outnumber the lines or not.
  std::vector<char> mem(1 << 16);
  const SidePrefetch::Span spans[] = {{mem.data(), 0},
                                      {mem.data() + 1, 40},
                                      {mem.data() + 100, 0},
                                      {mem.data() + 4096, 50 * 64 - 7},
                                      {mem.data() + 999, 129},
                                      {mem.data() + 5, 0}};
  std::vector<const char*> want;
  for (const auto& sp : spans) {
    for (size_t i = 0; i < (sp.bytes + 63) / 64; ++i) {
      want.push_back(static_cast<const char*>(sp.p) + 64 * i);
    }
  }
  ASSERT_EQ(want.size(), 1u + 50u + 3u);
  const SidePrefetch side{spans, 6};
  SideLines lines;
  lines.reset(&side);
  EXPECT_EQ(lines.size(), want.size());
  for (int total : {1, 7, 54, 70, 20000}) {
    std::vector<const char*> got;
    for (int t = 0; t < total; ++t) {
      lines.each_of_row(t, total, [&](const char* line) { got.push_back(line); });
    }
    EXPECT_EQ(got, want) << "total=" << total;
  }
  lines.reset(nullptr);
  EXPECT_EQ(lines.size(), 0u);
}

TEST(QGemv, SidePrefetchChangesNoResult) {
  // Spans of every shape the fetch loop walks: empty ones (at the start, between, at the end), one
  // shorter than a cache line, an unaligned start, and in all far more lines than output rows
  // (several lines per row) or far fewer (most rows fetch none); one row and 8 (the lane form).
  const int rows = 70, cols = 256;
  const GgmlType t = GgmlType::Q4_1;
  auto packed = random_blocks(t, rows, cols, 50);
  const QMatrix w{t, packed.data(), rows, cols, ggml_row_bytes(t, cols)};
  const QMatrix* ws[1] = {&w};
  std::vector<char> mem(1 << 20);
  for (size_t lines : {size_t{3}, size_t{5000}}) {
    const SidePrefetch::Span spans[] = {{mem.data(), 0},
                                        {mem.data() + 1, 40},
                                        {mem.data() + 100, 0},
                                        {mem.data() + 4096, lines * 64 - 7},
                                        {mem.data() + 999, 0}};
    const SidePrefetch side{spans, 5};
    for (int n : {1, 8}) {
      auto x = randn((size_t)n * cols, 51 + n);
      std::vector<float> plain((size_t)n * rows), fetched((size_t)n * rows, -1.0f);
      qgemv_batch(ws, 1, x.data(), n, plain.data(), rows);
      qgemv_batch(ws, 1, x.data(), n, fetched.data(), rows, QgemvPath::kNative, &side);
      ASSERT_EQ(fetched, plain) << "lines=" << lines << " n=" << n;
      if (n == 1) {
        std::vector<float> many(rows, -1.0f);
        float* ys[1] = {many.data()};
        qgemv_many(ws, ys, 1, x.data(), QgemvPath::kNative, &side);
        ASSERT_EQ(many, plain) << "lines=" << lines;
      }
    }
  }
}

TEST(QGemv, MultiRowFormsEqualOneRowFormOnEveryQuantPattern) {
  // Random blocks reach every quant (Q8_0's -128 included; every K-quant scale, min and high-bit
  // pattern) and the inputs their +-127 ends (one element per 32 is the block's largest): 8, 13
  // and 16 rows against each row alone, under both paths, and the two paths' batches against
  // each other. The 32-element types run the lane form (a full tile, and one of 5 that falls
  // back); the K-quants run tiles of 8 rows (512-bit sums where the build has AVX-512 VNNI) and
  // of 4.
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const int rows = 37, cols = ggml_block_elems(t) == 32 ? 320 : 512;
    auto packed = random_blocks(t, rows, cols, 93);
    const size_t rb = ggml_row_bytes(t, cols);
    const QMatrix w{t, packed.data(), rows, cols, rb};
    const QMatrix* ws[1] = {&w};
    for (int n : {8, 13, 16}) {
      auto x = randn((size_t)n * cols, 94 + n);
      for (int i = 0; i < n; ++i) x[(size_t)i * cols + 7] = i % 2 ? 40.0f : -40.0f;
      std::vector<float> y_native;
      for (QgemvPath path : {QgemvPath::kNative, QgemvPath::kAvx2}) {
        std::vector<float> y((size_t)n * rows);
        qgemv_batch(ws, 1, x.data(), n, y.data(), rows, path);
        for (int i = 0; i < n; ++i) {
          std::vector<float> one(rows);
          qgemv(w, x.data() + (size_t)i * cols, one.data(), path);
          for (int r = 0; r < rows; ++r) {
            ASSERT_EQ(y[(size_t)i * rows + r], one[r])
                << ggml_type_name(t) << " n=" << n << " row " << i << " out " << r;
          }
        }
        if (path == QgemvPath::kNative) {
          y_native = y;
        } else {
          ASSERT_EQ(y, y_native) << ggml_type_name(t) << " n=" << n << ": AVX2 against native";
        }
      }
    }
  }
}

TEST(QGemm, UnpackedRowsEqualTheReferenceDequantiser) {
  // d * u + o per element against ggml_to_f32_ref: two float roundings apart at most.
  const int cols = 512;
  for (GgmlType t : kAllTypes) {
    if (!qgemm_supported(t)) {
      EXPECT_EQ(ggml_block_elems(t), 1) << ggml_type_name(t) << " is quantised but has no unpacker";
      continue;
    }
    const auto packed = random_blocks(t, 4, cols, 90);
    const size_t rb = ggml_row_bytes(t, cols);
    std::vector<uint8_t> u(cols);
    std::vector<float> d(cols / 16), o(cols / 16), ref(cols);
    int u_seen = 0;
    for (int r = 0; r < 4; ++r) {
      qgemm_unpack_row(t, packed.data() + r * rb, cols, u.data(), d.data(), o.data());
      for (int e = 0; e < cols; ++e) u_seen = std::max(u_seen, (int)u[e]);
      ggml_to_f32_ref(t, packed.data() + r * rb, ref.data(), cols);
      for (int e = 0; e < cols; ++e) {
        const double v = (double)d[e / 16] * u[e] + o[e / 16];
        const double mag = std::fabs((double)d[e / 16] * u[e]) + std::fabs((double)o[e / 16]);
        ASSERT_LE(std::fabs(v - ref[e]), 2.4e-7 * mag + 1e-30)
            << ggml_type_name(t) << " row " << r << " element " << e << ": u " << (int)u[e]
            << " d " << d[e / 16] << " o " << o[e / 16] << " ref " << ref[e];
      }
    }
    // The quant bound the AVX2 kernel's choice of maddubs rests on, and random blocks reach it.
    EXPECT_EQ(u_seen, qgemm_max_quant(t)) << ggml_type_name(t);
  }
}

TEST(QGemm, MatchesReferenceOnRandomBlocksForEveryType) {
  // Every quantised type, 37 rows (four strips of 8 and a partial one), input row counts around
  // the tile sizes. Against the double-precision reference on the rounded input (qgemm_input):
  // |y - ref| <= kRelTol * sum_e (|d u| + |o|) |x_used| (float rounding; a layout mistake is of
  // the order of the magnitude). The input's rounding is checked as in qgemv's test. kAvx2
  // (maddubs for the types whose quants stay below 128) and kAvx2Wide equal kNative bit for bit,
  // and so does kNative with all five strips in one block (with 512-bit VNNI: two pairs of strips
  // in pair_tile and the partial strip alone), whatever blocking the thread count gave first.
  const int rows = 37, cols = 512;
  const QgemmBlocking one_block{5, qgemm_tile_rows()};
  for (GgmlType t : kAllTypes) {
    if (!qgemm_supported(t)) continue;
    const auto packed = random_blocks(t, rows, cols, 91);
    const QMatrix w{t, packed.data(), rows, cols, ggml_row_bytes(t, cols)};
    const QMatrix* ws[1] = {&w};
    for (int n : {1, 3, 8, 13, 21}) {
      const auto x = randn((size_t)n * cols, 92 + n);
      std::vector<float> y((size_t)n * rows), y_avx2((size_t)n * rows), y_wide((size_t)n * rows);
      qgemm(ws, 1, x.data(), n, y.data(), rows);
      qgemm(ws, 1, x.data(), n, y_avx2.data(), rows, QgemmPath::kAvx2);
      qgemm(ws, 1, x.data(), n, y_wide.data(), rows, QgemmPath::kAvx2Wide);
      ASSERT_EQ(y_avx2, y) << ggml_type_name(t) << " cols=" << cols << " n=" << n;
      ASSERT_EQ(y_wide, y) << ggml_type_name(t) << " n=" << n;
      std::vector<float> y_block((size_t)n * rows);
      qgemm(ws, 1, x.data(), n, y_block.data(), rows, QgemmPath::kNative, &one_block);
      ASSERT_EQ(y_block, y_avx2) << ggml_type_name(t) << " n=" << n << ", one block";
      std::vector<float> x_used(cols), yu(rows);
      std::vector<uint8_t> u(cols);
      std::vector<float> d(cols / 16), o(cols / 16);
      for (int i = 0; i < n; ++i) {
        const float* xi = x.data() + (size_t)i * cols;
        qgemm_input(xi, cols, x_used.data());
        for (int c0 = 0; c0 < cols; c0 += 32) {
          double amax = 0;
          for (int c = c0; c < c0 + 32; ++c) amax = std::max(amax, std::fabs((double)xi[c]));
          for (int c = c0; c < c0 + 32; ++c) {
            ASSERT_LE(std::fabs((double)xi[c] - x_used[c]), amax / 254 * (1 + 1e-6));
          }
        }
        qgemv_ref(w, x_used.data(), yu.data());
        for (int r = 0; r < rows; ++r) {
          qgemm_unpack_row(t, packed.data() + r * w.row_bytes, cols, u.data(), d.data(), o.data());
          double mag = 0;
          for (int e = 0; e < cols; ++e) {
            mag += (std::fabs((double)d[e / 16] * u[e]) + std::fabs((double)o[e / 16])) *
                   std::fabs((double)x_used[e]);
          }
          ASSERT_LE(std::fabs((double)y[(size_t)i * rows + r] - yu[r]), kRelTol * mag + 1e-6)
              << ggml_type_name(t) << " n=" << n << " input row " << i << " weight row " << r
              << ": qgemm " << y[(size_t)i * rows + r] << " vs reference " << yu[r];
        }
      }
    }
  }
}

TEST(QGemm, AvxFormsStayExactAtTheQuantAndInputBounds) {
  // The worst case for the AVX2 form's int16 sums (maddubs pairs, several added before one
  // madd): every weight quant at its type's bound and every input quant at +127 or -127 (a
  // constant row rounds to it). kAvx2 must still give kAvx2Wide's bits (no int16 sum saturates
  // or wraps), for every type. All bytes 0xff reach the bound on every type but Q8_0 (whose
  // quants take the wide form anyway).
  const int rows = 11, cols = 512;
  for (GgmlType t : kAllTypes) {
    if (!qgemm_supported(t)) continue;
    const size_t rb = ggml_row_bytes(t, cols), bb = ggml_block_bytes(t);
    std::vector<uint8_t> packed(rb * rows, 0xff);
    for (size_t blk = 0; blk < packed.size() / bb; ++blk) {
      for (int off : fp16_fields(t)) {
        const uint16_t h = f32_to_fp16(0.25f);
        std::memcpy(&packed[blk * bb + off], &h, 2);
      }
    }
    std::vector<uint8_t> u(cols);
    std::vector<float> d(cols / 16), o(cols / 16);
    qgemm_unpack_row(t, packed.data(), cols, u.data(), d.data(), o.data());
    if (t != GgmlType::Q8_0) {
      for (int e = 0; e < cols; ++e) ASSERT_EQ((int)u[e], qgemm_max_quant(t)) << ggml_type_name(t);
    }
    const QMatrix w{t, packed.data(), rows, cols, rb};
    const QMatrix* ws[1] = {&w};
    const int n = 6;
    std::vector<float> x((size_t)n * cols);
    for (int i = 0; i < n; ++i) {
      for (int e = 0; e < cols; ++e) x[(size_t)i * cols + e] = i % 2 ? -1.5f : 2.0f;
    }
    std::vector<float> y((size_t)n * rows), y_avx2((size_t)n * rows), y_wide((size_t)n * rows);
    qgemm(ws, 1, x.data(), n, y.data(), rows);
    qgemm(ws, 1, x.data(), n, y_avx2.data(), rows, QgemmPath::kAvx2);
    qgemm(ws, 1, x.data(), n, y_wide.data(), rows, QgemmPath::kAvx2Wide);
    ASSERT_EQ(y_avx2, y_wide) << ggml_type_name(t);
    ASSERT_EQ(y, y_wide) << ggml_type_name(t);
    // And the sums are the exact ones: the reference on the rounded input.
    std::vector<float> x_used(cols), yu(rows);
    qgemm_input(x.data(), cols, x_used.data());
    qgemv_ref(w, x_used.data(), yu.data());
    for (int r = 0; r < rows; ++r) {
      ASSERT_NEAR(y_wide[r], yu[r], 1e-4 * std::fabs(yu[r]) + 1e-3) << ggml_type_name(t) << " row " << r;
    }
  }
}

TEST(QGemm, RowsEqualSingleRowCallsAndStackedMatricesEqualSeparateOnes) {
  // Two stacked matrices of different types into a padded output: every input row's results are
  // the bits of that row alone through each matrix alone, and the padding is untouched. Under
  // qgemm's own blocking and under blockings that cross several chunks of input rows (ending in
  // a partial tile) and several blocks of strips, some spanning both matrices (5 strips, then 4).
  // n * cols is above qgemm's threshold for encoding the input rows on several threads (they
  // run on several when the test has more than one OpenMP thread, as tools/test.sh does on a
  // multi-core machine).
  const int cols = 2048;
  const GgmlType types[2] = {GgmlType::Q4_K, GgmlType::Q6_K};
  const int rows[2] = {36, 27};
  std::vector<uint8_t> packed[2];
  QMatrix w[2];
  for (int m = 0; m < 2; ++m) {
    const auto wf = randn((size_t)rows[m] * cols, 100 + m, 0.5f);
    packed[m] = encode_matrix(types[m], wf, rows[m], cols);
    w[m] = QMatrix{types[m], packed[m].data(), rows[m], cols, ggml_row_bytes(types[m], cols)};
  }
  const QMatrix* ws[2] = {&w[0], &w[1]};
  const int tile = qgemm_tile_rows();
  const int n = 43, stride = rows[0] + rows[1] + 5;  // 43: not a multiple of any tile
  ASSERT_GE(n * cols, 1 << 16);
  ASSERT_GT(n, 4 * tile);
  const auto x = randn((size_t)n * cols, 102);
  std::vector<std::vector<float>> alone(n * 2);
  for (int i = 0; i < n; ++i) {
    for (int m = 0; m < 2; ++m) {
      alone[2 * i + m].resize(rows[m]);
      qgemm(&ws[m], 1, x.data() + (size_t)i * cols, 1, alone[2 * i + m].data(), rows[m]);
    }
  }
  const QgemmBlocking own = qgemm_blocking(cols, 9);
  const QgemmBlocking blockings[] = {own, {2, tile}, {3, 2 * tile}, {1, 4 * tile}, {32, tile}};
  for (const QgemmBlocking& blk : blockings) {
    std::vector<float> y((size_t)n * stride, -7.0f);
    qgemm(ws, 2, x.data(), n, y.data(), stride, QgemmPath::kNative, &blk);
    for (int i = 0; i < n; ++i) {
      for (int m = 0; m < 2; ++m) {
        for (int r = 0; r < rows[m]; ++r) {
          ASSERT_EQ(y[(size_t)i * stride + (m ? rows[0] : 0) + r], alone[2 * i + m][r])
              << "blocks of " << blk.strips << " strips, " << blk.rows << " rows: input row "
              << i << " matrix " << m << " row " << r;
        }
      }
      for (int r = rows[0] + rows[1]; r < stride; ++r) ASSERT_EQ(y[(size_t)i * stride + r], -7.0f);
    }
  }
}

TEST(QGemm, BlockingKeepsTheCacheBudgetAndTheTile) {
  // The default blocking: a multiple of the tile, about 256 KiB of input rows, about 192 KiB of
  // unpacked weights (at least one strip), and enough blocks for every thread.
  const int tile = qgemm_tile_rows();
  for (int cols : {576, 1536, 8960}) {
    const QgemmBlocking b = qgemm_blocking(cols, 4096);
    EXPECT_EQ(b.rows % tile, 0) << cols;
    EXPECT_LE((size_t)b.rows * cols, (size_t)256 << 10) << cols;
    EXPECT_GT((size_t)(b.rows + tile) * cols, (size_t)256 << 10) << cols;
    EXPECT_GE(b.strips, 1);
    EXPECT_LE((size_t)b.strips * 8 * cols, std::max<size_t>((size_t)192 << 10, 8 * cols)) << cols;
  }
  EXPECT_EQ(qgemm_blocking(1536, 3).strips, 1);  // 3 strips: one block each
}

}  // namespace
}  // namespace ct::cpu
