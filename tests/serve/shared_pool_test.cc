// Several `cachetune serve` processes sharing one cache pool (issue 13 item 7), on loopback:
// a chunk ingested through server A is a hit on server B with no re-encoding (one Redis), and on
// a 3-master Redis Cluster killing the node that holds chunks keeps answers coming: the lost
// chunks are recomputed for the request and B's /metrics shows the Redis errors and the
// re-encodings. Skipped when redis-server is not on PATH.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "support/chunk_fixtures.h"
#include "support/serve_process.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

using nlohmann::json;

const std::vector<std::string> kDocs = {
    "The lighthouse on Gull Point was built in 1871 and painted red and white in 1903.",
    "Marta Olsen kept the lighthouse for forty years and wrote a diary of every storm.",
    "The storm of 1911 flooded the harbour and carried away the old pier.",
    "A new pier was finished in 1914, paid for by the fishing cooperative.",
    "The lamp was electrified in 1932; the keeper's cottage became a museum in 1970.",
    "Visitors climb 112 steps to the lantern room, open from May to September."};

json post(const test::ServeProcess& s, const std::string& path, const json& body) {
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(300, 0);
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  if (!r) return {{"http_error", httplib::to_string(r.error())}};
  json j = json::parse(r->body, nullptr, false);
  j["http_status"] = r->status;
  return j;
}

std::string metrics_of(const test::ServeProcess& s) {
  httplib::Client c("127.0.0.1", s.port());
  auto r = c.Get("/metrics");
  return r && r->status == 200 ? r->body : "";
}

// Value of the exposition line `prefix value`; -1 when the series is absent.
double sample(const std::string& text, const std::string& prefix) {
  const size_t at = ("\n" + text).find("\n" + prefix + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + prefix.size() + 1));
}

json chat(const std::vector<std::string>& docs) {
  return {{"messages", {{{"role", "user"}, {"content", "When was the pier rebuilt?"}}}},
          {"chunks", docs},
          {"max_tokens", 6}};
}

class SharedPool : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::RedisServer::available()) GTEST_SKIP() << "redis-server is not on PATH";
    test::TinyModelOptions o;
    o.n_layer = 2;
    model_ = test::write_tiny_model(dir_.path() + "/tiny.gguf", o);
  }
  void start_servers(int redis_port) {
    const std::string spec = "redis:127.0.0.1:" + std::to_string(redis_port);
    std::string err;
    ASSERT_TRUE(a_.start(CT_CLI_PATH, {"--model", model_, "--tiers", spec}, {},
                         dir_.path() + "/a.log", &err))
        << err;
    ASSERT_TRUE(b_.start(CT_CLI_PATH, {"--model", model_, "--tiers", spec}, {},
                         dir_.path() + "/b.log", &err))
        << err;
  }

  test::TempDir dir_;
  std::string model_;
  test::ServeProcess a_, b_;
};

