// Unit tests for the store's building blocks: CRC32C (fast path against the portable reference),
// the record header encoding (round trip and rejection of damaged headers), the row-group
// arithmetic that widens partial reads, and the vectorised F16 unpacking against the scalar one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "core/error.h"
#include "core/fp16.h"
#include "store/crc32c.h"
#include "store/record_format.h"
#include "support/chunk_fixtures.h"

namespace ct::store {
namespace {

TEST(Crc32c, KnownVector) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_portable("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(Crc32c, FastPathMatchesReferenceAtEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(1024 + 16);
  for (uint8_t& b : buf) b = (uint8_t)rng();
  for (size_t off = 0; off < 8; ++off)
    for (size_t n = 0; n <= 1024; n += (n < 64 ? 1 : 37))
      ASSERT_EQ(crc32c(buf.data() + off, n), crc32c_portable(buf.data() + off, n))
          << "offset " << off << " length " << n;
}

TEST(Crc32c, ContinuationEqualsWholeBuffer) {
  std::vector<uint8_t> buf(1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = (uint8_t)(i * 31 + 7);
  for (size_t split : {0, 1, 7, 8, 500, 999, 1000}) {
    EXPECT_EQ(crc32c(buf.data() + split, buf.size() - split, crc32c(buf.data(), split)),
              crc32c(buf.data(), buf.size()));
  }
}

class HeaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kv_ = test::make_random_chunk("hdr-chunk", 130, 3, 8, KvDtype::F16, 11);
    layout_ = plan_record(kv_.meta, 4096);
    const int n_groups = n_row_groups(kv_.meta.n_tok);
    crcs_.resize(3 * n_groups);
    std::vector<uint8_t> slab(slab_bytes(kv_.meta));
    for (int l = 0; l < 3; ++l) {
      slab_pack(kv_, l, slab.data());
      slab_group_crcs(slab.data(), kv_.meta, &crcs_[l * n_groups]);
    }
    bytes_ = encode_header(layout_, kv_.meta, crcs_);
  }
  ChunkKV kv_;
  RecordLayout layout_;
  std::vector<uint32_t> crcs_;
  std::vector<uint8_t> bytes_;
};

TEST_F(HeaderTest, RoundTrip) {
  std::string err;
  auto h = decode_header(bytes_.data(), bytes_.size(), &err);
  ASSERT_TRUE(h) << err;
  ChunkKV meta_only{h->meta, kv_.k, kv_.v};
  EXPECT_TRUE(test::chunks_equal(meta_only, kv_));
  EXPECT_EQ(h->group_crc, crcs_);
  EXPECT_EQ(h->group_rows, kGroupRows);
  EXPECT_EQ(h->n_groups, (130 + (int)kGroupRows - 1) / (int)kGroupRows);
  EXPECT_EQ(h->data_offset % 4096, 0u);
  EXPECT_EQ(h->slab_stride % 4096, 0u);
  EXPECT_EQ(h->total_bytes, layout_.total_bytes);
  EXPECT_EQ(*peek_header_bytes(bytes_.data(), bytes_.size(), &err), bytes_.size());
}

TEST_F(HeaderTest, EveryFlippedByteIsRejected) {
  std::string err;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    std::vector<uint8_t> bad = bytes_;
    bad[i] ^= 0x20;
    EXPECT_FALSE(decode_header(bad.data(), bad.size(), &err)) << "byte " << i;
  }
}

TEST_F(HeaderTest, BadMagicAndTruncationAreNamed) {
  std::string err;
  std::vector<uint8_t> bad = bytes_;
  bad[0] = 'X';
  EXPECT_FALSE(peek_header_bytes(bad.data(), bad.size(), &err));
  EXPECT_NE(err.find("magic"), std::string::npos) << err;
  EXPECT_FALSE(decode_header(bytes_.data(), bytes_.size() - 1, &err));
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  EXPECT_FALSE(decode_header(bytes_.data(), 10, &err));
}

