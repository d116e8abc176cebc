// CachePool tests: LRU eviction that demotes down the tier stack and drops only from the last
// tier, promotion on hit, hit statistics per tier, restart with a disk tier, corruption handling
// through the pool, and concurrent readers while a writer forces demotion cascades.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <thread>

#include "store/disk_tier.h"
#include "store/memory_tier.h"
#include "store/pool.h"
#include "store/record_format.h"
#include "support/chunk_fixtures.h"

namespace ct::store {
namespace {

// Every chunk of these tests has the same shape, so each tier holds a fixed number of them.
ChunkKV chunk(int i) {
  return test::make_random_chunk("c" + std::to_string(i), 96, 2, 16, KvDtype::F16, 1000 + i);
}

class PoolTest : public ::testing::Test {
 protected:
  // device and host hold `per_tier` chunks each, disk holds `disk_chunks`.
  std::unique_ptr<CachePool> make_pool(int per_tier, int disk_chunks, PoolOptions opt = {}) {
    const ChunkMeta m = chunk(0).meta;
    auto dev = std::make_unique<MemoryTier>("device", 0);
    const size_t mem_fp = dev->footprint(m);
    std::vector<std::unique_ptr<Tier>> tiers;
    // Half a chunk of slack: footprints differ by a few bytes with the id's length.
    const size_t mem_cap = per_tier * mem_fp + mem_fp / 2;
    tiers.push_back(std::make_unique<MemoryTier>("device", mem_cap));
    tiers.push_back(std::make_unique<MemoryTier>("host", mem_cap));
    DiskTierOptions d;
    d.dir = dir_.path() + "/disk";
    d.sync_writes = false;
    d.capacity_bytes = 0;
    auto probe = std::make_unique<DiskTier>(d);
    d.capacity_bytes = disk_chunks * probe->footprint(m) + probe->footprint(m) / 2;
    probe.reset();
    tiers.push_back(std::make_unique<DiskTier>(d));
    return std::make_unique<CachePool>(std::move(tiers), opt);
  }
  static std::vector<int> tiers_of(const CachePool& pool, int n) {
    std::vector<int> t;
    for (int i = 0; i < n; ++i) t.push_back(pool.tier_of("c" + std::to_string(i)));
    return t;
  }
  static void expect_readable(CachePool& pool, int i) {
    const ChunkKV kv = chunk(i);
    const size_t n = 96 * kv_row_bytes(kv.meta);
    std::vector<uint8_t> k(n), v(n);
    for (int l = 0; l < 2; ++l) {
      ASSERT_TRUE(pool.read_rows(kv.meta.id, l, 0, 96, k.data(), v.data())) << kv.meta.id;
      EXPECT_EQ(k, kv.k[l]) << kv.meta.id;
      EXPECT_EQ(v, kv.v[l]) << kv.meta.id;
    }
  }
  test::TempDir dir_;
};

TEST_F(PoolTest, EvictionDemotesDownTheStackAndDropsOnlyFromTheLast) {
  auto pool = make_pool(2, 2);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(pool->put(chunk(i)));
  EXPECT_EQ(tiers_of(*pool, 6), (std::vector<int>{2, 2, 1, 1, 0, 0}));
  ASSERT_TRUE(pool->put(chunk(6)));
  EXPECT_EQ(tiers_of(*pool, 7), (std::vector<int>{-1, 2, 2, 1, 1, 0, 0}));
  const PoolStat s = pool->stat();
  EXPECT_EQ(s.dropped, 1u);
  EXPECT_EQ(s.tiers[1].demotions_in, 5u);  // c0 ... c4 came down from the device
  EXPECT_EQ(s.tiers[2].demotions_in, 3u);  // c0, c1, c2 came down from the host
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(s.tiers[t].n_chunks, 2u);
    EXPECT_LE(s.tiers[t].used_bytes, s.tiers[t].capacity_bytes);
  }
  for (int i = 1; i < 7; ++i) expect_readable(*pool, i);
}

TEST_F(PoolTest, APinnedChunkIsReadFromItsRecordAfterThePoolDropsOrMovesIt) {
  // A request pins c0 (device) and c1 (disk) at lookup; other chunks then push c0 down the stack
  // and c1 out of the pool before the request reads them. The pinned reads still return the
  // records, counted as their tiers' bytes; a miss pins nothing.
  auto pool = make_pool(1, 1, PoolOptions{.promote_on_hit = false});
  ASSERT_TRUE(pool->put(chunk(1)));
  ASSERT_TRUE(pool->put(chunk(9)));
  ASSERT_TRUE(pool->put(chunk(0)));
  ASSERT_EQ(tiers_of(*pool, 2), (std::vector<int>{0, 2}));
  const CachePool::Pin p0 = pool->pin("c0"), p1 = pool->pin("c1");
  ASSERT_NE(p0.record, nullptr);
  ASSERT_NE(p1.record, nullptr);
  EXPECT_EQ(p0.tier, 0);
  EXPECT_EQ(p1.tier, 2);
  EXPECT_EQ(pool->pin("c7").record, nullptr);
  for (int i = 2; i < 5; ++i) ASSERT_TRUE(pool->put(chunk(i)));
  EXPECT_EQ(pool->tier_of("c1"), -1);  // dropped from the last tier
  EXPECT_NE(pool->tier_of("c0"), 0);   // demoted
  const size_t n = 96 * kv_row_bytes(chunk(0).meta);
  const uint64_t dev_before = pool->stat().tiers[0].bytes_read;
  const uint64_t disk_before = pool->stat().tiers[2].bytes_read;
  for (const auto& [i, pin] : {std::pair{0, &p0}, std::pair{1, &p1}}) {
    const ChunkKV kv = chunk(i);
    std::vector<uint8_t> k(n), v(n);
    for (int l = 0; l < 2; ++l) {
      ASSERT_TRUE(pool->read_pinned(*pin, kv.meta.id, l, 0, 96, k.data(), v.data())) << i;
      EXPECT_EQ(k, kv.k[l]) << kv.meta.id;
      EXPECT_EQ(v, kv.v[l]) << kv.meta.id;
    }
  }
  EXPECT_EQ(pool->stat().tiers[0].bytes_read - dev_before, 2 * (uint64_t)2 * n);
  EXPECT_EQ(pool->stat().tiers[2].bytes_read - disk_before, 2 * (uint64_t)2 * n);
}

TEST_F(PoolTest, LookupRefreshesRecencySoTheLeastRecentlyUsedIsDemoted) {
  auto pool = make_pool(2, 2, PoolOptions{.promote_on_hit = false});
  ASSERT_TRUE(pool->put(chunk(0)));
  ASSERT_TRUE(pool->put(chunk(1)));
  ASSERT_TRUE(pool->lookup("c0"));  // c1 is now the least recently used
  ASSERT_TRUE(pool->put(chunk(2)));
  EXPECT_EQ(tiers_of(*pool, 3), (std::vector<int>{0, 1, 0}));
}

TEST_F(PoolTest, HitPromotesToTheTopAndCountsPerTier) {
  auto pool = make_pool(2, 2);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(pool->put(chunk(i)));
  // c0 sits on disk. A hit brings it to the device; the device's LRU (c4) goes to the host, the
  // host's LRU (c2) goes to the disk.
  std::optional<ChunkMeta> meta = pool->lookup("c0");
  ASSERT_TRUE(meta);
  EXPECT_EQ(meta->n_tok, 96);
  EXPECT_EQ(tiers_of(*pool, 6), (std::vector<int>{0, 2, 2, 1, 1, 0}));
  ASSERT_TRUE(pool->lookup("c0"));
  ASSERT_TRUE(pool->lookup("c3"));  // on the host: promoted, c5 (device LRU) goes down
  EXPECT_EQ(tiers_of(*pool, 6), (std::vector<int>{0, 2, 2, 0, 1, 1}));
  EXPECT_FALSE(pool->lookup("c99"));
  expect_readable(*pool, 0);
  expect_readable(*pool, 2);

  const PoolStat s = pool->stat();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.tiers[0].hits, 1u);
  EXPECT_EQ(s.tiers[1].hits, 1u);
  EXPECT_EQ(s.tiers[2].hits, 1u);
  EXPECT_EQ(s.tiers[2].promotions_out, 1u);
  EXPECT_EQ(s.tiers[1].promotions_out, 1u);
  for (const ChunkStat& c : s.chunks) {
    EXPECT_EQ(c.n_tok, 96);
    EXPECT_EQ(c.tier_name, pool->tier(c.tier).name());
    EXPECT_EQ(c.bytes, pool->tier(c.tier).footprint(chunk(0).meta));
    if (c.id == "c0") {
      EXPECT_EQ(c.hits, 2u);
      EXPECT_EQ(c.hits_by_tier, (std::vector<uint64_t>{1, 0, 1}));
    } else if (c.id == "c3") {
      EXPECT_EQ(c.hits_by_tier, (std::vector<uint64_t>{0, 1, 0}));
    } else {
      EXPECT_EQ(c.hits, 0u);
    }
  }
}

