// Tests for the evaluation metrics: every case of tests/fixtures/metrics_ref.json (Python
// references: LongBench-style qa_f1, rouge-score rougeL) to 4 decimals, plus hand-checked cases.
#include "eval/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace ct {
namespace {

constexpr double kTol = 5e-5;  // "equal to 4 decimals"

nlohmann::json load_fixture() {
  const std::string path = std::string(CT_FIXTURE_DIR) + "/metrics_ref.json";
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot open " << path
                  << " (regenerate: python3 tools/make_metrics_fixture.py)";
    return {};
  }
  return nlohmann::json::parse(in);
}

// Collects mismatches and prints the first few, so one failure shows what differs.
struct Mismatches {
  int count = 0;
  std::ostringstream first;
  void check(const char* metric, double got, double want, const std::string& a,
             const std::string& b) {
    if (std::fabs(got - want) < kTol) return;
    if (++count <= 10) {
      first << metric << ": got " << got << " want " << want << "\n  pred: " << a.substr(0, 200)
            << "\n  ref:  " << b.substr(0, 200) << "\n";
    }
  }
};

TEST(Metrics, MatchesPythonFixture) {
  const nlohmann::json doc = load_fixture();
  ASSERT_TRUE(doc.contains("cases"));
  const auto& cases = doc["cases"];
  ASSERT_GE(cases.size(), 300u);
  Mismatches f1, rl;
  for (const auto& c : cases) {
    const std::string pred = c["pred"], ref = c["ref"];
    f1.check("qa_f1", qa_f1(pred, ref), c["qa_f1"].get<double>(), pred, ref);
    rl.check("rouge_l", rouge_l_f(pred, ref), c["rouge_l"].get<double>(), pred, ref);
  }
  EXPECT_EQ(f1.count, 0) << f1.count << " of " << cases.size() << " qa_f1 cases differ; first:\n"
                         << f1.first.str();
  EXPECT_EQ(rl.count, 0) << rl.count << " of " << cases.size() << " rouge_l cases differ; first:\n"
                         << rl.first.str();

  Mismatches f1m, rlm;
  for (const auto& c : doc["max_cases"]) {
    const std::string pred = c["pred"];
    const std::vector<std::string> refs = c["refs"];
    const std::string joined = refs.empty() ? "" : refs.front() + " | ...";
    f1m.check("qa_f1_max", qa_f1_max(pred, refs), c["qa_f1_max"].get<double>(), pred, joined);
    rlm.check("rouge_l_max", rouge_l_f_max(pred, refs), c["rouge_l_max"].get<double>(), pred,
              joined);
  }
  EXPECT_EQ(f1m.count, 0) << f1m.first.str();
  EXPECT_EQ(rlm.count, 0) << rlm.first.str();
}

TEST(Metrics, QaF1HandCases) {
  EXPECT_DOUBLE_EQ(qa_f1("Exeter College", "Exeter College"), 1.0);
  EXPECT_DOUBLE_EQ(qa_f1("The Exeter College.", "exeter, college"), 1.0);  // article, punct, case
  EXPECT_DOUBLE_EQ(qa_f1("Paris", "London"), 0.0);
  // pred {new, york}, gold {new, york, city}: P = 1, R = 2/3, F1 = 0.8.
  EXPECT_DOUBLE_EQ(qa_f1("New York", "New York City"), 0.8);
  // Multiset overlap: "cat cat" vs "cat": 1 shared token, P = 1/2, R = 1.
  EXPECT_NEAR(qa_f1("cat cat", "cat"), 2.0 / 3.0, 1e-15);
  // Empty sides (and sides that normalise to nothing) score 0, as in LongBench.
  EXPECT_EQ(qa_f1("", ""), 0.0);
  EXPECT_EQ(qa_f1("", "x"), 0.0);
  EXPECT_EQ(qa_f1("x", ""), 0.0);
  EXPECT_EQ(qa_f1("the a an", "the"), 0.0);
  // Articles only go when they are whole words.
  EXPECT_DOUBLE_EQ(qa_f1("theory", "the theory"), 1.0);
  EXPECT_DOUBLE_EQ(qa_f1("\xC3\x89"
                         "cole",
                         "\xC3\xA9"
                         "cole"),
                   1.0);  // Unicode lower-case
  EXPECT_DOUBLE_EQ(qa_f1("a\xC2\xA0"
                         "b",
                         "a b"),
                   1.0);                          // NBSP splits like Python
  EXPECT_EQ(qa_f1("\xFF\xFE", "\xFF\xFE"), 1.0);  // invalid UTF-8 is kept
}

TEST(Metrics, RougeLHandCases) {
  EXPECT_DOUBLE_EQ(rouge_l_f("the cat sat", "the cat sat"), 1.0);
  EXPECT_DOUBLE_EQ(rouge_l_f("dog", "cat"), 0.0);
  EXPECT_EQ(rouge_l_f("", ""), 0.0);
  EXPECT_EQ(rouge_l_f("...", "cat"), 0.0);  // no [a-z0-9] tokens at all
  // LCS("a b c d", "a c b d") = 3: P = R = 3/4.
  EXPECT_DOUBLE_EQ(rouge_l_f("a c b d", "a b c d"), 0.75);
  // Symmetric in its arguments (F of P and R).
  EXPECT_DOUBLE_EQ(rouge_l_f("a b", "a b c d e"), rouge_l_f("a b c d e", "a b"));
  EXPECT_DOUBLE_EQ(rouge_l_f("Don't STOP", "don t stop"), 1.0);
  EXPECT_DOUBLE_EQ(rouge_l_f("caf\xC3\xA9", "caf"), 1.0);  // non-ASCII letters separate
  EXPECT_DOUBLE_EQ(rouge_l_f_max("x y", {}), 0.0);
  EXPECT_DOUBLE_EQ(rouge_l_f_max("x y", {"z", "x y"}), 1.0);
  EXPECT_DOUBLE_EQ(qa_f1_max("x y", {}), 0.0);
  EXPECT_DOUBLE_EQ(qa_f1_max("x y", {"x", "z"}), 2.0 / 3.0);
}

}  // namespace
}  // namespace ct
