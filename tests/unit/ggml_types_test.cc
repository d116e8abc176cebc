// Tests for the scalar fp16/bf16 conversions (against F16C and an independent rounding model) and
// the ggml type table: hand-computed blocks, quantisation error bounds, and the AVX2 dequantisers
// against the scalar reference.
#include "support/errors.h"
#include "core/ggml_types.h"
#include "core/kv_dtype.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "support/quant_fixture.h"

namespace ct {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f16c_from_f32(float f) {
  return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// Compares f32_to_fp16 with the hardware conversion; NaNs only need to stay NaN with their sign.
void expect_fp16_matches_f16c(float f) {
  const uint16_t got = f32_to_fp16(f);
  const uint16_t want = f16c_from_f32(f);
  if (std::isnan(f)) {
    EXPECT_EQ(got & 0x7c00, 0x7c00) << "bits 0x" << std::hex << bits_of(f);
    EXPECT_NE(got & 0x03ff, 0) << "bits 0x" << std::hex << bits_of(f);
    EXPECT_EQ(got & 0x8000, want & 0x8000);
  } else {
    EXPECT_EQ(got, want) << "f32 bits 0x" << std::hex << bits_of(f) << " (" << f << ")";
  }
}

TEST(Fp16Test, AllHalvesToFloatMatchF16c) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float got = fp16_to_f32((uint16_t)h);
    const float want = _cvtsh_ss((unsigned short)h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << "half 0x" << std::hex << h;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << "half 0x" << std::hex << h;
    } else {
      ASSERT_EQ(bits_of(got), bits_of(want)) << "half 0x" << std::hex << h;
    }
  }
}

TEST(Fp16Test, FloatToHalfMatchesF16cAtEveryRoundingBoundary) {
  // Every half value, the exact midpoints to its neighbour, and the floats one or two ulps either
  // side: this covers every rounding decision, including subnormals and overflow to infinity.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const float lo = fp16_to_f32((uint16_t)(h | sign));
      // The next half up may be infinity (0x7c00); its "value" for the midpoint is then 65536.
      const double hi = h + 1 == 0x7c00 ? (sign ? -65536.0 : 65536.0)
                                        : (double)fp16_to_f32((uint16_t)((h + 1) | sign));
      const float mid = (float)(((double)lo + hi) / 2);  // exact: 12 significant bits
      for (float base : {lo, mid}) {
        const uint32_t b = bits_of(base);
        for (int d = -2; d <= 2; ++d) {
          if (base == 0.0f && d < 0) continue;  // would wrap to NaN patterns
          expect_fp16_matches_f16c(float_of(b + d));
        }
      }
    }
  }
}

TEST(Fp16Test, FloatToHalfMatchesF16cOnRandomBitPatterns) {
  std::mt19937 rng(7);
  for (int k = 0; k < 1000000; ++k) expect_fp16_matches_f16c(float_of(rng()));
}

TEST(Fp16Test, KnownValues) {
  EXPECT_EQ(f32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(65519.99f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7c00);  // tie with an odd mantissa rounds up to infinity
  EXPECT_EQ(f32_to_fp16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_fp16(-INFINITY), 0xfc00);
  EXPECT_EQ(f32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);             // smallest subnormal
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);             // tie rounds to even (zero)
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.5f, -24)), 0x0002);             // tie rounds to even (2)
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even stays
  EXPECT_EQ(f32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, odd rounds up
  EXPECT_TRUE(std::isnan(fp16_to_f32(f32_to_fp16(NAN))));
  EXPECT_EQ(fp16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_f32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_to_f32(0xfc00), -INFINITY);
}

// Independent bf16 rounding model: pick the nearer of the two bf16 neighbours in double precision,
// ties to the even pattern. Patterns are decoded arithmetically rather than by shifting.
double bf16_value(uint32_t p) {
  const int e = (p >> 7) & 0xff;
  const double m = p & 0x7f;
  const double mag = e == 0 ? std::ldexp(m / 128.0, -126) : std::ldexp(1.0 + m / 128.0, e - 127);
  return (p & 0x8000) ? -mag : mag;
}

