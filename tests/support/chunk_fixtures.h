// Test support for the store: random ChunkKV records, bit-exact record comparison, row slices,
// a self-deleting temporary directory, and a throwaway redis-server child process on a free
// loopback port.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "store/chunk.h"
#include "store/redis_client.h"

namespace ct::test {

// A record of the given shape: K/V drawn from N(0, 1) and packed to dtype, tokens random,
// order a random permutation, scores random with one NaN (so bit-exact storage is exercised).
// The same arguments always give the same bytes.
ChunkKV make_random_chunk(const std::string& id, int n_tok, int n_layer, int kv_dim, KvDtype dtype,
                          uint64_t seed);

// Bit-exact equality of every meta field, array and K/V byte; the failure names the first
// difference.
::testing::AssertionResult chunks_equal(const ChunkKV& a, const ChunkKV& b);

// Bytes of rows [row_begin, row_end) of layer `layer`'s K (v_block false) or V block.
std::vector<uint8_t> block_rows(const ChunkKV& kv, int layer, bool v_block, int row_begin,
                                int row_end);

// mkdtemp under $TMPDIR (or /tmp); removed recursively on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// `name` inside a directory of this test process's own (a TempDir made on first use and removed
// at exit), so that test processes ctest runs at the same time never share a file.
std::string temp_path(const std::string& name);

// A loopback TCP port that was free a moment ago; lo/hi bound the accepted range (a cluster
// node's bus port must also be a valid port). The product's (store/redis_client.h).
using store::pick_free_port;

// redis-server as a child process (store::LocalRedisServer, the product's launcher) in its own
// working directory, logging to redis.log there, with what fault-injection tests need on top:
// restart on the same port, SIGSTOP/SIGCONT, raw commands.
class RedisServer {
 public:
  // False when redis-server is not on PATH (tests GTEST_SKIP then).
  static bool available();

  RedisServer() = default;
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts on a fresh free port (up to three tries); false (with *err) when it does not answer
  // PING within 10 s.
  bool start(const std::vector<std::string>& extra_args = {}, std::string* err = nullptr);
  // Starts again on the port of the previous start (after stop(): a server restarted with an
  // empty data set, as a crashed redis-server without persistence comes back); false (with
  // *err) when it does not answer within 10 s, e.g. because another process took the port.
  bool restart(std::string* err = nullptr);
  void stop();    // SIGKILL and reap; no-op when not running
  void pause();   // SIGSTOP: the server accepts connections but never answers
  void resume();  // SIGCONT
  bool ping() const;
  // Runs one command (arguments as given) and returns the reply as text ("" for nil, integers in
  // decimal, errors prefixed "ERR:", arrays joined by '\n').
  std::string command(const std::vector<std::string>& args) const;

  int port() const { return port_; }
  pid_t pid() const { return srv_ ? srv_->pid() : -1; }
  const std::string& dir() const { return dir_.path(); }

 private:
  bool start_once(int port, const std::vector<std::string>& extra_args, std::string* err);

  TempDir dir_;
  int port_ = 0;
  std::unique_ptr<store::LocalRedisServer> srv_;
  std::vector<std::string> extra_args_;
};

// A small tmpfs mounted over a directory, for tests of a full or read-only filesystem (the
// tests run as root in CI, where chmod does not stop writes). mount() fails (with *err naming
// the errno) where mounting is not permitted; tests skip then. Unmounted on destruction.
class TmpfsMount {
 public:
  TmpfsMount() = default;
  ~TmpfsMount();
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;

  // Creates `dir` when missing and mounts a tmpfs of `bytes` there.
  bool mount(const std::string& dir, size_t bytes, std::string* err);
  // Remounts it read-only (EROFS for every write from then on).
  bool remount_read_only(std::string* err);
  // Writes a file of zeros into the mount until the filesystem is full; returns its size.
  size_t fill(const std::string& name);

 private:
  std::string dir_;
  size_t bytes_ = 0;
};

}  // namespace ct::test
