// Conformance tests run on every tier kind (device/host memory, disk buffered and O_DIRECT,
// Redis) and storage dtype: bit-exact round trips, complement reads for several recompute ratios,
// arbitrary row ranges, accounting, and concurrent readers against a writer.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <thread>

#include "core/error.h"
#include "store/disk_tier.h"
#include "store/memory_tier.h"
#include "store/record_format.h"
#include "store/redis_tier.h"
#include "support/chunk_fixtures.h"

namespace ct::store {
namespace {

enum class Kind { Memory, Disk, DiskDirect, Redis };

std::string kind_name(Kind k) {
  switch (k) {
    case Kind::Memory:
      return "memory";
    case Kind::Disk:
      return "disk";
    case Kind::DiskDirect:
      return "disk_direct";
    case Kind::Redis:
      return "redis";
  }
  return "?";
}

class TierTest : public ::testing::TestWithParam<std::tuple<Kind, KvDtype>> {
 protected:
  static void SetUpTestSuite() {
    if (!test::RedisServer::available()) return;
    redis_ = new test::RedisServer();
    std::string err;
    if (!redis_->start({}, &err)) {
      ADD_FAILURE() << "redis-server is on PATH but did not start: " << err;
      delete redis_;
      redis_ = nullptr;
    }
  }
  static void TearDownTestSuite() {
    delete redis_;
    redis_ = nullptr;
  }

  void SetUp() override {
    kind_ = std::get<0>(GetParam());
    dtype_ = std::get<1>(GetParam());
    if (kind_ == Kind::Redis && !redis_) GTEST_SKIP() << "redis-server is not on PATH";
    tier_ = make_tier();
  }

  std::unique_ptr<Tier> make_tier() {
    switch (kind_) {
      case Kind::Memory:
        return std::make_unique<MemoryTier>("host", SIZE_MAX);
      case Kind::Disk:
      case Kind::DiskDirect: {
        DiskTierOptions o;
        o.dir = dir_.path() + "/disk";
        o.direct_io = kind_ == Kind::DiskDirect;
        return std::make_unique<DiskTier>(o);
      }
      case Kind::Redis: {
        RedisTierOptions o;
        o.port = redis_->port();
        // A fresh namespace per test: the server is shared by the whole suite.
        o.key_prefix = "t" + std::to_string(++prefix_counter_) + ":";
        return std::make_unique<RedisTier>(o);
      }
    }
    return nullptr;
  }

  ChunkKV chunk(const std::string& id, int n_tok, uint64_t seed, int n_layer = 3, int kv_dim = 24) {
    return test::make_random_chunk(id, n_tok, n_layer, kv_dim, dtype_, seed);
  }

  // Reads rows [a, b) of every layer and compares them with the record's bytes.
  void expect_rows(const ChunkKV& kv, int a, int b) {
    for (int l = 0; l < kv.meta.n_layer; ++l) {
      const size_t n = (size_t)(b - a) * kv_bytes(kv.meta.dtype, kv.meta.kv_dim);
      std::vector<uint8_t> k(n + 1, 0xAB), v(n + 1, 0xCD);  // one guard byte each
      ASSERT_TRUE(tier_->read_rows(kv.meta.id, l, a, b, k.data(), v.data()))
          << "layer " << l << " rows [" << a << ", " << b << ")";
      EXPECT_EQ(k[n], 0xAB) << "wrote past the K range";
      EXPECT_EQ(v[n], 0xCD) << "wrote past the V range";
      k.pop_back();
      v.pop_back();
      EXPECT_EQ(k, test::block_rows(kv, l, false, a, b))
          << "K layer " << l << " [" << a << "," << b << ")";
      EXPECT_EQ(v, test::block_rows(kv, l, true, a, b))
          << "V layer " << l << " [" << a << "," << b << ")";
    }
  }

