// Golden-section search over the recompute ratio with a warm-start bracket and one expansion; see
// golden_section.h for the contract.
#include "sched/golden_section.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ct::sched {
namespace {

// phi = (sqrt(5) - 1) / 2 satisfies phi^2 = 1 - phi, which is what lets the surviving probe sit
// exactly at a golden position of the reduced bracket.
const double kPhi = (std::sqrt(5.0) - 1.0) / 2.0;

struct PhaseEnds {
  double lo = 0, hi = 0;
  bool lo_moved = false, hi_moved = false;
  int n_iter = 0;
};

double probe(const std::function<double(double)>& objective, double r, GoldenSectionResult& out) {
  const double value = objective(r);
  CT_THROW_IF_NOT(std::isfinite(value), "golden-section objective at r={} returned {}", r, value);
  out.probes.push_back({r, value});
  return value;
}

PhaseEnds run_phase(const std::function<double(double)>& objective, double a, double b, double eps,
                    GoldenSectionResult& out) {
  PhaseEnds ends{a, b, false, false, golden_section_iterations(b - a, eps)};
  if (ends.n_iter == 0) return ends;
  double x1 = b - kPhi * (b - a);
  double x2 = a + kPhi * (b - a);
  double f1 = probe(objective, x1, out);
  double f2 = probe(objective, x2, out);
  for (int i = 0; i < ends.n_iter; ++i) {
    const bool last = i + 1 == ends.n_iter;
    if (f1 <= f2) {  // a unimodal minimum lies in [a, x2]
      b = x2;
      ends.hi_moved = true;
      x2 = x1;
      f2 = f1;
      if (!last) {
        x1 = b - kPhi * (b - a);
        f1 = probe(objective, x1, out);
      }
    } else {  // ... in [x1, b]
      a = x1;
      ends.lo_moved = true;
      x1 = x2;
      f1 = f2;
      if (!last) {
        x2 = a + kPhi * (b - a);
        f2 = probe(objective, x2, out);
      }
    }
  }
  ends.lo = a;
  ends.hi = b;
  return ends;
}

}  // namespace

int golden_section_iterations(double width, double eps) {
  CT_THROW_IF_NOT(std::isfinite(width) && width >= 0, "golden-section width={}: expected >= 0",
                  width);
  CT_THROW_IF_NOT(std::isfinite(eps) && eps >= 1e-9, "golden-section eps={}: expected >= 1e-9",
                  eps);
  int k = 0;
  for (double w = width; w >= eps; w *= kPhi) ++k;
  return k;
}

int golden_section_evaluations(double width, double eps) {
  const int k = golden_section_iterations(width, eps);
  return k == 0 ? 0 : k + 1;
}

GoldenSectionResult golden_section_search(const std::function<double(double)>& objective, double a,
                                          double b, const GoldenSectionOptions& options) {
  CT_THROW_IF_NOT(objective != nullptr, "golden-section search: empty objective");
  CT_THROW_IF_NOT(std::isfinite(a) && std::isfinite(b) && std::isfinite(options.r_min),
                  "golden-section bracket [{}, {}] r_min={}: expected finite values", a, b,
                  options.r_min);
  const double lo = std::max(a, options.r_min);
  const double hi = b;
  CT_THROW_IF_NOT(lo <= hi, "golden-section bracket [{}, {}] with r_min={}: empty search range", a,
                  b, options.r_min);
  CT_THROW_IF_NOT(std::isfinite(options.warm_width) && options.warm_width > 0,
                  "golden-section warm_width={}: expected > 0", options.warm_width);

  double a0 = lo, b0 = hi;
  if (options.r0) {
    CT_THROW_IF_NOT(std::isfinite(*options.r0), "golden-section warm start r0={}: not finite",
                    *options.r0);
    // An r0 outside [lo, hi] is moved to the nearer bound, so the bracket never leaves [lo, hi].
    const double r0 = std::clamp(*options.r0, lo, hi);
    a0 = std::max(lo, r0 - options.warm_width);
    b0 = std::min(hi, r0 + options.warm_width);
  }

  GoldenSectionResult out;
  PhaseEnds ends = run_phase(objective, a0, b0, options.eps, out);
  out.n_iter = ends.n_iter;
  if (ends.n_iter > 0) {
    if (!ends.lo_moved && a0 > lo) {
      ends = run_phase(objective, lo, ends.hi, options.eps, out);
      out.expanded = true;
    } else if (!ends.hi_moved && b0 < hi) {
      ends = run_phase(objective, ends.lo, hi, options.eps, out);
      out.expanded = true;
    }
    if (out.expanded) out.n_iter += ends.n_iter;
  }
  out.lo = ends.lo;
  out.hi = ends.hi;
  out.r = 0.5 * (ends.lo + ends.hi);
  out.n_eval = static_cast<int>(out.probes.size());
  return out;
}

}  // namespace ct::sched