uint16_t bf16_model(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t lo = x >> 16;
  if (std::isinf(f)) return (uint16_t)lo;
  const double v = std::fabs((double)f);
  const double vlo = std::fabs(bf16_value(lo));
  const double vhi = std::fabs(bf16_value(lo + 1));  // 0x7f80 decodes as 2^128 here
  if (v - vlo < vhi - v) return (uint16_t)lo;
  if (v - vlo > vhi - v) return (uint16_t)(lo + 1);
  return (uint16_t)((lo & 1) ? lo + 1 : lo);
}

TEST(Bf16Test, MatchesRoundingModel) {
  std::mt19937 rng(11);
  std::vector<uint32_t> samples;
  for (int k = 0; k < 1000000; ++k) samples.push_back(rng());
  for (uint32_t hi : {0x0000u, 0x0001u, 0x3f80u, 0x3f81u, 0x7f7eu, 0x7f7fu, 0x8001u, 0xbf80u}) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      samples.push_back(hi << 16 | low);
    }
  }
  for (uint32_t b : samples) {
    const float f = float_of(b);
    const uint16_t got = f32_to_bf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(got))) << std::hex << b;
    } else {
      ASSERT_EQ(got, bf16_model(f)) << "f32 bits 0x" << std::hex << b;
    }
  }
}

TEST(Bf16Test, KnownValues) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(float_of(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(float_of(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(float_of(0x3f808001)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(float_of(0x00018000)), 0x0002);  // subnormals are kept
  EXPECT_EQ(f32_to_bf16(float_of(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds to infinity
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(float_of(0x7f800001)))));  // sNaN stays NaN
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
}

// Every supported type with the byte offsets of its fp16 scale fields inside a block (the ggml
// block_* layouts), for tests that fill blocks with random bytes but need finite scales.
struct TypeCase {
  GgmlType type;
  std::vector<int> scale_offsets;
};
const std::vector<TypeCase>& all_types() {
  static const std::vector<TypeCase> v = {
      {GgmlType::F32, {}},      {GgmlType::F16, {}},      {GgmlType::BF16, {}},
      {GgmlType::Q4_0, {0}},    {GgmlType::Q4_1, {0, 2}}, {GgmlType::Q5_0, {0}},
      {GgmlType::Q5_1, {0, 2}}, {GgmlType::Q8_0, {0}},    {GgmlType::Q2_K, {80, 82}},
      {GgmlType::Q3_K, {108}},  {GgmlType::Q4_K, {0, 2}}, {GgmlType::Q5_K, {0, 2}},
      {GgmlType::Q6_K, {208}},
  };
  return v;
}

TEST(GgmlTypesTest, TableAndRowSizes) {
  EXPECT_EQ(ggml_type_name(GgmlType::Q4_1), "q4_1");
  EXPECT_EQ(ggml_type_name(GgmlType::Q6_K), "q6_K");
  EXPECT_EQ(ggml_type_name(GgmlType::BF16), "bf16");
  EXPECT_EQ(ggml_type_name(GgmlType::Q8_K), "q8_K");
  EXPECT_EQ(ggml_type_name(static_cast<GgmlType>(99)), "unknown(99)");
  for (const TypeCase& c : all_types()) {
    const GgmlTypeTraits* tt = ggml_type_traits(c.type);
    ASSERT_NE(tt, nullptr) << ggml_type_name(c.type);
    EXPECT_EQ(tt->type, c.type);
    EXPECT_EQ(ggml_type_name(c.type), tt->name);
    EXPECT_TRUE(ggml_type_supported(c.type)) << tt->name;
    EXPECT_NE(tt->to_f32_ref, nullptr) << tt->name;
    EXPECT_NE(tt->to_f32, nullptr) << tt->name;
    EXPECT_NE(tt->from_f32, nullptr) << tt->name;
  }
  for (GgmlType t :
       {GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::I8, GgmlType::F64, static_cast<GgmlType>(99)}) {
    EXPECT_FALSE(ggml_type_supported(t)) << ggml_type_name(t);
    EXPECT_EQ(ggml_type_traits(t), nullptr) << ggml_type_name(t);
  }

  EXPECT_EQ(ggml_row_bytes(GgmlType::F32, 7), 28u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::F16, 3), 6u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::BF16, 5), 10u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_0, 32), 18u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_1, 64), 40u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q5_0, 64), 44u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q5_1, 32), 24u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q8_0, 96), 102u);
  // K-quants: 256-element super-blocks (the sizes of ggml's block_q2_K ... block_q6_K).
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q2_K, 512), 168u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q3_K, 256), 110u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_K, 256), 144u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q5_K, 256), 176u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q6_K, 768), 630u);
  EXPECT_EQ(ggml_block_elems(GgmlType::Q8_0), 32);
  EXPECT_EQ(ggml_block_elems(GgmlType::Q4_K), 256);
  EXPECT_EQ(ggml_block_elems(GgmlType::F16), 1);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q4_1), 20u);
}

