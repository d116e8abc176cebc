// `cachetune calibrate`: hardware-aware recompute ratio for one cache tier (paper App. C, D.4).
// Prints the cost profile, the analytic guess, every probe of the search and the chosen r, and
// stores it for `generate --ratio auto`; --sweep adds an exhaustive sweep of r as evidence.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/timer.h"
#include "engine/calibration.h"
#include "tools/cli/commands.h"
#include "tools/cli/engine_flags.h"

namespace ct::cli {
namespace {

struct CalibrateArgs {
  EngineFlags engine;  // model and encoding settings; the tier comes from --tier
  std::string tier;
  std::string calibration;
  std::string data;
  int limit = 10;
  CalibrateOptions cal;
  bool sweep = false;
  double sweep_step = 0.05;
  double sweep_max = 0;  // 0: up to --rmax
};

// The default calibration set (paper App. D.4: the first examples of one task): hotpotqa from
// ../shared/data beside the repository, else the example documents shipped with it.
std::string default_data_path() {
  const std::string repo = CT_SOURCE_DIR;
  const std::string task = repo + "/../shared/data/hotpotqa.jsonl";
  std::error_code ec;
  if (std::filesystem::exists(task, ec)) return task;
  return repo + "/examples/docs";
}

void print_entry(const sched::CalibrationEntry& e) {
  std::printf(
      "profile: t_c = %.3f us/token/layer, t_i = %.3f us/token/layer, t_o = %.1f us/layer\n",
      e.profile.t_c * 1e6, e.profile.t_i * 1e6, e.profile.t_o * 1e6);
  std::printf("analytic guess: r0 = %.3f\n", e.analytic_r);
  for (size_t i = 0; i < e.probes.size(); ++i) {
    std::printf("  probe %2zu: r = %.4f  mean TTFT %.1f ms\n", i + 1, e.probes[i].r,
                e.probes[i].value * 1e3);
  }
  std::printf("chosen r = %.4f\n", e.chosen_r);
}

// Everything known before the search: the fitted profile, the request shape, the analytic guess.
void print_profile(const CalibrationRun& run, const CalibrateOptions& o) {
  const sched::CostParams& p = run.fit.params;
  std::printf("profile (fit of real layer and load timings):\n");
  std::printf("  t_c = %8.3f us per token per layer (recompute)             R^2 %.3f%s\n",
              p.t_c * 1e6, run.fit.r2_compute, run.fit.t_c_clamped ? "  [clamped to 0]" : "");
  std::printf("  t_i = %8.3f us per token per layer (read + unpack + RoPE)  R^2 %.3f\n",
              p.t_i * 1e6, run.fit.r2_load);
  std::printf("  t_o = %8.1f us per layer (fixed overhead)%s\n", p.t_o * 1e6,
              run.fit.t_o_clamped ? "  [clamped to 0]" : "");
  std::printf(
      "shape: N = %lld reused + %lld fixed tokens, L = %d layers; predicted prefill "
      "%.1f ms at r_min, %.1f ms at r0\n",
      (long long)run.shape.n_reuse, (long long)run.shape.n_fixed, run.shape.n_layer,
      sched::predicted_prefill_seconds(p, run.shape, o.r_min) * 1e3,
      sched::predicted_prefill_seconds(p, run.shape, run.analytic.r) * 1e3);
  std::printf(
      "analytic guess: r_balance = %.4f -> r0 = %.4f%s\n", run.analytic.r_balance, run.analytic.r,
      run.analytic.clamped ? fmt::format(" (clamped to [{:.2f}, {:.2f}])", o.r_min, o.r_max).c_str()
                           : "");
  std::printf("golden-section search on measured mean TTFT, warm-started at r0:\n");
  std::fflush(stdout);
}

void print_result(const CalibrationRun& run) {
  const sched::GoldenSectionResult& g = run.search;
  std::printf(
      "search: %d probes (%d of them in paired rounds for %d comparisons), %d bracket "
      "reductions%s, final bracket [%.4f, %.4f]\n",
      g.n_eval, g.n_paired_probes, g.n_paired, g.n_iter,
      g.expanded ? " (warm bracket expanded once)" : "", g.lo, g.hi);
  if (g.lower_bound_checked) {
    std::printf("lower-bound check: r_min %s the bracket midpoint %.4f in paired rounds\n",
                g.lower_bound_won ? "was faster than" : "was slower than", 0.5 * (g.lo + g.hi));
  }
  std::printf("chosen r = %.4f\n", run.entry.chosen_r);
}

void run_sweep(Engine& eng, const std::vector<CalibrationRequest>& reqs, const CalibrateArgs& a,
               double chosen_r) {
  CalibrationWorkload work(eng, reqs);
  const int repeats = a.cal.repeats;
  const double r_end = a.sweep_max > 0 ? std::min(a.sweep_max, a.cal.r_max) : a.cal.r_max;
  PolicyOptions pol;
  pol.kind = &find_policy("cachetune");
  pol.ratio = a.cal.r_min;
  work.mean_ttft_seconds(pol);  // untimed warm-up, as in calibration
  std::printf(
      "sweep r = %.2f..%.2f step %.2f (cachetune policy, mean TTFT over %zu requests, "
      "%d repeat(s)):\n",
      a.cal.r_min, r_end, a.sweep_step, work.size(), repeats);
  double best_r = a.cal.r_min, best_t = INFINITY;
  const int n_steps = (int)std::floor((r_end - a.cal.r_min) / a.sweep_step + 1e-9);
  for (int i = 0; i <= n_steps; ++i) {
    pol.ratio = std::min(r_end, a.cal.r_min + i * a.sweep_step);
    const double t = work.mean_ttft_seconds(pol, repeats);
    std::printf("  r = %.2f  mean TTFT %.1f ms\n", pol.ratio, t * 1e3);
    std::fflush(stdout);
    if (t < best_t) {
      best_t = t;
      best_r = pol.ratio;
    }
  }
  // The comparison figures are measured again, back to back, so that they share the machine's
  // state: on a shared machine two measurements minutes apart differ by more than 3%.
  auto ttft_at = [&](double r) {
    pol.ratio = r;
    return work.mean_ttft_seconds(pol, repeats);
  };
  const double t_best = ttft_at(best_r);
  const double t_chosen = ttft_at(chosen_r);
  const double t_rmin = ttft_at(a.cal.r_min);
  PolicyOptions full;
  full.kind = &find_policy("full");
  const double t_full = work.mean_ttft_seconds(full, repeats);
  const double dr = std::fabs(chosen_r - best_r);
  const double dt = t_chosen / t_best - 1;
  const bool holds = dr <= 0.02 || dt <= 0.03;
  std::printf(
      "re-measured: sweep best r = %.2f %.1f ms, chosen r = %.4f %.1f ms, r_min = %.2f "
      "%.1f ms, full recompute %.1f ms\n",
      best_r, t_best * 1e3, chosen_r, t_chosen * 1e3, a.cal.r_min, t_rmin * 1e3, t_full * 1e3);
  std::printf("chosen vs sweep best: |dr| = %.3f, TTFT %+.1f%% -> %s\n", dr, dt * 100,
              holds ? "criterion holds (|dr| <= 0.02 or TTFT within 3%)"
                    : "criterion FAILS (|dr| > 0.02 and TTFT more than 3% above)");
  std::printf("TTFT speedup over full: %.2fx at r_min = %.2f, %.2fx at calibrated r = %.4f\n",
              t_full / t_rmin, a.cal.r_min, t_full / t_chosen, chosen_r);
}

void run_calibrate(CalibrateArgs& a) {
  CT_THROW_IF_NOT(!a.tier.empty(), "give the tier to calibrate with --tier SPEC");
  CT_THROW_IF_NOT(!a.sweep || a.sweep_step > 0, "--sweep-step {}: expected > 0", a.sweep_step);
  Timer total;
  EngineOptions eo = a.engine.options();
  a.cal.r_min = eo.r_min;  // --rmin, else the model's measured floor
  eo.tiers = {parse_tier_spec(a.tier)};
  eo.calibration_path = a.calibration;
  Engine eng(std::move(eo));
  const std::string data = a.data.empty() ? default_data_path() : a.data;
  const std::vector<CalibrationRequest> reqs = load_calibration_requests(data, a.limit);
  const sched::CalibrationKey key = eng.calibration_key(0, eng.backend_name());
  std::printf("calibrating tier %s (spec '%s'), backend %s\n  model %s\n  machine %s\n",
              key.tier.c_str(), a.tier.c_str(), key.backend.c_str(), eng.model().path().c_str(),
              key.machine.c_str());
  std::printf("calibration set: %zu requests from %s\n", reqs.size(), data.c_str());
  std::fflush(stdout);
  a.cal.on_probe = [](double r, double s) {
    std::printf("  probe: r = %.4f  mean TTFT %.1f ms\n", r, s * 1e3);
    std::fflush(stdout);
  };
  a.cal.on_profile = [&a](const CalibrationRun& run) { print_profile(run, a.cal); };
  const CalibrationRun run = calibrate_top_tier(eng, reqs, a.cal);
  if (run.reused) {
    std::printf("found a stored calibration in %s (use --force to recalibrate):\n",
                eng.options().calibration_path.c_str());
    print_entry(run.entry);
  } else {
    print_result(run);
    std::printf("calibration took %.1f s (chunk encoding, profiling and %d probes); saved to %s\n",
                run.seconds, run.search.n_eval, eng.options().calibration_path.c_str());
  }
  std::fflush(stdout);
  if (a.sweep) run_sweep(eng, reqs, a, run.entry.chosen_r);
  std::fprintf(stderr, "total %.1f s\n", total.seconds());
}

}  // namespace

void register_calibrate(CLI::App& app) {
  auto a = std::make_shared<CalibrateArgs>();
  CLI::App* c = app.add_subcommand(
      "calibrate", "Choose the recompute ratio for a cache tier from measured TTFT and store it");
  c->add_option("--tier", a->tier,
                "Tier under test: device[:CAP] host[:CAP] disk[:DIR][:CAP][:bw=RATE] "
                "redis[:HOST[:PORT]]")
      ->required();
  add_model_option(c, &a->engine.model);
  add_kv_dtype_option(c, &a->engine.dtype);
  add_cache_type_option(c, &a->engine.cache_type)
      ->description("Live K/V cache type to calibrate with (f16 or f32); part of the stored key, "
                    "so serve --ratio auto uses it only with the same --cache-type");
  c->add_option("--alpha", a->engine.alpha, "Low-frequency fraction kept by the ranking")
      ->capture_default_str();
  add_rmin_option(c, &a->engine.r_min);
  add_device_option(c, &a->engine.device)
      ->description("Backend to calibrate: cpu, or cuda (a CT_CUDA build and a GPU); the stored "
                    "key names it, and --ratio auto uses it for prefills on that backend");
  c->add_option("--rmax", a->cal.r_max, "Largest ratio searched")->capture_default_str();
  c->add_option("--eps", a->cal.eps, "Stop when the search bracket is narrower than this")
      ->capture_default_str();
  c->add_option("--noise", a->cal.noise,
                "Relative TTFT noise: probes closer than this are re-measured back to back "
                "(0: trust single measurements)")
      ->capture_default_str();
  c->add_option("--paired-rounds", a->cal.paired_rounds,
                "Back-to-back re-measurement rounds of a close comparison")
      ->capture_default_str();
  c->add_option("--data", a->data,
                "Calibration set: a task .jsonl (first --limit examples) or a directory of .txt "
                "documents (default: ../shared/data/hotpotqa.jsonl beside the repository, else "
                "examples/docs)");
  c->add_option("--limit", a->limit, "Calibration requests")->capture_default_str();
  c->add_option("--repeats", a->cal.repeats,
                "Runs per request and ratio; each request's fastest counts")
      ->capture_default_str();
  c->add_option("--calibration", a->calibration,
                "Calibration store (default: $CACHETUNE_CALIBRATION or "
                "~/.cache/cachetune/calibration.json)");
  c->add_flag("--force", a->cal.force, "Recalibrate even when the store has this configuration");
  c->add_flag("--sweep", a->sweep,
              "Also time every r from --rmin to --rmax and full recompute (evidence)");
  c->add_option("--sweep-step", a->sweep_step, "Step of the sweep")->capture_default_str();
  c->add_option("--sweep-max", a->sweep_max, "Last ratio of the sweep (default: --rmax)");
  c->callback([a] { run_calibrate(*a); });
}

}  // namespace ct::cli
