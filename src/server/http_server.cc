#include "server/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <string>

#include "server/task_queue.h"

namespace ct::server {
namespace {

using Clock = std::chrono::steady_clock;

thread_local int t_current_socket = -1;
thread_local bool t_close_after = false;

// The longest stop() may go unseen by a waiting worker.
constexpr int kStopCheckMs = 100;

// poll() on one descriptor for `events`, retried on EINTR; > 0 ready, 0 timed out, < 0 error.
int poll_one(int fd, short events, int timeout_ms, short* revents = nullptr) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (revents) *revents = p.revents;
    return r;
  }
}

// The address of socket fd's one end, as `name` (getpeername or getsockname) gives it.
void ip_and_port(int fd, int (*name)(int, sockaddr*, socklen_t*), std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t l = sizeof(a);
  if (name(fd, reinterpret_cast<sockaddr*>(&a), &l) != 0) a.ss_family = AF_UNSPEC;
  char buf[INET6_ADDRSTRLEN] = {0};
  port = -1;
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    ::inet_ntop(AF_INET, &v4.sin_addr, buf, sizeof(buf));
    port = ntohs(v4.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    ::inet_ntop(AF_INET6, &v6.sin6_addr, buf, sizeof(buf));
    port = ntohs(v6.sin6_port);
  }
  ip = buf;
}

int to_ms(time_t sec, time_t usec) {
  return (int)std::min<int64_t>(sec * 1000 + usec / 1000, 1 << 30);
}

// One connection's byte stream. Reads go through a buffer that lives as long as the connection
// (httplib reads request lines one byte at a time); each read waits at most the read timeout and
// never past the current request's deadline.
class ConnectionStream final : public httplib::Stream {
 public:
  // listening: the server's listening socket, INVALID_SOCKET once stop() has closed it.
  ConnectionStream(int fd, int read_timeout_ms, int write_timeout_ms,
                   const std::atomic<socket_t>& listening)
      : fd_(fd),
        read_timeout_ms_(read_timeout_ms),
        write_timeout_ms_(write_timeout_ms),
        listening_(listening) {}

  // The next request must have arrived by `deadline` (Clock::time_point::max(): no bound).
  void start_request(Clock::time_point deadline) {
    deadline_ = deadline;
    timed_out_ = false;
  }
  bool timed_out() const { return timed_out_; }
  bool has_buffered() const { return pos_ < len_; }

  bool is_readable() const override { return has_buffered() || wait_readable(); }

