// `cachetune serve`: an OpenAI-compatible HTTP server over one Engine (docs/SERVER.md).
// Routes: GET /health, GET /metrics (Prometheus text), GET /v1/models, POST
// /v1/chat/completions (optionally streamed as server-sent events; chunk-aware via "chunks" and
// "cachetune"), POST /v1/chunks (encode documents into the cache ahead of use). With an API key
// every route but /health needs `Authorization: Bearer <key>`. Connections are served by a thread
// pool; the engine is driven by one scheduler thread that decodes all running requests together
// in one batch per step (engine/scheduler.h), admitting new ones as the K/V budget allows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "server/api.h"
#include "server/server_metrics.h"

namespace ct::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                   // 0: any free port (see Server::port)
  size_t max_body_bytes = 8u << 20;  // larger bodies get 413
  ApiLimits limits;
  std::string model_id = "cachetune";  // reported by /v1/models and in every response
  // Origins whose browser requests are served ("*": any). A request with another Origin header
  // gets 403: a page on a foreign site must not drive a local server.
  std::vector<std::string> allowed_origins;
  // Connection workers; a slow client holds at most one, and so does every request running or
  // waiting in the scheduler, so there must be more than batching.max_running + max_queue.
  int http_threads = 128;
  // Accepted connections waiting for a worker; a connection beyond them is answered 503 with
  // Retry-After by a separate overflow worker (server/task_queue.h) instead of waiting unboundedly.
  int http_queue = 256;
  double request_timeout_s = 30;  // longest a connection may take to send a request (0: none)
  // One stderr line per engine step that did work: its decode, prefill and encoding rows and
  // its wall time (`serve --log-steps`; for finding what holds up the running requests).
  bool log_steps = false;
  int listen_backlog = 512;  // pending connections the kernel queues
  // Continuous batching: the K/V budget (bytes), the most requests decoding at once, and the
  // longest admission queue (beyond it: 503 with Retry-After).
  SchedulerOptions batching;
  // Non-empty: every route but /health requires `Authorization: Bearer <api_key>` (401 else).
  std::string api_key;
  // Largest request line plus headers; a larger request gets 431 (the HTTP layer itself refuses
  // a single header line over 8 KiB with 400 and a request line over 8 KiB with 414).
  size_t max_header_bytes = 64u << 10;
};

class Server {
 public:
  Server(Engine& engine, ServerOptions opt);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns the port. Throws ct::Error naming host and port when the
  // address cannot be bound.
  int bind();
  int port() const;
  // Requests (streamed or not) stopped early because their client closed the connection.
  uint64_t cancelled_requests() const;
  // Connections closed because they took longer than request_timeout_s to send a request.
  uint64_t slow_connections_closed() const;
  // Requests answered 503 because the connection queue (http_queue) was full.
  uint64_t overload_rejected() const;
  // Queue, batch and K/V budget figures of the scheduler.
  SchedulerStats batch_stats() const;
  Scheduler& scheduler();  // e.g. for tests that hold it (Scheduler::run) to fill the queue
  // The series of GET /metrics; a scheduler sets its gauges here (server_metrics.h).
  ServerMetrics& metrics();
  // Serves until stop() (from another thread or a signal handler's helper thread). bind() first.
  void serve();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Longest prefix of `pending` that ends on a UTF-8 character boundary is moved to the result;
// an incomplete trailing sequence (a character split across tokens) stays in `pending`.
std::string take_complete_utf8(std::string& pending);

// True when the peer of socket fd has closed or reset its side (poll: RDHUP/HUP/ERR); false for
// fd < 0 or an open connection, pipelined bytes included.
bool peer_has_closed(int fd);

}  // namespace ct::server
