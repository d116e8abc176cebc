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

namespace ct::server {
namespace {

using Clock = std::chrono::steady_clock;

thread_local int t_current_socket = -1;

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

void ip_and_port(const sockaddr_storage& a, std::string& ip, int& port) {
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

int to_ms(time_t sec, time_t usec) { return (int)std::min<int64_t>(sec * 1000 + usec / 1000, 1 << 30); }

// One connection's byte stream. Reads go through a buffer that lives as long as the connection
// (httplib reads request lines one byte at a time); each read waits at most the read timeout and
// never past the current request's deadline.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, int read_timeout_ms, int write_timeout_ms)
      : fd_(fd), read_timeout_ms_(read_timeout_ms), write_timeout_ms_(write_timeout_ms) {}

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
    sockaddr_storage a{};
    socklen_t l = sizeof(a);
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &l) != 0) a.ss_family = AF_UNSPEC;
    ip_and_port(a, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t l = sizeof(a);
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &l) != 0) a.ss_family = AF_UNSPEC;
    ip_and_port(a, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  // Waits for input up to the read timeout or the deadline, whichever is first; past the
  // deadline the request has taken too long (timed_out()).
  bool wait_readable() const {
    int wait_ms = read_timeout_ms_;
    if (deadline_ != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now());
      if (left.count() <= 0) {
        timed_out_ = true;
        return false;
      }
      wait_ms = (int)std::min<int64_t>(wait_ms, left.count());
    }
    if (poll_one(fd_, POLLIN, wait_ms) > 0) return true;
    if (deadline_ != Clock::time_point::max() && Clock::now() >= deadline_) timed_out_ = true;
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
  Clock::time_point deadline_ = Clock::time_point::max();
  mutable bool timed_out_ = false;
  char buf_[4096];
  size_t pos_ = 0, len_ = 0;
};

}  // namespace

int HttpServer::current_socket() { return t_current_socket; }

// Serves requests on one connection until the client closes it, the keep-alive count or idle
// time runs out, a request fails or times out, or the server stops; then shuts it down and closes
// it. Only this function closes `sock`, after the last handler using it has returned.
bool HttpServer::process_and_close_socket(socket_t sock) {
  ConnectionStream strm(sock, to_ms(read_timeout_sec_, read_timeout_usec_),
                        to_ms(write_timeout_sec_, write_timeout_usec_));
  const int idle_ms = to_ms(keep_alive_timeout_sec_, 0);
  bool ret = false;
  for (size_t left = keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
    // Wait for the next request in short slices, so that stop() is seen within 100 ms.
    bool readable = strm.has_buffered();
    for (const auto idle_end = Clock::now() + std::chrono::milliseconds(idle_ms);
         !readable && svr_sock_ != INVALID_SOCKET && Clock::now() < idle_end;) {
      const int r = poll_one(sock, POLLIN, 100);
      if (r < 0) break;
      readable = r > 0;
    }
    if (!readable || svr_sock_ == INVALID_SOCKET) break;
    strm.start_request(request_timeout_s_ > 0
                           ? Clock::now() + std::chrono::milliseconds(
                                                (int64_t)std::llround(request_timeout_s_ * 1000))
                           : Clock::time_point::max());
    bool connection_closed = false;
    t_current_socket = sock;
    ret = process_request(strm, left == 1, connection_closed, nullptr);
    t_current_socket = -1;
    if (strm.timed_out()) {  // httplib may have answered 400; the connection ends either way
      timed_out_.fetch_add(1);
      break;
    }
    if (!ret || connection_closed) break;
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace ct::server
