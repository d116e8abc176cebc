// Smoke run of the evaluation harness on the real model (label "model"; skipped without it): two
// short original examples (tests/fixtures/eval_smoke.jsonl), three policies, a 4-token answer
// budget. Checks the output files and their keys, that full compared with itself is exactly
// faithful, and that a second run resumes: finished units are skipped, an unfinished last line
// is dropped, and only a newly listed policy runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "eval/runner.h"
#include "support/model_fixture.h"

namespace ct {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<json> read_lines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

EvalOptions smoke_options(const std::string& dir) {
  EvalOptions o;
  o.data_files = {std::string(CT_FIXTURE_DIR) + "/eval_smoke.jsonl"};
  o.policies = {&find_policy("full"), &find_policy("reuse"), &find_policy("cachetune")};
  o.limit = 2;
  o.max_tokens_qa = 4;
  o.out_dir = dir;
  o.command = "eval_smoke_test";
  return o;
}

TEST(EvalSmoke, WritesResultsSummaryAndResumes) {
  CT_REQUIRE_REAL_MODEL(m);
  const std::string dir = (fs::temp_directory_path() / "ct_eval_smoke").string();
  fs::remove_all(dir);
  EvalOptions o = smoke_options(dir);
  const EvalStats st = run_eval(*m, o);
  EXPECT_EQ(st.n_run, 6);
  EXPECT_EQ(st.n_skipped, 0);
  ASSERT_TRUE(fs::exists(dir + "/results.jsonl"));
  ASSERT_TRUE(fs::exists(dir + "/summary.json"));
  ASSERT_TRUE(fs::exists(dir + "/run.json"));

  const auto recs = read_lines(dir + "/results.jsonl");
  ASSERT_EQ(recs.size(), 6u);
  for (const json& r : recs) {
    for (const char* key : {"example", "task", "setting", "ref_setting", "policy", "ratio", "alpha",
                            "n_prompt", "answer", "metric", "task_score", "fid_score", "kl",
                            "kl_positions", "attn_cos", "ttft_ms", "decode_ms", "breakdown"}) {
      EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
    }
    EXPECT_EQ(r["setting"], "base");
    EXPECT_EQ(r["metric"], "qa_f1");
    EXPECT_TRUE(r["task_score"].is_number());
    EXPECT_GT(r["ttft_ms"].get<double>(), 0.0);
    EXPECT_TRUE(r["breakdown"].contains("compute_ms"));
    if (r["policy"] == "full") {
      // Full recompute is its own reference.
      EXPECT_EQ(r["fid_score"].get<double>(), 1.0);
      EXPECT_EQ(r["kl"].get<double>(), 0.0);
      EXPECT_DOUBLE_EQ(r["attn_cos"].get<double>(), 1.0);
      EXPECT_EQ(r["band_energy"].size(), 10u);
    } else {
      EXPECT_GE(r["kl"].get<double>(), 0.0);
      EXPECT_LE(r["attn_cos"].get<double>(), 1.0 + 1e-9);
    }
    if (r["policy"] == "cachetune") {
      EXPECT_TRUE(r["recall"].is_number());
      EXPECT_GT(r["recall_ref"].get<int>(), 0);
    }
  }
  const json summary = json::parse(std::ifstream(dir + "/summary.json"));
  const json& base = summary["tasks"]["smoke_qa"]["settings"]["base"];
  for (const char* p : {"full", "reuse", "cachetune"}) {
    ASSERT_TRUE(base.contains(p)) << p;
    EXPECT_EQ(base[p]["n"], 2);
  }
  EXPECT_EQ(base["full"]["speedup"].get<double>(), 1.0);
  EXPECT_EQ(base["full"]["kl"].get<double>(), 0.0);

  // Resume: nothing left to do.
  const EvalStats again = run_eval(*m, o);
  EXPECT_EQ(again.n_run, 0);
  EXPECT_EQ(again.n_skipped, 6);
  EXPECT_EQ(read_lines(dir + "/results.jsonl").size(), 6u);

  // A run killed while writing leaves half a line: it is dropped, and a newly listed policy is
  // the only work done (the full reference comes from refs/, not recomputed).
  {
    std::ofstream f(dir + "/results.jsonl", std::ios::app);
    f << R"({"example": "smoke-0000", "setting": "ba)";
  }
  o.policies.push_back(&find_policy("epic"));
  std::vector<std::string> notes;
  o.log = [&](const std::string& s) { notes.push_back(s); };
  const EvalStats more = run_eval(*m, o);
  EXPECT_EQ(more.n_run, 2);
  EXPECT_EQ(more.n_skipped, 6);
  const auto after = read_lines(dir + "/results.jsonl");
  ASSERT_EQ(after.size(), 8u);
  EXPECT_EQ(after[6]["policy"], "epic");
  bool noted = false;
  for (const auto& n : notes) noted = noted || n.find("unfinished last line") != std::string::npos;
  EXPECT_TRUE(noted);

  // run.json: one record per invocation, each with its wall time and units run.
  const json run = json::parse(std::ifstream(dir + "/run.json"));
  ASSERT_EQ(run["invocations"].size(), 3u);
  EXPECT_EQ(run["invocations"][0]["units_run"], 6);
  EXPECT_EQ(run["invocations"][1]["units_run"], 0);
  EXPECT_EQ(run["invocations"][2]["units_run"], 2);
  EXPECT_GT(run["invocations"][0]["seconds"].get<double>(), 0.0);
  EXPECT_EQ(run["config"]["sink"], true);

  // Result-affecting settings cannot change within one directory.
  o.ratio = 0.2;
  EXPECT_THROW(run_eval(*m, o), Error);
  o.ratio = 0.15;
  o.sink = false;
  EXPECT_THROW(run_eval(*m, o), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ct
