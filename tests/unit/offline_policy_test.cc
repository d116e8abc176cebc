// The offline policies of issue 15 on tiny random models: head and probe rank deterministically,
// select exactly n_select(r, N) tokens, and their ranking travels with the record (rank mode,
// rank_params, order) through a disk tier and back; oracle recomputes exactly what it is given.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <numeric>

#include "core/error.h"
#include "reuse/encoder.h"
#include "reuse/policy.h"
#include "reuse/policy/head.h"
#include "reuse/policy/probe.h"
#include "reuse/selective.h"
#include "store/disk_tier.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

namespace fs = std::filesystem;

class OfflinePolicyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::TinyModelOptions o;
    o.n_layer = 6;
    const std::string path = (fs::temp_directory_path() / "ct_offline_policy_tiny.gguf").string();
    test::write_tiny_model(path, o);
    model_ = Model::load(path);
  }
  static void TearDownTestSuite() { model_.reset(); }
  static EncodeOptions probe_options(int layers = 0) {
    EncodeOptions eo;
    eo.rank.mode = RankMode::kProbe;
    eo.probe.layers = layers;
    return eo;
  }
  static EncodeOptions lowfreq_options() {
    EncodeOptions eo;
    eo.rank.mode = RankMode::kLowFreq;
    return eo;
  }
  static std::unique_ptr<Model> model_;
};
std::unique_ptr<Model> OfflinePolicyTest::model_;

bool is_permutation_of_n(const std::vector<int32_t>& o, int n) {
  std::vector<int32_t> s = o;
  std::sort(s.begin(), s.end());
  for (int i = 0; i < n; ++i) {
    if (i >= (int)s.size() || s[i] != i) return false;
  }
  return (int)s.size() == n;
}

TEST_F(OfflinePolicyTest, TheDefaultEncodingStoresTheProbeRanking) {
  const auto toks = test::random_byte_tokens(25, 13);
  const ChunkKV a = encode_chunk(*model_, toks, EncodeOptions());
  EXPECT_EQ(a.meta.rank_mode, "probe");
  EXPECT_EQ(a.meta.order, encode_chunk(*model_, toks, probe_options()).meta.order);
}