using test::error_of;

TEST(GgmlTypesTest, UnsupportedTypesAndBadLengthsThrowNamingThem) {
  float buf[64] = {};
  uint8_t raw[256] = {};
  const std::string bb = error_of([] { ggml_block_bytes(GgmlType::Q8_K); });
  EXPECT_NE(bb.find("q8_K"), std::string::npos) << bb;
  EXPECT_NE(bb.find("not supported"), std::string::npos) << bb;
  EXPECT_NE(bb.find("q6_K"), std::string::npos) << "lists the supported types: " << bb;
  EXPECT_NE(error_of([&] { ggml_to_f32(GgmlType::Q8_1, raw, buf, 32); }).find("q8_1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ggml_to_f32_ref(GgmlType::I32, raw, buf, 32); }).find("i32"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { ggml_from_f32(static_cast<GgmlType>(99), buf, raw, 1); }).find("unknown(99)"),
      std::string::npos);
  const std::string m = error_of([] { ggml_row_bytes(GgmlType::Q8_0, 33); });
  EXPECT_NE(m.find("33"), std::string::npos) << m;
  EXPECT_NE(m.find("q8_0"), std::string::npos) << m;
  EXPECT_NE(m.find("32"), std::string::npos) << m;
  EXPECT_NE(error_of([&] { ggml_to_f32(GgmlType::Q4_1, raw, buf, 48); }).find("48"),
            std::string::npos);
  const std::string k = error_of([&] { ggml_to_f32(GgmlType::Q4_K, raw, buf, 64); });
  EXPECT_NE(k.find("256"), std::string::npos) << k;
}

// --- hand-computed blocks ---------------------------------------------------------------------

std::vector<float> dequant(GgmlType t, const std::vector<uint8_t>& raw, int64_t n) {
  std::vector<float> out((size_t)n);
  ggml_to_f32(t, raw.data(), out.data(), n);
  std::vector<float> ref((size_t)n);
  ggml_to_f32_ref(t, raw.data(), ref.data(), n);
  EXPECT_EQ(std::memcmp(out.data(), ref.data(), (size_t)n * 4), 0) << ggml_type_name(t);
  return out;
}

std::vector<uint8_t> quant(GgmlType t, const std::vector<float>& x) {
  std::vector<uint8_t> raw(ggml_row_bytes(t, (int64_t)x.size()));
  ggml_from_f32(t, x.data(), raw.data(), (int64_t)x.size());
  return raw;
}

TEST(GgmlTypesTest, DequantisesHandComputedBlocks) {
  // Q4_0: d = 0.5; byte j holds element j (low) = j and element j + 16 (high) = 15 - j.
  std::vector<uint8_t> q40 = {0x00, 0x38};
  for (int j = 0; j < 16; ++j) q40.push_back((uint8_t)(j | ((15 - j) << 4)));
  const auto y40 = dequant(GgmlType::Q4_0, q40, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y40[j], (j - 8) * 0.5f) << j;
    EXPECT_EQ(y40[j + 16], (7 - j) * 0.5f) << j;
  }
  // Q4_1: d = 0.25, m = -1; low nibble j, high nibble 15 - j.
  std::vector<uint8_t> q41 = {0x00, 0x34, 0x00, 0xbc};
  for (int j = 0; j < 16; ++j) q41.push_back((uint8_t)(j | ((15 - j) << 4)));
  const auto y41 = dequant(GgmlType::Q4_1, q41, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y41[j], j * 0.25f - 1.0f) << j;
    EXPECT_EQ(y41[j + 16], (15 - j) * 0.25f - 1.0f) << j;
  }
  // Q8_0: d = 2, q = j - 16.
  std::vector<uint8_t> q80 = {0x00, 0x40};
  for (int j = 0; j < 32; ++j) q80.push_back((uint8_t)(int8_t)(j - 16));
  const auto y80 = dequant(GgmlType::Q8_0, q80, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y80[j], 2.0f * (j - 16)) << j;
  // F16 and BF16 are plain little-endian 16-bit values.
  const auto yf16 = dequant(GgmlType::F16, {0x00, 0x3c, 0x00, 0xc0}, 2);
  EXPECT_EQ(yf16[0], 1.0f);
  EXPECT_EQ(yf16[1], -2.0f);
  const auto ybf16 = dequant(GgmlType::BF16, {0x80, 0x3f, 0x49, 0x40}, 2);
  EXPECT_EQ(ybf16[0], 1.0f);
  EXPECT_EQ(ybf16[1], 3.140625f);
}

