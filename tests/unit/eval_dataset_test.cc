// Evaluation data reading (src/eval/dataset.h): a good file parses, and each kind of bad line is
// reported with the file, the line number and the field.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "eval/dataset.h"
#include "support/chunk_fixtures.h"

namespace ct {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = test::temp_path(name);
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::string& path) {
  try {
    read_examples(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EvalDataset, ReadsExamplesAndSkipsBlankLines) {
  const std::string path = write_temp(
      "ct_eval_ds_good.jsonl",
      R"({"id": "t-0000", "task": "t", "chunks": ["a", "b"], "question": "q?", "answers": ["x"]})"
      "\n\n"
      R"({"id": "t-0001", "task": "t", "chunks": ["c"], "question": "r?", "answers": []})"
      "\n");
  const auto ex = read_examples(path);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].id, "t-0000");
  EXPECT_EQ(ex[0].chunks, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ex[0].answers, (std::vector<std::string>{"x"}));
  EXPECT_EQ(ex[1].line, 3);
  EXPECT_TRUE(ex[1].answers.empty());
}

TEST(EvalDataset, ErrorsNameFileLineAndField) {
  const std::string good =
      R"({"id": "t-0000", "task": "t", "chunks": ["a"], "question": "q", "answers": []})";
  std::string p = write_temp("ct_eval_ds_bad1.jsonl", good + "\n{not json\n");
  std::string e = error_of(p);
  EXPECT_NE(e.find(p + ":2: invalid JSON"), std::string::npos) << e;

  p = write_temp("ct_eval_ds_bad2.jsonl",
                 R"({"id": "t-1", "task": "t", "chunks": ["a"], "answers": []})"
                 "\n");
  e = error_of(p);
  EXPECT_NE(e.find(":1: missing field 'question'"), std::string::npos) << e;

  p = write_temp("ct_eval_ds_bad3.jsonl",
                 R"({"id": "t-1", "task": "t", "chunks": "a", "question": "q", "answers": []})"
                 "\n");
  e = error_of(p);
  EXPECT_NE(e.find("field 'chunks' must be a list of strings, got string"), std::string::npos) << e;

  p = write_temp("ct_eval_ds_bad4.jsonl", good + "\n" + good + "\n");
  e = error_of(p);
  EXPECT_NE(e.find(":2: duplicate example id 't-0000'"), std::string::npos) << e;

  p = write_temp("ct_eval_ds_bad5.jsonl",
                 R"({"id": "t-1", "task": "t", "chunks": [], "question": "q", "answers": []})"
                 "\n");
  EXPECT_NE(error_of(p).find("has no chunks"), std::string::npos);

  EXPECT_NE(error_of("/nonexistent/x.jsonl").find("cannot open data file '/nonexistent/x.jsonl'"),
            std::string::npos);
}

TEST(EvalDataset, TaskSpecs) {
  EXPECT_EQ(task_spec("hotpotqa").kind, TaskKind::kQa);
  EXPECT_EQ(task_spec("hotpotqa").metric, "qa_f1");
  EXPECT_EQ(task_spec("multi_news").kind, TaskKind::kSummary);
  EXPECT_EQ(task_spec("multi_news").metric, "rouge_l");
  EXPECT_DOUBLE_EQ(task_metric_max(task_spec("musique"), "Exeter College", {"exeter college"}),
                   1.0);
  EXPECT_DOUBLE_EQ(task_metric(task_spec("multi_news"), "a b c", "a b c"), 1.0);
}

}  // namespace
}  // namespace ct
