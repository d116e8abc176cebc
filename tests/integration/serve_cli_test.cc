// `cachetune serve` as a user runs it (label "model"; skipped without the real model): the built
// binary is started on a free port with a memory-only cache, answers an OpenAI chat request with
// chunks (the second identical request finds both chunks cached and gives the same greedy
// answer), refuses a bad one with a JSON 400, and stops cleanly on SIGTERM.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "support/chunk_fixtures.h"
#include "support/model_fixture.h"

namespace ct {
namespace {

using nlohmann::json;

TEST(ServeCli, AnswersReusesChunksAndStopsOnSigterm) {
  CT_REQUIRE_REAL_MODEL(m);
  const int port = test::pick_free_port(20000, 60000);
  const std::string port_s = std::to_string(port), model = test::real_model_path();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(CT_CLI_PATH, CT_CLI_PATH, "serve", "--port", port_s.c_str(), "--model", model.c_str(),
          "--tiers", "host:512M", "--max-tokens-limit", "64", static_cast<char*>(nullptr));
    _exit(127);
  }
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  bool up = false, exited = false;
  for (int i = 0; i < 600 && !up && !exited; ++i) {  // model load: a few seconds
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto h = c.Get("/health");
    up = h && h->status == 200;
    exited = waitpid(pid, nullptr, WNOHANG) == pid;
  }
  ASSERT_FALSE(exited) << "cachetune serve exited before answering (see its error above)";
  if (!up) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << "cachetune serve did not answer /health on port " << port;
  }

  const json body = {
      {"messages", {{{"role", "user"}, {"content", "Who painted the lighthouse red?"}}}},
      {"chunks",
       {"The lighthouse on Gull Point was built in 1871.",
        "In 1903 the keeper, Marta Olsen, painted the lighthouse red and white."}},
      {"max_tokens", 12}};
  std::string first_answer;
  for (int round = 0; round < 2; ++round) {
    auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const json j = json::parse(res->body);
    const std::string text = j["choices"][0]["message"]["content"];
    EXPECT_FALSE(text.empty());
    ASSERT_EQ(j["cachetune"]["chunks"].size(), 2u);
    for (const auto& ch : j["cachetune"]["chunks"]) EXPECT_EQ(ch["hit"].get<bool>(), round == 1);
    if (round == 0) first_answer = text;
    if (round == 1) {
      EXPECT_EQ(text, first_answer);  // greedy, same chunks, same prompt
    }
  }
  auto bad =
      c.Post("/v1/chat/completions", R"({"messages": [], "max_tokens": 100})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_TRUE(json::parse(bad->body).contains("error"));

  kill(pid, SIGTERM);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 100 && done == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    done = waitpid(pid, &status, WNOHANG);
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << "cachetune serve did not stop within 10 s of SIGTERM";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

}  // namespace
}  // namespace ct
