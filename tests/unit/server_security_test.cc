// The server's guards and observability on a live server over a tiny random model: the API key
// (every route but /health; 401 in OpenAI's shape; the Bearer scheme case-insensitive), header
// size bounds (an oversize header line, request line or header block gets a 4xx or a closed
// connection, never a hang, and the server keeps serving), the default loopback bind, GET
// /metrics after real requests, and stop sequences end to end.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "server/auth.h"
#include "server/server.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct::server {
namespace {

using nlohmann::json;

constexpr const char* kKey = "sk-test-0123456789";

TEST(ServerAuth, AcceptsOnlyTheBearerKey) {
  EXPECT_EQ(api_key_refusal("Bearer abc", "abc"), "");
  EXPECT_EQ(api_key_refusal("bearer abc", "abc"), "");  // the scheme is case-insensitive
  EXPECT_EQ(api_key_refusal("BEARER   abc", "abc"), "");
  EXPECT_NE(api_key_refusal(std::nullopt, "abc").find("no API key"), std::string::npos);
  EXPECT_NE(api_key_refusal("", "abc").find("no API key"), std::string::npos);
  EXPECT_NE(api_key_refusal("Basic abc", "abc").find("Bearer"), std::string::npos);
  EXPECT_NE(api_key_refusal("Bearer", "abc").find("Bearer"), std::string::npos);
  EXPECT_NE(api_key_refusal("Bearer abd", "abc").find("incorrect"), std::string::npos);
  EXPECT_NE(api_key_refusal("Bearer ab", "abc").find("incorrect"), std::string::npos);
  EXPECT_NE(api_key_refusal("Bearer abcd", "abc").find("incorrect"), std::string::npos);
  EXPECT_NE(api_key_refusal("Bearer ABC", "abc").find("incorrect"), std::string::npos);
  const json e = api_key_error_body("incorrect API key provided");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["code"], "invalid_api_key");
  EXPECT_TRUE(e["error"]["param"].is_null());
  EXPECT_TRUE(route_is_public("/health"));
  EXPECT_FALSE(route_is_public("/metrics"));
  EXPECT_FALSE(route_is_public("/health/../v1/models"));
}

TEST(ServerOptionsDefaults, BindLoopbackAndBoundHeaders) {
  const ServerOptions so;
  EXPECT_EQ(so.host, "127.0.0.1");
  EXPECT_TRUE(so.api_key.empty());
  EXPECT_GT(so.max_header_bytes, 0u);
  EXPECT_GT(so.request_timeout_s, 0);
}

class GuardedServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    test::TinyModelOptions o;
    o.n_layer = 2;
    EngineOptions eo;
    eo.model_path = test::write_tiny_model(dir_->path() + "/tiny.gguf", o);
    eo.tiers = {parse_tier_spec("host:64M")};
    engine_ = new Engine(eo);
    ServerOptions so;
    so.port = 0;
    so.model_id = "tiny";
    so.api_key = kKey;
    so.max_header_bytes = 16 << 10;
    server_ = new Server(*engine_, so);
    port_ = server_->bind();
    thread_ = new std::thread([] { server_->serve(); });
  }
  static void TearDownTestSuite() {
    server_->stop();
    thread_->join();
    delete thread_;
    delete server_;
    delete engine_;
    delete dir_;
  }
  static httplib::Client client(const std::string& key = kKey) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    if (!key.empty()) c.set_bearer_token_auth(key.c_str());
    return c;
  }
  // Sends raw bytes on a fresh connection and returns the response's status line, or "" when
  // the server closed the connection without one. Waits at most 20 s (a hang fails the test).
  static std::string raw_status(const std::string& request) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(fd, 0);
    timeval tv{20, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    // The server may answer and close before it has read everything: a failed send is fine.
    for (size_t at = 0; at < request.size();) {
      const ssize_t n = ::send(fd, request.data() + at, request.size() - at, MSG_NOSIGNAL);
      if (n <= 0) break;
      at += (size_t)n;
    }
    std::string got;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n < 0) {
        ADD_FAILURE() << "no answer and no close within 20 s (the server hangs)";
        break;
      }
      if (n == 0) break;
      got.append(buf, (size_t)n);
      if (got.find("\r\n") != std::string::npos) break;
    }
    ::close(fd);
    return got.substr(0, got.find("\r\n"));
  }

  static inline test::TempDir* dir_ = nullptr;
  static inline Engine* engine_ = nullptr;
  static inline Server* server_ = nullptr;
  static inline std::thread* thread_ = nullptr;
  static inline int port_ = 0;
};

