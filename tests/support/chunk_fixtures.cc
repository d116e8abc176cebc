// Implementation of the store test fixtures (random records, temp dirs, redis-server child).
#include "support/chunk_fixtures.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <thread>

namespace ct::test {

ChunkKV make_random_chunk(const std::string& id, int n_tok, int n_layer, int kv_dim, KvDtype dtype,
                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  ChunkKV kv;
  ChunkMeta& m = kv.meta;
  m.id = id;
  m.model_fingerprint = "fp-" + std::to_string(seed);
  m.n_tok = n_tok;
  m.n_layer = n_layer;
  m.kv_dim = kv_dim;
  m.dtype = dtype;
  m.sink = seed % 2 == 1;
  m.rank_mode = "lowfreq";
  m.alpha = 0.25 + (double)(seed % 7) / 8;
  m.rank_ms = 1.5 * (double)(seed % 11);
  m.tokens.resize(n_tok);
  for (int32_t& t : m.tokens) t = (int32_t)(rng() % 49152);
  m.order.resize(n_tok);
  std::iota(m.order.begin(), m.order.end(), 0);
  std::shuffle(m.order.begin(), m.order.end(), rng);
  m.scores.resize(n_tok);
  for (float& s : m.scores) s = normal(rng);
  m.scores[0] = std::nanf("");
  std::vector<float> values((size_t)n_tok * kv_dim);
  for (int l = 0; l < n_layer; ++l) {
    for (auto* blocks : {&kv.k, &kv.v}) {
      for (float& x : values) x = normal(rng);
      blocks->emplace_back(m.layer_bytes());
      kv_pack(dtype, values.data(), blocks->back().data(), values.size());
    }
  }
  return kv;
}

::testing::AssertionResult chunks_equal(const ChunkKV& a, const ChunkKV& b) {
  const ChunkMeta &x = a.meta, &y = b.meta;
#define CT_FIELD_EQ(f) \
  if (!(x.f == y.f)) return ::testing::AssertionFailure() << "meta." #f " differs"
  CT_FIELD_EQ(id);
  CT_FIELD_EQ(model_fingerprint);
  CT_FIELD_EQ(n_tok);
  CT_FIELD_EQ(n_layer);
  CT_FIELD_EQ(kv_dim);
  CT_FIELD_EQ(dtype);
  CT_FIELD_EQ(sink);
  CT_FIELD_EQ(rank_mode);
  CT_FIELD_EQ(alpha);
  CT_FIELD_EQ(rank_ms);
  CT_FIELD_EQ(tokens);
  CT_FIELD_EQ(order);
#undef CT_FIELD_EQ
  if (x.scores.size() != y.scores.size() ||
      (!x.scores.empty() &&
       std::memcmp(x.scores.data(), y.scores.data(), 4 * x.scores.size()) != 0))
    return ::testing::AssertionFailure() << "meta.scores differ bitwise";
  if (a.k.size() != b.k.size() || a.v.size() != b.v.size())
    return ::testing::AssertionFailure() << "layer counts differ";
  for (size_t l = 0; l < a.k.size(); ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<uint8_t>& p = kv ? a.v[l] : a.k[l];
      const std::vector<uint8_t>& q = kv ? b.v[l] : b.k[l];
      if (p.size() != q.size())
        return ::testing::AssertionFailure()
               << "layer " << l << (kv ? " V" : " K") << " size " << p.size() << " vs " << q.size();
      for (size_t i = 0; i < p.size(); ++i)
        if (p[i] != q[i])
          return ::testing::AssertionFailure() << "layer " << l << (kv ? " V" : " K") << " byte "
                                               << i << ": " << (int)p[i] << " vs " << (int)q[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<uint8_t> block_rows(const ChunkKV& kv, int layer, bool v_block, int row_begin,
                                int row_end) {
  const size_t row = kv_bytes(kv.meta.dtype, kv.meta.kv_dim);
  const std::vector<uint8_t>& b = v_block ? kv.v.at(layer) : kv.k.at(layer);
  return std::vector<uint8_t>(b.begin() + row_begin * row, b.begin() + row_end * row);
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ct_store_test.XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string temp_path(const std::string& name) {
  static const TempDir dir;
  return dir.path() + "/" + name;
}

namespace {

std::string find_on_path(const std::string& exe) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = dirs.substr(start, end - start) + "/" + exe;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

std::string reply_text(const redisReply* r) {
  if (!r) return "ERR:no reply";
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
      return std::string(r->str, r->len);
    case REDIS_REPLY_ERROR: {
      std::string e = "ERR:";
      e.append(r->str, r->len);
      return e;
    }
    case REDIS_REPLY_INTEGER:
      return std::to_string(r->integer);
    case REDIS_REPLY_ARRAY: {
      std::string s;
      for (size_t i = 0; i < r->elements; ++i) {
        if (i) s.push_back('\n');
        s.append(reply_text(r->element[i]));
      }
      return s;
    }
    default:
      return "";
  }
}

}  // namespace

bool RedisServer::available() { return !find_on_path("redis-server").empty(); }

bool RedisServer::start(const std::vector<std::string>& extra_args, std::string* err) {
  // The port was free when picked but another process may take it before redis-server binds
  // it; a few attempts on fresh ports make that race harmless.
  extra_args_ = extra_args;
  for (int attempt = 0; attempt < 3; ++attempt)
    if (start_once(pick_free_port(), extra_args, err)) return true;
  return false;
}

bool RedisServer::restart(std::string* err) {
  if (port_ <= 0) {
    if (err) *err = "restart before a first start";
    return false;
  }
  return start_once(port_, extra_args_, err);
}

bool RedisServer::start_once(int port, const std::vector<std::string>& extra_args,
                             std::string* err) {
  stop();
  port_ = port;
  std::string why;
  srv_ = store::LocalRedisServer::start(dir_.path(), &why, {port, extra_args, true});
  if (!srv_ && err) *err = why;
  return srv_ != nullptr;
}

void RedisServer::stop() { srv_.reset(); }

void RedisServer::pause() {
  if (srv_) ::kill(srv_->pid(), SIGSTOP);
}

void RedisServer::resume() {
  if (srv_) ::kill(srv_->pid(), SIGCONT);
}

bool RedisServer::ping() const { return command({"PING"}) == "PONG"; }

std::string RedisServer::command(const std::vector<std::string>& args) const {
  if (port_ <= 0) return "ERR:not started";
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, timeval{1, 0});
  if (!c || c->err) {
    if (c) redisFree(c);
    return "ERR:connect";
  }
  redisSetTimeout(c, timeval{2, 0});
  std::vector<const char*> argv;
  std::vector<size_t> argl;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    argl.push_back(a.size());
  }
  auto* r =
      static_cast<redisReply*>(redisCommandArgv(c, (int)argv.size(), argv.data(), argl.data()));
  std::string out = reply_text(r);
  if (r) freeReplyObject(r);
  redisFree(c);
  return out;
}

TmpfsMount::~TmpfsMount() {
  if (!dir_.empty()) ::umount2(dir_.c_str(), MNT_DETACH);
}

bool TmpfsMount::mount(const std::string& dir, size_t bytes, std::string* err) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string opts = "size=" + std::to_string(bytes) + ",mode=0755";
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
    if (err) *err = "mount -t tmpfs -o " + opts + " " + dir + ": " + std::strerror(errno);
    return false;
  }
  dir_ = dir;
  bytes_ = bytes;
  return true;
}

bool TmpfsMount::remount_read_only(std::string* err) {
  const std::string opts = "size=" + std::to_string(bytes_) + ",mode=0755";
  if (dir_.empty() ||
      ::mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, opts.c_str()) != 0) {
    if (err) *err = "remount read-only " + dir_ + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

size_t TmpfsMount::fill(const std::string& name) {
  const std::string path = dir_ + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return 0;
  std::vector<char> zeros(4096, 0);
  size_t total = 0;
  for (;;) {
    const ssize_t w = ::write(fd, zeros.data(), zeros.size());
    if (w <= 0) break;
    total += (size_t)w;
  }
  ::close(fd);
  return total;
}

}  // namespace ct::test