TEST_F(PoolTest, WithoutPromotionAHitStaysInItsTier) {
  auto pool = make_pool(1, 4, PoolOptions{.promote_on_hit = false});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool->put(chunk(i)));
  ASSERT_TRUE(pool->lookup("c0"));
  EXPECT_EQ(pool->tier_of("c0"), 2);
  EXPECT_EQ(pool->stat().tiers[2].hits, 1u);
}

TEST_F(PoolTest, AChunkTooBigForTheTopGoesToTheFirstTierThatCanHoldIt) {
  auto pool = make_pool(1, 4);
  const ChunkKV big = test::make_random_chunk("big", 300, 2, 16, KvDtype::F16, 5);
  ASSERT_TRUE(pool->put(big));
  EXPECT_EQ(pool->tier_of("big"), 2);
  ASSERT_TRUE(pool->lookup("big"));  // cannot be promoted: stays
  EXPECT_EQ(pool->tier_of("big"), 2);
  const ChunkKV huge = test::make_random_chunk("huge", 2000, 4, 64, KvDtype::F32, 6);
  EXPECT_FALSE(pool->put(huge));
  EXPECT_FALSE(pool->contains("huge"));
}

TEST_F(PoolTest, ReplacingAChunkKeepsItsHitsAndEvictRemovesIt) {
  auto pool = make_pool(2, 2);
  ASSERT_TRUE(pool->put(chunk(0)));
  ASSERT_TRUE(pool->lookup("c0"));
  ASSERT_TRUE(pool->put(chunk(0)));
  EXPECT_EQ(pool->stat().chunks.at(0).hits, 1u);
  EXPECT_EQ(pool->tier(0).used_bytes(), pool->tier(0).footprint(chunk(0).meta));
  EXPECT_TRUE(pool->evict("c0"));
  EXPECT_FALSE(pool->evict("c0"));
  EXPECT_FALSE(pool->contains("c0"));
  EXPECT_EQ(pool->tier(0).used_bytes(), 0u);
}

