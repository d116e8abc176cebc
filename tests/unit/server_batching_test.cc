// The live server over the batching scheduler (tiny random model, port 0): concurrent chat
// requests, whole and streamed, get exactly the answers the engine gives each alone; a request
// larger than the K/V budget is a 400 naming the numbers; a full admission queue is a 503 with
// Retry-After.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "server/api.h"
#include "server/server.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct::server {
namespace {

using nlohmann::json;

json body(const std::string& q, const std::vector<std::string>& docs, int max_tokens,
          bool stream) {
  return {{"messages", {{{"role", "user"}, {"content", q}}}},
          {"chunks", docs},
          {"max_tokens", max_tokens},
          {"ignore_eos", true},
          {"stream", stream}};
}

// The text of a streamed response: its content deltas concatenated.
std::string streamed_text(const std::string& sse) {
  std::string text;
  size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    const std::string ev = sse.substr(at + 6, end - at - 6);
    at = end;
    if (ev == "[DONE]") break;
    const json j = json::parse(ev);
    if (j.contains("choices") && !j["choices"].empty() && j["choices"][0].contains("delta") &&
        j["choices"][0]["delta"].contains("content")) {
      text += j["choices"][0]["delta"]["content"].get<std::string>();
    }
  }
  return text;
}

class ServerBatchingTest : public ::testing::Test {
 protected:
  void start(SchedulerOptions batching) {
    test::TinyModelOptions o;
    o.n_layer = 2;
    o.context_length = 512;
    eo_.model_path = test::write_tiny_model(dir_.path() + "/tiny.gguf", o);
    eo_.tiers = {parse_tier_spec("host:64M")};
    engine_ = std::make_unique<Engine>(eo_);
    ServerOptions so;
    so.port = 0;
    so.model_id = "tiny";
    so.batching = batching;
    server_ = std::make_unique<Server>(*engine_, so);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
  }
  void TearDown() override {
    if (server_) {
      server_->stop();
      thread_.join();
    }
  }
  httplib::Result post(const json& b) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c.Post("/v1/chat/completions", b.dump(), "application/json");
  }
  test::TempDir dir_;
  EngineOptions eo_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// Holds the scheduler's thread in a task from construction to release(), so that requests sent
// meanwhile wait in its queue.
class SchedulerHold {
 public:
  explicit SchedulerHold(Scheduler& s)
      : t_([this, &s] {
          s.run([this] {
            entered_ = true;
            while (!open_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          });
        }) {
    while (!entered_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~SchedulerHold() { release(); }
  void release() {
    open_ = true;
    if (t_.joinable()) t_.join();
  }

 private:
  std::atomic<bool> open_{false}, entered_{false};
  std::thread t_;
};

const std::vector<std::string> kA = {"The lighthouse on Gull Point was built in 1871.",
                                     "Marta Olsen kept the lighthouse for forty years."};
const std::vector<std::string> kB = {"The ferry leaves the harbour at seven each morning.",
                                     "Tickets are sold at the kiosk beside the pier."};

TEST_F(ServerBatchingTest, ConcurrentRequestsAnswerAsTheyDoAlone) {
  start(SchedulerOptions{});
  const std::vector<json> bodies = {
      body("Who kept the lighthouse?", kA, 10, false), body("When does it leave?", kB, 10, true),
      body("Where are tickets sold?", {kB[1], kA[0]}, 10, false),
      body("When was it built?", kA, 10, true), body("Hello there.", {}, 10, false),
      body("Who wrote it?", {kA[1], kB[0]}, 10, true)};
  // Expected: each alone, on an engine of its own.
  std::vector<std::string> want;
  {
    Engine alone(eo_);
    for (const json& b : bodies) {
      const ChatRequest r = parse_chat_request(b, ApiLimits{});
      want.push_back(alone.answer(r.chunks, r.question, r.sel, r.gen, r.answer).text);
    }
  }
  std::vector<std::string> got(bodies.size());
  std::vector<int> status(bodies.size(), 0);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < bodies.size(); ++i) {
    ts.emplace_back([&, i] {
      auto res = post(bodies[i]);
      if (!res) return;
      status[i] = res->status;
      got[i] = bodies[i]["stream"].get<bool>()
                   ? streamed_text(res->body)
                   : json::parse(res->body)["choices"][0]["message"]["content"].get<std::string>();
    });
  }
  for (auto& t : ts) t.join();
  for (size_t i = 0; i < bodies.size(); ++i) {
    EXPECT_EQ(status[i], 200) << i;
    EXPECT_EQ(got[i], want[i]) << "request " << i;
  }
  EXPECT_EQ(server_->batch_stats().kv_in_use, 0u);
}

TEST_F(ServerBatchingTest, LargerThanTheBudgetIs400AndAFullQueueIs503) {
  // A budget for a short request but not for one asking 300 new tokens.
  SchedulerOptions so;
  so.max_queue = 1;
  so.kv_budget_bytes = 0;  // set below from the model's shape
  {
    test::TinyModelOptions o;
    o.n_layer = 2;
    o.context_length = 512;
    const std::string p = test::write_tiny_model(dir_.path() + "/shape.gguf", o);
    auto m = Model::load(p);
    so.kv_budget_bytes = Generation::kv_bytes_for(m->config(), EngineOptions().kv_type, 120, 20);
  }
  start(so);
  auto big = post(body("Who kept the lighthouse?", kA, 300, false));
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 400) << big->body;
  EXPECT_NE(big->body.find(std::to_string(so.kv_budget_bytes)), std::string::npos) << big->body;
  EXPECT_NE(big->body.find("--kv-budget"), std::string::npos) << big->body;

  // Hold the scheduler so one request waits in the queue; the next finds it full.
  SchedulerHold hold(server_->scheduler());
  int first_status = 0;
  std::thread first([&] {
    auto r = post(body("Hello?", {}, 4, false));
    if (r) first_status = r->status;
  });
  while (server_->batch_stats().queued < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto busy = post(body("Hello again?", {}, 4, true));  // refused before any stream starts
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, 503) << busy->body;
  EXPECT_EQ(busy->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(busy->body)["error"]["type"], "server_error") << busy->body;
  hold.release();
  first.join();
  EXPECT_EQ(first_status, 200);
}

// A request's n choices are queued together or refused together: on a server whose queue takes
// 3, n is at most 3 (a 400 beyond); three choices waiting fill the queue, so the next request is
// a 503; once the scheduler runs, the three are answered.
TEST_F(ServerBatchingTest, NChoicesQueueTogetherOrNotAtAll) {
  SchedulerOptions so;
  so.max_queue = 3;
  start(so);
  json four = body("Hello?", {}, 3, false);
  four["n"] = 4;
  auto r4 = post(four);
  ASSERT_TRUE(r4);
  EXPECT_EQ(r4->status, 400) << r4->body;
  EXPECT_NE(r4->body.find("[1, 3]"), std::string::npos) << r4->body;

  SchedulerHold hold(server_->scheduler());
  json three = body("Hello?", {}, 3, false);
  three["n"] = 3;
  json answered;
  int status = 0;
  std::thread first([&] {
    auto r = post(three);
    if (r) {
      status = r->status;
      answered = json::parse(r->body);
    }
  });
  while (server_->batch_stats().queued < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto busy = post(body("Hello again?", {}, 2, false));
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, 503) << busy->body;
  hold.release();
  first.join();
  ASSERT_EQ(status, 200) << answered.dump();
  EXPECT_EQ(answered["choices"].size(), 3u);
  EXPECT_EQ(answered["usage"]["completion_tokens"], 9);
}

}  // namespace
}  // namespace ct::server