  static test::RedisServer* redis_;
  static int prefix_counter_;
  test::TempDir dir_;
  Kind kind_{};
  KvDtype dtype_{};
  std::unique_ptr<Tier> tier_;
};

test::RedisServer* TierTest::redis_ = nullptr;
int TierTest::prefix_counter_ = 0;

TEST_P(TierTest, WholeRecordRoundTripsBitExactly) {
  for (int n_tok : {1, 63, 64, 65, 200}) {
    const ChunkKV kv = chunk("c" + std::to_string(n_tok), n_tok, 100 + n_tok);
    ASSERT_TRUE(tier_->put(kv));
    EXPECT_TRUE(tier_->contains(kv.meta.id));
    std::optional<ChunkKV> back = tier_->get(kv.meta.id);
    ASSERT_TRUE(back);
    EXPECT_TRUE(test::chunks_equal(*back, kv)) << "n_tok " << n_tok;
    std::optional<ChunkMeta> meta = tier_->get_meta(kv.meta.id);
    ASSERT_TRUE(meta);
    EXPECT_TRUE(test::chunks_equal(ChunkKV{*meta, kv.k, kv.v}, kv));
    EXPECT_TRUE(tier_->verify(kv.meta.id));
  }
}

TEST_P(TierTest, ComplementReadsEqualTheRankedSuffix) {
  const ChunkKV kv = chunk("complement", 300, 5);
  ASSERT_TRUE(tier_->put(kv));
  for (double r : {0.0, 0.05, 0.15, 0.3, 0.5, 0.8, 0.99, 1.0}) {
    const int n_sel = (int)std::ceil(r * kv.meta.n_tok);
    SCOPED_TRACE("r = " + std::to_string(r));
    expect_rows(kv, n_sel, kv.meta.n_tok);
  }
}

TEST_P(TierTest, ArbitraryRowRangesAndGroupEdges) {
  const ChunkKV kv = chunk("ranges", 200, 6, 2, 40);
  ASSERT_TRUE(tier_->put(kv));
  for (auto [a, b] : std::vector<std::pair<int, int>>{
           {0, 1}, {63, 64}, {63, 65}, {64, 128}, {10, 190}, {199, 200}, {128, 200}, {70, 70}})
    expect_rows(kv, a, b);
  std::vector<uint8_t> k(8), v(8);
  EXPECT_THROW(tier_->read_rows("ranges", 2, 0, 1, k.data(), v.data()), ct::Error);
  EXPECT_THROW(tier_->read_rows("ranges", 0, 5, 201, k.data(), v.data()), ct::Error);
  EXPECT_FALSE(tier_->read_rows("absent", 0, 0, 1, k.data(), v.data()));
}

TEST_P(TierTest, AccountingListAndErase) {
  EXPECT_EQ(tier_->used_bytes(), 0u);
  std::vector<ChunkKV> kvs;
  size_t expect_bytes = 0;
  for (int i = 0; i < 4; ++i) {
    kvs.push_back(chunk("acct" + std::to_string(i), 50 + 10 * i, 40 + i));
    ASSERT_TRUE(tier_->put(kvs.back()));
    expect_bytes += tier_->footprint(kvs.back().meta);
    EXPECT_GE(tier_->footprint(kvs.back().meta), kvs.back().meta.kv_bytes());
  }
  EXPECT_EQ(tier_->used_bytes(), expect_bytes);
  EXPECT_EQ(tier_->list(), (std::vector<std::string>{"acct0", "acct1", "acct2", "acct3"}));
  ASSERT_TRUE(tier_->put(kvs[1]));  // replacing does not double count
  EXPECT_EQ(tier_->used_bytes(), expect_bytes);
  EXPECT_TRUE(tier_->erase("acct2"));
  EXPECT_FALSE(tier_->erase("acct2"));
  EXPECT_FALSE(tier_->contains("acct2"));
  EXPECT_FALSE(tier_->get("acct2"));
  EXPECT_FALSE(tier_->get_meta("acct2"));
  EXPECT_EQ(tier_->used_bytes(), expect_bytes - tier_->footprint(kvs[2].meta));
  EXPECT_EQ(tier_->list(), (std::vector<std::string>{"acct0", "acct3", "acct1"}));
}

TEST_P(TierTest, MalformedRecordThrows) {
  ChunkKV kv = chunk("bad id/with slash", 4, 1);
  EXPECT_THROW(tier_->put(kv), ct::Error);
  kv = chunk("short", 4, 1);
  kv.v[0].resize(3);
  EXPECT_THROW(tier_->put(kv), ct::Error);
}

// One writer alternates two different records under one id (and erases now and then) while
// readers read row ranges: every successful read must return K and V rows of one single version,
// never a mix of versions or a torn write.
TEST_P(TierTest, ConcurrentReadersAndWriterNeverSeeTornEntries) {
  const ChunkKV a = chunk("shared", 150, 1, 2, 16);
  const ChunkKV b = chunk("shared", 150, 2, 2, 16);
  ASSERT_TRUE(tier_->put(a));
  std::atomic<bool> stop{false};
  std::atomic<int> n_ok{0}, n_bad{0};
  auto reader = [&](int seed) {
    std::mt19937 rng(seed);
    const size_t row = kv_bytes(dtype_, 16);
    while (!stop.load()) {
      const int l = rng() % 2;
      const int r0 = rng() % 150;
      const int r1 = r0 + 1 + rng() % (150 - r0);
      std::vector<uint8_t> k((r1 - r0) * row), v((r1 - r0) * row);
      if (!tier_->read_rows("shared", l, r0, r1, k.data(), v.data())) continue;
      const bool is_a =
          k == test::block_rows(a, l, false, r0, r1) && v == test::block_rows(a, l, true, r0, r1);
      const bool is_b =
          k == test::block_rows(b, l, false, r0, r1) && v == test::block_rows(b, l, true, r0, r1);
      (is_a || is_b ? n_ok : n_bad)++;
    }
  };
  std::vector<std::thread> readers;
  for (int i = 0; i < 3; ++i) readers.emplace_back(reader, i);
  for (int i = 0; i < 40; ++i) {
    if (i % 10 == 9) tier_->erase("shared");
    ASSERT_TRUE(tier_->put(i % 2 ? a : b));
  }
  // Let the readers make progress on the last version too.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (n_ok.load() < 50 && n_bad.load() == 0 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::yield();
  stop = true;
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(n_bad.load(), 0);
  EXPECT_GE(n_ok.load(), 50);
  std::optional<ChunkKV> last = tier_->get("shared");
  ASSERT_TRUE(last);
  EXPECT_TRUE(test::chunks_equal(*last, a));  // i = 39 put a
}

TEST_P(TierTest, APinnedRecordStaysReadableAfterEraseAndReplace) {
  const ChunkKV kv = chunk("pinned", 130, 21);
  ASSERT_TRUE(tier_->put(kv));
  EXPECT_EQ(tier_->pin("absent"), nullptr);
  std::shared_ptr<PinnedRecord> pin = tier_->pin("pinned");
  if (kind_ == Kind::Redis) {
    EXPECT_EQ(pin, nullptr);  // read by id: a shared server cannot hold a record open
    return;
  }
  ASSERT_NE(pin, nullptr);
  auto expect_pinned_rows = [&](int a, int b) {
    for (int l = 0; l < kv.meta.n_layer; ++l) {
      const size_t n = (size_t)(b - a) * kv_bytes(kv.meta.dtype, kv.meta.kv_dim);
      std::vector<uint8_t> k(n), v(n);
      ASSERT_TRUE(pin->read_rows(l, a, b, k.data(), v.data())) << "layer " << l;
      EXPECT_EQ(k, test::block_rows(kv, l, false, a, b)) << "K layer " << l;
      EXPECT_EQ(v, test::block_rows(kv, l, true, a, b)) << "V layer " << l;
    }
  };
  expect_pinned_rows(20, 130);
  ASSERT_TRUE(tier_->erase("pinned"));  // evicted or demoted meanwhile
  EXPECT_FALSE(tier_->contains("pinned"));
  expect_pinned_rows(0, 77);
  // Stored again with other bytes under the same id: the pin still reads what it pinned.
  ChunkKV other = chunk("pinned", 130, 22);
  ASSERT_TRUE(tier_->put(other));
  expect_pinned_rows(64, 130);
  std::vector<uint8_t> k(8), v(8);
  EXPECT_THROW(pin->read_rows(3, 0, 1, k.data(), v.data()), ct::Error);  // no such layer
  pin.reset();
  expect_rows(other, 0, 130);
}

INSTANTIATE_TEST_SUITE_P(
    AllTiers, TierTest,
    ::testing::Combine(::testing::Values(Kind::Memory, Kind::Disk, Kind::DiskDirect, Kind::Redis),
                       ::testing::Values(KvDtype::F16, KvDtype::BF16, KvDtype::F32)),
    [](const auto& info) {
      return kind_name(std::get<0>(info.param)) + "_" + kv_dtype_name(std::get<1>(info.param));
    });

}  // namespace
}  // namespace ct::store