json ask(const std::string& q, int max_tokens = 4) {
  return {{"messages", {{{"role", "user"}, {"content", q}}}}, {"max_tokens", max_tokens}};
}

void expect_401(const httplib::Result& r, const std::string& needle) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << r->body;
  EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
  const json e = json::parse(r->body);
  EXPECT_EQ(e["error"]["code"], "invalid_api_key") << r->body;
  EXPECT_EQ(e["error"]["type"], "invalid_request_error") << r->body;
  EXPECT_NE(e["error"]["message"].get<std::string>().find(needle), std::string::npos) << r->body;
}

TEST_F(GuardedServerTest, EveryRouteButHealthNeedsTheKey) {
  auto none = client("");
  auto h = none.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  expect_401(none.Get("/v1/models"), "no API key");
  expect_401(none.Get("/metrics"), "no API key");
  expect_401(none.Post("/v1/chat/completions", ask("hi").dump(), "application/json"), "no API key");
  expect_401(none.Post("/v1/chunks", json{{"chunks", {"doc"}}}.dump(), "application/json"),
             "no API key");
  expect_401(none.Get("/no/such/route"), "no API key");  // no route list without a key
  expect_401(client("sk-wrong").Get("/v1/models"), "incorrect API key");
  expect_401(client(std::string(kKey) + "x").Get("/v1/models"), "incorrect API key");
  httplib::Headers basic = {{"Authorization", "Basic dXNlcjpwYXNz"}};
  expect_401(none.Get("/v1/models", basic), "Bearer");

  // A refused request with a body leaves the connection usable: the same keep-alive client
  // then succeeds with the key.
  httplib::Client k("127.0.0.1", port_);
  k.set_keep_alive(true);
  k.set_read_timeout(120, 0);
  expect_401(k.Post("/v1/chat/completions", ask("hi").dump(), "application/json"), "no API key");
  k.set_bearer_token_auth(kKey);
  auto again = k.Post("/v1/chat/completions", ask("hi").dump(), "application/json");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200) << again->body;

  auto ok = client().Get("/v1/models");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  auto chat = client().Post("/v1/chat/completions", ask("hi").dump(), "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 200) << chat->body;
}

