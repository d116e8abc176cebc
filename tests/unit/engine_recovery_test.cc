// Engine-level recovery from a damaged disk tier (tiny random model, temp directory): a stored
// .ctkv file with a flipped byte, deleted or truncated while the engine runs, or truncated while
// it is stopped, still lets the request answer with the same text; the damaged entry is dropped
// and the chunk re-encoded. Also failing media: an unreachable Redis, a disk that fills up or is
// read-only, and a Redis server killed and restarted while requests are being served.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "reuse/policy.h"
#include "store/disk_tier.h"
#include "store/record_format.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kDocs = {
    "The lighthouse on Gull Point was built in 1871 and painted red and white in 1903.",
    "Marta Olsen kept the lighthouse for forty years and wrote a diary of every storm.",
    "The keeper's cottage is now a small museum that opens on weekends in summer."};
const char* const kQuestion = "Who kept the lighthouse?";

class EngineRecoveryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ = new test::TempDir();
    test::TinyModelOptions o;
    o.n_layer = 3;
    o.context_length = 1024;
    model_path_ = new std::string(test::write_tiny_model(model_dir_->path() + "/tiny.gguf", o));
  }
  static void TearDownTestSuite() {
    delete model_path_;
    delete model_dir_;
  }

  EngineOptions options() const {
    EngineOptions eo;
    eo.model_path = *model_path_;
    eo.tiers = {parse_tier_spec("disk:" + cache_.path())};
    eo.prefill_chunk = prefill_chunk_;
    return eo;
  }

  SelectiveOptions sel_of() const {
    SelectiveOptions sel;
    sel.policy.kind = &find_policy(policy_);
    sel.policy.ratio = 0.15;
    return sel;
  }
  static GenerateOptions gen_of() {
    GenerateOptions gen;
    gen.max_tokens = 8;
    gen.stop_at_eog = false;  // always 8 tokens, so the comparison covers a real continuation
    return gen;
  }
  Answer ask(Engine& eng) const { return eng.answer(kDocs, kQuestion, sel_of(), gen_of()); }

  static store::DiskTier& disk(Engine& eng) {
    return dynamic_cast<store::DiskTier&>(eng.pool().tier(0));
  }

  // Byte offset of layer 0's last slab row in a stored record: the lowest-ranked token, covered
  // by a row-group CRC and read by every request with r < 1 (it is always in the complement).
  static uint64_t last_slab_row_byte(const std::string& path, int layer = 0) {
    std::ifstream f(path, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
    std::string err;
    std::optional<store::RecordHeader> h = store::decode_header(bytes.data(), bytes.size(), &err);
    EXPECT_TRUE(h.has_value()) << path << ": " << err;
    return h ? h->slab_offset(layer) +
                   (uint64_t)(h->meta.n_tok - 1) * store::slab_row_bytes(h->meta)
             : 0;
  }

  static void flip_byte(const std::string& path, uint64_t offset) {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    ASSERT_TRUE(f.good()) << "cannot open " << path;
    f.seekg((std::streamoff)offset);
    char c = 0;
    f.read(&c, 1);
    c = (char)(c ^ 0x5a);
    f.seekp((std::streamoff)offset);
    f.write(&c, 1);
    ASSERT_TRUE(f.good()) << "cannot rewrite byte " << offset << " of " << path;
  }

  // Answers once, damages the first chunk's file with `damage`, answers again, and checks that
  // the second answer equals the first and came from a re-encoded chunk.
  void expect_recovers(const std::function<void(const std::string& path)>& damage) {
    Engine eng(options());
    const Answer before = ask(eng);
    ASSERT_EQ(before.chunks.size(), kDocs.size());
    ASSERT_EQ(before.retries, 0);
    const std::string id = before.chunks[0].id;
    const std::string path = disk(eng).path_of(id);
    ASSERT_TRUE(fs::exists(path)) << path;
    damage(path);

    const Answer after = ask(eng);
    EXPECT_EQ(after.text, before.text);
    EXPECT_EQ(after.tokens, before.tokens);
    EXPECT_GE(after.retries, 1);
    // The damaged record was dropped (counted by the pool) and replaced by a fresh, intact
    // encoding under the same id.
    EXPECT_GE(eng.pool().stat().dropped, 1u);
    EXPECT_FALSE(after.chunks[0].hit) << "the chunk was served from the damaged record";
    EXPECT_TRUE(eng.pool().contains(id));
    EXPECT_TRUE(disk(eng).verify(id)) << "the re-encoded record does not verify";
    for (size_t i = 1; i < kDocs.size(); ++i) EXPECT_TRUE(after.chunks[i].hit) << "chunk " << i;

    // And the request after the recovery is an ordinary one.
    const Answer third = ask(eng);
    EXPECT_EQ(third.text, before.text);
    EXPECT_EQ(third.retries, 0);
  }

  // Answers once with an engine that is then closed; returns the first chunk's id, the path of
  // its record and the answer, for tests that damage the record while no engine runs.
  struct FirstChunk {
    std::string id, path, text;
  };
  FirstChunk answer_once() const {
    Engine eng(options());
    const Answer a = ask(eng);
    return {a.chunks[0].id, disk(eng).path_of(a.chunks[0].id), a.text};
  }

  static test::TempDir* model_dir_;
  static std::string* model_path_;
  test::TempDir cache_;
  int prefill_chunk_ = 0;              // EngineOptions::prefill_chunk
  const char* policy_ = "cachetune";  // the requests' policy
};
test::TempDir* EngineRecoveryTest::model_dir_ = nullptr;
std::string* EngineRecoveryTest::model_path_ = nullptr;