TEST(HeadPolicy, RanksInTextOrderAndSelectsTheFirstCeilRN) {
  const ChunkRanking r = head_ranking(7);
  EXPECT_EQ(r.order, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(std::is_sorted(r.scores.rbegin(), r.scores.rend()));
  EXPECT_EQ(head_selection(100, 0.15), [] {
    std::vector<int32_t> v(15);
    std::iota(v.begin(), v.end(), 0);
    return v;
  }());
  EXPECT_EQ(head_selection(7, 0.15).size(), 2u);  // ceil(1.05)
  EXPECT_TRUE(head_selection(7, 0.0).empty());
  EXPECT_EQ(head_selection(7, 1.0).size(), 7u);
}

TEST_F(OfflinePolicyTest, ProbeRankingIsDeterministicAndPartOfTheId) {
  const auto toks = test::random_byte_tokens(40, 3);
  const ChunkKV a = encode_chunk(*model_, toks, probe_options());
  const ChunkKV b = encode_chunk(*model_, toks, probe_options());
  EXPECT_EQ(a.meta.rank_mode, "probe");
  EXPECT_EQ(a.meta.rank_params, probe_params(ProbeOptions()));
  EXPECT_EQ(a.meta.order, b.meta.order);
  EXPECT_EQ(a.meta.scores, b.meta.scores);
  EXPECT_TRUE(is_permutation_of_n(a.meta.order, 40));
  // Scores are descending along the order, ties by index.
  for (int j = 1; j < 40; ++j) {
    const float p = a.meta.scores[a.meta.order[j - 1]], q = a.meta.scores[a.meta.order[j]];
    EXPECT_TRUE(p > q || (p == q && a.meta.order[j - 1] < a.meta.order[j])) << j;
  }
  // Context moves some tokens more than others.
  const auto [mn, mx] = std::minmax_element(a.meta.scores.begin(), a.meta.scores.end());
  EXPECT_LT(*mn, *mx);
  // Another probe text or layer count is another ranking, hence another id; the spectral ids
  // are what they were (no rank_params in their hash).
  EncodeOptions other = probe_options();
  other.probe.text = "A different probe context.";
  EXPECT_NE(chunk_id(model_->fingerprint(), toks, other), a.meta.id);
  EXPECT_NE(chunk_id(model_->fingerprint(), toks, probe_options(3)), a.meta.id);
  EncodeOptions lf = lowfreq_options();
  EXPECT_NE(chunk_id(model_->fingerprint(), toks, lf), a.meta.id);
  EXPECT_EQ(encode_chunk(*model_, toks, lf).meta.rank_params, "");
}

TEST_F(OfflinePolicyTest, ProbeAlsoRankingEqualsTheStoredOne) {
  const auto toks = test::random_byte_tokens(33, 4);
  EncodeOptions lf = lowfreq_options();
  RankOptions pr;
  pr.mode = RankMode::kProbe;
  lf.also = {pr};
  EncodeExtras ex;
  const ChunkKV a = encode_chunk(*model_, toks, lf, &ex);
  ASSERT_EQ(ex.rankings.size(), 1u);
  EXPECT_EQ(a.meta.rank_mode, "lowfreq");
  EXPECT_EQ(ex.rankings[0].order, encode_chunk(*model_, toks, probe_options()).meta.order);
  EXPECT_GT(ex.forward_ms, 0.0);
}

TEST_F(OfflinePolicyTest, ProbeLayersDefaultAndClamp) {
  ProbeOptions o;
  EXPECT_EQ(probe_layers(o, 30), 6);
  EXPECT_EQ(probe_layers(o, 24), 5);
  EXPECT_EQ(probe_layers(o, 6), 2);
  o.layers = 100;
  EXPECT_EQ(probe_layers(o, 6), 6);
  o.layers = 1;
  EXPECT_EQ(probe_layers(o, 6), 2);  // layer 0 alone carries no drift
}

TEST_F(OfflinePolicyTest, EveryOfflinePolicySelectsExactlyItsBudget) {
  const ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(61, 5), probe_options());
  const ChunkKV b = encode_chunk(*model_, test::random_byte_tokens(9, 6), probe_options());
  InMemoryChunk sa(a), sb(b);
  for (double r : {0.0, 0.15, 0.5, 1.0}) {
    for (const Policy* k : {&find_policy("head"), &find_policy("probe"), &find_policy("freq"),
                         &find_policy("cachetune")}) {
      PolicyOptions po;
      po.kind = k;
      po.ratio = r;
      for (const ChunkSource* s : {(const ChunkSource*)&sa, (const ChunkSource*)&sb}) {
        const auto sel = select_offline(*s, po);
        EXPECT_EQ((int)sel.size(), n_select(r, s->meta().n_tok)) << k->name() << " r=" << r;
        EXPECT_TRUE(std::is_sorted(sel.begin(), sel.end()));
        EXPECT_EQ(std::adjacent_find(sel.begin(), sel.end()), sel.end());
      }
    }
  }
  // cachetune on a probe record is the top of the probe ranking; head is the chunk start.
  PolicyOptions po;
  po.ratio = 0.15;
  po.kind = &find_policy("cachetune");
  const auto ct_sel = select_offline(sa, po);
  po.kind = &find_policy("probe");
  EXPECT_EQ(select_offline(sa, po), ct_sel);
  std::vector<int32_t> top(a.meta.order.begin(), a.meta.order.begin() + n_select(0.15, 61));
  std::sort(top.begin(), top.end());
  EXPECT_EQ(ct_sel, top);
  po.kind = &find_policy("head");
  EXPECT_EQ(select_offline(sa, po), head_selection(61, 0.15));
}

TEST_F(OfflinePolicyTest, RandomDrawIsPortableAndSeededByChunk) {
  ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(20, 8), probe_options());
  a.meta.id = "portable-draw-chunk";
  InMemoryChunk s(a);
  PolicyOptions po;
  po.kind = &find_policy("random");
  po.ratio = 0.25;
  po.seed = 7;
  const auto sel = select_offline(s, po);
  EXPECT_EQ(select_offline(s, po), sel);  // deterministic
  // The draw is SplitMix64 + Fisher-Yates (core/random.h), not std::shuffle or std::hash, so
  // these rows are the same on every platform and standard library (computed independently by
  // a Python rendering of the same generator).
  EXPECT_EQ(sel, (std::vector<int32_t>{1, 7, 9, 12, 17}));
  po.seed = 8;
  EXPECT_NE(select_offline(s, po), sel);
  EXPECT_EQ((int)select_offline(s, po).size(), n_select(0.25, 20));
}