TEST_F(GuardedServerTest, OversizeHeadersAreRefusedAndTheServerGoesOn) {
  const std::string auth = std::string("Authorization: Bearer ") + kKey + "\r\n";
  auto status_code = [](const std::string& line) {
    return line.size() >= 12 ? std::atoi(line.substr(9, 3).c_str()) : 0;
  };
  // One header line over the HTTP layer's 8 KiB line limit.
  const std::string long_line = raw_status("GET /v1/models HTTP/1.1\r\nHost: x\r\n" + auth +
                                           "X-Big: " + std::string(20 << 10, 'a') + "\r\n\r\n");
  EXPECT_TRUE(long_line.empty() || (status_code(long_line) >= 400 && status_code(long_line) < 500))
      << long_line;
  // Many short headers, past the server's own bound on the whole header block (16 KiB here).
  std::string many = "GET /v1/models HTTP/1.1\r\nHost: x\r\n" + auth;
  for (int i = 0; i < 400; ++i)
    many += "X-H" + std::to_string(i) + ": " + std::string(100, 'b') + "\r\n";
  const std::string block = raw_status(many + "\r\n");
  EXPECT_EQ(status_code(block), 431) << block;
  // A request line (URI) over 8 KiB.
  const std::string uri =
      raw_status("GET /v1/models?" + std::string(20 << 10, 'q') + " HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(uri.empty() || (status_code(uri) >= 400 && status_code(uri) < 500)) << uri;
  // Still serving.
  auto ok = client().Get("/v1/models");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

// One line of the exposition that starts with `prefix`, parsed as its value; -1 when absent.
double sample(const std::string& text, const std::string& prefix) {
  const size_t at = ("\n" + text).find("\n" + prefix + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + prefix.size() + 1));
}

TEST_F(GuardedServerTest, MetricsCountRequestsTokensAndChunks) {
  json body = ask("Who kept the lighthouse?", 5);
  body["chunks"] = {"The lighthouse on Gull Point was built in 1871.", "Marta Olsen kept it."};
  auto c = client();
  for (int i = 0; i < 2; ++i) {  // the second finds both chunks
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
  }
  client("").Get("/v1/models");  // a 401
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  EXPECT_NE(m->get_header_value("Content-Type").find("text/plain; version=0.0.4"),
            std::string::npos);
  const std::string& t = m->body;
  EXPECT_GE(sample(t, "cachetune_http_requests_total{route=\"/v1/chat/completions\",code=\"200\"}"),
            2)
      << t;
  EXPECT_GE(sample(t, "cachetune_http_requests_total{route=\"/v1/models\",code=\"401\"}"), 1) << t;
  EXPECT_GE(sample(t, "cachetune_time_to_first_token_seconds_count"), 2) << t;
  EXPECT_GE(sample(t, "cachetune_chunk_lookups_total{tier=\"host\",result=\"hit\"}"), 2) << t;
  EXPECT_GE(sample(t, "cachetune_chunk_lookups_total{tier=\"host\",result=\"miss\"}"), 2) << t;
  EXPECT_GT(sample(t, "cachetune_prefill_rows_total{kind=\"loaded\"}"), 0) << t;
  EXPECT_GT(sample(t, "cachetune_prefill_rows_total{kind=\"recomputed\"}"), 0) << t;
  EXPECT_GT(sample(t, "cachetune_tier_read_bytes_total{tier=\"host\"}"), 0) << t;
  EXPECT_GE(sample(t, "cachetune_generation_tokens_total"), 2) << t;
  EXPECT_EQ(sample(t, "cachetune_queue_length"), 0) << t;
  EXPECT_EQ(sample(t, "cachetune_requests_cancelled_total"), 0) << t;
  EXPECT_NE(t.find("# TYPE cachetune_batch_rows histogram"), std::string::npos) << t;
  // The scheduler's figures: idle now, and the two answers took decode steps.
  EXPECT_EQ(sample(t, "cachetune_running_sequences"), 0) << t;
  EXPECT_EQ(sample(t, "cachetune_kv_budget_bytes_in_use"), 0) << t;
  EXPECT_GE(sample(t, "cachetune_batch_rows_count"), 2) << t;
  EXPECT_GE(sample(t, "cachetune_step_seconds_count"), sample(t, "cachetune_batch_rows_count"))
      << t;
  EXPECT_NE(t.find("# TYPE cachetune_encode_rows_total counter"), std::string::npos) << t;
}

// Text of a streamed response's content deltas and its finish_reason.
std::pair<std::string, std::string> read_stream(const std::string& body) {
  std::string text, finish;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string payload = body.substr(at + 6, end - at - 6);
    at = end;
    if (payload == "[DONE]") break;
    const json e = json::parse(payload);
    const json& d = e["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  return {text, finish};
}

TEST_F(GuardedServerTest, StopSequencesCutTheAnswerWholeAndStreamed) {
  auto c = client();
  json body = ask("Tell me a story.", 24);
  body["ignore_eos"] = true;
  auto free_run = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(free_run);
  ASSERT_EQ(free_run->status, 200) << free_run->body;
  const std::string text = json::parse(free_run->body)["choices"][0]["message"]["content"];
  // A two-byte ASCII stop sequence from the middle of the greedy answer.
  std::string stop;
  for (size_t k = text.size() / 2; k + 2 <= text.size() && stop.empty(); ++k) {
    if ((unsigned char)text[k] < 0x80 && (unsigned char)text[k + 1] < 0x80)
      stop = text.substr(k, 2);
  }
  if (stop.empty()) GTEST_SKIP() << "no ASCII pair in the tiny model's answer: " << text;
  const std::string want = text.substr(0, text.find(stop));
  for (const json& s : {json(stop), json({"\x01never", stop})}) {
    body["stop"] = s;
    body["stream"] = false;
    auto whole = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(whole);
    ASSERT_EQ(whole->status, 200) << whole->body;
    const json j = json::parse(whole->body);
    EXPECT_EQ(j["choices"][0]["message"]["content"], want) << "stop " << s.dump();
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    EXPECT_LT(j["usage"]["completion_tokens"].get<int>(), 24);
    body["stream"] = true;
    auto streamed = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(streamed);
    ASSERT_EQ(streamed->status, 200);
    const auto [stext, finish] = read_stream(streamed->body);
    EXPECT_EQ(stext, want) << "stop " << s.dump();
    EXPECT_EQ(finish, "stop");
  }
  // A stop sequence that never occurs changes nothing.
  body["stop"] = "\x01\x02";
  body["stream"] = false;
  auto same = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(same);
  EXPECT_EQ(json::parse(same->body)["choices"][0]["message"]["content"], text);
  EXPECT_EQ(json::parse(same->body)["choices"][0]["finish_reason"], "length");
}

}  // namespace
}  // namespace ct::server
