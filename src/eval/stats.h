// Sample statistics for the evaluation summary: mean, median and percentile-bootstrap intervals,
// with a random generator defined here (SplitMix64 and an exact bounded draw), so an interval is
// the same on every platform and standard library for the same data and seed; std::mt19937 is
// portable but std::uniform_int_distribution is not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ct {

// SplitMix64 (Steele, Lea, Flood 2014): next() = the well-known mix of state += 0x9e3779b97f4a7c15.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : s_(seed) {}
  uint64_t next();
  // Uniform in [0, n) without modulo bias (Lemire's multiply-shift with rejection); n >= 1.
  uint64_t below(uint64_t n);

 private:
  uint64_t s_;
};

// FNV-1a of `label` mixed into `seed`: one independent stream per table cell.
uint64_t stream_seed(uint64_t seed, const std::string& label);

inline constexpr uint64_t kBootstrapSeed = 20261201;
inline constexpr int kBootstrapResamples = 2000;

double sample_mean(const std::vector<double>& x);  // NaN when empty
double sample_median(std::vector<double> x);       // NaN when empty
// Quantile q in [0, 1] of sorted data, linear interpolation between order statistics (R type 7,
// numpy's default): x[(n-1)q]. NaN when empty.
double quantile_sorted(const std::vector<double>& sorted, double q);

struct Interval {
  double lo = 0, hi = 0;
};
// Percentile bootstrap interval of the mean at `level` (0.95: the 2.5% and 97.5% quantiles of
// `resamples` resampled means). Each resample draws x.size() indices with SplitMix64(seed).below.
// Empty x: NaN bounds; one value or all equal: [x, x].
Interval bootstrap_mean_ci(const std::vector<double>& x, uint64_t seed,
                           int resamples = kBootstrapResamples, double level = 0.95);

struct SampleSummary {
  int n = 0;
  double mean = 0, median = 0;
  Interval ci;  // bootstrap 95% interval of the mean
};
SampleSummary summarize_sample(const std::vector<double>& x, uint64_t seed,
                               int resamples = kBootstrapResamples);

}  // namespace ct
