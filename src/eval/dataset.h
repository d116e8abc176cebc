// Evaluation examples from JSON-lines files (shared/data/README.md: id, task, chunks, question,
// answers) and the per-task prompt settings: which instruction, metric and answer budget a task
// gets. Malformed input fails with the file, line and field named.
#pragma once

#include <string>
#include <vector>

#include "core/data_jsonl.h"

namespace ct {

// One example of a data file; the fields are those of core/data_jsonl.h's reader.
using EvalExample = DataExample;

// Reads every non-blank line of `path`. Throws ct::Error "<path>:<line>: ..." for unreadable
// files, invalid JSON, a missing or mistyped field, an empty chunk list, or a duplicate id.
std::vector<EvalExample> read_examples(const std::string& path);

enum class TaskKind { kQa, kSummary };

// How a task is prompted and scored.
struct TaskSpec {
  TaskKind kind = TaskKind::kQa;
  std::string instruction;  // placed in the user turn before the documents
  std::string metric;       // "qa_f1" or "rouge_l"
};

// Summarisation for multi_news (and the other LongBench summarisation task names: gov_report,
// qmsum, samsum, vcsum); question answering for everything else.
TaskSpec task_spec(const std::string& task);

// The task metric of `spec` between one prediction and one reference (qa_f1 or rouge_l_f).
double task_metric(const TaskSpec& spec, const std::string& prediction,
                   const std::string& reference);
// Max over golds; the caller treats an empty list as "no score".
double task_metric_max(const TaskSpec& spec, const std::string& prediction,
                       const std::vector<std::string>& golds);

}  // namespace ct