TEST_F(EngineRecoveryTest, FlippedByteInAStoredRecord) {
  expect_recovers([](const std::string& path) { flip_byte(path, last_slab_row_byte(path) + 10); });
}

// With chunked prefill the damage is found in the first slice's pass (an engine step), where
// the request's prefill starts again on a re-encoded chunk.
TEST_F(EngineRecoveryTest, FlippedByteFoundInAChunkedPrefillsFirstSlice) {
  prefill_chunk_ = 4;
  expect_recovers([](const std::string& path) { flip_byte(path, last_slab_row_byte(path) + 10); });
}

// A sliced CacheBlend reads every chunk's check layer (1) once its selection pass has run, to
// choose: the damage is found there, and the chunk is staged (re-encoded) again before the first
// slice. (It never reads layer 0, which it recomputes.)
TEST_F(EngineRecoveryTest, FlippedByteFoundBySlicedCacheBlendsSelection) {
  prefill_chunk_ = 4;
  policy_ = "cacheblend";
  expect_recovers([](const std::string& path) {
    flip_byte(path, last_slab_row_byte(path, Policy::kCheckLayer) + 10);
  });
}

// With chunked prefill a request looks its chunks up (and encodes missing ones) step by step and
// reads them in its first slice, possibly some steps later. The chunks are pinned at the lookup,
// so evicting them in between (other requests filling the tier) costs no re-encoding: the slice
// reads the pinned records. Here the step that looks up the stored chunks also encodes the last
// one, which takes the step's budget, so the first slice comes a step later.
TEST_F(EngineRecoveryTest, ChunksEvictedBetweenTheirLookupAndTheFirstSliceAreReadFromTheirPins) {
  prefill_chunk_ = 4;
  Engine eng(options());
  const RagPromptTokens p = build_rag_prompt(eng.model().tokenizer(), kDocs, kQuestion);
  const SelectiveOptions sel = sel_of();
  const GenerateOptions gen = gen_of();
  const Answer before = eng.answer(p, sel, gen);  // encodes and stores the chunks
  ASSERT_EQ(before.retries, 0);
  ASSERT_GT((int)p.chunks.back().size(), prefill_chunk_);
  ASSERT_TRUE(eng.pool().evict(before.chunks.back().id));  // the last must be encoded again

  std::unique_ptr<Generation> g = eng.begin(p, sel, gen);
  ASSERT_TRUE(g->prefilling());
  EXPECT_TRUE(g->answer().chunks.empty());  // nothing looked up before the first step
  Generation* gp = g.get();
  // The found chunks and the missing one's encoding, in slices over the first steps (the
  // encoding takes each step's budget; its ranking pass, longer than the budget, a step alone).
  int steps = 0;
  while (g->answer().chunks.size() < kDocs.size() && steps < 100) {
    const StepRows st = eng.advance(&gp, 1);
    EXPECT_EQ(st.prefill, 0) << "step " << steps;
    EXPECT_GT(st.encode, 0) << "step " << steps;
    ++steps;
  }
  EXPECT_GT(steps, 1);
  ASSERT_EQ(g->answer().chunks.size(), kDocs.size());
  for (size_t i = 0; i < kDocs.size(); ++i) {
    const ChunkInfo& c = g->answer().chunks[i];
    EXPECT_EQ(c.hit, i + 1 < kDocs.size()) << "chunk " << i;
    ASSERT_TRUE(eng.pool().evict(c.id)) << c.id;
    EXPECT_FALSE(fs::exists(disk(eng).path_of(c.id)));
  }
  for (int step = 0; step < 200 && !g->done(); ++step) eng.advance(&gp, 1);
  ASSERT_TRUE(g->done());
  ASSERT_FALSE(g->error());
  const Answer& after = g->answer();
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(after.retries, 0) << "a chunk was re-encoded instead of read from its pin";
  for (const ChunkInfo& c : after.chunks) EXPECT_FALSE(eng.pool().contains(c.id)) << c.id;
}

