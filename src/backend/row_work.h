// RowWork: what computing a pass's rows costs, for the engine's step budget
// (EngineOptions::prefill_chunk). A row costs its products with the weights, the same for every
// row, and its attention over the keys before it, which grows with its position: counted in rows
// of weights, a row at position p costs 1 + (p + 1) / keys_per_row, where keys_per_row is the
// number of keys whose attention costs as much as a row's weights (`cachetune bench
// --step-block` measures it on a machine; engine.h gives the default). A budget in this work
// keeps the steps even whether a slice's rows sit at the start of a long prompt or at its end.
// The count depends only on positions and options, never on timing, so a pass's slices (and so
// its bits) are the same on every run.
#pragma once

#include <cstdint>

namespace ct {

struct RowWork {
  double keys_per_row = 0;  // 0: every row costs 1 (rows counted alone)

  // The rows at positions first .. first + n - 1, each `share` of a row of the whole model (a
  // pass through some of its layers).
  double rows(int64_t first, int64_t n, double share = 1.0) const {
    if (n <= 0) return 0;
    const double attn = keys_per_row > 0 ? (double)n * (2 * first + n + 1) / 2 / keys_per_row : 0;
    return share * ((double)n + attn);
  }
  // The rows at the given positions.
  double rows_at(const int32_t* pos, int n, double share = 1.0) const {
    double w = 0;
    for (int i = 0; i < n; ++i) w += rows(pos[i], 1, share);
    return w;
  }
  // How many of the next n rows (contiguous from position first) fit within `work`: the most
  // whose rows() is at most work, possibly 0.
  int fit(int64_t first, int n, double work, double share = 1.0) const {
    int lo = 0, hi = n;  // rows(first, lo) <= work; the answer is in [lo, hi]
    while (lo < hi) {
      const int mid = lo + (hi - lo + 1) / 2;
      if (rows(first, mid, share) <= work) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }
  // The same for rows at the given ascending positions.
  int fit_at(const int32_t* pos, int n, double work, double share = 1.0) const {
    double w = 0;
    int r = 0;
    for (; r < n; ++r) {
      w += rows(pos[r], 1, share);
      if (w > work) break;
    }
    return r;
  }
};

}  // namespace ct
