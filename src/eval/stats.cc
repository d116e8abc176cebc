#include "eval/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace ct {

double sample_mean(const std::vector<double>& x) {
  if (x.empty()) return std::numeric_limits<double>::quiet_NaN();
  double s = 0;
  for (double v : x) s += v;
  return s / (double)x.size();
}

double quantile_sorted(const std::vector<double>& s, double q) {
  if (s.empty()) return std::numeric_limits<double>::quiet_NaN();
  CT_THROW_IF_NOT(q >= 0 && q <= 1, "quantile {} outside [0, 1]", q);
  const double h = (double)(s.size() - 1) * q;
  const size_t lo = (size_t)std::floor(h);
  const size_t hi = std::min(lo + 1, s.size() - 1);
  return s[lo] + (h - (double)lo) * (s[hi] - s[lo]);
}

double sample_median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return quantile_sorted(x, 0.5);
}

Interval bootstrap_mean_ci(const std::vector<double>& x, uint64_t seed, int resamples,
                           double level) {
  CT_THROW_IF_NOT(resamples >= 1, "bootstrap with {} resamples", resamples);
  CT_THROW_IF_NOT(level > 0 && level < 1, "interval level {} outside (0, 1)", level);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (x.empty()) return {nan, nan};
  for (double v : x) CT_THROW_IF_NOT(std::isfinite(v), "bootstrap of a non-finite value {}", v);
  const auto [mn, mx] = std::minmax_element(x.begin(), x.end());
  if (*mn == *mx) return {*mn, *mn};
  SplitMix64 g(seed);
  const size_t n = x.size();
  std::vector<double> means(resamples);
  for (int b = 0; b < resamples; ++b) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += x[g.below(n)];
    means[b] = s / (double)n;
  }
  std::sort(means.begin(), means.end());
  const double a = (1 - level) / 2;
  return {quantile_sorted(means, a), quantile_sorted(means, 1 - a)};
}

SampleSummary summarize_sample(const std::vector<double>& x, uint64_t seed, int resamples) {
  SampleSummary s;
  s.n = (int)x.size();
  s.mean = sample_mean(x);
  s.median = sample_median(x);
  s.ci = bootstrap_mean_ci(x, seed, resamples);
  return s;
}

}  // namespace ct
