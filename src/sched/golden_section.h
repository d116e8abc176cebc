// Warm-started golden-section search for the recompute ratio (paper App. C.2): minimises a measured
// objective (mean TTFT over the calibration requests) over r with one new measurement per bracket
// reduction, starting from the cost model's analytic guess.
#pragma once

#include <functional>
#include <optional>
#include <vector>

namespace ct::sched {

struct GoldenSectionOptions {
  double r_min = 0.15;  // quality floor (App. E.3); nothing below it is ever probed
  double eps = 0.01;    // stop once the bracket is narrower than this; must be >= 1e-9
  // Analytic guess. Given, the first bracket is [max(lo, r0 - warm_width), min(hi, r0 +
  // warm_width)] within the global bounds [lo, hi] = [max(a, r_min), b].
  std::optional<double> r0;
  double warm_width = 0.15;
  // Measurement noise, relative (e.g. 0.03 = 3%). 0 (default) is the plain search: every
  // comparison trusts one measurement per probe. With noise > 0, when two probes' values differ
  // by no more than noise * min(f1, f2), both are measured again in paired_rounds back-to-back
  // rounds that alternate which one goes first (so a load trend over the rounds weighs on both
  // alike), and compared on the means of those paired measurements alone: the retained probe's
  // first value was taken earlier, under another machine state. On a shared machine two
  // measurements of the same r minutes apart differ by more than the slope near the optimum, so
  // one-shot comparisons of a fresh probe against a stale retained one walk the search off in
  // the direction of the load trend; this is what the paired rounds guard against.
  double noise = 0;
  int paired_rounds = 2;
};

struct GoldenSectionProbe {
  double r = 0;
  double value = 0;        // objective at r, e.g. mean TTFT in seconds
  bool remeasure = false;  // a paired repeat of an earlier probe's r (noise > 0 only)
};

struct GoldenSectionResult {
  double r = 0;                            // midpoint of the final bracket (App. C.2)
  double lo = 0, hi = 0;                   // final bracket; hi - lo < eps
  std::vector<GoldenSectionProbe> probes;  // every objective call, in call order
  int n_eval = 0;                          // == probes.size()
  int n_remeasure = 0;                     // probes with remeasure set
  int n_paired = 0;                        // comparisons decided by paired re-measurement
  int n_iter = 0;                          // bracket reductions over both phases
  bool expanded = false;                   // the warm bracket was widened once (see below)
};

// Searches [max(a, r_min), b]. Each reduction keeps the side of the lower probe (ties keep the
// lower-r side) and reuses the other probe, so a phase over width W costs
// golden_section_evaluations(W, eps) objective calls: two to seed and one per later reduction
// (plus, with options.noise > 0, at most 2 * paired_rounds repeats per reduction).
// The number of reductions is fixed up front from W (golden_section_iterations), so the
// calibration cost is known before anything is measured and rounding in the bracket ends cannot
// add a stray measurement.
//
// Warm start and expansion: a wrong analytic model can put the true optimum outside the warm
// bracket; the search then never moves the bracket end on that side. If that happens at an end that
// is not a global bound, the search runs once more over [lo, hi_final] (or [lo_final, hi]), i.e.
// from the converged bracket out to the global bound on that side. Going all the way to the bound
// costs only a few extra calls (the count grows with log(width)) and, since it is done only once,
// guarantees the optimum of a unimodal objective is inside the second bracket. Probes of the first
// phase are not reused: they do not sit at golden positions of the new bracket.
//
// Throws ct::Error for a bad bracket or options, or when the objective returns a non-finite value.
GoldenSectionResult golden_section_search(const std::function<double(double)>& objective, double a,
                                          double b, const GoldenSectionOptions& options = {});

// Bracket reductions needed to go from `width` to below `eps`: the least k >= 0 with
// width * phi^k < eps.
int golden_section_iterations(double width, double eps);

// Objective calls for one phase over `width`: 0 when no reduction is needed, else iterations + 1.
int golden_section_evaluations(double width, double eps);

}  // namespace ct::sched
