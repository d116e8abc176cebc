// The HTTP layer's connection loop, owned by cachetune. cpp-httplib 0.11 serves each accepted
// connection in Server::process_and_close_socket, which exposes neither the socket to the handlers
// nor a bound on the time a whole request may take to arrive (only each read is bounded). Both
// were worked around by scanning /proc/self/fd for the connection's number, which raced with the
// worker closing it (a number reused by a new connection could be shut down; TSan reported it).
//
// HttpServer overrides that one virtual function with its own keep-alive loop over its own Stream,
// and calls httplib's request processing (routing, handlers, responses) unchanged. So:
//  - each request must arrive completely within request_timeout (every read is bounded by the
//    deadline as well as by the read timeout); a connection that misses it is closed and counted;
//  - a handler learns its connection's descriptor from current_socket(), valid while the handler
//    (or its streaming provider) runs on this worker thread, and only the worker closes it;
//  - bytes a client pipelines after a request stay buffered for the next one on the connection;
//  - a worker waiting on a client sees stop() within 100 ms;
//  - a connection on the overflow worker (task_queue.h) gets one request and a 2 s deadline.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>

namespace ct::server {

class HttpServer final : public httplib::Server {
 public:
  // Longest a request (request line, headers, body) may take to arrive, from its first byte;
  // <= 0 or over a day: no bound beyond the per-read timeout.
  void set_request_timeout(double seconds);
  // Connections closed because a request took longer than the request timeout to arrive.
  uint64_t timed_out_connections() const { return timed_out_.load(); }
  // The listening socket (after bind), or -1.
  int listen_socket() const { return svr_sock_.load(); }
  // The connection the calling worker thread is serving a request on, or -1 on other threads.
  static int current_socket();
  // Called from a handler: the connection ends after this response. For responses sent before
  // the request's body was read (the unread body would be parsed as the next request); the
  // handler also sets `Connection: close` so that the client knows.
  static void close_after_response();

 private:
  bool process_and_close_socket(socket_t sock) override;

  int64_t request_timeout_ms_ = 0;
  std::atomic<uint64_t> timed_out_{0};
};

}  // namespace ct::server