TEST_F(OfflinePolicyTest, ProbeOnALowFreqRecordNeedsTheProbeRanking) {
  const auto toks = test::random_byte_tokens(20, 7);
  const ChunkKV a = encode_chunk(*model_, toks, lowfreq_options());
  InMemoryChunk s(a);
  PolicyOptions po;
  po.kind = &find_policy("probe");
  EXPECT_THROW(select_offline(s, po), Error);
  const ChunkKV p = encode_chunk(*model_, toks, probe_options());
  remember_ranking(a.meta.id, "probe", p.meta.order);
  std::vector<int32_t> top(p.meta.order.begin(), p.meta.order.begin() + n_select(0.15, 20));
  std::sort(top.begin(), top.end());
  EXPECT_EQ(select_offline(s, po), top);
}

TEST_F(OfflinePolicyTest, ProbeAndHeadRecordsRoundTripThroughADiskTier) {
  const fs::path dir = fs::temp_directory_path() / "ct_offline_policy_disk";
  fs::remove_all(dir);
  store::DiskTierOptions dopt;
  dopt.dir = dir.string();
  dopt.sync_writes = false;
  for (RankMode mode : {RankMode::kProbe, RankMode::kHead}) {
    EncodeOptions eo = probe_options();
    eo.rank.mode = mode;
    const ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(50, 8), eo);
    {
      store::DiskTier t(dopt);
      ASSERT_TRUE(t.put(a));
    }
    store::DiskTier t(dopt);  // a fresh tier: the record is read from the file
    const auto got = t.get(a.meta.id);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->meta.rank_mode, a.meta.rank_mode);
    EXPECT_EQ(got->meta.rank_params, a.meta.rank_params);
    EXPECT_EQ(got->meta.order, a.meta.order);
    EXPECT_EQ(got->meta.scores, a.meta.scores);
    EXPECT_EQ(got->k, a.k);
    EXPECT_EQ(got->v, a.v);
    // The complement of cachetune's selection is one contiguous suffix of rank rows.
    InMemoryChunk s(*got);
    PolicyOptions po;
    po.kind = &find_policy("cachetune");
    const auto sel = select_offline(s, po);
    std::vector<int32_t> top(got->meta.order.begin(), got->meta.order.begin() + sel.size());
    std::sort(top.begin(), top.end());
    EXPECT_EQ(sel, top);
  }
  fs::remove_all(dir);
}

TEST_F(OfflinePolicyTest, OracleRecomputesExactlyTheGivenTokens) {
  const ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(30, 9), EncodeOptions());
  const ChunkKV b = encode_chunk(*model_, test::random_byte_tokens(12, 10), EncodeOptions());
  InMemoryChunk sa(a), sb(b);
  ComposedRequest req{test::random_byte_tokens(3, 11), {&sa, &sb}, test::random_byte_tokens(4, 12)};
  const std::vector<std::vector<int32_t>> given = {{1, 5, 29}, {0, 11}};
  SelectiveOptions so;
  so.policy.kind = &find_policy("oracle");
  so.policy.oracle = &given;
  const RequestLayout lay = layout_request(req);
  KVCache kv = model_->make_cache(lay.n_total);
  Workspace ws;
  SelectionReport rep;
  selective_prefill(*model_, req, so, kv, ws, nullptr, &rep);
  EXPECT_EQ(rep.selected, given);
  // Without a selection per chunk it is refused.
  const std::vector<std::vector<int32_t>> short_given = {{1}};
  so.policy.oracle = &short_given;
  kv.n_pos = 0;
  EXPECT_THROW(selective_prefill(*model_, req, so, kv, ws, nullptr, &rep), Error);
}

}  // namespace
}  // namespace ct
