// The bootstrap and summary statistics of eval/stats.h: known answers, determinism and a
// generator that is defined here, not by the standard library.
#include "eval/stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/quality_stats.h"

namespace ct {
namespace {

TEST(SplitMix64, KnownSequence) {
  // Reference values of SplitMix64 seeded with 0 (Vigna's splitmix64.c).
  SplitMix64 g(0);
  EXPECT_EQ(g.next(), 0xe220a8397b1dcdafull);
  EXPECT_EQ(g.next(), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(g.next(), 0x06c45d188009454full);
}

TEST(SplitMix64, BelowIsInRangeAndUniform) {
  SplitMix64 g(7);
  std::vector<int> count(6, 0);
  for (int i = 0; i < 60000; ++i) {
    const uint64_t v = g.below(6);
    ASSERT_LT(v, 6u);
    ++count[v];
  }
  for (int c : count) EXPECT_NEAR(c, 10000, 400);
  EXPECT_EQ(g.below(1), 0u);
}

TEST(Stats, MeanMedianQuantile) {
  EXPECT_DOUBLE_EQ(sample_mean({1, 2, 3, 10}), 4.0);
  EXPECT_DOUBLE_EQ(sample_median({3, 1, 10, 2}), 2.5);
  EXPECT_DOUBLE_EQ(sample_median({5, 1, 3}), 3.0);
  EXPECT_DOUBLE_EQ(quantile_sorted({0, 10}, 0.25), 2.5);  // numpy.quantile([0, 10], 0.25)
  EXPECT_DOUBLE_EQ(quantile_sorted({1, 2, 3, 4, 5}, 0.975), 4.9);
  EXPECT_TRUE(std::isnan(sample_mean({})));
  EXPECT_TRUE(std::isnan(sample_median({})));
}

TEST(Bootstrap, DegenerateSamples) {
  const Interval c = bootstrap_mean_ci({0.7, 0.7, 0.7}, 1);
  EXPECT_EQ(c.lo, 0.7);
  EXPECT_EQ(c.hi, 0.7);
  const Interval one = bootstrap_mean_ci({2.5}, 1);
  EXPECT_EQ(one.lo, 2.5);
  EXPECT_EQ(one.hi, 2.5);
  const Interval none = bootstrap_mean_ci({}, 1);
  EXPECT_TRUE(std::isnan(none.lo) && std::isnan(none.hi));
  EXPECT_THROW(bootstrap_mean_ci({1.0, NAN}, 1), Error);
}

TEST(Bootstrap, DeterministicForASeedAndDifferentAcrossSeeds) {
  const std::vector<double> x = {0.1, 0.5, 0.9, 1.3, 0.2, 0.4, 2.0, 0.05};
  const Interval a = bootstrap_mean_ci(x, 42), b = bootstrap_mean_ci(x, 42);
  EXPECT_EQ(a.lo, b.lo);
  EXPECT_EQ(a.hi, b.hi);
  const Interval c = bootstrap_mean_ci(x, 43);
  EXPECT_TRUE(a.lo != c.lo || a.hi != c.hi);
  const double m = sample_mean(x);
  EXPECT_LT(a.lo, m);
  EXPECT_GT(a.hi, m);
}

TEST(Bootstrap, TwoPointSampleMatchesTheExactResamplingDistribution) {
  // x = {0, 1}: a resample mean is k/2 with k ~ Binomial(2, 1/2): P(0) = P(1) = 1/4, P(1/2) = 1/2,
  // so the 2.5% and 97.5% quantiles of many resampled means are 0 and 1.
  const Interval c = bootstrap_mean_ci({0.0, 1.0}, 5, 4000);
  EXPECT_EQ(c.lo, 0.0);
  EXPECT_EQ(c.hi, 1.0);
}

TEST(Bootstrap, BernoulliIntervalMatchesTheNormalApproximation) {
  // 100 values, 30 ones: the mean's standard error is sqrt(0.3 * 0.7 / 100) = 0.0458, so the
  // 95% interval is close to 0.3 -+ 1.96 * 0.0458 = [0.210, 0.390].
  std::vector<double> x(100, 0.0);
  for (int i = 0; i < 30; ++i) x[i] = 1.0;
  const Interval c = bootstrap_mean_ci(x, 11, 4000);
  EXPECT_NEAR(c.lo, 0.210, 0.02);
  EXPECT_NEAR(c.hi, 0.390, 0.02);
}

TEST(QualityStats, KlRatioAndPairedDifferences) {
  using nlohmann::json;
  std::vector<json> recs;
  auto add = [&](const char* ex, const char* pol, double kl, double fid) {
    recs.push_back({{"example", ex}, {"task", "t"}, {"setting", "base"}, {"ref_setting", "base"},
                    {"policy", pol}, {"kl", kl}, {"fid_score", fid}, {"task_score", nullptr},
                    {"ttft_ms", 10.0}, {"recall", nullptr}});
  };
  add("a", "full", 0, 1);
  add("b", "full", 0, 1);
  add("a", "reuse", 0.2, 0.5);
  add("b", "reuse", 0.4, 0.5);
  add("a", "x", 0.1, 1.0);  // ratio 0.5
  add("b", "x", 0.1, 0.0);  // ratio 0.25
  const json s = quality_stats(recs);
  const json& x = s["tasks"]["t"]["base"]["policies"]["x"]["kl_ratio"];
  EXPECT_EQ(x["n"], 2);
  EXPECT_DOUBLE_EQ(x["mean"].get<double>(), 0.375);
  EXPECT_DOUBLE_EQ(x["median"].get<double>(), 0.375);
  EXPECT_DOUBLE_EQ(s["tasks"]["t"]["base"]["policies"]["reuse"]["kl_ratio"]["mean"].get<double>(),
                   1.0);
  const json& d = s["tasks"]["t"]["base"]["paired"]["x|reuse"]["kl_ratio"];
  EXPECT_DOUBLE_EQ(d["mean"].get<double>(), -0.625);
  EXPECT_LE(d["lo"].get<double>(), d["hi"].get<double>());
  EXPECT_DOUBLE_EQ(s["overall"]["base"]["policies"]["x"]["fid_score"]["mean"].get<double>(), 0.5);
  // Same input, same intervals.
  EXPECT_EQ(quality_stats(recs).dump(), s.dump());
}

}  // namespace
}  // namespace ct