TEST_F(EngineRecoveryTest, DeletedRecord) {
  expect_recovers([](const std::string& path) { ASSERT_TRUE(fs::remove(path)) << path; });
}

TEST_F(EngineRecoveryTest, TruncatedRecord) {
  expect_recovers([](const std::string& path) {
    const auto size = fs::file_size(path);
    ASSERT_EQ(::truncate(path.c_str(), (off_t)(size / 2)), 0) << path;
  });
}

// Damage done while no engine runs is found by the start-up scan: the file is deleted, the
// chunk is simply missing and is re-encoded before the prefill (no retry needed).
TEST_F(EngineRecoveryTest, TruncatedWhileStopped) {
  const auto [id, path, text] = answer_once();
  ASSERT_EQ(::truncate(path.c_str(), 100), 0) << path;
  Engine eng(options());
  EXPECT_FALSE(eng.pool().contains(id));
  const Answer b = ask(eng);
  EXPECT_EQ(b.text, text);
  EXPECT_FALSE(b.chunks[0].hit);
  EXPECT_TRUE(b.chunks[1].hit);
  EXPECT_TRUE(disk(eng).verify(id));
}

// Rewrites the meta of a stored record in place, with its header checksum recomputed, as an
// attacker who can write the disk-tier directory would.
void rewrite_meta(const std::string& path, const std::function<void(ChunkMeta&)>& edit) {
  std::vector<uint8_t> bytes;
  {
    std::ifstream f(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  std::string err;
  std::optional<store::RecordHeader> h = store::decode_header(bytes.data(), bytes.size(), &err);
  ASSERT_TRUE(h.has_value()) << path << ": " << err;
  edit(h->meta);
  const store::RecordLayout lay = store::plan_record(h->meta, 4096);
  ASSERT_EQ(lay.header_bytes, h->header_bytes) << "the edit changed the header size";
  const std::vector<uint8_t> header = store::encode_header(lay, h->meta, h->group_crc);
  std::copy(header.begin(), header.end(), bytes.begin());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), (std::streamsize)bytes.size());
  ASSERT_TRUE(f.good()) << "cannot rewrite " << path;
}