TEST(GgmlTypesTest, QuantisesHandComputedBlocks) {
  // Q8_0 with amax 127 gives d = 1: q = round(x), halves away from zero.
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.49f;
  x[4] = -100.0f;
  auto q = quant(GgmlType::Q8_0, x);
  EXPECT_EQ(q[0], 0x00);
  EXPECT_EQ(q[1], 0x3c);  // d = 1.0 in fp16
  EXPECT_EQ((int8_t)q[2], 127);
  EXPECT_EQ((int8_t)q[3], 3);
  EXPECT_EQ((int8_t)q[4], -3);
  EXPECT_EQ((int8_t)q[5], 0);
  EXPECT_EQ((int8_t)q[6], -100);

  // Q4_0: the largest magnitude -8 sets d = 1; values map to round-half-up(x) + 8, clamped to 15.
  std::fill(x.begin(), x.end(), 0.0f);
  x[0] = -8.0f;
  x[1] = 8.0f;    // 16 clamps to 15
  x[2] = 0.5f;    // 9
  x[3] = -0.5f;   // 8
  x[4] = 2.4f;    // 10
  x[16] = 7.0f;   // 15, high nibble of byte 0
  x[17] = -3.0f;  // 5, high nibble of byte 1
  q = quant(GgmlType::Q4_0, x);
  EXPECT_EQ(q[0] | q[1] << 8, 0x3c00);  // d = max / -8 = 1
  EXPECT_EQ(q[2], 0x0 | 15 << 4);
  EXPECT_EQ(q[3], 15 | 5 << 4);
  EXPECT_EQ(q[4], 9 | 8 << 4);
  EXPECT_EQ(q[5], 8 | 8 << 4);
  EXPECT_EQ(q[6], 10 | 8 << 4);

  // Q4_1: min -1, max 14 gives d = 1, m = -1 and q = x + 1.
  for (int j = 0; j < 32; ++j) x[j] = (float)(j % 16) - 1.0f;
  q = quant(GgmlType::Q4_1, x);
  EXPECT_EQ(q[0] | q[1] << 8, 0x3c00);  // d = 1
  EXPECT_EQ(q[2] | q[3] << 8, 0xbc00);  // m = -1
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q[4 + j], j | j << 4) << j;

  // All-zero blocks must give zero scales and exact zeros back, never NaN.
  const std::vector<float> zeros(32, 0.0f);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0}) {
    for (float v : dequant(t, quant(t, zeros), 32)) EXPECT_EQ(v, 0.0f) << ggml_type_name(t);
  }
}

