// Redis tier against a real redis-server child process (skipped when redis-server is not on
// PATH): restart via SCAN, corruption and missing values, replacement by another writer, a server
// killed or stalled mid-test (reads miss, nothing crashes, the timeout is honoured), and a
// two-node Redis Cluster where the tier follows MOVED redirections.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "store/memory_tier.h"
#include "store/pool.h"
#include "store/record_format.h"
#include "store/redis_tier.h"
#include "support/chunk_fixtures.h"

namespace ct::store {
namespace {

ChunkKV chunk(const std::string& id, uint64_t seed) {
  return test::make_random_chunk(id, 150, 3, 32, KvDtype::BF16, seed);
}

bool read_rows_equal(Tier& t, const ChunkKV& kv, int layer, int a, int b) {
  std::vector<uint8_t> k((b - a) * kv_row_bytes(kv.meta)), v(k.size());
  if (!t.read_rows(kv.meta.id, layer, a, b, k.data(), v.data())) return false;
  EXPECT_EQ(k, test::block_rows(kv, layer, false, a, b));
  EXPECT_EQ(v, test::block_rows(kv, layer, true, a, b));
  return true;
}

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::RedisServer::available())
      GTEST_SKIP() << "redis-server is not on PATH; install the redis-server package to run "
                      "the Redis tier tests";
    std::string err;
    ASSERT_TRUE(server_.start({}, &err)) << err;
  }
  RedisTierOptions options() const {
    RedisTierOptions o;
    o.port = server_.port();
    o.connect_timeout_ms = 500;
    o.command_timeout_ms = 300;
    o.retry_after_ms = 200;
    return o;
  }
  test::RedisServer server_;
};

TEST_F(RedisTierTest, KeysOfAChunkShareOneSlot) {
  RedisTier tier(options());
  ASSERT_TRUE(tier.put(chunk("slot", 1)));
  const int slot = redis_key_slot(tier.meta_key("slot"));
  EXPECT_EQ(slot, redis_key_slot("slot"));
  for (int l = 0; l < 3; ++l) EXPECT_EQ(redis_key_slot(tier.layer_key("slot", l)), slot);
  EXPECT_EQ(redis_key_slot("123456789"), 0x31C3);  // CRC16/XMODEM check value (12739)
  EXPECT_EQ(server_.command({"EXISTS", tier.meta_key("slot")}), "1");
}

TEST_F(RedisTierTest, ANewTierRebuildsItsIndexFromTheServer) {
  const ChunkKV a = chunk("ra", 2), b = chunk("rb", 3);
  {
    RedisTier tier(options());
    ASSERT_TRUE(tier.put(a));
    ASSERT_TRUE(tier.put(b));
    RedisTierOptions other = options();
    other.key_prefix = "other:";
    RedisTier unrelated(other);
    ASSERT_TRUE(unrelated.put(chunk("rc", 4)));
  }
  RedisTier tier(options());
  std::vector<std::string> ids = tier.list();
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<std::string>{"ra", "rb"}));
  std::optional<ChunkKV> back = tier.get("rb");
  ASSERT_TRUE(back);
  EXPECT_TRUE(test::chunks_equal(*back, b));
  EXPECT_TRUE(read_rows_equal(tier, a, 1, 40, 150));
}

