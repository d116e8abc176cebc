// The metrics registry and its Prometheus text exposition: HELP/TYPE lines, label and help
// escaping, value formatting, cumulative histogram buckets with +Inf, _sum and _count, refusal
// of invalid names and mismatched re-registration, concurrent updates, and the server's
// recorders (route labels, chunk lookups, prefill rows, re-encodings).
#include "server/server_metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "core/error.h"
#include "server/metrics.h"

namespace ct::server {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(Metrics, CounterAndGaugeExposition) {
  MetricsRegistry r;
  Counter& c = r.counter("app_requests_total", "Requests answered", {"route", "code"});
  c.inc({"/v1/chat", "200"});
  c.inc({"/v1/chat", "200"}, 2);
  c.inc({"/health", "200"});
  Gauge& g = r.gauge("app_queue", "Waiting requests");
  g.set(3);
  g.add({}, -1);
  const std::string t = r.exposition();
  EXPECT_TRUE(has_line(t, "# HELP app_requests_total Requests answered")) << t;
  EXPECT_TRUE(has_line(t, "# TYPE app_requests_total counter")) << t;
  EXPECT_TRUE(has_line(t, "app_requests_total{route=\"/v1/chat\",code=\"200\"} 3")) << t;
  EXPECT_TRUE(has_line(t, "app_requests_total{route=\"/health\",code=\"200\"} 1")) << t;
  EXPECT_TRUE(has_line(t, "# TYPE app_queue gauge")) << t;
  EXPECT_TRUE(has_line(t, "app_queue 2")) << t;
  EXPECT_EQ(c.value({"/v1/chat", "200"}), 3);
  EXPECT_EQ(c.value({"/nowhere", "404"}), 0);
  // Families appear in registration order, HELP before TYPE before samples.
  EXPECT_LT(t.find("# HELP app_requests_total"), t.find("# TYPE app_requests_total"));
  EXPECT_LT(t.find("app_requests_total{"), t.find("# HELP app_queue"));
  EXPECT_EQ(t.back(), '\n');
}

TEST(Metrics, UnlabelledFamiliesShowZeroBeforeAnyUpdate) {
  MetricsRegistry r;
  r.counter("a_total", "a");
  r.gauge("b", "b");
  r.counter("c_total", "c", {"x"});  // labelled: no series until one is used
  const std::string t = r.exposition();
  EXPECT_TRUE(has_line(t, "a_total 0")) << t;
  EXPECT_TRUE(has_line(t, "b 0")) << t;
  EXPECT_TRUE(has_line(t, "# TYPE c_total counter")) << t;
  EXPECT_EQ(t.find("c_total{"), std::string::npos) << t;
}

TEST(Metrics, EscapesHelpAndLabelValues) {
  EXPECT_EQ(escape_help("a\\b\nc\"d"), "a\\\\b\\nc\"d");  // quotes stay in HELP
  EXPECT_EQ(escape_label_value("a\\b\nc\"d"), "a\\\\b\\nc\\\"d");
  MetricsRegistry r;
  r.counter("x_total", "line one\nline \\two", {"path"}).inc({"say \"hi\"\n\\"});
  const std::string t = r.exposition();
  EXPECT_TRUE(has_line(t, "# HELP x_total line one\\nline \\\\two")) << t;
  EXPECT_TRUE(has_line(t, "x_total{path=\"say \\\"hi\\\"\\n\\\\\"} 1")) << t;
}

TEST(Metrics, FormatsValues) {
  EXPECT_EQ(format_metric_value(0), "0");
  EXPECT_EQ(format_metric_value(42), "42");
  EXPECT_EQ(format_metric_value(-3), "-3");
  EXPECT_EQ(format_metric_value(0.005), "0.005");
  EXPECT_EQ(format_metric_value(2.5), "2.5");
  EXPECT_EQ(format_metric_value(INFINITY), "+Inf");
  EXPECT_EQ(format_metric_value(-INFINITY), "-Inf");
  EXPECT_EQ(format_metric_value(NAN), "NaN");
  EXPECT_EQ(std::stod(format_metric_value(1.0 / 3)), 1.0 / 3);  // round-trips
  EXPECT_EQ(std::stod(format_metric_value(1e300)), 1e300);
}

TEST(Metrics, HistogramBucketsAreCumulativeWithInf) {
  MetricsRegistry r;
  // Binary-exact values, so the sum prints exactly.
  Histogram& h = r.histogram("lat_seconds", "Latency", {0.125, 1, 10}, {"route"});
  for (double v : {0.0625, 0.125, 0.5, 5.0, 50.0}) h.observe({"a"}, v);
  h.observe({"a"}, NAN);  // ignored
  const Histogram::Snapshot s = h.snapshot({"a"});
  EXPECT_EQ(s.count, 5u);
  EXPECT_EQ(s.sum, 55.6875);
  ASSERT_EQ(s.counts.size(), 4u);
  EXPECT_EQ(s.counts[0], 2u);  // 0.0625 and 0.125: le is inclusive
  const std::string t = r.exposition();
  EXPECT_TRUE(has_line(t, "# TYPE lat_seconds histogram")) << t;
  EXPECT_TRUE(has_line(t, "lat_seconds_bucket{route=\"a\",le=\"0.125\"} 2")) << t;
  EXPECT_TRUE(has_line(t, "lat_seconds_bucket{route=\"a\",le=\"1\"} 3")) << t;
  EXPECT_TRUE(has_line(t, "lat_seconds_bucket{route=\"a\",le=\"10\"} 4")) << t;
  EXPECT_TRUE(has_line(t, "lat_seconds_bucket{route=\"a\",le=\"+Inf\"} 5")) << t;
  EXPECT_TRUE(has_line(t, "lat_seconds_sum{route=\"a\"} 55.6875")) << t;
  EXPECT_TRUE(has_line(t, "lat_seconds_count{route=\"a\"} 5")) << t;

  MetricsRegistry r2;
  r2.histogram("plain", "p", {1});
  const std::string t2 = r2.exposition();
  EXPECT_TRUE(has_line(t2, "plain_bucket{le=\"1\"} 0")) << t2;
  EXPECT_TRUE(has_line(t2, "plain_bucket{le=\"+Inf\"} 0")) << t2;
  EXPECT_TRUE(has_line(t2, "plain_sum 0")) << t2;
  EXPECT_TRUE(has_line(t2, "plain_count 0")) << t2;
}

TEST(Metrics, RefusesInvalidNamesLabelsAndUse) {
  MetricsRegistry r;
  EXPECT_THROW(r.counter("", "x"), Error);
  EXPECT_THROW(r.counter("9lives", "x"), Error);
  EXPECT_THROW(r.counter("has-dash", "x"), Error);
  EXPECT_THROW(r.counter("ok_total", "x", {"bad-label"}), Error);
  EXPECT_THROW(r.counter("ok_total", "x", {"__reserved"}), Error);
  EXPECT_THROW(r.histogram("h", "x", {1, 2}, {"le"}), Error);
  EXPECT_THROW(r.histogram("h", "x", {2, 1}), Error);
  EXPECT_THROW(r.histogram("h", "x", {1, INFINITY}), Error);
  EXPECT_NO_THROW(r.counter("ns:ok_total", "colons are allowed in metric names"));
  Counter& c = r.counter("c_total", "x", {"a"});
  EXPECT_THROW(c.inc({}), Error);          // one label value expected
  EXPECT_THROW(c.inc({"1", "2"}), Error);  // ...not two
  EXPECT_THROW(c.inc({"1"}, -1), Error);   // counters only go up
  // The same registration again is the same family; a different one is refused.
  EXPECT_EQ(&r.counter("c_total", "x", {"a"}), &c);
  EXPECT_THROW(r.counter("c_total", "x", {"b"}), Error);
  EXPECT_THROW(r.gauge("c_total", "x", {"a"}), Error);
  r.histogram("h2", "x", {1, 2});
  EXPECT_THROW(r.histogram("h2", "x", {1, 3}), Error);
  EXPECT_EQ(r.find_counter("c_total"), &c);
  EXPECT_EQ(r.find_gauge("c_total"), nullptr);
  EXPECT_EQ(r.find_histogram("nope"), nullptr);
}

TEST(Metrics, CollectorsRunBeforeExposition) {
  MetricsRegistry r;
  Counter& c = r.counter("mirrored_total", "kept elsewhere", {"tier"});
  int source = 0;
  r.add_collector([&] { c.set({"redis"}, ++source * 10); });
  EXPECT_TRUE(has_line(r.exposition(), "mirrored_total{tier=\"redis\"} 10"));
  EXPECT_TRUE(has_line(r.exposition(), "mirrored_total{tier=\"redis\"} 20"));
}

TEST(Metrics, ConcurrentUpdatesAreNotLost) {
  MetricsRegistry r;
  Counter& c = r.counter("n_total", "n", {"t"});
  Histogram& h = r.histogram("v", "v", {0.5});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        c.inc({std::to_string(t % 2)});
        h.observe(i % 2 ? 1.0 : 0.0);
        if (i % 500 == 0) r.exposition();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(c.value({"0"}) + c.value({"1"}), 8000);
  EXPECT_EQ(h.snapshot().count, 8000u);
  EXPECT_EQ(h.snapshot().counts[0], 4000u);
}

TEST(ServerMetrics, RegistersTheSchedulerSeriesAndRecordsAnswers) {
  ServerMetrics m;
  // The batching scheduler finds its series by name.
  ASSERT_NE(m.registry.find_gauge("cachetune_queue_length"), nullptr);
  ASSERT_NE(m.registry.find_gauge("cachetune_running_sequences"), nullptr);
  ASSERT_NE(m.registry.find_gauge("cachetune_kv_budget_bytes_in_use"), nullptr);
  ASSERT_NE(m.registry.find_histogram("cachetune_batch_rows"), nullptr);
  m.registry.find_gauge("cachetune_queue_length")->set(7);
  EXPECT_EQ(m.queue_length.value(), 7);

  EXPECT_EQ(ServerMetrics::route_label("/v1/chat/completions"), "/v1/chat/completions");
  EXPECT_EQ(ServerMetrics::route_label("/v1/completions"), "/v1/completions");
  EXPECT_EQ(ServerMetrics::route_label("/tokenize"), "/tokenize");
  EXPECT_EQ(ServerMetrics::route_label("/v1/chat/completions/../x"), "other");
  m.count_request("/metrics", 200);
  m.count_request("/random/path", 404);
  EXPECT_EQ(m.requests.value({"/metrics", "200"}), 1);
  EXPECT_EQ(m.requests.value({"other", "404"}), 1);

  Answer a;
  a.ttft_ms = 250;
  a.n_prompt = 100;
  a.tokens = {1, 2, 3};
  a.prefill.n_active = 40;
  a.prefill.n_loaded = 60;
  a.retries = 1;
  ChunkInfo hit, miss;
  hit.hit = true;
  hit.tier = "redis";
  miss.tier = "host";
  miss.replaced = 1;
  a.chunks = {hit, miss};
  m.record_answer(a);
  EXPECT_EQ(m.chunk_lookups.value({"redis", "hit"}), 1);
  EXPECT_EQ(m.chunk_lookups.value({"host", "miss"}), 1);
  EXPECT_EQ(m.prefill_rows.value({"recomputed"}), 40);
  EXPECT_EQ(m.prefill_rows.value({"loaded"}), 60);
  EXPECT_EQ(m.reencodes.value({"read_failure"}), 1);
  EXPECT_EQ(m.reencodes.value({"mismatch"}), 1);
  EXPECT_EQ(m.prompt_tokens.value(), 100);
  EXPECT_EQ(m.generated_tokens.value(), 3);
  EXPECT_EQ(m.ttft.snapshot().count, 1u);
  EXPECT_DOUBLE_EQ(m.ttft.snapshot().sum, 0.25);

  TokenClock clock(m.inter_token);
  clock.tick();  // the first token: its latency is the TTFT, not an inter-token gap
  EXPECT_EQ(m.inter_token.snapshot().count, 0u);
  clock.tick();
  clock.tick();
  EXPECT_EQ(m.inter_token.snapshot().count, 2u);
}

}  // namespace
}  // namespace ct::server
