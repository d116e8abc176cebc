// The series `cachetune serve` exports at GET /metrics (docs/SERVER.md "Metrics"), and the
// recorders the transport calls where a request ends, a token is produced or an answer is done.
//
// The batching scheduler's series (engine/scheduler.h), set by the server from its stats at each
// scrape and from its step observer:
//   cachetune_queue_length             gauge      requests waiting for admission
//   cachetune_running_sequences        gauge      sequences in the running batch
//   cachetune_kv_budget_bytes_in_use   gauge      bytes of the KV budget held by sequences
//   cachetune_batch_rows               histogram  rows per engine step (decode and prefill)
//   cachetune_step_seconds             histogram  wall time of an engine step that did work
//   cachetune_encode_rows_total        counter    rows of chunk encoding work run in steps
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"

namespace ct::server {

class ServerMetrics {
 public:
  ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  MetricsRegistry registry;

  Counter& requests;          // cachetune_http_requests_total{route, code}
  Histogram& ttft;            // cachetune_time_to_first_token_seconds
  Histogram& inter_token;     // cachetune_inter_token_latency_seconds
  Counter& prompt_tokens;     // cachetune_prompt_tokens_total
  Counter& generated_tokens;  // cachetune_generation_tokens_total
  Counter& chunk_lookups;     // cachetune_chunk_lookups_total{tier, result}
  Counter& prefill_rows;      // cachetune_prefill_rows_total{kind="recomputed"|"loaded"}
  Counter& reencodes;         // cachetune_chunk_reencodes_total{reason}
  Counter& tier_read_bytes;   // cachetune_tier_read_bytes_total{tier}      (collected)
  Counter& tier_errors;       // cachetune_tier_errors_total{tier}          (collected)
  Gauge& tier_used_bytes;     // cachetune_tier_used_bytes{tier}            (collected)
  Counter& cancelled;         // cachetune_requests_cancelled_total         (collected)
  Counter& slow_closed;       // cachetune_slow_connections_closed_total    (collected)
  Counter& http_rejected;     // cachetune_http_overload_rejected_total     (collected)
  Gauge& queue_length;        // set by the scheduler, see above
  Gauge& running_sequences;
  Gauge& kv_budget_bytes_in_use;
  Histogram& batch_rows;
  Histogram& step_seconds;
  Counter& encode_rows;
  // The scheduler's step observer: the step's rows and time into the series above.
  void record_step(const StepRows& rows, double seconds);

  // The route label of a request path: one of the server's routes, or "other" (so that unknown
  // paths cannot create unbounded series).
  static std::string route_label(const std::string& path);
  void count_request(const std::string& path, int status);
  // The engine figures of one finished answer: TTFT, token counts, chunk lookups, prefill rows
  // and re-encodings.
  void record_answer(const Answer& a);
  // Chunk lookups of an ingest (POST /v1/chunks).
  void record_chunks(const std::vector<ChunkInfo>& chunks);

  // Collectors that copy, at each scrape, the pool's per-tier bytes read, errors and use
  // (labelled by the configured tier kinds) and the server's own counts.
  void collect_pool(Engine& engine);
  void collect_server(std::function<uint64_t()> cancelled_requests,
                      std::function<uint64_t()> slow_connections_closed,
                      std::function<uint64_t()> overload_rejected);
};

// Measures the gaps between generated tokens of one request into the inter-token histogram:
// tick() at each token; the first tick only starts the clock (its latency is the TTFT).
class TokenClock {
 public:
  explicit TokenClock(Histogram& h) : h_(h) {}
  void tick();

 private:
  Histogram& h_;
  bool started_ = false;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace ct::server