// A header whose checksum is right but whose meta is hostile (the attacker recomputes the CRC):
// every field the readers index with is checked, and the error names it.
TEST_F(HeaderTest, HostileMetaWithAValidChecksumIsRejected) {
  struct Case {
    const char* field;
    std::function<void(ChunkMeta&)> edit;
  };
  const std::vector<Case> cases = {
      {"order", [](ChunkMeta& m) { m.order[0] = 1000000; }},
      {"order", [](ChunkMeta& m) { m.order[5] = -3; }},
      {"order", [](ChunkMeta& m) { m.order[2] = m.order[7]; }},
      {"order", [](ChunkMeta& m) { m.order.pop_back(); }},
      {"tokens", [](ChunkMeta& m) { m.tokens.push_back(1); }},
      {"tokens", [](ChunkMeta& m) { m.tokens[3] = -1; }},
      {"scores", [](ChunkMeta& m) { m.scores.clear(); }},
      {"rank_mode", [](ChunkMeta& m) { m.rank_mode = "../x"; }},
      {"meta is not valid", [](ChunkMeta& m) { m.alpha = std::nan(""); }},  // JSON null
  };
  for (const Case& c : cases) {
    ChunkMeta m = kv_.meta;
    c.edit(m);
    const RecordLayout lay = plan_record(m, 4096);
    const std::vector<uint8_t> bytes = encode_header(lay, m, crcs_);
    std::string err;
    EXPECT_FALSE(decode_header(bytes.data(), bytes.size(), &err)) << c.field;
    EXPECT_NE(err.find(c.field), std::string::npos) << err;
  }
  ChunkMeta nan_alpha = kv_.meta;
  nan_alpha.alpha = std::nan("");
  std::string alpha_err;
  EXPECT_FALSE(check_meta(nan_alpha, &alpha_err));
  EXPECT_NE(alpha_err.find("alpha"), std::string::npos) << alpha_err;
  ChunkMeta huge = kv_.meta;
  huge.kv_dim = 1 << 30;
  std::string err;
  EXPECT_FALSE(check_meta(huge, &err));
  EXPECT_NE(err.find("kv_dim"), std::string::npos) << err;
}

// Fixed-header fields and meta JSON text edited in place, the checksum recomputed: what the record
// fuzz target (fuzz/record_fuzz.cc, flag bit 0) does. header_bytes and json_bytes follow the edit.
std::vector<uint8_t> resealed(std::vector<uint8_t> h, const std::string& from = "",
                              const std::string& to = "") {
  if (!from.empty()) {
    uint32_t json_bytes = 0;
    std::memcpy(&json_bytes, &h[16], 4);
    std::string json(h.begin() + 64, h.begin() + 64 + json_bytes);
    const size_t at = json.find(from);
    EXPECT_NE(at, std::string::npos) << from << " not in " << json;
    json.replace(at, from.size(), to);
    h.erase(h.begin() + 64, h.begin() + 64 + json_bytes);
    h.insert(h.begin() + 64, json.begin(), json.end());
    const uint32_t jb = (uint32_t)json.size(), hb = (uint32_t)h.size();
    std::memcpy(&h[16], &jb, 4);
    std::memcpy(&h[12], &hb, 4);
  }
  std::memset(&h[36], 0, 4);
  const uint32_t crc = crc32c(h.data(), h.size());
  std::memcpy(&h[36], &crc, 4);
  return h;
}

// Inputs found by fuzzing the record reader (kept in fuzz/corpus/record as crash-*): each has a
// valid checksum and used to get past decode_header.
TEST_F(HeaderTest, FuzzFoundHostileFieldsWithAValidChecksumAreRejected) {
  std::string err;
  ASSERT_TRUE(decode_header(resealed(bytes_).data(), bytes_.size(), &err)) << err;

  // group_rows above INT_MAX with one group per layer: covering_groups divided by a negative
  // group size and returned spans before row 0 and past the checksum table.
  std::vector<uint8_t> g = bytes_;
  const uint32_t one = 1, huge_rows = 0xFFFFFFFFu;
  std::memcpy(&g[28], &one, 4);
  std::memcpy(&g[32], &huge_rows, 4);
  const size_t crc_table = 4 * crcs_.size();
  g.erase(g.end() - (long)crc_table + 4 * 3, g.end());  // 3 layers x 1 group remain
  const uint32_t hb = (uint32_t)g.size();
  std::memcpy(&g[12], &hb, 4);
  g = resealed(g);
  EXPECT_FALSE(decode_header(g.data(), g.size(), &err));
  EXPECT_NE(err.find("group_rows 4294967295, expected 1 to 16777216"), std::string::npos) << err;

  // Array lengths whose 4 * sum wraps around 2^64 to the arrays section's size: the reader then
  // resized a vector to 2^61 elements (ASan: allocation-size-too-big; elsewhere bad_alloc).
  const std::string lens = "\"order_len\":130";
  std::vector<uint8_t> w = resealed(bytes_, lens, "\"order_len\":2305843009213693953");
  w = resealed(w, "\"tokens_len\":130", "\"tokens_len\":2305843009213693951");
  w = resealed(w, "\"scores_len\":130", "\"scores_len\":390");
  EXPECT_FALSE(decode_header(w.data(), w.size(), &err));
  EXPECT_NE(err.find("tokens_len is 2305843009213693951, expected an integer in [0, 390]"),
            std::string::npos)
      << err;

  // n_tok as a float out of int range (undefined behaviour in nlohmann's conversion) and as an
  // integer above 2^32 (wrapped silently to 130 + 2^32 - 2^32 = 130 and was accepted).
  for (const std::string bad : {"1e300", "4294967426", "130.0"}) {
    const std::vector<uint8_t> n = resealed(bytes_, "\"n_tok\":130", "\"n_tok\":" + bad);
    EXPECT_FALSE(decode_header(n.data(), n.size(), &err)) << bad;
    EXPECT_NE(err.find("n_tok is"), std::string::npos) << err;
  }
}

