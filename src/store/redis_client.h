// The Redis client the Redis tier talks through (hiredis): a small per-node connection pool,
// Redis Cluster slot routing (MOVED remembered per slot, ASK retried after ASKING, one ASKING
// before MULTI for a transaction), node down-marking with a retry delay, and the one retry of a
// pooled connection the server closed while idle (a restart between requests). It knows nothing
// of chunk records; the tier (redis_tier.h) builds the commands and reads the replies.
// hiredis writes with write(2), which raises SIGPIPE on a closed socket; every exchange blocks
// SIGPIPE in the calling thread and consumes any it raised, so the process disposition is kept.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

struct redisContext;
struct redisReply;

namespace ct::store {

struct RedisClientOptions {
  std::string name = "redis";  // for log lines
  std::string host = "127.0.0.1";
  int port = 6379;
  int connect_timeout_ms = 200;
  int command_timeout_ms = 1000;
  int retry_after_ms = 1000;  // a node that failed is not contacted again for this long
  int max_redirects = 5;
};

// Redis Cluster key slot: CRC16 (XMODEM) of the key's hash tag (or the whole key) mod 16384.
int redis_key_slot(std::string_view key);

class RedisClient {
 public:
  struct ReplyFree {
    void operator()(redisReply* r) const;
  };
  using Reply = std::unique_ptr<redisReply, ReplyFree>;
  using Command = std::vector<std::string_view>;

  explicit RedisClient(RedisClientOptions opt);  // connects lazily; never fails
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Sends cmds as one pipeline to the node serving `slot`, following redirections; nullopt after
  // logging when the node is down, unreachable or too slow. Thread-safe.
  std::optional<std::vector<Reply>> exchange(int slot, const std::vector<Command>& cmds);

  const std::string& address() const { return default_addr_; }  // "host:port" first contacted
  uint64_t redirects_followed() const { return redirects_.load(); }
  uint64_t failed_exchanges() const { return failures_.load(); }
  // Counts a failure the caller found in a reply (e.g. an EXEC that did not run).
  void count_failure() { ++failures_; }

 private:
  struct Node {
    std::vector<redisContext*> idle;
    std::chrono::steady_clock::time_point down_until{};
  };
  // A pooled connection (*reused true) or a new one; null while the node is marked down.
  redisContext* acquire(const std::string& addr, bool* reused);
  void release(const std::string& addr, redisContext* c);
  void mark_down(const std::string& addr, const std::string& why);
  std::string addr_for_slot(int slot);

  RedisClientOptions opt_;
  std::string default_addr_;
  std::mutex conn_mu_;  // connections and slot map
  std::map<std::string, Node> nodes_;
  std::map<int, std::string> slot_owner_;  // learnt from MOVED
  std::atomic<uint64_t> redirects_{0};
  std::atomic<uint64_t> failures_{0};
};

// True when a server at host:port answers PING with PONG within timeout_ms.
bool redis_ping(const std::string& host, int port, int timeout_ms = 200);

// A loopback TCP port in [lo, hi] that was free a moment ago (bind port 0, read it, close; up to
// 100 tries for one in range). Throws ct::Error when none is found.
int pick_free_port(int lo = 1024, int hi = 65535);

// A throwaway redis-server child (no persistence) on a loopback port, killed on destruction:
// what `cachetune bench-tiers` measures against when no --redis server is given, and what the
// tests start (tests/support wraps it with restart, pause and raw commands).
class LocalRedisServer {
 public:
  struct Options {
    int port = 0;                         // 0: a free port
    std::vector<std::string> extra_args;  // appended to the command line (e.g. cluster mode)
    bool log_file = false;                // log to WORK_DIR/redis.log instead of nowhere
  };
  // `redis-server --port P --bind 127.0.0.1 --save '' --appendonly no --dir WORK_DIR ...`,
  // waiting until it answers PING (10 s at most). Null when redis-server cannot be started;
  // *why says what went wrong.
  static std::unique_ptr<LocalRedisServer> start(const std::string& work_dir, std::string* why,
                                                 const Options& opt);
  static std::unique_ptr<LocalRedisServer> start(const std::string& work_dir, std::string* why) {
    return start(work_dir, why, Options{});
  }
  ~LocalRedisServer();  // SIGCONT (in case it was stopped), SIGKILL, reap
  LocalRedisServer(const LocalRedisServer&) = delete;
  LocalRedisServer& operator=(const LocalRedisServer&) = delete;
  int port() const { return port_; }
  pid_t pid() const { return pid_; }

 private:
  LocalRedisServer() = default;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace ct::store