// A record whose ranking is not a permutation (an index far outside the chunk, or a repeated
// one) is refused by the start-up scan even though its header checksum is right: the prefill
// would otherwise write outside its buffers. The chunk is re-encoded and the answer unchanged.
TEST_F(EngineRecoveryTest, HostileRankingInAStoredRecordIsRefused) {
  for (int variant = 0; variant < 3; ++variant) {
    const auto [id, path, text] = answer_once();
    rewrite_meta(path, [variant](ChunkMeta& m) {
      if (variant == 0) m.order[0] = 1000000;
      if (variant == 1) m.order[1] = m.order[0];
      if (variant == 2) m.order.back() = -1;
    });
    Engine eng(options());
    EXPECT_FALSE(eng.pool().contains(id)) << "variant " << variant;
    const Answer b = ask(eng);
    EXPECT_EQ(b.text, text) << "variant " << variant;
    EXPECT_FALSE(b.chunks[0].hit);
    EXPECT_TRUE(disk(eng).verify(id));
  }
}

// A well-formed record stored under a chunk's id but holding other tokens (out of the vocabulary
// here), another shape or another model's fingerprint is not used: the engine drops it and
// re-encodes, and the answer is the one from an intact cache.
TEST_F(EngineRecoveryTest, RecordThatDoesNotMatchTheRequestIsReplaced) {
  for (int variant = 0; variant < 3; ++variant) {
    const auto [id, path, text] = answer_once();
    rewrite_meta(path, [variant](ChunkMeta& m) {
      if (variant == 0) m.tokens[0] = 1 << 30;
      if (variant == 1) std::swap(m.tokens[0], m.tokens[1]);
      if (variant == 2) m.model_fingerprint[0] = m.model_fingerprint[0] == 'a' ? 'b' : 'a';
    });
    Engine eng(options());
    ASSERT_TRUE(eng.pool().contains(id)) << "variant " << variant << " is a well-formed record";
    const Answer b = ask(eng);
    EXPECT_EQ(b.text, text) << "variant " << variant;
    EXPECT_FALSE(b.chunks[0].hit);
    EXPECT_EQ(b.chunks[0].replaced, 1);
    EXPECT_TRUE(b.chunks[1].hit);
    const Answer c = ask(eng);
    EXPECT_TRUE(c.chunks[0].hit) << "the replacement was not stored";
  }
}

// A pool whose only tier is a Redis server that is down (nothing listens on the port): requests
// with chunks still answer, from encodings kept in memory for the request, and say so per chunk;
// the answer equals the one from a working cache.
TEST_F(EngineRecoveryTest, UnreachableOnlyTierServesFromMemory) {
  std::string text;
  {
    Engine eng(options());
    text = ask(eng).text;
  }
  EngineOptions eo = options();
  eo.tiers = {parse_tier_spec("redis:127.0.0.1:1")};
  Engine eng(eo);
  for (int i = 0; i < 2; ++i) {
    const Answer a = ask(eng);
    EXPECT_EQ(a.text, text);
    ASSERT_EQ(a.chunks.size(), kDocs.size());
    for (const ChunkInfo& c : a.chunks) {
      EXPECT_FALSE(c.hit);
      EXPECT_EQ(c.tier, "request");
      EXPECT_NE(c.note.find("fits in no cache tier"), std::string::npos) << c.note;
    }
  }
  // Callers that need the chunk stored (ingest) still get the error.
  EXPECT_THROW(eng.ensure_chunk(tokenize_chunk(eng.model().tokenizer(), kDocs[0])), Error);
}