// Two pools (two servers) on one Redis, both built before anything is stored: a chunk the first
// stores is found by the second through discover(), read from Redis (bytes counted per tier)
// and never promoted out of it into the second pool's memory tier, so the first still has it.
TEST_F(RedisTierTest, PoolsSharingOneRedisSeeEachOthersChunks) {
  auto make_pool = [&] {
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(std::make_unique<MemoryTier>("host", 64u << 20));
    tiers.push_back(std::make_unique<RedisTier>(options()));
    return std::make_unique<CachePool>(std::move(tiers));
  };
  auto a = make_pool(), b = make_pool();
  const ChunkKV kv = chunk("shared", 7);
  ASSERT_TRUE(a->put(kv, 1));  // into a's Redis tier
  EXPECT_FALSE(b->contains("shared"));
  const std::optional<ChunkMeta> meta = b->lookup("shared");
  ASSERT_TRUE(meta);
  EXPECT_EQ(meta->n_tok, kv.meta.n_tok);
  EXPECT_EQ(b->tier_of("shared"), 1);  // still in Redis: a shared tier is not promoted from
  const size_t row = 2 * kv_bytes(kv.meta.dtype, kv.meta.kv_dim);
  std::vector<uint8_t> k(row / 2 * 50), v(row / 2 * 50);  // K and V halves of each row
  ASSERT_TRUE(b->read_rows("shared", 0, 100, 150, k.data(), v.data()));
  const std::vector<TierStat> st = b->tier_stats();
  EXPECT_EQ(st[1].bytes_read, 50 * row);
  EXPECT_EQ(st[1].discovered, 1u);
  EXPECT_EQ(st[0].bytes_read, 0u);
  EXPECT_EQ(st[1].io_errors, 0u);
  EXPECT_EQ(k, test::block_rows(kv, 0, false, 100, 150));
  EXPECT_TRUE(a->lookup("shared"));
  EXPECT_FALSE(b->lookup("absent"));  // asked of Redis, not there: a miss
  // A Redis that is gone counts errors; lookups of unknown ids are misses, not failures.
  server_.stop();
  EXPECT_FALSE(b->lookup("another"));
  EXPECT_GT(b->tier_stats()[1].io_errors, 0u);
}

TEST_F(RedisTierTest, CorruptMissingAndTruncatedValuesAreMissesAndDropped) {
  RedisTier tier(options());
  const ChunkKV c1 = chunk("x1", 5), c2 = chunk("x2", 6), c3 = chunk("x3", 7), c4 = chunk("x4", 8);
  for (const ChunkKV* kv : {&c1, &c2, &c3, &c4}) ASSERT_TRUE(tier.put(*kv));

  // A flipped byte in layer 2, row 70 (rows 64-79 with 16-row groups): reads of rows 0-63
  // still verify.
  const size_t off = 70 * slab_row_bytes(c1.meta) + 3;
  std::string key = tier.layer_key("x1", 2);
  std::string byte = server_.command({"GETRANGE", key, std::to_string(off), std::to_string(off)});
  byte[0] ^= 0x40;
  server_.command({"SETRANGE", key, std::to_string(off), byte});
  EXPECT_TRUE(read_rows_equal(tier, c1, 2, 0, 64));
  EXPECT_FALSE(read_rows_equal(tier, c1, 2, 60, 80));
  EXPECT_FALSE(tier.contains("x1"));
  EXPECT_EQ(server_.command({"EXISTS", tier.meta_key("x1"), key}), "0");

  server_.command({"DEL", tier.layer_key("x2", 0)});
  EXPECT_FALSE(read_rows_equal(tier, c2, 0, 0, 10));
  EXPECT_FALSE(tier.contains("x2"));
  EXPECT_EQ(server_.command({"EXISTS", tier.meta_key("x2")}), "0");

  server_.command({"SET", tier.layer_key("x3", 1), "short"});
  EXPECT_FALSE(read_rows_equal(tier, c3, 1, 0, 150));
  EXPECT_FALSE(tier.contains("x3"));

  // verify() re-checks every group of every layer.
  key = tier.layer_key("x4", 1);
  server_.command({"SETRANGE", key, std::to_string(slab_bytes(c4.meta) - 1), "?"});
  EXPECT_FALSE(tier.verify("x4"));
  EXPECT_FALSE(tier.contains("x4"));
  EXPECT_EQ(tier.used_bytes(), 0u);
}