  bool is_writable() const override {
    short rev = 0;
    if (poll_one(fd_, POLLOUT, write_timeout_ms_, &rev) <= 0 || (rev & (POLLERR | POLLHUP)))
      return false;
    // Alive unless the peer has closed: pending input (pipelined bytes) counts as alive.
    if (poll_one(fd_, POLLIN, 0, &rev) <= 0) return true;
    char b;
    return ::recv(fd_, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (size == 0) return 0;
    if (!has_buffered()) {
      if (!wait_readable()) return -1;
      if (size >= sizeof(buf_)) return recv_some(ptr, size);
      const ssize_t n = recv_some(buf_, sizeof(buf_));
      if (n <= 0) return n;
      pos_ = 0;
      len_ = (size_t)n;
    }
    const size_t n = std::min(size, len_ - pos_);
    std::copy(buf_ + pos_, buf_ + pos_ + n, ptr);
    pos_ += n;
    return (ssize_t)n;
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    for (;;) {
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip_and_port(fd_, ::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip_and_port(fd_, ::getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  // Waits for input up to the read timeout or the deadline, whichever is first, in slices so
  // that stop() is seen; past the deadline the request has taken too long (timed_out()).
  // Input already there is taken even at the deadline.
  bool wait_readable() const {
    if (poll_one(fd_, POLLIN, 0) > 0) return true;
    const auto end =
        std::min(deadline_, Clock::now() + std::chrono::milliseconds(read_timeout_ms_));
    for (;;) {
      if (listening_ == INVALID_SOCKET) return false;  // the server is stopping
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(end - Clock::now()).count();
      if (left <= 0) break;
      const int r = poll_one(fd_, POLLIN, (int)std::min<int64_t>(left, kStopCheckMs));
      if (r > 0) return true;
      if (r < 0) return false;
    }
    if (Clock::now() >= deadline_) timed_out_ = true;
    return false;
  }
  ssize_t recv_some(char* p, size_t n) {
    for (;;) {
      const ssize_t r = ::recv(fd_, p, n, 0);
      if (r < 0 && errno == EINTR) continue;
      return r;
    }
  }

  const int fd_;
  const int read_timeout_ms_, write_timeout_ms_;
  const std::atomic<socket_t>& listening_;
  Clock::time_point deadline_ = Clock::time_point::max();
  mutable bool timed_out_ = false;
  char buf_[4096];
  size_t pos_ = 0, len_ = 0;
};

}  // namespace

int HttpServer::current_socket() { return t_current_socket; }

void HttpServer::close_after_response() { t_close_after = true; }

void HttpServer::set_request_timeout(double seconds) {
  // Past a day it is no bound (and the deadline arithmetic stays in range); at least 1 ms.
  request_timeout_ms_ =
      seconds > 0 && seconds <= 86400 ? std::max<int64_t>(1, std::llround(seconds * 1000)) : 0;
}

// Serves requests on one connection until the client closes it, the keep-alive count or idle
// time runs out, a request fails or times out, or the server stops; then shuts it down and closes
// it. Only this function closes `sock`, after the last handler using it has returned.
bool HttpServer::process_and_close_socket(socket_t sock) {
  // Closes the connection however this ends (a handler's exception included), after the last
  // handler using it has returned.
  struct Owner {
    int fd;
    bool drain = false;  // unread request bytes may be waiting
    ~Owner() {
      t_current_socket = -1;
      if (drain) {
        // Closing a socket with unread input makes Linux send a reset, which can destroy the
        // response before the client reads it: end our side, then read (a bounded amount,
        // briefly) what the client is still sending.
        ::shutdown(fd, SHUT_WR);
        char buf[4096];
        size_t got = 0;
        const auto end = Clock::now() + std::chrono::milliseconds(200);
        while (got < (256u << 10) && Clock::now() < end && poll_one(fd, POLLIN, 50) > 0) {
          const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
          if (n <= 0) break;
          got += (size_t)n;
        }
      }
      ::shutdown(fd, SHUT_RDWR);
      ::close(fd);
    }
  } owner{sock};
  ConnectionStream strm(sock, to_ms(read_timeout_sec_, read_timeout_usec_),
                        to_ms(write_timeout_sec_, write_timeout_usec_), svr_sock_);
  // A connection on the overflow worker is answered 503 at once (server.cc): one request, and
  // a short deadline, so that a slow client there cannot hold up the other refusals.
  const bool overflow = BoundedTaskQueue::in_overflow();
  const int64_t timeout_ms =
      overflow ? std::min<int64_t>(request_timeout_ms_ > 0 ? request_timeout_ms_ : 2000, 2000)
               : request_timeout_ms_;
  const int idle_ms = std::max(10, to_ms(keep_alive_timeout_sec_, 0));
  bool ret = false;
  for (size_t left = overflow ? 1 : keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET;
       --left) {
    // Wait for the next request in short slices, so that stop() is seen.
    bool readable = strm.has_buffered();
    for (const auto idle_end = Clock::now() + std::chrono::milliseconds(idle_ms);
         !readable && svr_sock_ != INVALID_SOCKET && Clock::now() < idle_end;) {
      const int r = poll_one(sock, POLLIN, kStopCheckMs);
      if (r < 0) break;
      readable = r > 0;
    }
    if (!readable || svr_sock_ == INVALID_SOCKET) break;
    strm.start_request(timeout_ms > 0 ? Clock::now() + std::chrono::milliseconds(timeout_ms)
                                      : Clock::time_point::max());
    bool connection_closed = false;
    t_current_socket = sock;
    t_close_after = false;
    ret = process_request(strm, left == 1, connection_closed, nullptr);
    t_current_socket = -1;
    if (strm.timed_out()) {  // httplib may have answered 400; the connection ends either way
      timed_out_.fetch_add(1);
      break;
    }
    // A response sent before its request's body was read leaves that body on the connection,
    // where it would be parsed as the next request: such a response ends the connection.
    if (t_close_after) owner.drain = true;
    if (!ret || connection_closed || t_close_after) break;
  }
  return ret;
}

}  // namespace ct::server
