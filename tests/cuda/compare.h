// Shared by the GPU tests: the largest absolute difference between two arrays, relative to the
// reference's largest magnitude (at least 1), the measure their tolerances are stated in.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace ct::test {

inline double rel_max_diff(const float* got, const float* want, size_t n) {
  double worst = 0.0, scale = 1.0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  return worst / scale;
}

}  // namespace ct::test
