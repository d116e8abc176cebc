// Engine-level recovery from a damaged disk tier (tiny random model, temp directory): a stored
// .ctkv file with a flipped byte, deleted or truncated while the engine runs, or truncated while
// it is stopped, still lets the request answer with the same text; the damaged entry is dropped
// and the chunk re-encoded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/engine.h"
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
    return eo;
  }

  static Answer ask(Engine& eng) {
    SelectiveOptions sel;
    sel.policy.kind = PolicyKind::kCacheTune;
    sel.policy.ratio = 0.15;
    GenerateOptions gen;
    gen.max_tokens = 8;
    gen.stop_at_eog = false;  // always 8 tokens, so the comparison covers a real continuation
    return eng.answer(kDocs, kQuestion, sel, gen);
  }

  static store::DiskTier& disk(Engine& eng) {
    return dynamic_cast<store::DiskTier&>(eng.pool().tier(0));
  }

  // Byte offset of layer 0's last slab row in a stored record: the lowest-ranked token, covered
  // by a row-group CRC and read by every request with r < 1 (it is always in the complement).
  static uint64_t last_slab_row_byte(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
    std::string err;
    std::optional<store::RecordHeader> h = store::decode_header(bytes.data(), bytes.size(), &err);
    EXPECT_TRUE(h.has_value()) << path << ": " << err;
    return h ? h->slab_offset(0) + (uint64_t)(h->meta.n_tok - 1) * store::slab_row_bytes(h->meta)
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

  static test::TempDir* model_dir_;
  static std::string* model_path_;
  test::TempDir cache_;
};
test::TempDir* EngineRecoveryTest::model_dir_ = nullptr;
std::string* EngineRecoveryTest::model_path_ = nullptr;

TEST_F(EngineRecoveryTest, FlippedByteInAStoredRecord) {
  expect_recovers([](const std::string& path) { flip_byte(path, last_slab_row_byte(path) + 10); });
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
  std::string id, path, text;
  {
    Engine eng(options());
    const Answer a = ask(eng);
    text = a.text;
    id = a.chunks[0].id;
    path = disk(eng).path_of(id);
  }
  ASSERT_EQ(::truncate(path.c_str(), 100), 0) << path;
  Engine eng(options());
  EXPECT_FALSE(eng.pool().contains(id));
  const Answer b = ask(eng);
  EXPECT_EQ(b.text, text);
  EXPECT_FALSE(b.chunks[0].hit);
  EXPECT_TRUE(b.chunks[1].hit);
  EXPECT_TRUE(disk(eng).verify(id));
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