// A disk tier on a real filesystem that fills up, then is remounted read-only (a 4 MiB tmpfs;
// skipped where mounting is not permitted). Full: chunks stored before keep being served from
// disk, a new chunk is served from the request's own encoding with a note naming the directory
// and ENOSPC, answers equal those of an engine with a healthy cache, and `ingest`'s path
// (ensure_chunk without a fallback) fails with that message. Read-only at start: the stored
// chunks are served, new ones come from memory with a note saying the directory is not writable.
TEST_F(EngineRecoveryTest, FullThenReadOnlyDiskKeepsServing) {
  test::TmpfsMount mnt;
  std::string err;
  const std::string dir = cache_.path() + "/mnt";
  if (!mnt.mount(dir, 4 << 20, &err))
    GTEST_SKIP() << "cannot mount a tmpfs here (" << err
                 << "); run as root where mounting is allowed to test a full disk tier";
  const std::vector<std::string> more = {
      kDocs[0], "A second lighthouse stood on the far side of the bay until the flood of 1920.",
      kDocs[2]};
  const SelectiveOptions sel = sel_of();
  const GenerateOptions gen = gen_of();
  EngineOptions healthy = options();
  healthy.tiers = {parse_tier_spec("host:64M")};
  Engine ref(healthy);
  const std::string want = ask(ref).text, want_more = ref.answer(more, kQuestion, sel, gen).text;

  EngineOptions eo = options();
  eo.tiers = {parse_tier_spec("disk:" + dir)};
  {
    Engine eng(eo);
    ASSERT_EQ(ask(eng).text, want);
    const size_t filled = mnt.fill("filler");
    EXPECT_GT(filled, 0u);
    const Answer a = eng.answer(more, kQuestion, sel, gen);
    EXPECT_EQ(a.text, want_more);
    ASSERT_EQ(a.chunks.size(), 3u);
    for (int i : {0, 2}) {
      EXPECT_TRUE(a.chunks[i].hit) << "chunk " << i;
      EXPECT_EQ(a.chunks[i].tier, "disk") << "chunk " << i;
    }
    EXPECT_FALSE(a.chunks[1].hit);
    EXPECT_EQ(a.chunks[1].tier, "request");
    EXPECT_NE(a.chunks[1].note.find(dir), std::string::npos) << a.chunks[1].note;
    EXPECT_NE(a.chunks[1].note.find(std::strerror(ENOSPC)), std::string::npos) << a.chunks[1].note;
    for (const auto& e : fs::directory_iterator(dir))
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
    // The records stored before the disk filled up are intact.
    EXPECT_EQ(ask(eng).text, want);
    EXPECT_EQ(eng.pool().verify_all().bad.size(), 0u);
    try {
      eng.ensure_chunk(tokenize_chunk(eng.model().tokenizer(), more[1]));
      ADD_FAILURE() << "storing a chunk on a full disk did not fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::strerror(ENOSPC)), std::string::npos) << e.what();
    }
  }
  ASSERT_TRUE(mnt.remount_read_only(&err)) << err;
  Engine eng(eo);
  EXPECT_TRUE(disk(eng).read_only());
  const Answer a = ask(eng);
  EXPECT_EQ(a.text, want);
  for (const ChunkInfo& c : a.chunks) {
    EXPECT_TRUE(c.hit);
    EXPECT_EQ(c.tier, "disk");
  }
  const Answer b = eng.answer(more, kQuestion, sel, gen);
  EXPECT_EQ(b.text, want_more);
  EXPECT_EQ(b.chunks[1].tier, "request");
  EXPECT_NE(b.chunks[1].note.find("not writable"), std::string::npos) << b.chunks[1].note;
  EXPECT_NE(b.chunks[1].note.find(std::strerror(EROFS)), std::string::npos) << b.chunks[1].note;
}