TEST_F(RedisTierTest, AReplacementByAnotherWriterIsFollowed) {
  RedisTier reader(options());
  RedisTier writer(options());
  const ChunkKV v1 = chunk("rep", 9), v2 = chunk("rep", 10);
  ASSERT_TRUE(reader.put(v1));
  ASSERT_TRUE(read_rows_equal(reader, v1, 0, 0, 150));
  ASSERT_TRUE(writer.put(v2));  // deletes v1's layer values in the same transaction
  EXPECT_TRUE(read_rows_equal(reader, v2, 1, 10, 100));
  std::optional<ChunkKV> back = reader.get("rep");
  ASSERT_TRUE(back);
  EXPECT_TRUE(test::chunks_equal(*back, v2));
  EXPECT_EQ(server_.command({"DBSIZE"}), "4");  // header + 3 layers: nothing orphaned
  ASSERT_TRUE(writer.erase("rep"));
  EXPECT_FALSE(read_rows_equal(reader, v2, 1, 10, 100));
  EXPECT_FALSE(reader.contains("rep"));
  EXPECT_EQ(server_.command({"DBSIZE"}), "0");
}

TEST_F(RedisTierTest, ServerKilledMidTestGivesMissesNotCrashes) {
  RedisTier tier(options());
  const ChunkKV kv = chunk("k", 11);
  ASSERT_TRUE(tier.put(kv));
  ASSERT_TRUE(read_rows_equal(tier, kv, 0, 0, 150));
  server_.stop();
  EXPECT_FALSE(read_rows_equal(tier, kv, 0, 0, 150));
  EXPECT_FALSE(tier.get("k"));
  EXPECT_FALSE(tier.verify("k"));
  EXPECT_FALSE(tier.put(chunk("k2", 12)));
  EXPECT_TRUE(tier.contains("k"));  // unreachable is not corrupt: the entry stays indexed
  EXPECT_GE(tier.failed_exchanges(), 1u);

  // Through a pool the same failure is a miss, and the chunk is kept for when Redis is back.
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::make_unique<MemoryTier>("host", 0));
  tiers.push_back(std::make_unique<RedisTier>(options()));  // nothing to scan: starts empty
  CachePool pool(std::move(tiers));
  EXPECT_FALSE(pool.put(kv));  // host too small, Redis down
  EXPECT_FALSE(pool.lookup("k"));
}

// redis-server SIGKILLed and restarted on the same port (empty, as without persistence) between
// two operations: the tier's pooled connection is dead, and the next operation reconnects at once
// instead of calling the node down for retry_after_ms. While it is down, failures are instant
// (refused connections, no timeout) and the node is skipped until retry_after_ms has passed.
TEST_F(RedisTierTest, ARestartBetweenOperationsIsUsedAtOnce) {
  RedisTierOptions o = options();
  o.retry_after_ms = 60000;  // a node called down would stay down for the rest of the test
  // Long timeouts, so that any wait on one is far above the bound checked below.
  o.connect_timeout_ms = 5000;
  o.command_timeout_ms = 5000;
  RedisTier tier(o);
  const ChunkKV a = chunk("before", 14), b = chunk("after", 15);
  ASSERT_TRUE(tier.put(a));
  ASSERT_TRUE(read_rows_equal(tier, a, 1, 0, 150));
  server_.stop();
  std::string err;
  ASSERT_TRUE(server_.restart(&err)) << err;
  EXPECT_TRUE(tier.put(b)) << "the restarted server was not used";
  EXPECT_TRUE(read_rows_equal(tier, b, 2, 10, 90));
  EXPECT_EQ(tier.failed_exchanges(), 0u);
  // The record written before the restart is gone from the server: a miss, and dropped.
  EXPECT_FALSE(read_rows_equal(tier, a, 0, 0, 150));
  EXPECT_FALSE(tier.contains("before"));

  // Killed for good: the first operation fails without waiting for a timeout, and later ones
  // are misses without contacting the node.
  server_.stop();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(read_rows_equal(tier, b, 0, 0, 150));
  EXPECT_FALSE(tier.put(chunk("late", 16)));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 2.5) << "a refused connection waited for a timeout";
  EXPECT_EQ(tier.failed_exchanges(), 1u) << "the node was contacted again while marked down";
  EXPECT_NE(tier.last_put_error().find("unreachable"), std::string::npos) << tier.last_put_error();
}

