// The complement-loading pipeline (paper App. B.2) on a tiny random model: every combination of
// overlap, sparse loading and RoPE placement gives bit-identical logits, whether the chunks come
// from memory or from a cache pool over any tier; loader failures reach the caller as
// ChunkReadError; sparse loading reads fewer bytes from disk.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>

#include "backend/cpu_forward.h"
#include "engine/generate.h"
#include "reuse/encoder.h"
#include "reuse/pooled_chunk.h"
#include "reuse/selective.h"
#include "store/disk_tier.h"
#include "store/memory_tier.h"
#include "store/record_format.h"
#include "store/redis_tier.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

// All eight switch combinations, the unoptimised one first.
std::vector<PipelineOptions> all_pipelines() {
  std::vector<PipelineOptions> v;
  for (int bits = 0; bits < 8; ++bits)
    v.push_back({(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0});
  return v;
}

std::string describe(const PipelineOptions& p) {
  return std::string("overlap=") + (p.overlap ? "1" : "0") + " sparse=" + (p.sparse ? "1" : "0") +
         " rope_in_loader=" + (p.rope_in_loader ? "1" : "0");
}

class PipelineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    test::TinyModelOptions o;
    o.n_layer = 4;
    model_ = Model::load(test::write_tiny_model(dir_->path() + "/tiny.gguf", o)).release();
    EncodeOptions eo;  // F16 storage, sink, low-frequency ranking: the defaults the CLI uses
    // Chunk lengths straddle the 16-row checksum groups of the disk and Redis records.
    chunks_ = new std::vector<ChunkKV>{encode_chunk(*model_, test::random_byte_tokens(150, 1), eo),
                                       encode_chunk(*model_, test::random_byte_tokens(41, 2), eo),
                                       encode_chunk(*model_, test::random_byte_tokens(90, 3), eo)};
  }
  static void TearDownTestSuite() {
    delete chunks_;
    delete model_;
    delete dir_;
  }

  static ComposedRequest request(const std::vector<const ChunkSource*>& srcs) {
    return ComposedRequest{test::random_byte_tokens(6, 10), srcs, test::random_byte_tokens(5, 11)};
  }

  // Prefill logits followed by the logits of a few greedy decode steps, so a difference anywhere
  // in the cache (not only at the last prompt row) shows up.
  static std::vector<float> generate_logits(const ComposedRequest& req, const Policy* kind, double r,
                                            const PipelineOptions& p,
                                            PrefillBreakdown* bd = nullptr) {
    const RequestLayout lay = layout_request(req);
    const int n_gen = 4;
    KVCache kv = model_->make_cache(lay.n_total + n_gen + 1);
    Workspace ws;
    SelectiveOptions opt;
    opt.policy.kind = kind;
    opt.policy.ratio = r;
    opt.pipeline = p;
    std::vector<float> logits = selective_prefill(*model_, req, opt, kv, ws, bd);
    std::vector<float> all = logits;
    const int n_vocab = model_->config().n_vocab;
    for (int i = 0; i < n_gen; ++i) {
      const int32_t id = argmax(logits.data(), n_vocab);
      logits = cpu::prefill(*model_, &id, 1, kv.n_pos, kv, ws);
      all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
  }

  static std::vector<const ChunkSource*> in_memory() {
    static std::vector<std::unique_ptr<InMemoryChunk>> keep;
    if (keep.empty()) {
      for (const ChunkKV& c : *chunks_) keep.push_back(std::make_unique<InMemoryChunk>(c));
    }
    std::vector<const ChunkSource*> v;
    for (auto& k : keep) v.push_back(k.get());
    return v;
  }

  // Sources over a pool that holds every chunk in its single tier.
  struct PoolSources {
    std::unique_ptr<store::CachePool> pool;
    std::vector<std::unique_ptr<PooledChunk>> keep;
    std::vector<const ChunkSource*> srcs;
  };
  static PoolSources pooled(std::unique_ptr<store::Tier> tier) {
    PoolSources ps;
    std::vector<std::unique_ptr<store::Tier>> tiers;
    tiers.push_back(std::move(tier));
    ps.pool = std::make_unique<store::CachePool>(std::move(tiers));
    for (const ChunkKV& c : *chunks_) {
      EXPECT_TRUE(ps.pool->put(c)) << "chunk " << c.meta.id << " did not fit";
      std::optional<ChunkMeta> meta = ps.pool->lookup(c.meta.id);
      EXPECT_TRUE(meta.has_value());
      ps.keep.push_back(std::make_unique<PooledChunk>(*ps.pool, *meta));
      ps.srcs.push_back(ps.keep.back().get());
    }
    return ps;
  }

  static std::unique_ptr<store::DiskTier> disk_tier(const std::string& dir, double bw = 0) {
    store::DiskTierOptions d;
    d.dir = dir;
    d.sync_writes = false;  // a temp dir; durability is tested in store_disk_test
    d.read_bytes_per_sec = bw;
    return std::make_unique<store::DiskTier>(d);
  }

  static test::TempDir* dir_;
  static Model* model_;
  static std::vector<ChunkKV>* chunks_;
};
test::TempDir* PipelineTest::dir_ = nullptr;
Model* PipelineTest::model_ = nullptr;
std::vector<ChunkKV>* PipelineTest::chunks_ = nullptr;