// The engine serving requests from a thread while its only tier, a real redis-server, is
// SIGKILLed and later restarted on the same port (empty: no persistence). Every request is
// answered with the same text as from a healthy cache; while Redis is down the chunks are
// encoded for each request and served from memory (tier "request", a note naming the server);
// no request waits long (killed: connections are refused at once; the connect timeout is
// 200 ms); after the restart the tier reconnects by itself and chunks are stored and hit in
// Redis again, without restarting the engine. Skipped when redis-server is not on PATH.
TEST_F(EngineRecoveryTest, RedisKilledAndRestartedMidRun) {
  if (!test::RedisServer::available())
    GTEST_SKIP() << "redis-server is not on PATH; install the redis-server package to run this";
  test::RedisServer srv;
  std::string err;
  ASSERT_TRUE(srv.start({}, &err)) << err;
  std::string want;
  {
    EngineOptions healthy = options();
    healthy.tiers = {parse_tier_spec("host:64M")};
    Engine ref(healthy);
    want = ask(ref).text;
  }
  EngineOptions eo = options();
  eo.tiers = {parse_tier_spec("redis:127.0.0.1:" + std::to_string(srv.port()))};
  Engine eng(eo);
  {
    const Answer a = ask(eng), b = ask(eng);
    EXPECT_EQ(a.text, want);
    EXPECT_EQ(b.text, want);
    for (const ChunkInfo& c : b.chunks) {
      EXPECT_TRUE(c.hit);
      EXPECT_EQ(c.tier, "redis");
    }
  }

  enum Phase { kUp = 0, kDown = 1, kRestarted = 2 };
  struct Record {
    int phase_begin, phase_end;
    std::string text, error;
    std::vector<ChunkInfo> chunks;
    double seconds;
  };
  std::atomic<int> phase{kUp};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<Record> log;
  std::thread client([&] {
    while (!stop) {
      Record r;
      r.phase_begin = phase;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        const Answer a = ask(eng);
        r.text = a.text;
        r.chunks = a.chunks;
      } catch (const std::exception& e) {
        r.error = e.what();
      }
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.phase_end = phase;
      std::lock_guard lock(mu);
      log.push_back(std::move(r));
    }
  });
  // Waits until `n` requests began and ended in phase p, or 60 s.
  auto wait_for = [&](int p, int n, const std::function<bool(const Record&)>& also) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard lock(mu);
        int k = 0;
        for (const Record& r : log) k += r.phase_begin == p && r.phase_end == p && also(r);
        if (k >= n) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  auto any = [](const Record&) { return true; };
  auto all_in_redis = [](const Record& r) {
    bool ok = !r.chunks.empty();
    for (const ChunkInfo& c : r.chunks) ok = ok && c.hit && c.tier == "redis";
    return ok;
  };
  const bool up_ok = wait_for(kUp, 2, all_in_redis);
  srv.stop();  // SIGKILL
  phase = kDown;
  const bool down_ok = wait_for(kDown, 4, any);
  const bool restarted = srv.restart(&err);
  phase = kRestarted;
  const bool back_ok = restarted && wait_for(kRestarted, 1, all_in_redis);
  stop = true;
  client.join();
  EXPECT_TRUE(up_ok);
  EXPECT_TRUE(down_ok) << "fewer than 4 requests answered in 60 s while Redis was down";
  ASSERT_TRUE(restarted) << err;
  EXPECT_TRUE(back_ok) << "no request was served from Redis within 60 s of its restart";

  int n_down = 0;
  double worst_down = 0;
  for (const Record& r : log) {
    SCOPED_TRACE("request in phase " + std::to_string(r.phase_begin) + ".." +
                 std::to_string(r.phase_end));
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.text, want);
    if (r.phase_begin != kDown || r.phase_end != kDown) continue;
    ++n_down;
    worst_down = std::max(worst_down, r.seconds);
    ASSERT_EQ(r.chunks.size(), kDocs.size());
    for (const ChunkInfo& c : r.chunks) {
      EXPECT_FALSE(c.hit);
      EXPECT_EQ(c.tier, "request");
      EXPECT_NE(c.note.find("127.0.0.1:" + std::to_string(srv.port())), std::string::npos)
          << c.note;
    }
  }
  EXPECT_GE(n_down, 4);
  // A bound far above the model's own time, well below a stall on timeouts in every request.
  EXPECT_LT(worst_down, 10.0) << "a request stalled while Redis was down";
  std::printf("%zu requests, %d while Redis was down (slowest %.3f s)\n", log.size(), n_down,
              worst_down);
  EXPECT_NE(srv.command({"DBSIZE"}), "0") << "nothing was stored in the restarted server";
}

// A prompt that cannot fit the model's context (1,024 tokens here) is refused before any of its
// chunks is encoded: nothing reaches the cache.
TEST_F(EngineRecoveryTest, OverlongPromptIsRefusedBeforeEncoding) {
  Engine eng(options());
  std::string doc;
  for (int i = 0; i < 700; ++i) doc += "storm ";
  SelectiveOptions sel;
  GenerateOptions gen;
  gen.max_tokens = 8;
  try {
    eng.answer({doc, doc + "again"}, kQuestion, sel, gen);
    FAIL() << "expected ct::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the model context"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_empty(cache_.path())) << "a chunk was encoded before the refusal";
}

}  // namespace
}  // namespace ct