TEST_F(RedisTierTest, AStalledServerIsAMissAfterTheTimeout) {
  RedisTier tier(options());
  const ChunkKV kv = chunk("slow", 13);
  ASSERT_TRUE(tier.put(kv));
  server_.pause();  // accepts connections, never answers
  // Watchdog: if the timeout were not honoured the read would block until this resumes the
  // server, and then succeed, failing the expectation below.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return done; })) server_.resume();
  });
  const bool got = read_rows_equal(tier, kv, 0, 0, 150);
  {
    std::lock_guard lock(mu);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
  EXPECT_FALSE(got);
  EXPECT_TRUE(tier.contains("slow"));
  server_.resume();
  // After retry_after_ms the node is tried again and answers.
  bool recovered = false;
  for (int i = 0; i < 100 && !recovered; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    recovered = read_rows_equal(tier, kv, 2, 100, 150);
  }
  EXPECT_TRUE(recovered);
}

TEST(RedisTierNoServer, UnreachableAtStartIsAnEmptyTierThatMisses) {
  RedisTierOptions o;
  o.port = test::pick_free_port();  // nothing listens there
  o.connect_timeout_ms = 200;
  RedisTier tier(o);
  EXPECT_TRUE(tier.list().empty());
  EXPECT_FALSE(tier.put(chunk("n", 14)));
  std::vector<uint8_t> k(64), v(64);
  EXPECT_FALSE(tier.read_rows("n", 0, 0, 1, k.data(), v.data()));
}

// hiredis writes with write(2): a peer that closed the connection raises SIGPIPE, which would
// kill the process. A fake server answers the put's first command (GET of the old header) with
// nil and closes, so the big transaction that follows is written into a dead connection.
TEST(RedisTierNoServer, AConnectionClosedDuringAWriteIsAFailureNotASignal) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  // One connection is served, then the "server" is gone: the listener closes too, so the tier's
  // one reconnect attempt after the closed connection is refused at once (a listener that
  // accepted and never answered would be a stalled server, AStalledServerIsAMissAfterTheTimeout).
  std::thread server([listener] {
    const int c = ::accept(listener, nullptr, nullptr);
    ::close(listener);
    if (c < 0) return;
    char buf[4096];
    (void)::recv(c, buf, sizeof(buf), 0);
    (void)::send(c, "$-1\r\n", 5, MSG_NOSIGNAL);
    ::close(c);
  });
  RedisTierOptions o;
  o.port = ntohs(addr.sin_port);
  o.scan_on_start = false;
  o.command_timeout_ms = 5000;
  RedisTier tier(o);
  ::signal(SIGPIPE, SIG_DFL);
  const ChunkKV big = test::make_random_chunk("big", 2048, 4, 256, KvDtype::F32, 1);  // 16 MiB
  EXPECT_FALSE(tier.put(big));
  server.join();
  EXPECT_FALSE(tier.contains("big"));
}

