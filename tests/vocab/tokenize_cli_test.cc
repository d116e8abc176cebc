// `cachetune tokenize` on llama.cpp's Llama 3 vocabulary file: BOS as the file asks, --no-bos,
// --special, --file with bytes as they are, and a one-line error for a missing file. Skipped when
// the vocabulary files are absent (tools/fetch_vocab_tests.sh).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace ct {
namespace {

std::string vocab_file() {
  const char* env = std::getenv("CACHETUNE_VOCAB_DIR");
  const char* home = std::getenv("HOME");
  return (env ? std::string(env) : std::string(home ? home : "") + "/.cache/cachetune/vocab") +
         "/ggml-vocab-llama-bpe.gguf";
}

// Runs the CLI with `args` (already shell-quoted); returns stdout and sets *rc to the exit status.
std::string run_cli(const std::string& args, int* rc) {
  const std::string cmd = std::string(CT_CLI_PATH) + " tokenize " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr) << cmd;
  std::string out;
  char buf[4096];
  for (size_t n; p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int status = p ? pclose(p) : -1;
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

class TokenizeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(vocab_file())) {
      GTEST_SKIP() << vocab_file() << " not found; run tools/fetch_vocab_tests.sh";
    }
  }
};

TEST_F(TokenizeCliTest, PrintsIdsOnOneLine) {
  const std::string model = "--model '" + vocab_file() + "'";
  int rc = -1;
  // Ids of llama.cpp's test case " Hello World!" (ggml-vocab-llama-bpe.gguf.out), after BOS.
  EXPECT_EQ(run_cli(model + " --text ' Hello World!'", &rc), "128000 22691 4435 0\n");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(run_cli(model + " --no-bos --text ' Hello World!'", &rc), "22691 4435 0\n");
  EXPECT_EQ(run_cli(model + " --no-bos --special --text '<|begin_of_text|>!'", &rc), "128000 0\n");
  EXPECT_NE(run_cli(model + " --no-bos --text '<|begin_of_text|>!'", &rc), "128000 0\n");

  const std::string path = testing::TempDir() + "/tokenize_cli_text.txt";
  std::ofstream(path, std::ios::binary) << " Hello World!";
  EXPECT_EQ(run_cli(model + " --no-bos --file '" + path + "'", &rc), "22691 4435 0\n");
  std::filesystem::remove(path);

  EXPECT_EQ(run_cli("--model /nonexistent.gguf --text x", &rc), "");
  EXPECT_EQ(rc, 1);
  run_cli(model + " --text a --file b", &rc);  // --text and --file exclude each other
  EXPECT_NE(rc, 0);
}

}  // namespace
}  // namespace ct