TEST_F(PipelineTest, EverySwitchCombinationGivesIdenticalLogits) {
  const ComposedRequest req = request(in_memory());
  // cachetune loads a contiguous rank suffix (sparse applies); the others scan every row, and
  // cacheblend starts its loader at layer 1.
  for (const Policy* kind : {&find_policy("cachetune"), &find_policy("reuse"), &find_policy("random"),
                          &find_policy("cacheblend"), &find_policy("prophetkv")}) {
    const std::vector<double> ratios =
        kind == &find_policy("cachetune") ? std::vector<double>{0.15, 0.5} : std::vector<double>{0.15};
    for (double r : ratios) {
      const auto pipes = all_pipelines();
      PrefillBreakdown bd0;
      const auto want = generate_logits(req, kind, r, pipes[0], &bd0);
      for (size_t i = 1; i < pipes.size(); ++i) {
        PrefillBreakdown bd;
        EXPECT_EQ(generate_logits(req, kind, r, pipes[i], &bd), want)
            << kind->name() << " r=" << r << " " << describe(pipes[i]);
        EXPECT_EQ(bd.n_loaded, bd0.n_loaded) << describe(pipes[i]);
        EXPECT_EQ(bd.n_active, bd0.n_active) << describe(pipes[i]);
      }
    }
  }
}

TEST_F(PipelineTest, DiskPoolMatchesMemoryUnderEverySwitchCombination) {
  test::TempDir dir;
  PoolSources disk = pooled(disk_tier(dir.path()));
  // A throttled medium only adds sleeps; the bytes (and so the logits) must not change.
  test::TempDir slow_dir;
  PoolSources slow = pooled(disk_tier(slow_dir.path(), 50e6));
  const ComposedRequest mem_req = request(in_memory());
  for (const PipelineOptions& p : all_pipelines()) {
    const auto want = generate_logits(mem_req, &find_policy("cachetune"), 0.15, p);
    EXPECT_EQ(generate_logits(request(disk.srcs), &find_policy("cachetune"), 0.15, p), want)
        << describe(p);
    EXPECT_EQ(generate_logits(request(slow.srcs), &find_policy("cachetune"), 0.15, p), want)
        << describe(p);
  }
  EXPECT_EQ(disk.pool->stat().misses, 0u);
}

// Generation through each tier against the device tier: the stored bytes are identical, so the
// logits must be identical bit for bit.
TEST_F(PipelineTest, EveryTierGivesTheDeviceTierLogits) {
  PoolSources device = pooled(std::make_unique<store::MemoryTier>("device", SIZE_MAX));
  const ComposedRequest dev_req = request(device.srcs);
  const PipelineOptions full;  // overlap, sparse, RoPE in the loader
  const auto want = generate_logits(dev_req, &find_policy("cachetune"), 0.15, full);
  EXPECT_EQ(generate_logits(request(in_memory()), &find_policy("cachetune"), 0.15, full), want);

  PoolSources host = pooled(std::make_unique<store::MemoryTier>("host", SIZE_MAX));
  EXPECT_EQ(generate_logits(request(host.srcs), &find_policy("cachetune"), 0.15, full), want)
      << "host tier";

  test::TempDir dir;
  PoolSources disk = pooled(disk_tier(dir.path()));
  EXPECT_EQ(generate_logits(request(disk.srcs), &find_policy("cachetune"), 0.15, full), want)
      << "disk tier";

  if (!test::RedisServer::available()) {
    GTEST_SKIP() << "redis-server is not on PATH; the Redis tier part was skipped";
  }
  test::RedisServer server;
  std::string err;
  ASSERT_TRUE(server.start({}, &err)) << err;
  store::RedisTierOptions ro;
  ro.port = server.port();
  ro.command_timeout_ms =
      5000;  // generous: the machine may be loaded, and this is not a timeout test
  PoolSources redis = pooled(std::make_unique<store::RedisTier>(ro));
  for (const PipelineOptions& p : all_pipelines()) {
    EXPECT_EQ(generate_logits(request(redis.srcs), &find_policy("cachetune"), 0.15, p),
              generate_logits(dev_req, &find_policy("cachetune"), 0.15, p))
        << "redis tier, " << describe(p);
  }
  EXPECT_EQ(redis.pool->stat().misses, 0u);
}

