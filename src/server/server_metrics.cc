// The server's metric families and their recorders (see server_metrics.h).
#include "server/server_metrics.h"

#include <map>

namespace ct::server {
namespace {

// Seconds; TTFT of a chunk-aware request is milliseconds to seconds on a CPU.
const std::vector<double> kTtftBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                          1,     2.5,  5,     10,   30,  60};
const std::vector<double> kInterTokenBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                0.1,   0.25,   0.5,   1,    2.5};
const std::vector<double> kBatchRowBuckets = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
const std::vector<double> kStepBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

}  // namespace

ServerMetrics::ServerMetrics()
    : requests(registry.counter("cachetune_http_requests_total",
                                "HTTP requests answered, by route and status code",
                                {"route", "code"})),
      ttft(registry.histogram("cachetune_time_to_first_token_seconds",
                              "Time from a request's arrival at the engine to its first token "
                              "(chunk lookup and encoding, prefill, first sample)",
                              kTtftBuckets)),
      inter_token(registry.histogram("cachetune_inter_token_latency_seconds",
                                     "Time between consecutive generated tokens of a request",
                                     kInterTokenBuckets)),
      prompt_tokens(
          registry.counter("cachetune_prompt_tokens_total", "Prompt tokens of answered requests")),
      generated_tokens(registry.counter("cachetune_generation_tokens_total",
                                        "Tokens generated for answered requests")),
      chunk_lookups(registry.counter(
          "cachetune_chunk_lookups_total",
          "Chunk lookups by result (hit: found in the pool; miss: encoded) and tier (where it "
          "was found, or where the new encoding went; \"request\" when no tier took it)",
          {"tier", "result"})),
      prefill_rows(registry.counter(
          "cachetune_prefill_rows_total",
          "Prompt rows per layer of answered requests: recomputed by the model, or loaded from "
          "the cache",
          {"kind"})),
      reencodes(registry.counter(
          "cachetune_chunk_reencodes_total",
          "Chunks encoded again because a stored record failed to read (read_failure) or did "
          "not match the request (mismatch)",
          {"reason"})),
      tier_read_bytes(registry.counter("cachetune_tier_read_bytes_total",
                                       "K/V bytes read from each cache tier", {"tier"})),
      tier_errors(registry.counter(
          "cachetune_tier_errors_total",
          "Failed exchanges with a cache tier's medium (Redis: unreachable node, I/O error, "
          "timeout, failed transaction)",
          {"tier"})),
      tier_used_bytes(
          registry.gauge("cachetune_tier_used_bytes", "Bytes stored in each cache tier", {"tier"})),
      cancelled(registry.counter("cachetune_requests_cancelled_total",
                                 "Requests stopped early because their client closed the "
                                 "connection")),
      slow_closed(registry.counter("cachetune_slow_connections_closed_total",
                                   "Connections closed because they took longer than "
                                   "--request-timeout to send a request")),
      http_rejected(registry.counter("cachetune_http_overload_rejected_total",
                                     "Requests answered 503 because every connection worker was "
                                     "busy and the connection queue (--http-queue) full")),
      queue_length(registry.gauge("cachetune_queue_length",
                                  "Requests waiting for admission into the running batch")),
      running_sequences(
          registry.gauge("cachetune_running_sequences", "Sequences in the engine's running batch")),
      kv_budget_bytes_in_use(registry.gauge("cachetune_kv_budget_bytes_in_use",
                                            "Bytes of the KV memory budget held by sequences")),
      batch_rows(registry.histogram(
          "cachetune_batch_rows",
          "Rows in one engine step: a decode row per generating sequence and prefill rows",
          kBatchRowBuckets)),
      step_seconds(registry.histogram("cachetune_step_seconds",
                                      "Wall time of one engine step that did work (decode rows, "
                                      "prefill slices, chunk encoding)",
                                      kStepBuckets)),
      encode_rows(registry.counter("cachetune_encode_rows_total",
                                   "Rows of chunk encodings run in engine steps (the isolated "
                                   "pass's rows and the probe pass's, a probe row counted as "
                                   "one)")) {}

void ServerMetrics::record_step(const StepRows& rows, double seconds) {
  if (rows.decode + rows.prefill > 0) batch_rows.observe(rows.decode + rows.prefill);
  step_seconds.observe(seconds);
  if (rows.encode > 0) encode_rows.inc({}, rows.encode);
}

std::string ServerMetrics::route_label(const std::string& path) {
  static const char* const kRoutes[] = {
      "/health",         "/metrics",   "/v1/models", "/v1/chat/completions",
      "/v1/completions", "/v1/chunks", "/tokenize",  "/detokenize"};
  for (const char* r : kRoutes)
    if (path == r) return r;
  return "other";
}

void ServerMetrics::count_request(const std::string& path, int status) {
  requests.inc({route_label(path), std::to_string(status)});
}

void ServerMetrics::record_chunks(const std::vector<ChunkInfo>& chunks) {
  for (const ChunkInfo& c : chunks) {
    chunk_lookups.inc({c.tier.empty() ? "none" : c.tier, c.hit ? "hit" : "miss"});
    if (c.replaced > 0) reencodes.inc({"mismatch"}, c.replaced);
  }
}

void ServerMetrics::record_answer(const Answer& a) {
  ttft.observe(a.ttft_ms / 1e3);
  prompt_tokens.inc({}, a.n_prompt);
  generated_tokens.inc({}, (double)a.tokens.size());
  record_chunks(a.chunks);
  prefill_rows.inc({"recomputed"}, a.prefill.n_active);
  prefill_rows.inc({"loaded"}, a.prefill.n_loaded);
  if (a.retries > 0) reencodes.inc({"read_failure"}, a.retries);
}

void ServerMetrics::collect_pool(Engine& engine) {
  registry.add_collector([this, &engine] {
    const std::vector<store::TierStat> st = engine.pool().tier_stats();
    // Two tiers of one kind share a label: their counts add up.
    std::map<std::string, store::TierStat> by_kind;
    for (size_t t = 0; t < st.size(); ++t) {
      const std::string kind =
          t < engine.options().tiers.size() ? engine.options().tiers[t].kind : st[t].name;
      store::TierStat& k = by_kind[kind];
      k.bytes_read += st[t].bytes_read;
      k.io_errors += st[t].io_errors;
      k.used_bytes += st[t].used_bytes;
    }
    for (const auto& [kind, k] : by_kind) {
      tier_read_bytes.set({kind}, (double)k.bytes_read);
      tier_errors.set({kind}, (double)k.io_errors);
      tier_used_bytes.set({kind}, (double)k.used_bytes);
    }
  });
}

void ServerMetrics::collect_server(std::function<uint64_t()> cancelled_requests,
                                   std::function<uint64_t()> slow_connections_closed,
                                   std::function<uint64_t()> overload_rejected) {
  registry.add_collector([this, c = std::move(cancelled_requests),
                          s = std::move(slow_connections_closed),
                          o = std::move(overload_rejected)] {
    cancelled.set({}, (double)c());
    slow_closed.set({}, (double)s());
    http_rejected.set({}, (double)o());
  });
}

void TokenClock::tick() {
  const auto now = std::chrono::steady_clock::now();
  if (started_) h_.observe(std::chrono::duration<double>(now - last_).count());
  started_ = true;
  last_ = now;
}

}  // namespace ct::server
