// Analytic prefill cost model of the recompute/load pipeline (paper Sec. 4.3 and App. C.1):
// predicts TTFT for a recompute ratio r, gives the ratio that balances recomputation against KV
// loading, and fits the model's per-token and per-layer costs from profiling samples.
#pragma once

#include <cstdint>
#include <vector>

namespace ct::sched {

// Hardware/tier costs, all in seconds. Appendix C.1 defines them; the profiler measures them on the
// target model and cache path (paper: "estimated during deployment initialization").
struct CostParams {
  double t_c = 0;  // recompute cost per token per layer (model width x device compute)
  double t_i = 0;  // load cost per token per layer for one tier, incl. dtype conversion and RoPE
  double t_o = 0;  // fixed per-layer overhead: launches, event waits, buffer management
};

// One prefill request as the cost model sees it.
struct PrefillShape {
  int64_t n_reuse = 0;  // N: tokens of cached chunks; r*N are recomputed, (1-r)*N are loaded
  int64_t n_fixed = 0;  // tokens outside any chunk (query, suffix): always recomputed, never loaded
  int n_layer = 0;      // L
};

// The prefill-time formula. The extracted paper text (Sec. 4.3, App. C.1) names N, L, r, t_c, t_i
// and t_o but the equation itself did not survive extraction, so this is our reconstruction from
// the pipeline of Sec. 4.2 (the load of layer l+1 overlaps the recompute of layer l):
//
//   C(r) = t_c * (n_fixed + r*N)          recompute path of one layer
//   I(r) = t_i * (1 - r) * N              load path of one layer
//   T(r) = I(r) + (L - 1) * max(C(r), I(r)) + C(r) + L * t_o
//
// I(r) up front is the pipeline fill (layer 1's KV must arrive before anything overlaps it); then
// L-1 overlapped steps each take the slower path; the last layer's recompute has nothing left to
// hide behind it (drain); the per-layer overhead is serial. This is the makespan of a two-stage
// flow shop with identical stages plus serial overhead. r is continuous here; the engine rounds
// r*N.
double recompute_path_seconds(const CostParams& p, const PrefillShape& s, double r);
double load_path_seconds(const CostParams& p, const PrefillShape& s, double r);
double predicted_prefill_seconds(const CostParams& p, const PrefillShape& s, double r);

// Solution of C(r) = I(r):  r_balance = (t_i*N - t_c*n_fixed) / ((t_c + t_i) * N).
// For L >= 2 with L*t_i > t_c and L*t_c > t_i, T(r) falls with slope N*(t_c - L*t_i) below
// r_balance and rises with slope N*(L*t_c - t_i) above it, so r_balance minimises T. The returned r
// is r_balance clamped to [r_min, r_max] (r_min is the quality floor of App. E.3); `clamped` says
// so, because a clamp means the model's optimum was not reachable.
struct AnalyticRatio {
  double r = 0;          // the ratio to use: r_balance clamped to [r_min, r_max]
  double r_balance = 0;  // unclamped balance point; may lie outside [0, 1]
  bool clamped = false;
};
AnalyticRatio analytic_ratio(const CostParams& p, const PrefillShape& s, double r_min,
                             double r_max);

// One profiling measurement: a token count and the seconds it took.
struct CostSample {
  double n_tokens = 0;
  double seconds = 0;
};

struct ProfileSamples {
  std::vector<CostSample> compute;  // (recomputed tokens, one layer's time); model t_c*n + t_o
  std::vector<CostSample> load;     // (loaded tokens, one layer's load time); model t_i*n
};

// Least-squares fit of the model. The load fit has no intercept because the model's load path has
// none; any fixed load latency shows up as a poor r2_load rather than being hidden. Costs are
// physically non-negative, so a noisy fit that goes negative is replaced by the exact constrained
// optimum on that boundary (t_o = 0: refit t_c through the origin; t_c = 0: t_o = mean time), and
// the *_clamped flag reports it. R^2 is the centred 1 - SS_res/SS_tot for both fits (it can be
// negative for the no-intercept load fit when the data have a large offset).
struct CostFit {
  CostParams params;
  double r2_compute = 0;
  double r2_load = 0;
  bool t_c_clamped = false;
  bool t_o_clamped = false;
  // No t_i flag: with non-negative samples the no-intercept slope sum(n*y)/sum(n*n) is >= 0.
};

// Throws ct::Error for negative or non-finite samples, fewer than two distinct compute token
// counts, or no load sample with n_tokens > 0.
CostFit fit_cost_model(const ProfileSamples& samples);

}  // namespace ct::sched
