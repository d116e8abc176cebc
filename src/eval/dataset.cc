// JSONL reading with line-precise errors, and the task table.
#include "eval/dataset.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "eval/metrics.h"
#include "reuse/prompt.h"

namespace ct {
namespace {

using nlohmann::json;

std::string field_string(const json& j, const char* key, const std::string& where) {
  CT_THROW_IF_NOT(j.contains(key), "{}: missing field '{}'", where, key);
  CT_THROW_IF_NOT(j[key].is_string(), "{}: field '{}' must be a string, got {}", where, key,
                  j[key].type_name());
  return j[key].get<std::string>();
}

std::vector<std::string> field_strings(const json& j, const char* key, const std::string& where) {
  CT_THROW_IF_NOT(j.contains(key), "{}: missing field '{}'", where, key);
  const json& a = j[key];
  CT_THROW_IF_NOT(a.is_array(), "{}: field '{}' must be a list of strings, got {}", where, key,
                  a.type_name());
  std::vector<std::string> out;
  for (size_t i = 0; i < a.size(); ++i) {
    CT_THROW_IF_NOT(a[i].is_string(), "{}: {}[{}] must be a string, got {}", where, key, i,
                    a[i].type_name());
    out.push_back(a[i].get<std::string>());
  }
  return out;
}

}  // namespace

std::vector<EvalExample> read_examples(const std::string& path) {
  std::ifstream in(path);
  CT_THROW_IF_NOT(in.good(), "cannot open data file '{}'", path);
  std::vector<EvalExample> out;
  std::set<std::string> ids;
  std::string line;
  for (int ln = 1; std::getline(in, line); ++ln) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(ln);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      CT_THROW("{}: invalid JSON ({})", where, e.what());
    }
    CT_THROW_IF_NOT(j.is_object(), "{}: expected a JSON object, got {}", where, j.type_name());
    EvalExample ex;
    ex.id = field_string(j, "id", where);
    ex.task = field_string(j, "task", where);
    ex.chunks = field_strings(j, "chunks", where);
    ex.question = field_string(j, "question", where);
    ex.answers = field_strings(j, "answers", where);
    CT_THROW_IF_NOT(!ex.chunks.empty(), "{}: example '{}' has no chunks", where, ex.id);
    for (size_t i = 0; i < ex.chunks.size(); ++i) {
      CT_THROW_IF_NOT(!ex.chunks[i].empty(), "{}: example '{}' chunk {} is empty", where, ex.id, i);
    }
    CT_THROW_IF_NOT(ids.insert(ex.id).second, "{}: duplicate example id '{}'", where, ex.id);
    ex.file = path;
    ex.line = ln;
    out.push_back(std::move(ex));
  }
  CT_THROW_IF_NOT(!in.bad(), "read error in data file '{}'", path);
  return out;
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
