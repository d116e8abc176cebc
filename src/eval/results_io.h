// The files of an evaluation directory (eval/runner.h): results.jsonl (one record per finished
// unit, appended and fsynced; a resumed run skips the units it holds), run.json (the
// configuration every record was made with, and each invocation's command, machine and cost),
// and refs/ (each layout's full-recompute reference, so a resumed or extended run does not
// recompute it).
#pragma once

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "eval/runner.h"
#include "model/model.h"

namespace ct::eval {

inline constexpr const char* kResultsFile = "results.jsonl";
inline constexpr const char* kRunFile = "run.json";
inline constexpr const char* kSummaryFile = "summary.json";

// The unit keys (plan.h unit_key) of the records in the results file. A last line without its
// newline (the run was killed while writing) is cut off so that appending continues on a clean
// line; a bad line elsewhere is an error naming the file and line.
std::set<std::string> load_done_keys(const std::string& path,
                                     const std::function<void(const std::string&)>& log);

class ResultsWriter {
 public:
  explicit ResultsWriter(const std::string& path);
  ~ResultsWriter();
  ResultsWriter(const ResultsWriter&) = delete;
  ResultsWriter& operator=(const ResultsWriter&) = delete;
  // One record per line, flushed and fsynced so a killed run loses at most the line in flight.
  void append(const nlohmann::json& j);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

// The CPU's model name, for the records of timings.
std::string cpu_model();
// Checks this run's configuration against the directory's run.json (a directory holds results of
// one configuration) and records the invocation; creates run.json for a new directory.
void update_run_json(const Model& m, const EvalOptions& o, const std::string& dir);
// Records the wall time and unit count of this invocation (the last one in run.json).
void finish_run_json(const std::string& dir, double seconds, int units_run);

// What the policies of one prompt layout are compared against.
struct Reference {
  std::string answer;                     // full recompute's greedy answer
  std::vector<int32_t> forced;            // its first K tokens (teacher forced)
  std::vector<float> forced_logits;       // F32 [max(1, |forced|)][n_vocab]
  std::vector<float> attn;                // F32 [n_total] query attention
  std::vector<std::vector<float>> drift;  // per chunk in prompt order: F32 [n_tok]
};
void write_reference(const std::string& path, const Reference& r);
// False (and the caller recomputes) when the file is missing, truncated or does not fit the
// request: another vocabulary, prompt length or chunk split.
bool read_reference(const std::string& path, int n_vocab, int n_total,
                    const std::vector<int>& chunk_tokens, Reference& r);

}  // namespace ct::eval
