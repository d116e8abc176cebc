// Interval statistics of an evaluation's records (summary.json "stats" and "overall"), per task
// and over all tasks: for each setting and policy the per-example KL ratio to full reuse
// (kl / reuse's kl on the same example and layout), answer agreement with full (fid_score: the
// task metric of the answer against full recompute's answer), task score, Recall@r of the drift
// set (pooled and per example), TTFT and per-example speedup, each with mean, median and a
// bootstrap 95% interval of the mean (eval/stats.h, fixed seed); and the paired differences
// between every two policies on the examples both ran (a - b).
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

namespace ct {

// records: results.jsonl lines. Returns {"tasks": {task: {setting: {"policies": {policy: {...}},
// "paired": {"a|b": {...}}}}}, "overall": {setting: {...same...}}}.
nlohmann::json quality_stats(const std::vector<nlohmann::json>& records);

}  // namespace ct
