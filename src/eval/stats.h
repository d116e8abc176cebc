// Sample statistics for the evaluation summary: mean, median and percentile-bootstrap intervals,
// drawn with core/random.h's SplitMix64, so an interval is the same on every platform and
// standard library for the same data and seed.
#pragma once

#include <cstdint>

#include "core/random.h"  // SplitMix64, stream_seed
#include <string>
#include <vector>

namespace ct {

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
