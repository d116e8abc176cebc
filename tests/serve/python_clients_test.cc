// The real `cachetune serve` binary (API key from CACHETUNE_API_KEY) on a tiny random model,
// checked by Python's own clients: the official `openai` package (whole and streamed
// completions, extra_body chunks, stop, AuthenticationError and BadRequestError) and
// prometheus_client's text parser on GET /metrics. The scripts exit 77 when their module is not
// installed; the test then skips with their message. With the real SmolLM2 file installed the
// openai checks also run against it.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/chunk_fixtures.h"
#include "support/fake_wheels.h"
#include "support/model_fixture.h"
#include "support/serve_process.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

constexpr const char* kKey = "sk-cachetune-test";
constexpr int kSkip = 77;

std::string script(const std::string& name) {
  return std::string(CT_SOURCE_DIR) + "/tests/serve/" + name;
}

class PythonClients : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::run_shell("python3 --version").rc != 0) GTEST_SKIP() << "python3 is not on PATH";
  }
  // Starts the server on `model` with the key in the environment.
  void start(const std::string& model) {
    std::string err;
    ASSERT_TRUE(server_.start(
        CT_CLI_PATH,
        {"--model", model, "--tiers", "host:64M", "--model-id", "tiny", "--max-tokens-limit", "64"},
        {{"CACHETUNE_API_KEY", kKey}}, dir_.path() + "/serve.log", &err))
        << err;
  }
  // Runs the script; skips on exit 77, fails with its output otherwise.
  void run(const std::string& command) {
    const test::ShellResult r = test::run_shell(command);
    if (r.rc == kSkip) GTEST_SKIP() << r.output;
    EXPECT_EQ(r.rc, 0) << command << "\n" << r.output << "\nserver log:\n" << server_.log();
  }
  std::string tiny_model() {
    test::TinyModelOptions o;
    o.n_layer = 2;
    return test::write_tiny_model(dir_.path() + "/tiny.gguf", o);
  }

  test::TempDir dir_;
  test::ServeProcess server_;
};

TEST_F(PythonClients, OpenAIClientOnTinyModel) {
  start(tiny_model());
  run("python3 " + script("openai_client_check.py") + " --base-url " + server_.base_url() +
      "/v1 --api-key " + kKey);
}

TEST_F(PythonClients, PrometheusParserReadsMetrics) {
  start(tiny_model());
  run("python3 " + script("metrics_check.py") + " --base-url " + server_.base_url() +
      " --api-key " + kKey);
}

TEST_F(PythonClients, OpenAIClientOnSmolLM2) {
  const std::string path = test::real_model_path();
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "model file not found: " << path << " (run tools/fetch_model.sh)";
  start(path);
  run("python3 " + script("openai_client_check.py") + " --base-url " + server_.base_url() +
      "/v1 --api-key " + kKey + " --model smollm2");
}

}  // namespace
}  // namespace ct
