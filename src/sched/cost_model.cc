// Prefill cost model and its least-squares fit; see cost_model.h for the formula and the paper
// sections it follows.
#include "sched/cost_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ct::sched {
namespace {

void check_params(const CostParams& p) {
  for (double v : {p.t_c, p.t_i, p.t_o}) {
    CT_THROW_IF_NOT(std::isfinite(v) && v >= 0,
                    "cost params t_c={} t_i={} t_o={}: expected finite values >= 0", p.t_c, p.t_i,
                    p.t_o);
  }
}

void check_shape(const PrefillShape& s) {
  CT_THROW_IF_NOT(s.n_reuse >= 0 && s.n_fixed >= 0 && s.n_layer >= 1,
                  "prefill shape n_reuse={} n_fixed={} n_layer={}: expected counts >= 0 and "
                  "n_layer >= 1",
                  s.n_reuse, s.n_fixed, s.n_layer);
}

void check_ratio(double r) {
  CT_THROW_IF_NOT(std::isfinite(r) && r >= 0 && r <= 1, "recompute ratio r={}: expected [0, 1]", r);
}

void check_samples(const std::vector<CostSample>& samples, const char* what) {
  for (const CostSample& x : samples) {
    CT_THROW_IF_NOT(
        std::isfinite(x.n_tokens) && std::isfinite(x.seconds) && x.n_tokens >= 0 && x.seconds >= 0,
        "{} sample (n_tokens={}, seconds={}): expected finite values >= 0", what, x.n_tokens,
        x.seconds);
  }
}

// Centred coefficient of determination; a constant y that is fitted exactly counts as a perfect
// fit.
double r_squared(const std::vector<CostSample>& samples, double slope, double intercept) {
  double mean_y = 0;
  for (const CostSample& x : samples) mean_y += x.seconds;
  mean_y /= static_cast<double>(samples.size());
  double ss_res = 0, ss_tot = 0;
  for (const CostSample& x : samples) {
    const double e = x.seconds - (slope * x.n_tokens + intercept);
    ss_res += e * e;
    ss_tot += (x.seconds - mean_y) * (x.seconds - mean_y);
  }
  if (ss_tot == 0) return ss_res == 0 ? 1.0 : 0.0;
  return 1.0 - ss_res / ss_tot;
}

}  // namespace

double recompute_path_seconds(const CostParams& p, const PrefillShape& s, double r) {
  check_params(p);
  check_shape(s);
  check_ratio(r);
  return p.t_c * (static_cast<double>(s.n_fixed) + r * static_cast<double>(s.n_reuse));
}

double load_path_seconds(const CostParams& p, const PrefillShape& s, double r) {
  check_params(p);
  check_shape(s);
  check_ratio(r);
  return p.t_i * (1.0 - r) * static_cast<double>(s.n_reuse);
}

double predicted_prefill_seconds(const CostParams& p, const PrefillShape& s, double r) {
  const double c = recompute_path_seconds(p, s, r);
  const double i = load_path_seconds(p, s, r);
  const double n_layer = s.n_layer;
  return i + (n_layer - 1) * std::max(c, i) + c + n_layer * p.t_o;
}

AnalyticRatio analytic_ratio(const CostParams& p, const PrefillShape& s, double r_min,
                             double r_max) {
  check_params(p);
  check_shape(s);
  CT_THROW_IF_NOT(
      std::isfinite(r_min) && std::isfinite(r_max) && 0 <= r_min && r_min <= r_max && r_max <= 1,
      "ratio bounds [{}, {}]: expected 0 <= r_min <= r_max <= 1", r_min, r_max);
  CT_THROW_IF_NOT(s.n_reuse > 0, "analytic ratio with n_reuse=0: no cached tokens to balance");
  CT_THROW_IF_NOT(p.t_c + p.t_i > 0,
                  "analytic ratio with t_c=0 and t_i=0: both paths are free, no balance point");
  const double n = static_cast<double>(s.n_reuse);
  AnalyticRatio out;
  out.r_balance = (p.t_i * n - p.t_c * static_cast<double>(s.n_fixed)) / ((p.t_c + p.t_i) * n);
  out.r = std::clamp(out.r_balance, r_min, r_max);
  out.clamped = out.r != out.r_balance;
  return out;
}

CostFit fit_cost_model(const ProfileSamples& samples) {
  check_samples(samples.compute, "compute");
  check_samples(samples.load, "load");
  CostFit fit;

  // Compute path: y = t_c*n + t_o. The centred normal equations give the same solution as the raw
  // 2x2 system but do not cancel catastrophically when n is large and its spread small.
  const auto& xs = samples.compute;
  CT_THROW_IF_NOT(!xs.empty(), "cost model fit: no compute samples");
  double mean_n = 0, mean_y = 0;
  for (const CostSample& x : xs) {
    mean_n += x.n_tokens;
    mean_y += x.seconds;
  }
  mean_n /= static_cast<double>(xs.size());
  mean_y /= static_cast<double>(xs.size());
  double s_nn = 0, s_ny = 0, raw_nn = 0, raw_ny = 0;
  for (const CostSample& x : xs) {
    s_nn += (x.n_tokens - mean_n) * (x.n_tokens - mean_n);
    s_ny += (x.n_tokens - mean_n) * (x.seconds - mean_y);
    raw_nn += x.n_tokens * x.n_tokens;
    raw_ny += x.n_tokens * x.seconds;
  }
  CT_THROW_IF_NOT(s_nn > 0,
                  "cost model fit: {} compute samples all at n_tokens={}; expected at least two "
                  "distinct token counts to separate t_c from t_o",
                  xs.size(), mean_n);
  double t_c = s_ny / s_nn;
  double t_o = mean_y - t_c * mean_n;
  // With y >= 0 and n >= 0, t_c < 0 implies t_o >= mean_y >= 0, so at most one bound is violated
  // and the constrained optimum of this convex problem lies on that bound.
  if (t_c < 0) {
    t_c = 0;
    t_o = mean_y;
    fit.t_c_clamped = true;
  } else if (t_o < 0) {
    t_o = 0;
    t_c = raw_ny / raw_nn;  // raw_nn > 0 because s_nn > 0
    fit.t_o_clamped = true;
  }
  fit.params.t_c = t_c;
  fit.params.t_o = t_o;
  fit.r2_compute = r_squared(xs, t_c, t_o);

  // Load path: y = t_i*n, no intercept (see header).
  double load_nn = 0, load_ny = 0;
  for (const CostSample& x : samples.load) {
    load_nn += x.n_tokens * x.n_tokens;
    load_ny += x.n_tokens * x.seconds;
  }
  CT_THROW_IF_NOT(load_nn > 0,
                  "cost model fit: {} load samples, none with n_tokens > 0; expected at least one",
                  samples.load.size());
  fit.params.t_i = load_ny / load_nn;
  fit.r2_load = r_squared(samples.load, fit.params.t_i, 0);
  return fit;
}

}  // namespace ct::sched