// --- round-trip error bounds ------------------------------------------------------------------

struct BoundCase {
  GgmlType type;
  double max_nmse;  // normalised mean squared error over the whole tensor, Gaussian input
};

class RoundTripTest : public ::testing::TestWithParam<BoundCase> {};

TEST_P(RoundTripTest, ErrorWithinBounds) {
  const GgmlType t = GetParam().type;
  const int64_t n = 32 * 512;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.3f, 1.5f);
  std::vector<float> x((size_t)n);
  for (float& v : x) v = dist(rng);
  const std::vector<float> y = dequant(t, quant(t, x), n);

  double err2 = 0, sig2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    err2 += (double)(x[i] - y[i]) * (x[i] - y[i]);
    sig2 += (double)x[i] * x[i];
  }
  EXPECT_LT(err2 / sig2, GetParam().max_nmse) << ggml_type_name(t);

  // Per-element bounds from each format's construction; 2^-11 is the fp16 relative rounding of
  // the stored scale and minimum.
  const double e16 = std::ldexp(1.0, -11);
  const int64_t be = ggml_block_elems(t);
  for (int64_t b = 0; b < n / be; ++b) {
    float amax = 0, mn = INFINITY, mx = -INFINITY;
    for (int64_t j = 0; j < be; ++j) {
      amax = std::max(amax, std::fabs(x[b * be + j]));
      mn = std::min(mn, x[b * be + j]);
      mx = std::max(mx, x[b * be + j]);
    }
    double bound;
    switch (t) {
      case GgmlType::F32:
        bound = 0;
        break;
      case GgmlType::F16:
        bound = amax * e16;
        break;
      case GgmlType::BF16:
        bound = amax * std::ldexp(1.0, -8);
        break;
      // Rounding is at most d/2, except for the element opposite the scale's sign, which clamps
      // from 8 to 7 (an error of d).
      case GgmlType::Q4_0:
        bound = amax / 8 * (1 + 16 * e16);
        break;
      case GgmlType::Q4_1: {
        const double d = (mx - mn) / 15.0;
        bound = d / 2 + 15 * d * e16 + std::fabs(mn) * e16;
        break;
      }
      case GgmlType::Q8_0:
        bound = amax / 127.0 * (0.5 + 127 * e16);
        break;
      case GgmlType::Q5_0:
        bound = amax / 16 * (1 + 32 * e16);
        break;
      case GgmlType::Q5_1: {
        const double d = (mx - mn) / 31.0;
        bound = d / 2 + 31 * d * e16 + std::fabs(mn) * e16;
        break;
      }
      // K-quants: half a step of the sub-block scale, which is rounded to an integer multiple of
      // the super-block scale; bounds are the measured worst errors of our encoders as a fraction
      // of the super-block's largest magnitude (q2_K 0.33, q3_K 0.26, q4_K 0.065, q5_K 0.032,
      // q6_K 0.023) times about 1.3.
      case GgmlType::Q2_K:
        bound = amax * 0.43;
        break;
      case GgmlType::Q3_K:
        bound = amax * 0.34;
        break;
      case GgmlType::Q4_K:
        bound = amax * 0.085;
        break;
      case GgmlType::Q5_K:
        bound = amax * 0.041;
        break;
      case GgmlType::Q6_K:
        bound = amax * 0.03;
        break;
      default:
        FAIL();
    }
    // Slack for the float arithmetic inside the quantisers (x * id, the fused q * d + m).
    const double slack = t == GgmlType::F32 ? 0.0 : amax * 1e-6;
    for (int64_t j = 0; j < be; ++j) {
      const int64_t i = b * be + j;
      ASSERT_LE(std::fabs((double)x[i] - y[i]), bound + slack)
          << ggml_type_name(t) << " element " << i << " x=" << x[i] << " y=" << y[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, RoundTripTest,
    // Limits about 1.3-2.5x the measured NMSE of a correct implementation (f16 4.2e-8, bf16
    // 2.8e-6, q8_0 2.9e-5, q4_1 6.0e-3, q4_0 7.4e-3, q5_0 1.8e-3, q5_1 1.4e-3; our plain K-quant
    // encoders: q2_K 0.105, q3_K 0.024, q4_K 6.0e-3, q5_K 1.4e-3, q6_K 3.6e-4).
    ::testing::Values(BoundCase{GgmlType::F32, 1e-30}, BoundCase{GgmlType::F16, 1e-7},
                      BoundCase{GgmlType::BF16, 5e-6}, BoundCase{GgmlType::Q8_0, 4e-5},
                      BoundCase{GgmlType::Q4_1, 8e-3}, BoundCase{GgmlType::Q4_0, 9.5e-3},
                      BoundCase{GgmlType::Q5_0, 2.5e-3}, BoundCase{GgmlType::Q5_1, 2e-3},
                      BoundCase{GgmlType::Q2_K, 0.14}, BoundCase{GgmlType::Q3_K, 0.032},
                      BoundCase{GgmlType::Q4_K, 8e-3}, BoundCase{GgmlType::Q5_K, 2e-3},
                      BoundCase{GgmlType::Q6_K, 5e-4}),
    [](const auto& info) { return ggml_type_name(info.param.type); });

// --- SIMD path against the scalar reference ---------------------------------------------------

// Random bytes everywhere (all nibble, int8 and scale-byte patterns), then finite fp16
// scales/minimums of every magnitude including subnormals (for F16, every element is such a
// value); an `offset` of leading bytes makes the source unaligned.
std::vector<uint8_t> random_blocks(const TypeCase& c, int64_t nb, uint32_t seed, size_t offset) {
  const size_t bb = ggml_block_bytes(c.type);
  std::mt19937 rng(seed);
  std::vector<uint8_t> raw(offset + nb * bb);
  for (uint8_t& b : raw) b = (uint8_t)rng();
  auto finite_half = [&] {
    uint16_t h;
    do h = (uint16_t)rng();
    while ((h & 0x7c00) == 0x7c00);
    return h;
  };
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = raw.data() + offset + b * bb;
    if (c.type == GgmlType::F16) {
      const uint16_t h = finite_half();
      std::memcpy(blk, &h, 2);
    } else if (c.type == GgmlType::F32 || c.type == GgmlType::BF16) {
      blk[bb - 1] &= 0xbf;  // clear the top exponent bit: never inf or nan
    }
    for (int off : c.scale_offsets) {
      const uint16_t h = finite_half();
      std::memcpy(blk + off, &h, 2);
    }
  }
  return raw;
}

class FastPathTest : public ::testing::TestWithParam<TypeCase> {};

TEST_P(FastPathTest, MatchesScalarBitForBit) {
  const GgmlType t = GetParam().type;
  const int64_t nb = 2000 * 32 / ggml_block_elems(t);
  const std::vector<uint8_t> raw = random_blocks(GetParam(), nb, 5, 1);
  const int64_t n = nb * ggml_block_elems(t);
  std::vector<float> fast((size_t)n), ref((size_t)n);
  ggml_to_f32(t, raw.data() + 1, fast.data(), n);
  ggml_to_f32_ref(t, raw.data() + 1, ref.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits_of(fast[i]), bits_of(ref[i]))
        << ggml_type_name(t) << " element " << i << ": " << fast[i] << " vs " << ref[i];
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, FastPathTest, ::testing::ValuesIn(all_types()),
                         [](const auto& info) { return ggml_type_name(info.param.type); });

// --- against gguf-py (tools/make_quant_fixture.py) --------------------------------------------

using test::read_quant_fixture;
using FixtureRecord = test::QuantFixtureRecord;

// Our dequantisers (reference and fast path) against gguf.quants.dequantize, block by block:
// bit-identical, except Q4_1/Q5_1, where we fuse q*d + m into one rounding and gguf-py rounds
// twice, so they may differ by half an ulp of q*d plus half an ulp of the result.
TEST(GgmlFixtureTest, DequantisationMatchesGgufPy) {
  std::set<GgmlType> seen;
  for (const FixtureRecord& r : read_quant_fixture()) {
    if (r.kind != 0) continue;
    const GgmlType t = r.type;
    seen.insert(t);
    const int64_t be = ggml_block_elems(t);
    const size_t bb = ggml_block_bytes(t);
    ASSERT_EQ(r.bytes.size(), r.n_blocks * bb) << ggml_type_name(t);
    ASSERT_EQ(r.floats.size(), r.n_blocks * (size_t)be) << ggml_type_name(t);
    const bool fused = t == GgmlType::Q4_1 || t == GgmlType::Q5_1;
    for (uint32_t b = 0; b < r.n_blocks; ++b) {
      const uint8_t* blk = r.bytes.data() + b * bb;
      const float* want = r.floats.data() + b * be;
      float m = 0;
      if (fused) {
        uint16_t h;
        std::memcpy(&h, blk + 2, 2);
        m = fp16_to_f32(h);
      }
      std::vector<float> ref((size_t)be), fast((size_t)be);
      ggml_to_f32_ref(t, blk, ref.data(), be);
      ggml_to_f32(t, blk, fast.data(), be);
      for (int64_t j = 0; j < be; ++j) {
        ASSERT_EQ(bits_of(fast[j]), bits_of(ref[j])) << ggml_type_name(t) << " block " << b;
        if (fused) {
          const double tol = std::ldexp(std::fabs((double)want[j] - m) + std::fabs(want[j]), -24);
          ASSERT_LE(std::fabs((double)ref[j] - want[j]), tol)
              << ggml_type_name(t) << " block " << b << " element " << j;
        } else {
          ASSERT_EQ(bits_of(ref[j]), bits_of(want[j]))
              << ggml_type_name(t) << " block " << b << " element " << j << ": " << ref[j]
              << " vs gguf-py " << want[j];
        }
      }
    }
  }
  for (const TypeCase& c : all_types()) {
    EXPECT_TRUE(seen.count(c.type)) << "no fixture blocks for " << ggml_type_name(c.type);
  }
}

// Our encoders against gguf.quants.quantize for the types gguf-py can encode, byte for byte.
TEST(GgmlFixtureTest, QuantisationMatchesGgufPy) {
  int n = 0;
  for (const FixtureRecord& r : read_quant_fixture()) {
    if (r.kind != 1) continue;
    ++n;
    std::vector<uint8_t> got(r.bytes.size());
    ASSERT_EQ(ggml_row_bytes(r.type, (int64_t)r.floats.size()), r.bytes.size());
    ggml_from_f32(r.type, r.floats.data(), got.data(), (int64_t)r.floats.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], r.bytes[i]) << ggml_type_name(r.type) << " byte " << i << " (block "
                                    << i / ggml_block_bytes(r.type) << ")";
    }
  }
  EXPECT_EQ(n, 7) << "f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0";
}

// The live KV cache's Q8_0 packer (kv_pack's vector path) against gguf.quants.quantize too.
TEST(GgmlFixtureTest, KvCacheQ8PackMatchesGgufPy) {
  int n = 0;
  for (const FixtureRecord& r : read_quant_fixture()) {
    if (r.kind != 1 || r.type != GgmlType::Q8_0) continue;
    ++n;
    std::vector<uint8_t> got(kv_bytes(KvDtype::Q8_0, r.floats.size()));
    ASSERT_EQ(got.size(), r.bytes.size());
    kv_pack(KvDtype::Q8_0, r.floats.data(), got.data(), r.floats.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], r.bytes[i]) << "byte " << i << " (block " << i / 34 << ")";
    }
  }
  EXPECT_EQ(n, 1);
}

}  // namespace
}  // namespace ct
