// `cachetune eval --model A,B` as a user runs it: several models into one results directory, one
// subdirectory each, every model resolved before any runs. Two tiny random models written by our
// GGUF writer (no real model needed) on the eval smoke fixture; it sits with the tests that run
// the built binary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/chunk_fixtures.h"
#include "support/fake_wheels.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

namespace fs = std::filesystem;

std::string eval_cmd(const std::string& models, const std::string& out) {
  return std::string(CT_CLI_PATH) + " eval --model " + models +
         " --data " CT_FIXTURE_DIR
         "/eval_smoke.jsonl --limit 1 --policies full,reuse --max-tokens-qa 2 --no-attention "
         "--out " +
         out + " 2>&1";
}

TEST(EvalCli, SeveralModelsWriteOneResultsDirectoryEach) {
  const fs::path root = test::temp_path("eval_cli");
  fs::remove_all(root);
  fs::create_directories(root);
  test::TinyModelOptions o;
  o.context_length = 2048;
  const std::string a = test::write_tiny_model((root / "alpha.gguf").string(), o);
  o.seed = 99;
  o.arch = "qwen2";
  const std::string b = test::write_tiny_model((root / "beta.gguf").string(), o);

  const test::ShellResult r = test::run_shell(eval_cmd(a + "," + b, (root / "out").string()));
  ASSERT_EQ(r.rc, 0) << r.output;
  for (const char* name : {"alpha", "beta"}) {
    const fs::path dir = root / "out" / name;
    ASSERT_TRUE(fs::exists(dir / "summary.json")) << dir << "\n" << r.output;
    std::ifstream in(dir / "run.json");
    const nlohmann::json run = nlohmann::json::parse(in);
    EXPECT_EQ(run["config"]["model"], std::string(name) + ".gguf") << run.dump();
    int lines = 0;
    std::ifstream res(dir / "results.jsonl");
    for (std::string l; std::getline(res, l);) ++lines;
    EXPECT_EQ(lines, 2) << dir;  // one example, full and reuse
  }
  EXPECT_FALSE(fs::exists(root / "out" / "results.jsonl")) << "the models' results were mixed";

  // --summarize-only on such a directory rewrites each model's summary.
  fs::remove(root / "out" / "beta" / "summary.json");
  const test::ShellResult sum = test::run_shell(std::string(CT_CLI_PATH) +
                                                " eval --summarize-only --data x --out " +
                                                (root / "out").string() + " 2>&1");
  EXPECT_EQ(sum.rc, 0) << sum.output;
  EXPECT_TRUE(fs::exists(root / "out" / "beta" / "summary.json")) << sum.output;

  // One model writes into --out itself, as before.
  const test::ShellResult one = test::run_shell(eval_cmd(a, (root / "single").string()));
  ASSERT_EQ(one.rc, 0) << one.output;
  EXPECT_TRUE(fs::exists(root / "single" / "results.jsonl")) << one.output;

  // A name that resolves to nothing fails before anything runs (no directory for the first).
  const test::ShellResult bad =
      test::run_shell(eval_cmd(a + ",no-such-model", (root / "out2").string()));
  EXPECT_NE(bad.rc, 0) << bad.output;
  EXPECT_NE(bad.output.find("no-such-model"), std::string::npos) << bad.output;
  EXPECT_FALSE(fs::exists(root / "out2" / "alpha")) << bad.output;

  // Two models that would share a directory are refused.
  const test::ShellResult twice = test::run_shell(eval_cmd(a + "," + a, (root / "out3").string()));
  EXPECT_NE(twice.rc, 0) << twice.output;
  EXPECT_NE(twice.output.find("would share"), std::string::npos) << twice.output;
  fs::remove_all(root);
}

}  // namespace
}  // namespace ct