TEST_F(PoolTest, RestartKeepsWhatTheDiskTierHeld) {
  {
    auto pool = make_pool(1, 4);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool->put(chunk(i)));
    EXPECT_EQ(tiers_of(*pool, 4), (std::vector<int>{2, 2, 1, 0}));
  }
  auto pool = make_pool(1, 4);  // memory tiers start empty, the disk is scanned
  EXPECT_EQ(tiers_of(*pool, 4), (std::vector<int>{2, 2, -1, -1}));
  expect_readable(*pool, 0);
  expect_readable(*pool, 1);
  ASSERT_TRUE(pool->lookup("c1"));
  EXPECT_EQ(pool->tier_of("c1"), 0);
}

TEST_F(PoolTest, ACopyInSeveralTiersIsKeptOnlyInTheHighest) {
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(std::make_unique<MemoryTier>("host", SIZE_MAX));
  DiskTierOptions d;
  d.dir = dir_.path() + "/dup";
  tiers.push_back(std::make_unique<DiskTier>(d));
  ASSERT_TRUE(tiers[0]->put(chunk(0)));
  ASSERT_TRUE(tiers[1]->put(chunk(0)));
  ASSERT_TRUE(tiers[1]->put(chunk(1)));
  CachePool pool(std::move(tiers));
  EXPECT_EQ(pool.tier_of("c0"), 0);
  EXPECT_EQ(pool.tier_of("c1"), 1);
  EXPECT_FALSE(pool.tier(1).contains("c0"));
}

