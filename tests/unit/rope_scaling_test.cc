// RoPE frequency scaling: linear position interpolation (rope.scaling.type "linear") and Llama
// 3.1's per-pair frequency factors (rope_freqs.weight), checked against a rotation written from
// llama.cpp's definition (angle = p * freq_scale * theta^(-2i/n_rot) / factor_i), in the operator
// and in a tiny model's forward pass; and the GGUF values the loader must refuse.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "backend/cpu/ops.h"
#include "backend/cpu_forward.h"
#include "core/error.h"
#include "model/model.h"
#include "support/random_data.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

using cpu::Rope;
using cpu::RopeStyle;

// Factors shaped like Llama 3.1's (1 for the fastest pairs, 8 for the slowest, a ramp between).
std::vector<float> llama31_like_factors(int half) {
  std::vector<float> f(half);
  for (int i = 0; i < half; ++i) f[i] = i < half / 4 ? 1.0f : i >= 3 * half / 4 ? 8.0f : 1.0f + i;
  return f;
}

// Rotates head vectors x[n][n_heads*head_dim] (row stride `stride`) from the definition, in
// double precision, independently of cpu::Rope.
void reference_rotate(std::vector<float>& x, int n, int stride, int n_heads, int head_dim,
                      int n_rot, double theta, RopeStyle style, double freq_scale,
                      const std::vector<float>& factors, const std::vector<int32_t>& pos) {
  const int half = n_rot / 2;
  for (int r = 0; r < n; ++r) {
    for (int h = 0; h < n_heads; ++h) {
      float* v = x.data() + (size_t)r * stride + (size_t)h * head_dim;
      for (int i = 0; i < half; ++i) {
        const double ang =
            pos[r] * freq_scale * std::pow(theta, -2.0 * i / n_rot) / (double)factors[i];
        const int i0 = style == RopeStyle::kNorm ? 2 * i : i;
        const int i1 = style == RopeStyle::kNorm ? 2 * i + 1 : i + half;
        const double a = v[i0], b = v[i1];
        v[i0] = (float)(a * std::cos(ang) - b * std::sin(ang));
        v[i1] = (float)(a * std::sin(ang) + b * std::cos(ang));
      }
    }
  }
}

using test::max_abs_diff;
using test::randn;

TEST(RopeScaling, EveryPathMatchesTheDefinitionWithFactorsAndLinearScale) {
  const int head_dim = 16, n_rot = 16, heads = 3, stride = head_dim * heads, n = 6;
  const std::vector<int32_t> pos = {0, 1, 17, 300, 4095, 30000};
  const std::vector<float> ff = llama31_like_factors(n_rot / 2);
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    for (float scale : {1.0f, 0.25f}) {
      const Rope rope(head_dim, n_rot, 500000.0f, style, scale, ff);
      const auto x = randn((size_t)n * stride, 3);
      auto want = x;
      reference_rotate(want, n, stride, heads, head_dim, n_rot, 500000.0, style, scale, ff, pos);
      auto fast = x, ref = x, deferred = x;
      rope.apply(fast.data(), n, stride, heads, pos.data());
      rope.apply_ref(ref.data(), n, stride, heads, pos.data());
      // Deferred RoPE's path: the angle table once, then rows rotated in a position-indexed buffer
      // (here the rows sit at indices 0..n-1 with the positions' angles: stride 0 between rows
      // is not allowed, so rotate each row alone).
      std::vector<float> cs, sn;
      rope.angle_table(pos.data(), n, cs, sn);
      for (int r = 0; r < n; ++r) {
        const int32_t zero = 0;
        rope.apply_at_positions(deferred.data() + (size_t)r * stride, stride, heads, &zero, 1,
                                cs.data() + (size_t)r * (n_rot / 2),
                                sn.data() + (size_t)r * (n_rot / 2));
      }
      const char* what = style == RopeStyle::kNorm ? "norm" : "neox";
      // Angles reach 3e4 rad: float angle tables cost ~1e-3 there (the plain RoPE test has 4e3).
      EXPECT_LT(max_abs_diff(fast, want), 5e-3f) << what << " scale " << scale;
      EXPECT_LT(max_abs_diff(ref, want), 1e-5f) << what << " scale " << scale;
      EXPECT_LT(max_abs_diff(deferred, want), 5e-3f) << what << " scale " << scale;
      // The factors matter: ignoring them is far from the definition.
      auto plain = x;
      Rope(head_dim, n_rot, 500000.0f, style, scale)
          .apply(plain.data(), n, stride, heads, pos.data());
      EXPECT_GT(max_abs_diff(plain, want), 0.1f) << what;
    }
  }
}

TEST(RopeScaling, LinearScaleIsPositionInterpolation) {
  // freq_scale s at position p rotates exactly as no scaling at position s*p.
  const Rope scaled(8, 8, 10000.0f, RopeStyle::kNorm, 0.5f),
      plain(8, 8, 10000.0f, RopeStyle::kNorm);
  const auto x = randn(8, 5);
  auto a = x, b = x;
  const int32_t p = 246, half_p = 123;
  scaled.apply_ref(a.data(), 1, 8, 1, &p);
  plain.apply_ref(b.data(), 1, 8, 1, &half_p);
  EXPECT_LT(max_abs_diff(a, b), 1e-6f);
}

class RopeScalingModelTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("ct_rope_scaling_" + name + ".gguf"))
        .string();
  }
};

TEST_F(RopeScalingModelTest, ConfigReadsScalingAndForwardRotatesKeysWithIt) {
  test::TinyModelOptions o;
  o.n_layer = 2;
  o.rope_theta = 500000.0f;
  o.rope_freq_factors = llama31_like_factors(o.head_dim / 2);
  o.rope_scaling_type = "linear";
  o.rope_scaling_factor = 4.0f;
  auto m = Model::load(test::write_tiny_model(path("llama31"), o));
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.rope_freq_factors, o.rope_freq_factors);
  EXPECT_FLOAT_EQ(c.rope_freq_scale, 0.25f);

  // Layer 0 of a prefill: its cached keys must be its pre-RoPE keys rotated by the definition.
  const int n = 300;
  const auto toks = test::random_byte_tokens(n, 21);
  std::vector<int32_t> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = i;
  std::vector<float> x((size_t)n * c.n_embd);
  m->embed(toks.data(), n, x.data());
  KVCache kv = m->make_cache(n);
  Workspace ws;
  std::vector<float> k_pre((size_t)n * c.kv_dim());
  LayerTap tap;
  tap.k_pre_rope = k_pre.data();
  cpu::forward_layer(*m, 0, x.data(), pos.data(), n, kv, ws, &tap);
  const std::vector<float> got(kv.k(0), kv.k(0) + (size_t)n * c.kv_dim());
  auto want = k_pre;
  reference_rotate(want, n, c.kv_dim(), c.n_head_kv, c.head_dim, c.n_rot, c.rope_theta,
                   RopeStyle::kNorm, 0.25, o.rope_freq_factors, pos);
  EXPECT_LT(max_abs_diff(got, want), 1e-4f);
  auto unscaled = k_pre;
  reference_rotate(unscaled, n, c.kv_dim(), c.n_head_kv, c.head_dim, c.n_rot, c.rope_theta,
                   RopeStyle::kNorm, 1.0, std::vector<float>(c.n_rot / 2, 1.0f), pos);
  EXPECT_GT(max_abs_diff(got, unscaled), 1e-2f) << "the scaling had no effect on the keys";
}

TEST_F(RopeScalingModelTest, NoScalingKeysMeansPlainRope) {
  test::TinyModelOptions o;
  o.n_layer = 1;
  auto m = Model::load(test::write_tiny_model(path("plain"), o));
  EXPECT_FLOAT_EQ(m->config().rope_freq_scale, 1.0f);
  EXPECT_TRUE(m->config().rope_freq_factors.empty());
  o.rope_scaling_type = "none";  // llama.cpp: never scale with type none, whatever the factor
  o.rope_scaling_factor = 8.0f;
  m = Model::load(test::write_tiny_model(path("none"), o));
  EXPECT_FLOAT_EQ(m->config().rope_freq_scale, 1.0f);
}

// Loads the file and returns the ct::Error message ("" if it loaded).
std::string load_error(const std::string& p) {
  try {
    Model::load(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(RopeScalingModelTest, UnsupportedScalingIsRefusedNamingFileKeyValueAndWhatWorks) {
  test::TinyModelOptions o;
  o.n_layer = 1;
  o.rope_scaling_type = "yarn";
  o.rope_scaling_factor = 4.0f;
  const std::string p = test::write_tiny_model(path("yarn"), o);
  const std::string msg = load_error(p);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama.rope.scaling.type"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'yarn'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("supported: linear, none"), std::string::npos) << msg;

  o.rope_scaling_type = "linear";
  o.rope_scaling_factor = -2.0f;
  const std::string neg = load_error(test::write_tiny_model(path("negative"), o));
  EXPECT_NE(neg.find("llama.rope.scaling.factor is -2"), std::string::npos) << neg;
}

TEST_F(RopeScalingModelTest, BadFrequencyFactorsAreRefused) {
  test::TinyModelOptions o;
  o.n_layer = 1;
  o.rope_freq_factors = std::vector<float>(o.head_dim / 2 + 1, 1.0f);  // one too many
  const std::string len = load_error(test::write_tiny_model(path("ff_len"), o));
  EXPECT_NE(len.find("rope_freqs.weight"), std::string::npos) << len;
  EXPECT_NE(len.find("expected F32 [8]"), std::string::npos) << len;
  o.rope_freq_factors = std::vector<float>(o.head_dim / 2, 1.0f);
  o.rope_freq_factors[5] = 0.0f;  // a zero divisor would make the angle infinite
  const std::string zero = load_error(test::write_tiny_model(path("ff_zero"), o));
  EXPECT_NE(zero.find("rope_freqs.weight[5] is 0"), std::string::npos) << zero;
}

}  // namespace
}  // namespace ct