TEST(KvUnpack, F16EqualsScalarConversionForEveryHalfAndTailLength) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = (uint16_t)h;
  // Lengths and offsets around the 8-wide vector step exercise the scalar tail as well.
  for (size_t off : {0, 1, 5}) {
    for (size_t n : {all.size() - off, (size_t)7, (size_t)9, (size_t)17}) {
      std::vector<float> got(n);
      kv_unpack(KvDtype::F16, all.data() + off, got.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const float want = fp16_to_f32(all[off + i]);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got[i])) << "half 0x" << std::hex << all[off + i];
          ASSERT_EQ(std::signbit(got[i]), std::signbit(want))
              << "half 0x" << std::hex << all[off + i];
        } else {
          uint32_t a, b;
          std::memcpy(&a, &got[i], 4);
          std::memcpy(&b, &want, 4);
          ASSERT_EQ(a, b) << "half 0x" << std::hex << all[off + i] << " at offset " << off;
        }
      }
    }
  }
}

TEST(RecordFormat, CoveringGroupsWidenToWholeGroups) {
  RecordHeader h;
  h.meta.n_tok = 130;
  h.group_rows = 64;
  auto s = covering_groups(h, 70, 100);
  EXPECT_EQ(s.g_begin, 1);
  EXPECT_EQ(s.g_end, 2);
  EXPECT_EQ(s.row_lo, 64);
  EXPECT_EQ(s.row_hi, 128);
  s = covering_groups(h, 63, 130);
  EXPECT_EQ(s.g_begin, 0);
  EXPECT_EQ(s.g_end, 3);
  EXPECT_EQ(s.row_hi, 130);
  s = covering_groups(h, 128, 129);
  EXPECT_EQ(s.row_lo, 128);
  EXPECT_EQ(s.row_hi, 130);
}

TEST(RecordFormat, SlabInterleavesKeysAndValuesPerRow) {
  const ChunkKV kv = test::make_random_chunk("slab", 5, 2, 3, KvDtype::F32, 3);
  std::vector<uint8_t> slab(slab_bytes(kv.meta));
  slab_pack(kv, 1, slab.data());
  const size_t row = kv_row_bytes(kv.meta);
  for (int j = 0; j < 5; ++j) {
    EXPECT_EQ(std::memcmp(&slab[2 * j * row], &kv.k[1][j * row], row), 0);
    EXPECT_EQ(std::memcmp(&slab[(2 * j + 1) * row], &kv.v[1][j * row], row), 0);
  }
  std::vector<uint8_t> k(2 * row), v(2 * row);
  slab_unpack(&slab[2 * 2 * row], 2, row, k.data(), v.data());
  EXPECT_EQ(k, test::block_rows(kv, 1, false, 2, 4));
  EXPECT_EQ(v, test::block_rows(kv, 1, true, 2, 4));
}

TEST(RecordFormat, ChunkIdsAndMalformedRecordsAreRejected) {
  EXPECT_TRUE(is_valid_chunk_id("0123abcdef"));
  EXPECT_TRUE(is_valid_chunk_id("chunk-a_1.x"));
  EXPECT_FALSE(is_valid_chunk_id(""));
  EXPECT_FALSE(is_valid_chunk_id(".hidden"));
  EXPECT_FALSE(is_valid_chunk_id("a/b"));
  EXPECT_FALSE(is_valid_chunk_id("a{b}"));
  ChunkKV kv = test::make_random_chunk("ok", 4, 2, 2, KvDtype::BF16, 1);
  EXPECT_NO_THROW(check_chunk(kv));
  kv.k[1].pop_back();
  EXPECT_THROW(check_chunk(kv), ct::Error);
}

}  // namespace
}  // namespace ct::store
