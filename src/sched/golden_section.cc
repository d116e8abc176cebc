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

double probe(const std::function<double(double)>& objective, double r, GoldenSectionResult& out,
             bool paired = false) {
  const double value = objective(r);
  CT_THROW_IF_NOT(std::isfinite(value), "golden-section objective at r={} returned {}", r, value);
  out.probes.push_back({r, value, paired});
  if (paired) ++out.n_paired_probes;
  return value;
}

struct Point {
  double x = 0, f = 0;
};

Point measure(const std::function<double(double)>& objective, double x, GoldenSectionResult& out) {
  return {x, probe(objective, x, out)};
}

// Measures p1 and p2 again in `rounds` back-to-back rounds, alternating which goes first, and
// replaces each value with its fastest paired measurement.
void remeasure_in_pairs(const std::function<double(double)>& objective, Point& p1, Point& p2,
                        int rounds, GoldenSectionResult& out) {
  double f1 = INFINITY, f2 = INFINITY;
  for (int k = 0; k < rounds; ++k) {
    if (k % 2 == 0) {
      f1 = std::min(f1, probe(objective, p1.x, out, true));
      f2 = std::min(f2, probe(objective, p2.x, out, true));
    } else {
      f2 = std::min(f2, probe(objective, p2.x, out, true));
      f1 = std::min(f1, probe(objective, p1.x, out, true));
    }
  }
  p1.f = f1;
  p2.f = f2;
  ++out.n_paired;
}

// True when the minimum is taken to lie on the lower-r side ([a, p2.x]); see
// GoldenSectionOptions::noise for when the two values are measured again first. The paired
// values decide even when they are still inside the band: a rule that forced one side on a
// tie would compound over the reductions (tested).
bool lower_side(const std::function<double(double)>& objective, Point& p1, Point& p2,
                const GoldenSectionOptions& opt, GoldenSectionResult& out) {
  const bool close = std::abs(p1.f - p2.f) <= opt.noise * std::min(std::abs(p1.f), std::abs(p2.f));
  if (opt.noise > 0 && opt.paired_rounds > 0 && close) {
    remeasure_in_pairs(objective, p1, p2, opt.paired_rounds, out);
  }
  return p1.f <= p2.f;
}

PhaseEnds run_phase(const std::function<double(double)>& objective, double a, double b,
                    const GoldenSectionOptions& opt, GoldenSectionResult& out) {
  PhaseEnds ends{a, b, false, false, golden_section_iterations(b - a, opt.eps)};
  if (ends.n_iter == 0) return ends;
  Point p1 = measure(objective, b - kPhi * (b - a), out);
  Point p2 = measure(objective, a + kPhi * (b - a), out);
  for (int i = 0; i < ends.n_iter; ++i) {
    const bool last = i + 1 == ends.n_iter;
    if (lower_side(objective, p1, p2, opt, out)) {  // a unimodal minimum lies in [a, x2]
      b = p2.x;
      ends.hi_moved = true;
      p2 = p1;
      if (!last) p1 = measure(objective, b - kPhi * (b - a), out);
    } else {  // ... in [x1, b]
      a = p1.x;
      ends.lo_moved = true;
      p1 = p2;
      if (!last) p2 = measure(objective, a + kPhi * (b - a), out);
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
  CT_THROW_IF_NOT(std::isfinite(options.noise) && options.noise >= 0 && options.paired_rounds >= 0,
                  "golden-section noise={} paired_rounds={}: expected noise >= 0 and "
                  "paired_rounds >= 0",
                  options.noise, options.paired_rounds);
  PhaseEnds ends = run_phase(objective, a0, b0, options, out);
  out.n_iter = ends.n_iter;
  if (ends.n_iter > 0) {
    if (!ends.lo_moved && a0 > lo) {
      ends = run_phase(objective, lo, ends.hi, options, out);
      out.expanded = true;
    } else if (!ends.hi_moved && b0 < hi) {
      ends = run_phase(objective, ends.lo, hi, options, out);
      out.expanded = true;
    }
    if (out.expanded) out.n_iter += ends.n_iter;
  }
  out.lo = ends.lo;
  out.hi = ends.hi;
  out.r = 0.5 * (ends.lo + ends.hi);
  if (options.noise > 0 && options.paired_rounds > 0 && out.r - lo >= options.eps) {
    Point bound{lo, 0}, chosen{out.r, 0};
    remeasure_in_pairs(objective, bound, chosen, options.paired_rounds, out);
    out.lower_bound_checked = true;
    if (bound.f <= chosen.f) {
      out.lower_bound_won = true;
      out.r = lo;
    }
  }
  out.n_eval = static_cast<int>(out.probes.size());
  return out;
}

}  // namespace ct::sched