// Sparse loading reads only the row groups covering the complement: with a 150-token chunk and
// r = 0.5 (ranks 0..74 selected) the row groups wholly below rank 75 are never read.
TEST_F(PipelineTest, SparseLoadingReadsFewerBytesFromDisk) {
  test::TempDir dir;
  auto tier = disk_tier(dir.path());
  store::DiskTier* disk = tier.get();
  PoolSources ps = pooled(std::move(tier));
  const ComposedRequest req{
      test::random_byte_tokens(4, 12), {ps.srcs[0]}, test::random_byte_tokens(3, 13)};
  PipelineOptions dense{true, false, true}, sparse{true, true, true};
  const uint64_t b0 = disk->bytes_read();
  const auto a = generate_logits(req, &find_policy("cachetune"), 0.5, dense);
  const uint64_t b1 = disk->bytes_read();
  const auto b = generate_logits(req, &find_policy("cachetune"), 0.5, sparse);
  const uint64_t b2 = disk->bytes_read();
  EXPECT_EQ(a, b);
  const ChunkMeta& m = (*chunks_)[0].meta;
  const uint64_t row = store::slab_row_bytes(m);  // K and V of one rank row
  EXPECT_EQ(b1 - b0, row * m.n_tok * m.n_layer);
  const int skipped = n_select(0.5, m.n_tok) / (int)store::kGroupRows * (int)store::kGroupRows;
  EXPECT_GT(skipped, 0);
  EXPECT_EQ(b2 - b1, row * (m.n_tok - skipped) * m.n_layer);
}

// A chunk that disappears from its tier mid-request surfaces as ChunkReadError (with its id)
// whether the read failed on the loader thread or on the calling thread.
TEST_F(PipelineTest, ALostChunkRaisesChunkReadErrorWithAndWithoutOverlap) {
  for (const PipelineOptions& p : all_pipelines()) {
    test::TempDir dir;
    auto tier = disk_tier(dir.path());
    store::DiskTier* disk = tier.get();
    PoolSources ps = pooled(std::move(tier));
    const std::string victim = ps.srcs[1]->meta().id;
    // Truncated under the request: the sources pin their records at creation, so a file deleted
    // now would still be read whole through its open descriptor; a truncated one is damage.
    const std::string path = disk->path_of(victim);
    ASSERT_EQ(::truncate(path.c_str(), (off_t)(std::filesystem::file_size(path) / 2)), 0) << path;
    try {
      generate_logits(request(ps.srcs), &find_policy("cachetune"), 0.15, p);
      ADD_FAILURE() << "expected ChunkReadError, " << describe(p);
    } catch (const ChunkReadError& e) {
      EXPECT_EQ(e.chunk_id(), victim) << describe(p);
    }
    EXPECT_FALSE(ps.pool->contains(victim)) << "the lost chunk stays indexed, " << describe(p);
  }
}

// The breakdown accounts for the load work wherever it ran: without overlap all of it is exposed;
// with RoPE on the compute thread that part is exposed too (and still counted as load work).
TEST_F(PipelineTest, BreakdownCountsExposedLoadWork) {
  const ComposedRequest req = request(in_memory());
  PrefillBreakdown bd;
  generate_logits(req, &find_policy("cachetune"), 0.15, {false, true, false}, &bd);
  EXPECT_EQ(bd.load_wait_ms, bd.load_ms);
  EXPECT_GT(bd.load_ms, 0.0);
  generate_logits(req, &find_policy("cachetune"), 0.15, {true, true, false}, &bd);
  EXPECT_GT(bd.load_wait_ms, 0.0);  // at least the RoPE done on the compute thread
  EXPECT_LE(bd.load_wait_ms, bd.total_ms);
  EXPECT_GT(bd.n_loaded, 0);
}

}  // namespace
}  // namespace ct
