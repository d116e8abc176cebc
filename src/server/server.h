// `cachetune serve`: an OpenAI-compatible HTTP server over one Engine (docs/SERVER.md).
// Routes: GET /health, GET /v1/models, POST /v1/chat/completions (optionally streamed as
// server-sent events; chunk-aware via "chunks" and "cachetune"), POST /v1/chunks (encode
// documents into the cache ahead of use). Connections are served by a thread pool; requests that
// use the engine run one at a time (the engine and its cache pool are single-threaded).
#pragma once

#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/api.h"

namespace ct::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                   // 0: any free port (see Server::port)
  size_t max_body_bytes = 8u << 20;  // larger bodies get 413
  ApiLimits limits;
  std::string model_id = "cachetune";  // reported by /v1/models and in every response
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

}  // namespace ct::server