TEST_F(PoolTest, CorruptionFoundByAReadOrByVerifyAllIsAMissAndDropped) {
  auto pool = make_pool(1, 4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool->put(chunk(i)));
  auto& disk = dynamic_cast<DiskTier&>(pool->tier(2));
  const uint64_t data = plan_record(chunk(0).meta, 4096).data_offset;
  for (const char* id : {"c0", "c1"}) {
    const int fd = ::open(disk.path_of(id).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const uint8_t junk[4] = {1, 2, 3, 4};
    ASSERT_EQ(::pwrite(fd, junk, 4, (off_t)data + 10), 4);
    ::close(fd);
  }
  std::vector<uint8_t> k(96 * 32), v(96 * 32);
  EXPECT_FALSE(pool->read_rows("c0", 0, 0, 96, k.data(), v.data()));
  EXPECT_FALSE(pool->contains("c0"));
  EXPECT_FALSE(pool->lookup("c0"));

  const VerifyReport report = pool->verify_all();
  EXPECT_EQ(report.n_checked, 3u);
  EXPECT_EQ(report.bad, std::vector<std::string>{"c1"});
  EXPECT_FALSE(pool->contains("c1"));
  const PoolStat s = pool->stat();
  EXPECT_EQ(s.dropped, 2u);
  EXPECT_EQ(s.chunks.size(), 2u);
  expect_readable(*pool, 2);
  expect_readable(*pool, 3);
}

// Readers look chunks up (promoting them) and read rows while a writer keeps adding chunks, so
// demotion cascades run all the time. Every successful read must return the chunk's exact rows.
TEST_F(PoolTest, ConcurrentReadersAndAWriterThroughThePool) {
  auto pool = make_pool(2, 3);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(pool->put(chunk(i)));
  std::vector<ChunkKV> expected;
  for (int i = 0; i < 30; ++i) expected.push_back(chunk(i));
  std::atomic<bool> stop{false};
  std::atomic<int> n_ok{0}, n_bad{0};
  auto reader = [&](int seed) {
    std::mt19937 rng(seed);
    const size_t row = kv_row_bytes(expected[0].meta);
    while (!stop.load()) {
      const int i = rng() % 30, l = rng() % 2, a = rng() % 96;
      const std::string id = "c" + std::to_string(i);
      if (rng() % 4 == 0) pool->lookup(id);
      std::vector<uint8_t> k((96 - a) * row), v((96 - a) * row);
      if (!pool->read_rows(id, l, a, 96, k.data(), v.data())) continue;
      const bool same = k == test::block_rows(expected[i], l, false, a, 96) &&
                        v == test::block_rows(expected[i], l, true, a, 96);
      (same ? n_ok : n_bad)++;
    }
  };
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) readers.emplace_back(reader, r);
  for (int i = 6; i < 30; ++i) ASSERT_TRUE(pool->put(expected[i]));
  for (int round = 0; round < 2; ++round)
    for (int i = 29; i >= 20; --i) pool->lookup("c" + std::to_string(i));
  stop = true;
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(n_bad.load(), 0);
  const PoolStat s = pool->stat();
  EXPECT_EQ(s.chunks.size(), 7u);
  for (const ChunkStat& c : s.chunks) expect_readable(*pool, std::stoi(c.id.substr(1)));
  EXPECT_TRUE(pool->verify_all().bad.empty());
}

}  // namespace
}  // namespace ct::store