TEST_F(SharedPool, ChunkIngestedOnServerAIsAHitOnServerB) {
  test::RedisServer redis;
  std::string err;
  ASSERT_TRUE(redis.start({}, &err)) << err;
  start_servers(redis.port());  // both up before the ingest: B learns of it from Redis itself
  const std::vector<std::string> docs(kDocs.begin(), kDocs.begin() + 2);
  const json ingest = post(a_, "/v1/chunks", {{"chunks", docs}});
  ASSERT_EQ(ingest.value("http_status", 0), 200) << ingest.dump();
  for (const json& c : ingest["data"]) {
    EXPECT_FALSE(c["hit"].get<bool>());
    EXPECT_EQ(c["tier"], "redis");
  }
  const json on_b = post(b_, "/v1/chat/completions", chat(docs));
  ASSERT_EQ(on_b.value("http_status", 0), 200) << on_b.dump() << b_.log();
  ASSERT_EQ(on_b["cachetune"]["chunks"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const json& c = on_b["cachetune"]["chunks"][i];
    EXPECT_TRUE(c["hit"].get<bool>()) << c.dump();
    EXPECT_EQ(c["tier"], "redis") << c.dump();
    EXPECT_EQ(c["id"], ingest["data"][i]["id"]);
    EXPECT_FALSE(c.contains("replaced")) << c.dump();
  }
  EXPECT_EQ(on_b["cachetune"]["retries"], 0);
  EXPECT_GT(on_b["cachetune"]["loaded_rows"].get<int>(), 0);
  // Same greedy answer from A, which encoded the chunks.
  const json on_a = post(a_, "/v1/chat/completions", chat(docs));
  EXPECT_EQ(on_a["choices"][0]["message"]["content"], on_b["choices"][0]["message"]["content"]);

  const std::string m = metrics_of(b_);
  EXPECT_EQ(sample(m, "cachetune_chunk_lookups_total{tier=\"redis\",result=\"hit\"}"), 2) << m;
  EXPECT_EQ(sample(m, "cachetune_chunk_lookups_total{tier=\"redis\",result=\"miss\"}"), -1) << m;
  EXPECT_EQ(sample(m, "cachetune_chunk_reencodes_total{reason=\"read_failure\"}"), -1) << m;
  EXPECT_GT(sample(m, "cachetune_tier_read_bytes_total{tier=\"redis\"}"), 0) << m;
  EXPECT_EQ(sample(m, "cachetune_tier_errors_total{tier=\"redis\"}"), 0) << m;
  // B did not take the chunks out of the shared Redis: A still finds them.
  const json again = post(a_, "/v1/chunks", {{"chunks", docs}});
  for (const json& c : again["data"]) EXPECT_TRUE(c["hit"].get<bool>()) << again.dump();
}

TEST_F(SharedPool, ClusterNodeKilledMidRunAnswersKeepComing) {
  test::RedisServer nodes[3];
  std::string err;
  for (auto& n : nodes) {
    const int bus = test::pick_free_port(1024, 65535);
    ASSERT_TRUE(n.start({"--cluster-enabled", "yes", "--cluster-port", std::to_string(bus),
                         "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"},
                        &err))
        << err;
  }
  const char* ranges[3][2] = {{"0", "5460"}, {"5461", "10922"}, {"10923", "16383"}};
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(nodes[i].command({"CLUSTER", "ADDSLOTSRANGE", ranges[i][0], ranges[i][1]}), "OK");
  for (int i = 1; i < 3; ++i) {
    const std::string bus = nodes[i].command({"CONFIG", "GET", "cluster-port"}).substr(13);
    ASSERT_EQ(
        nodes[0].command({"CLUSTER", "MEET", "127.0.0.1", std::to_string(nodes[i].port()), bus}),
        "OK");
  }
  bool ok = false;
  for (int t = 0; t < 300 && !ok; ++t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ok = true;
    for (auto& n : nodes)
      ok = ok && n.command({"CLUSTER", "INFO"}).find("cluster_state:ok") != std::string::npos;
  }
  ASSERT_TRUE(ok) << "the three-node cluster did not come up";

  start_servers(nodes[0].port());  // the tiers know node 0 and follow MOVED to the others
  const json ingest = post(a_, "/v1/chunks", {{"chunks", kDocs}});
  ASSERT_EQ(ingest.value("http_status", 0), 200) << ingest.dump() << a_.log();
  const json warm = post(b_, "/v1/chat/completions", chat(kDocs));
  ASSERT_EQ(warm.value("http_status", 0), 200) << warm.dump();
  for (const json& c : warm["cachetune"]["chunks"]) EXPECT_TRUE(c["hit"].get<bool>()) << c.dump();

  // Kill a node (not the one the tiers were given) that holds some of the chunks.
  int victim = -1;
  for (int i = 1; i < 3 && victim < 0; ++i)
    if (nodes[i].command({"DBSIZE"}) != "0") victim = i;
  ASSERT_GE(victim, 0) << "no chunk landed on nodes 1 or 2";
  nodes[victim].stop();

  for (int round = 0; round < 2; ++round) {
    const json r = post(b_, "/v1/chat/completions", chat(kDocs));
    ASSERT_EQ(r.value("http_status", 0), 200) << r.dump() << b_.log();
    EXPECT_FALSE(r["choices"][0]["message"]["content"].get<std::string>().empty() &&
                 r["usage"]["completion_tokens"].get<int>() == 0);
    int recomputed = 0;
    for (const json& c : r["cachetune"]["chunks"]) recomputed += !c["hit"].get<bool>();
    // First round: the chunks on the dead node were indexed, their reads fail and they are
    // re-encoded (retries); later rounds find them missing and encode them for the request.
    EXPECT_GT(recomputed + r["cachetune"]["retries"].get<int>(), 0) << r["cachetune"].dump();
  }
  const json from_a = post(a_, "/v1/chat/completions", chat(kDocs));
  EXPECT_EQ(from_a.value("http_status", 0), 200) << from_a.dump();

  const std::string m = metrics_of(b_);
  EXPECT_GT(sample(m, "cachetune_tier_errors_total{tier=\"redis\"}"), 0) << m;
  const double reads = sample(m, "cachetune_chunk_reencodes_total{reason=\"read_failure\"}");
  const double misses =
      sample(m, "cachetune_chunk_lookups_total{tier=\"request\",result=\"miss\"}");
  EXPECT_GT(std::max(reads, 0.0) + std::max(misses, 0.0), 0) << m;
  EXPECT_EQ(sample(m, "cachetune_http_requests_total{route=\"/v1/chat/completions\",code=\"200\"}"),
            3)
      << m;
}

}  // namespace
}  // namespace ct
