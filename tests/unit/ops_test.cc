// CPU operators against their plain-loop references: SGEMM, RMSNorm, RoPE, SiLU, tiled attention
// (odd sizes, GQA, sparse query positions, probability taps).
#include "backend/cpu/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "backend/cpu/qgemv.h"
#include "backend/cpu/vec.h"
#include "core/fp16.h"
#include "core/ggml_types.h"
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
  silu_mul(g.data(), u.data(), g.size());
  silu_mul_ref(gr.data(), u.data(), gr.size());
  EXPECT_LT(max_abs_diff(g, gr), 1e-5f);
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
  std::vector<float> out(c.n_q * qd), outr(c.n_q * qd), pa(c.n_ctx, 0.f), par(c.n_ctx, 0.f);
  AttnArgs a;
  a.q = q.data();
  a.q_pos = pos.data();
  a.n_q = c.n_q;
  a.k = k.data();
  a.v = v.data();
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
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(AttnCase{1, 1, 2, 1, 8, false},
                                           AttnCase{70, 70, 4, 2, 16, false},
                                           AttnCase{300, 33, 6, 2, 12, false},
                                           AttnCase{600, 45, 9, 3, 64, true},
                                           AttnCase{530, 530, 3, 3, 8, false}));

}  // namespace
}  // namespace ct::cpu

namespace ct::cpu {
namespace {

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                              GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                              GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                              GgmlType::Q6_K};

std::vector<uint8_t> encode_matrix(GgmlType t, const std::vector<float>& wf, int rows, int cols) {
  const size_t rb = ggml_row_bytes(t, cols);
  std::vector<uint8_t> packed(rb * rows);
  for (int r = 0; r < rows; ++r) {
    ggml_from_f32(t, wf.data() + (size_t)r * cols, packed.data() + r * rb, cols);
  }
  return packed;
}

TEST(QGemv, MatchesDequantisedReferenceForEveryType) {
  // 512 columns: two K-quant super-blocks, sixteen 32-element blocks. The kernels sum in float
  // in another order than the double reference; the bound is relative to sum_c |w_rc x_c|.
  const int rows = 70, cols = 512;
  for (GgmlType t : kAllTypes) {
    const auto wf = randn((size_t)rows * cols, 30, 0.5f);
    const auto packed = encode_matrix(t, wf, rows, cols);
    QMatrix w{t, packed.data(), rows, cols, ggml_row_bytes(t, cols)};
    ASSERT_TRUE(qgemv_supported(t)) << ggml_type_name(t);
    auto x = randn(cols, 31);
    std::vector<float> y(rows), yr(rows), row(cols);
    qgemv(w, x.data(), y.data());
    qgemv_ref(w, x.data(), yr.data());
    for (int r = 0; r < rows; ++r) {
      ggml_to_f32_ref(t, packed.data() + r * w.row_bytes, row.data(), cols);
      double mag = 0;
      for (int c = 0; c < cols; ++c) mag += std::fabs((double)row[c] * x[c]);
      ASSERT_LE(std::fabs((double)y[r] - yr[r]), 2e-6 * mag + 1e-6)
          << ggml_type_name(t) << " row " << r << ": " << y[r] << " vs " << yr[r];
    }
    // The quantised product stays close to the F32 one (catches a kernel and reference that
    // agree on a wrong layout only if the encoder shares the mistake; the fixture test in
    // ggml_types_test.cc rules that out).
    std::vector<float> yf(rows);
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
  // Random bytes reach every quant, scale and min pattern (negative Q6_K scales, the largest
  // 6-bit scales, set and clear high bits) that an encoder may never produce; only the fp16
  // fields (byte offsets per block) are set to finite values in [-1, 1].
  const std::pair<GgmlType, std::vector<int>> cases[] = {
      {GgmlType::Q4_0, {0}},    {GgmlType::Q4_1, {0, 2}}, {GgmlType::Q5_0, {0}},
      {GgmlType::Q5_1, {0, 2}}, {GgmlType::Q8_0, {0}},    {GgmlType::Q2_K, {80, 82}},
      {GgmlType::Q3_K, {108}},  {GgmlType::Q4_K, {0, 2}}, {GgmlType::Q5_K, {0, 2}},
      {GgmlType::Q6_K, {208}}};
  const int rows = 40, cols = 768;
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> scale(-1.0f, 1.0f);
  for (const auto& [t, offsets] : cases) {
    const size_t rb = ggml_row_bytes(t, cols), bb = ggml_block_bytes(t);
    std::vector<uint8_t> packed(rb * rows);
    for (uint8_t& v : packed) v = (uint8_t)rng();
    for (size_t blk = 0; blk < packed.size() / bb; ++blk) {
      for (int off : offsets) {
        const uint16_t h = f32_to_fp16(scale(rng));
        std::memcpy(&packed[blk * bb + off], &h, 2);
      }
    }
    QMatrix w{t, packed.data(), rows, cols, rb};
    const auto x = randn(cols, 78);
    std::vector<float> y(rows), yr(rows), row(cols);
    qgemv(w, x.data(), y.data());
    qgemv_ref(w, x.data(), yr.data());
    for (int r = 0; r < rows; ++r) {
      ggml_to_f32_ref(t, packed.data() + r * rb, row.data(), cols);
      double mag = 0;
      for (int c = 0; c < cols; ++c) mag += std::fabs((double)row[c] * x[c]);
      ASSERT_LE(std::fabs((double)y[r] - yr[r]), 2e-6 * mag + 1e-6)
          << ggml_type_name(t) << " row " << r << ": " << y[r] << " vs " << yr[r];
    }
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

}  // namespace
}  // namespace ct::cpu
