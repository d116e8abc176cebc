// Evaluation examples (core/data_jsonl.h with the eval fields required), and the task table.
#include "eval/dataset.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/data_jsonl.h"
#include "core/error.h"
#include "eval/metrics.h"
#include "reuse/prompt.h"

namespace ct {
std::vector<EvalExample> read_examples(const std::string& path) {
  return read_data_jsonl(path, {.eval_fields = true, .allow_empty = true});
}

TaskSpec task_spec(const std::string& task) {
  static const std::set<std::string> kSummaryTasks = {"multi_news", "gov_report", "qmsum", "samsum",
                                                      "vcsum"};
  TaskSpec s;
  if (kSummaryTasks.count(task)) {
    s.kind = TaskKind::kSummary;
    s.instruction = "Summarize the documents below, covering their main points.";
    s.metric = "rouge_l";
  } else {
    s.kind = TaskKind::kQa;
    s.instruction = kQaInstruction;
    s.metric = "qa_f1";
  }
  return s;
}

double task_metric(const TaskSpec& spec, const std::string& prediction,
                   const std::string& reference) {
  return spec.kind == TaskKind::kSummary ? rouge_l_f(prediction, reference)
                                         : qa_f1(prediction, reference);
}

double task_metric_max(const TaskSpec& spec, const std::string& prediction,
                       const std::vector<std::string>& golds) {
  return spec.kind == TaskKind::kSummary ? rouge_l_f_max(prediction, golds)
                                         : qa_f1_max(prediction, golds);
}

}  // namespace ct
