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
  // Measurement noise, relative (e.g. 0.05 = 5%). 0 (default) is the plain search: every
  // comparison trusts one measurement per probe. noise > 0 switches on the robust mode for
  // measured TTFT on a shared machine, where two measurements of the same r minutes apart differ
  // by more than the slope near the optimum:
  //  - Paired comparisons. When two probes' values differ by no more than noise * min(f1, f2),
  //    both are measured again in paired_rounds back-to-back rounds that alternate which one
  //    goes first, and compared on the fastest of those paired measurements alone: the retained
  //    probe's first value was taken earlier, under another machine state, and interference from
  //    other work only ever adds time, so the fastest run is the least disturbed one (as
  //    CalibrationWorkload keeps each request's fastest repeat).
  //  - Lower-bound check. The optimum often sits at the quality floor (fast media: App. E.4),
  //    where every wrong step of the search lands the midpoint above it. If the result is at
  //    least eps above the lower bound, the two are compared in paired rounds and the faster
  //    one is returned.
  double noise = 0;
  int paired_rounds = 2;
};

struct GoldenSectionProbe {
  double r = 0;
  double value = 0;        // objective at r, e.g. mean TTFT in seconds
  bool paired = false;     // taken in a paired comparison round (noise > 0 only)
};

struct GoldenSectionResult {
  double r = 0;  // midpoint of the final bracket (App. C.2), or the lower bound if it won the
                 // lower-bound check (noise > 0)
  double lo = 0, hi = 0;                   // final bracket; hi - lo < eps
  std::vector<GoldenSectionProbe> probes;  // every objective call, in call order
  int n_eval = 0;                          // == probes.size()
  int n_paired_probes = 0;                 // probes with `paired` set
  int n_paired = 0;                        // comparisons decided in paired rounds
  bool lower_bound_checked = false;        // the lower-bound check ran (noise > 0)
  bool lower_bound_won = false;            // ... and the lower bound was faster: r = lo bound
  int n_iter = 0;                          // bracket reductions over both phases
  bool expanded = false;                   // the warm bracket was widened once (see below)
};

// Searches [max(a, r_min), b]. Each reduction keeps the side of the lower probe (ties keep the
// lower-r side) and reuses the other probe, so a phase over width W costs
// golden_section_evaluations(W, eps) objective calls: two to seed and one per later reduction
// (plus, with options.noise > 0, at most 2 * paired_rounds per reduction and for the lower-bound
// check).
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
