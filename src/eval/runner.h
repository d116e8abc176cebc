// The evaluation harness behind `cachetune eval`: every example of the data files through every
// policy, in the base layout and optionally under context changes (paper Fig. 1c) and r / alpha
// sweeps (App. E.4). Writes one JSON line per (example, setting, policy) and a summary; resumes.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model.h"
#include "reuse/policy.h"
#include "reuse/policy/probe.h"
#include "store/chunk.h"

namespace ct {

// One finished unit of work, for a progress line.
struct EvalProgress {
  int done = 0;   // units finished in this invocation
  int total = 0;  // units planned in this invocation (finished ones from earlier runs excluded)
  std::string example, setting, policy;
  double unit_s = 0;     // wall time of this unit (its share of the example's shared work included)
  double elapsed_s = 0;  // since run_eval started
};

struct EvalOptions {
  std::vector<std::string> data_files;  // JSONL, shared/data/README.md format
  // Policies of the base and robustness settings. `full` is always run first as the reference
  // and always recorded, listed or not.
  std::vector<const Policy*> policies;
  double ratio = 0.15;  // recompute ratio r of the base and robustness settings
  double alpha = 0.5;   // low-frequency cutoff of the stored ranking (and of highfreq)
  int limit = 0;        // the first `limit` examples of each file; 0 = all
  std::string out_dir;
  int max_tokens_qa = 32;
  int max_tokens_summary = 128;
  int kl_positions = 8;  // K: teacher-forced positions of full's answer for the KL
  // Measure the query's attention over the context (attn_cos) with a second, untimed prefill per
  // policy; off saves that prefill where only KL, answers, recall and TTFT are wanted.
  bool attention = true;
  bool robustness = false;
  int extra_context_tokens = 1024;   // filler placed before the documents in the robustness run
  std::vector<double> sweep_ratios;  // each adds a setting "r=<v>" with sweep_policies
  std::vector<double> sweep_alphas;  // each adds a setting "alpha=<v>" (records re-ranked)
  std::vector<const Policy*> sweep_policies = {&find_policy("cachetune")};
  uint64_t seed = 0;  // random policy, chunk shuffles
  int n_bands = 10;   // KV energy bands
  KvDtype dtype = KvDtype::F16;
  bool sink = true;  // encode chunks after a BOS sink token (EncodeOptions::sink)
  // The probe context of the probe policy (its ranking is computed with every chunk encoding,
  // next to the stored low-frequency one; EncodeOptions::also).
  ProbeOptions probe;
  size_t chunk_cache_bytes = size_t{1} << 30;
  std::string command;  // the command line, recorded in run.json
  std::function<void(const EvalProgress&)> progress;
  std::function<void(const std::string&)> log;  // one-line notes (resume, truncated lines)
};

struct EvalStats {
  int n_run = 0;      // units computed now
  int n_skipped = 0;  // units found finished in out_dir
  double seconds = 0;
  std::string results_path, summary_path;
};

// Runs the evaluation into o.out_dir (created if needed): results.jsonl (appended and fsynced
// line by line), run.json (settings, machine, every invocation's command, and once it finishes
// its wall time and units run) and summary.json.
// Units already in results.jsonl are skipped. Throws ct::Error for bad options, unreadable
// data, or an out_dir whose run.json was produced with different result-affecting settings.
EvalStats run_eval(const Model& m, const EvalOptions& o);

// Aggregates results.jsonl of `dir` (see docs/RESULTS.md for the fields) and writes
// summary.json there; returns it.
nlohmann::json summarize_eval(const std::string& dir);

// The names of the settings a configuration produces, base first.
std::vector<std::string> eval_setting_names(const EvalOptions& o);

}  // namespace ct
