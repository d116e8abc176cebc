// RedisClient: pipelined hiredis exchanges with a small per-node connection pool, Redis Cluster
// slot routing and MOVED/ASK handling; LocalRedisServer, a throwaway redis-server child.
#include "store/redis_client.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "store/record_format.h"

namespace ct::store {
namespace {

uint16_t crc16_xmodem(const uint8_t* p, size_t n) {
  uint16_t crc = 0;
  for (size_t i = 0; i < n; ++i) {
    crc ^= (uint16_t)p[i] << 8;
    for (int k = 0; k < 8; ++k) crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : crc << 1;
  }
  return crc;
}

// Blocks SIGPIPE in this thread for the scope; a SIGPIPE raised meanwhile is consumed.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        sigtimedwait(&pipe_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

timeval to_timeval(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }

bool split_addr(const std::string& addr, std::string* host, int* port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return false;
  *host = addr.substr(0, colon);
  try {
    *port = std::stoi(addr.substr(colon + 1));
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

bool is_error_with(const redisReply* r, std::string_view prefix) {
  return r && r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).starts_with(prefix);
}

}  // namespace

int redis_key_slot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return crc16_xmodem(reinterpret_cast<const uint8_t*>(key.data()), key.size()) % 16384;
}

void RedisClient::ReplyFree::operator()(redisReply* r) const { freeReplyObject(r); }

RedisClient::RedisClient(RedisClientOptions opt)
    : opt_(std::move(opt)), default_addr_(fmt::format("{}:{}", opt_.host, opt_.port)) {}

RedisClient::~RedisClient() {
  for (auto& [addr, node] : nodes_)
    for (redisContext* c : node.idle) redisFree(c);
}

std::string RedisClient::addr_for_slot(int slot) {
  std::lock_guard lock(conn_mu_);
  auto it = slot_owner_.find(slot);
  return it == slot_owner_.end() ? default_addr_ : it->second;
}

redisContext* RedisClient::acquire(const std::string& addr, bool* reused) {
  *reused = false;
  {
    std::lock_guard lock(conn_mu_);
    Node& node = nodes_[addr];
    if (std::chrono::steady_clock::now() < node.down_until) return nullptr;
    if (!node.idle.empty()) {
      redisContext* c = node.idle.back();
      node.idle.pop_back();
      *reused = true;
      return c;
    }
  }
  std::string host;
  int port = 0;
  if (!split_addr(addr, &host, &port)) {
    mark_down(addr, "cannot parse the address");
    return nullptr;
  }
  if (host.empty()) host = opt_.host;  // a cluster node that does not know its own address
  redisContext* c =
      redisConnectWithTimeout(host.c_str(), port, to_timeval(opt_.connect_timeout_ms));
  if (!c || c->err) {
    mark_down(addr, fmt::format("connect: {}", c ? c->errstr : "out of memory"));
    if (c) redisFree(c);
    return nullptr;
  }
  redisSetTimeout(c, to_timeval(opt_.command_timeout_ms));
  return c;
}

void RedisClient::release(const std::string& addr, redisContext* c) {
  std::lock_guard lock(conn_mu_);
  nodes_[addr].idle.push_back(c);
}

void RedisClient::mark_down(const std::string& addr, const std::string& why) {
  ++failures_;
  std::vector<redisContext*> stale;
  {
    std::lock_guard lock(conn_mu_);
    Node& node = nodes_[addr];
    node.down_until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(opt_.retry_after_ms);
    stale.swap(node.idle);
  }
  for (redisContext* c : stale) redisFree(c);
  store_log_limited(fmt::format("{} node {}", opt_.name, addr),
                    fmt::format("{}: redis node {}: {}; treating as a miss for {} ms", opt_.name,
                                addr, why, opt_.retry_after_ms));
}

std::optional<std::vector<RedisClient::Reply>> RedisClient::exchange(
    int slot, const std::vector<Command>& cmds) {
  std::string addr = addr_for_slot(slot);
  bool asking = false;
  bool stale_retried = false;
  for (int attempt = 0; attempt <= opt_.max_redirects; ++attempt) {
    bool reused = false;
    redisContext* c = acquire(addr, &reused);
    if (!c) return std::nullopt;
    std::vector<Reply> replies;
    bool io_ok = true;
    {
      SigpipeBlock no_sigpipe;
      // After ASK: ASKING before every command, except that a transaction needs one ASKING
      // before MULTI (the flag then lasts until EXEC; an ASKING inside MULTI would be queued).
      const bool transaction = !cmds.empty() && !cmds[0].empty() && cmds[0][0] == "MULTI";
      std::vector<bool> is_asking_reply;
      std::vector<const char*> argv;
      std::vector<size_t> argl;
      for (size_t i = 0; i < cmds.size(); ++i) {
        if (asking && (!transaction || i == 0)) {
          redisAppendCommand(c, "ASKING");
          is_asking_reply.push_back(true);
        }
        argv.clear();
        argl.clear();
        for (std::string_view a : cmds[i]) {
          argv.push_back(a.data());
          argl.push_back(a.size());
        }
        redisAppendCommandArgv(c, (int)argv.size(), argv.data(), argl.data());
        is_asking_reply.push_back(false);
      }
      for (size_t i = 0; i < is_asking_reply.size() && io_ok; ++i) {
        void* r = nullptr;
        if (redisGetReply(c, &r) != REDIS_OK) {
          io_ok = false;
        } else if (!is_asking_reply[i]) {
          replies.emplace_back(static_cast<redisReply*>(r));
        } else {
          freeReplyObject(r);
        }
      }
    }
    if (!io_ok) {
      const std::string why = c->errstr[0] ? c->errstr : "I/O error";
      // A pooled connection the server closed while it sat idle (the server was restarted
      // between two requests) fails at once with EOF, a reset or a broken pipe, never with a
      // timeout: retry once on a fresh connection before calling the node down. Every exchange
      // is idempotent (SETs of one version's content, GETs, DELs, the drop script).
      const bool closed = c->err == REDIS_ERR_EOF ||
                          (c->err == REDIS_ERR_IO &&
                           (why == std::strerror(ECONNRESET) || why == std::strerror(EPIPE)));
      redisFree(c);
      if (reused && closed && !stale_retried) {
        stale_retried = true;
        std::vector<redisContext*> stale;
        {
          std::lock_guard lock(conn_mu_);
          stale.swap(nodes_[addr].idle);  // opened before the same restart
        }
        for (redisContext* s : stale) redisFree(s);
        --attempt;  // not a redirection
        continue;
      }
      mark_down(addr, why);
      return std::nullopt;
    }
    release(addr, c);
    // A redirection may sit in any reply of the pipeline (inside MULTI: a queued command's).
    const redisReply* redirect = nullptr;
    for (const Reply& r : replies) {
      if (is_error_with(r.get(), "MOVED ") || is_error_with(r.get(), "ASK ")) {
        redirect = r.get();
        break;
      }
    }
    if (!redirect) return replies;
    // "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>"
    const std::string text(redirect->str, redirect->len);
    const size_t sp1 = text.find(' '), sp2 = text.find(' ', sp1 + 1);
    if (sp2 == std::string::npos) break;
    const std::string target = text.substr(sp2 + 1);
    ++redirects_;
    if (text.starts_with("MOVED ")) {
      std::lock_guard lock(conn_mu_);
      slot_owner_[slot] = target;
      asking = false;
    } else {
      asking = true;
    }
    addr = target;
  }
  ++failures_;
  store_log(fmt::format("{}: slot {}: no answer after {} redirections", opt_.name, slot,
                        opt_.max_redirects));
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// redis_ping and LocalRedisServer

int pick_free_port(int lo, int hi) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    CT_THROW_IF_NOT(fd >= 0, "cannot create a socket to find a free port");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    int port = 0;
    if (::bind(fd, (sockaddr*)&addr, sizeof(addr)) == 0 &&
        ::getsockname(fd, (sockaddr*)&addr, &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    ::close(fd);
    if (port >= lo && port <= hi) return port;
  }
  CT_THROW("found no free loopback port in [{}, {}] in 100 tries", lo, hi);
}

bool redis_ping(const std::string& host, int port, int timeout_ms) {
  redisContext* c = redisConnectWithTimeout(host.c_str(), port, to_timeval(timeout_ms));
  if (!c || c->err) {
    if (c) redisFree(c);
    return false;
  }
  auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
  const bool ok = r && r->type == REDIS_REPLY_STATUS && std::string(r->str, r->len) == "PONG";
  if (r) freeReplyObject(r);
  redisFree(c);
  return ok;
}

std::unique_ptr<LocalRedisServer> LocalRedisServer::start(const std::string& work_dir,
                                                          std::string* why, const Options& opt) {
  auto r = std::unique_ptr<LocalRedisServer>(new LocalRedisServer());
  r->port_ = opt.port > 0 ? opt.port : pick_free_port();
  const std::string log = work_dir + "/redis.log";
  std::vector<std::string> args{"redis-server", "--port", std::to_string(r->port_), "--bind",
                                "127.0.0.1",    "--save", "",  "--appendonly",  "no",
                                "--dir",        work_dir};
  if (opt.log_file) {
    args.push_back("--logfile");
    args.push_back(log);
  }
  args.insert(args.end(), opt.extra_args.begin(), opt.extra_args.end());
  // argv is built before fork: the child of a multi-threaded process may only make
  // async-signal-safe calls (no allocation) before exec.
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  r->pid_ = ::fork();
  if (r->pid_ == 0) {
    const int devnull = ::open("/dev/null", O_RDWR);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    ::execvp("redis-server", argv.data());
    ::_exit(127);
  }
  if (r->pid_ < 0) {
    r->pid_ = -1;
    *why = "fork failed";
    return nullptr;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (redis_ping("127.0.0.1", r->port_)) return r;
    int status = 0;
    if (::waitpid(r->pid_, &status, WNOHANG) == r->pid_) {
      r->pid_ = -1;
      *why = WIFEXITED(status) && WEXITSTATUS(status) == 127
                 ? "redis-server is not on PATH (install the redis-server package)"
                 : "redis-server exited at start" + (opt.log_file ? " (see " + log + ")" : "");
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  *why = "redis-server did not answer PING within 10 s";
  return nullptr;  // the destructor kills it
}

LocalRedisServer::~LocalRedisServer() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGCONT);
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
}

}  // namespace ct::store