// Two masters splitting the 16384 slots; the tier only knows the first and must follow MOVED,
// and ASK while a slot migrates.
TEST(RedisTierCluster, FollowsMovedAndAskRedirections) {
  if (!test::RedisServer::available()) GTEST_SKIP() << "redis-server is not on PATH";
  test::RedisServer a, b;
  std::string err;
  auto cluster_args = [] {
    const int bus = test::pick_free_port(1024, 65535);
    return std::vector<std::string>{"--cluster-enabled",     "yes",
                                    "--cluster-port",        std::to_string(bus),
                                    "--cluster-config-file", "nodes.conf"};
  };
  ASSERT_TRUE(a.start(cluster_args(), &err)) << err;
  ASSERT_TRUE(b.start(cluster_args(), &err)) << err;
  ASSERT_EQ(a.command({"CLUSTER", "ADDSLOTSRANGE", "0", "8191"}), "OK");
  ASSERT_EQ(b.command({"CLUSTER", "ADDSLOTSRANGE", "8192", "16383"}), "OK");
  const std::string bus_b = b.command({"CONFIG", "GET", "cluster-port"}).substr(13);
  ASSERT_EQ(a.command({"CLUSTER", "MEET", "127.0.0.1", std::to_string(b.port()), bus_b}), "OK");
  bool ok = false;
  for (int i = 0; i < 200 && !ok; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ok = a.command({"CLUSTER", "INFO"}).find("cluster_state:ok") != std::string::npos &&
         b.command({"CLUSTER", "INFO"}).find("cluster_state:ok") != std::string::npos;
  }
  ASSERT_TRUE(ok) << "the two-node cluster did not come up";

  RedisTierOptions o;
  o.port = a.port();
  o.command_timeout_ms = 2000;
  RedisTier tier(o);
  std::vector<ChunkKV> kvs;
  for (int i = 0; i < 12; ++i) {
    kvs.push_back(chunk("cl" + std::to_string(i), 20 + i));
    ASSERT_TRUE(tier.put(kvs.back())) << kvs.back().meta.id;
  }
  for (const ChunkKV& kv : kvs) {
    EXPECT_TRUE(read_rows_equal(tier, kv, 1, 33, 150)) << kv.meta.id;
    std::optional<ChunkKV> back = tier.get(kv.meta.id);
    ASSERT_TRUE(back) << kv.meta.id;
    EXPECT_TRUE(test::chunks_equal(*back, kv));
  }
  EXPECT_GT(tier.redirects_followed(), 0u);
  EXPECT_NE(a.command({"DBSIZE"}), "0");
  EXPECT_NE(b.command({"DBSIZE"}), "0");
  for (const ChunkKV& kv : kvs) EXPECT_TRUE(tier.erase(kv.meta.id));
  EXPECT_EQ(a.command({"DBSIZE"}), "0");
  EXPECT_EQ(b.command({"DBSIZE"}), "0");

  // Migrate one chunk's slot from A to B: once its keys have moved, A answers ASK and the tier
  // must read from B after ASKING.
  auto id_where = [](const std::string& stem, auto pred) {
    for (int i = 0;; ++i)
      if (pred(redis_key_slot(stem + std::to_string(i)))) return stem + std::to_string(i);
  };
  const std::string moving_id = id_where("moving", [](int s) { return s < 8192; });  // on A
  const int slot = redis_key_slot(moving_id);
  const ChunkKV moving = chunk(moving_id, 40);
  ASSERT_TRUE(tier.put(moving));
  const std::string id_a = a.command({"CLUSTER", "MYID"}), id_b = b.command({"CLUSTER", "MYID"});
  ASSERT_EQ(b.command({"CLUSTER", "SETSLOT", std::to_string(slot), "IMPORTING", id_a}), "OK");
  ASSERT_EQ(a.command({"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", id_b}), "OK");
  std::vector<std::string> migrate{"MIGRATE", "127.0.0.1", std::to_string(b.port()), "", "0",
                                   "5000",    "KEYS",      tier.meta_key(moving_id)};
  for (int l = 0; l < 3; ++l) migrate.push_back(tier.layer_key(moving_id, l));
  ASSERT_EQ(a.command(migrate), "OK");
  const uint64_t before = tier.redirects_followed();
  EXPECT_TRUE(read_rows_equal(tier, moving, 2, 0, 150));
  std::optional<ChunkKV> back = tier.get(moving_id);
  ASSERT_TRUE(back);
  EXPECT_TRUE(test::chunks_equal(*back, moving));
  const std::string twin = id_where("twin", [slot](int s) { return s == slot; });
  const ChunkKV twin_kv = chunk(twin, 41);
  // Redis refuses a multi-key transaction on a slot being migrated (TRYAGAIN): reported, no crash.
  EXPECT_FALSE(tier.put(twin_kv));
  EXPECT_GE(tier.redirects_followed(), before + 3);
  // Finish the migration: B owns the slot, A answers MOVED, and the put goes through.
  ASSERT_EQ(b.command({"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", id_b}), "OK");
  ASSERT_EQ(a.command({"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", id_b}), "OK");
  ASSERT_TRUE(tier.put(twin_kv));
  EXPECT_TRUE(read_rows_equal(tier, twin_kv, 0, 5, 100));
  EXPECT_TRUE(read_rows_equal(tier, moving, 1, 0, 150));
  EXPECT_EQ(b.command({"EXISTS", tier.meta_key(twin)}), "1");
}

}  // namespace
}  // namespace ct::store
