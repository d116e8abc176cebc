// The offline policies of issue 15 on tiny random models: head and probe rank deterministically,
// select exactly n_select(r, N) tokens, and their ranking travels with the record (rank mode,
// rank_params, order) through a disk tier and back; the oracles recompute the true top drift; the
// shared budgets (probe-shared, oracle-shared) keep the request's total and give it to the top
// scores of all chunks together.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numeric>
#include <tuple>

#include "backend/backend.h"
#include "backend/cpu_forward.h"
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

// What the policy po.kind selects in chunk c alone.
std::vector<int32_t> select_offline(const ChunkSource& c, const PolicyOptions& po) {
  return po.kind->select_chunk(c, po);
}

bool is_permutation_of_n(const std::vector<int32_t>& o, int n) {
  std::vector<int32_t> s = o;
  std::sort(s.begin(), s.end());
  for (int i = 0; i < n; ++i) {
    if (i >= (int)s.size() || s[i] != i) return false;
  }
  return (int)s.size() == n;
}

// The probe pass runs through the layer contract, the probe context placed as already-rotated
// rows. The reference: the plain layer loop over a cache holding the context's own encoding, and
// the documented score, computed here in double (in a slightly different order, hence the
// tolerance), with and without a sink.
TEST_F(OfflinePolicyTest, ProbeRankingThroughTheBackendEqualsThePlainLayerLoop) {
  const ModelConfig& c = model_->config();
  const int KV = c.kv_dim();
  const ProbeOptions o;
  const int layers = probe_layers(o, c.n_layer);
  ASSERT_GE(layers, 2);
  for (bool sink : {true, false}) {
    SCOPED_TRACE(sink ? "sink" : "no sink");
    const auto toks = test::random_byte_tokens(37, 21);
    const int n = (int)toks.size();
    // The isolated encoding's pre-RoPE K/V, as encode_chunk taps them.
    std::vector<int32_t> iso;
    if (sink) iso.push_back(model_->tokenizer().bos() >= 0 ? model_->tokenizer().bos() : 0);
    iso.insert(iso.end(), toks.begin(), toks.end());
    const int ni = (int)iso.size(), off = sink ? 1 : 0;
    std::vector<float> k_all((size_t)c.n_layer * ni * KV), v_all(k_all.size());
    tapped_prefill(*model_, iso.data(), ni, nullptr, k_all.data(), v_all.data());
    std::vector<const float*> kl(c.n_layer), vl(c.n_layer);
    for (int l = 0; l < c.n_layer; ++l) {
      kl[l] = k_all.data() + ((size_t)l * ni + off) * KV;
      vl[l] = v_all.data() + ((size_t)l * ni + off) * KV;
    }
    const ChunkRanking got = probe_rank(*model_, toks, sink, kl, vl, o);

    // Reference: the probe context prefilled, then the chunk after it, plain layer loop.
    std::vector<int32_t> all;
    if (sink) all.push_back(iso[0]);
    const auto body = model_->tokenizer().encode(o.text, false);
    all.insert(all.end(), body.begin(), body.end());
    const int P = (int)all.size();
    KVCache kv(layers, P + n, KV);
    Workspace ws;
    std::vector<float> x((size_t)P * c.n_embd);
    model_->embed(all.data(), P, x.data());
    std::vector<int32_t> pos(P);
    std::iota(pos.begin(), pos.end(), 0);
    for (int l = 0; l < layers; ++l)
      cpu::forward_layer(*model_, l, x.data(), pos.data(), P, kv, ws);
    x.assign((size_t)n * c.n_embd, 0.0f);
    model_->embed(toks.data(), n, x.data());
    pos.resize(n);
    std::iota(pos.begin(), pos.end(), P);
    std::vector<float> kp((size_t)n * KV), vp((size_t)n * KV);
    std::vector<double> score(n, 0.0);
    double scale = 0;
    int scored = 0;
    for (int l = 0; l < layers; ++l) {
      LayerTap tap;
      tap.k_pre_rope = kp.data();
      tap.v = vp.data();
      cpu::forward_layer(*model_, l, x.data(), pos.data(), n, kv, ws, &tap);
      if (l == 0) continue;
      std::vector<double> dk(n), dv(n);
      double mk = 0, mv = 0;
      for (int t = 0; t < n; ++t) {
        double sk = 0, sv = 0;
        for (int i = 0; i < KV; ++i) {
          const double a = (double)kp[(size_t)t * KV + i] - kl[l][(size_t)t * KV + i];
          const double b = (double)vp[(size_t)t * KV + i] - vl[l][(size_t)t * KV + i];
          sk += a * a;
          sv += b * b;
        }
        dk[t] = std::sqrt(sk);
        dv[t] = std::sqrt(sv);
        mk += dk[t] / n;
        mv += dv[t] / n;
      }
      for (int t = 0; t < n; ++t) score[t] += 0.5 * dk[t] / mk + 0.5 * dv[t] / mv;
      scale += 0.5 * (mk + mv);
      ++scored;
    }
    ASSERT_EQ(got.scores.size(), (size_t)n);
    for (int t = 0; t < n; ++t) {
      const float want = (float)(score[t] / scored * (scale / scored));
      EXPECT_NEAR(got.scores[t], want, 1e-5f * std::fabs(want)) << "token " << t;
    }
  }
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
  remember_ranking(a.meta.id, "probe", ChunkRanking{p.meta.scores, p.meta.order});
  std::vector<int32_t> top(p.meta.order.begin(), p.meta.order.begin() + n_select(0.15, 20));
  std::sort(top.begin(), top.end());
  EXPECT_EQ(select_offline(s, po), top);
}

TEST_F(OfflinePolicyTest, OfflineRankedRecordsRoundTripThroughADiskTier) {
  const fs::path dir = fs::temp_directory_path() / "ct_offline_policy_disk";
  fs::remove_all(dir);
  store::DiskTierOptions dopt;
  dopt.dir = dir.string();
  dopt.sync_writes = false;
  for (RankMode mode : {RankMode::kProbe, RankMode::kHead, RankMode::kAttn, RankMode::kProbeAttn}) {
    SCOPED_TRACE(rank_mode_name(mode));
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

// n_select(r, N) of chunk c's drift, with ties to the lower index, from a brute-force sort.
std::vector<int32_t> brute_top(const std::vector<float>& d, int k) {
  std::vector<int32_t> idx(d.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return d[a] > d[b]; });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST_F(OfflinePolicyTest, OraclesRecomputeTheTrueTopDrift) {
  const ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(30, 9), EncodeOptions());
  const ChunkKV b = encode_chunk(*model_, test::random_byte_tokens(12, 10), EncodeOptions());
  InMemoryChunk sa(a), sb(b);
  ComposedRequest req{test::random_byte_tokens(3, 11), {&sa, &sb}, test::random_byte_tokens(4, 12)};
  // Chunk b drifts far more than chunk a.
  std::vector<std::vector<float>> drift(2);
  for (int t = 0; t < 30; ++t) drift[0].push_back((float)((t * 7) % 11));
  for (int t = 0; t < 12; ++t) drift[1].push_back(100.0f + (float)((t * 5) % 12));
  const double r = 0.4;
  SelectiveOptions so;
  so.policy.ratio = r;
  so.policy.drift = &drift;
  const RequestLayout lay = layout_request(req);
  KVCache kv = model_->make_cache(lay.n_total);
  Workspace ws;
  SelectionReport rep;
  so.policy.kind = &find_policy("oracle");
  selective_prefill(*model_, req, so, kv, ws, nullptr, &rep);
  EXPECT_EQ(rep.selected[0], brute_top(drift[0], n_select(r, 30)));
  EXPECT_EQ(rep.selected[1], brute_top(drift[1], n_select(r, 12)));
  // Shared: the same total (12 + 5), and chunk b's 12 tokens outrank all of a's.
  so.policy.kind = &find_policy("oracle-shared");
  kv.n_pos = 0;
  selective_prefill(*model_, req, so, kv, ws, nullptr, &rep);
  EXPECT_EQ(rep.selected[1], brute_top(drift[1], 12));
  EXPECT_EQ(rep.selected[0], brute_top(drift[0], n_select(r, 30) + n_select(r, 12) - 12));
  // Without the drift of every chunk both are refused.
  const std::vector<std::vector<float>> short_drift = {drift[0]};
  for (const char* n : {"oracle", "oracle-shared"}) {
    so.policy.kind = &find_policy(n);
    so.policy.drift = &short_drift;
    kv.n_pos = 0;
    EXPECT_THROW(selective_prefill(*model_, req, so, kv, ws, nullptr, &rep), Error) << n;
    so.policy.drift = nullptr;
    EXPECT_THROW(selective_prefill(*model_, req, so, kv, ws, nullptr, &rep), Error) << n;
  }
}

TEST(SharedBudget, KeepsTheTotalAndFollowsTheScoresAcrossChunks) {
  const std::vector<float> lo = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, hi = {50, 40, 30};
  const std::vector<float> mid = {5.5f, 5.5f, 5.5f, 5.5f};
  // Totals: ceil(0.3 * 10) + ceil(0.3 * 3) + ceil(0.3 * 4) = 3 + 1 + 2 = 6 go to 50, 40, 30,
  // 10, 9, 8: hi gets all three, lo three, mid none.
  EXPECT_EQ(shared_budget({&lo, &hi, &mid}, 0.3), (std::vector<int>{3, 3, 0}));
  // Equal scores go to the earlier chunk, then the lower index.
  const std::vector<float> same = {1, 1, 1, 1};
  EXPECT_EQ(shared_budget({&same, &same}, 0.25), (std::vector<int>{2, 0}));
  EXPECT_EQ(shared_budget({&same, &same}, 1.0), (std::vector<int>{4, 4}));
  EXPECT_EQ(shared_budget({&same, &same}, 0.0), (std::vector<int>{0, 0}));
  EXPECT_TRUE(shared_budget({}, 0.3).empty());
  const std::vector<float> bad = {1, std::nanf("")};
  EXPECT_THROW(shared_budget({&bad}, 0.5), Error);
}

TEST_F(OfflinePolicyTest, ProbeSharedSpendsTheRequestBudgetOnTheTopProbeScores) {
  const ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(37, 21), probe_options());
  const ChunkKV b = encode_chunk(*model_, test::random_byte_tokens(23, 22), probe_options());
  const ChunkKV c = encode_chunk(*model_, test::random_byte_tokens(9, 23), probe_options());
  InMemoryChunk sa(a), sb(b), sc(c);
  ComposedRequest req{
      test::random_byte_tokens(3, 24), {&sa, &sb, &sc}, test::random_byte_tokens(4, 25)};
  const RequestLayout lay = layout_request(req);
  for (double r : {0.15, 0.4}) {
    SelectiveOptions so;
    so.policy.kind = &find_policy("probe-shared");
    so.policy.ratio = r;
    KVCache kv = model_->make_cache(lay.n_total);
    Workspace ws;
    SelectionReport rep;
    selective_prefill(*model_, req, so, kv, ws, nullptr, &rep);
    ASSERT_EQ(rep.selected.size(), 3u);
    // The selection is the request's top n_select sum of all probe scores, chunk by chunk...
    struct Cand {
      float s;
      int c, t;
    };
    std::vector<Cand> all;
    int total = 0;
    const ChunkKV* recs[] = {&a, &b, &c};
    for (int k = 0; k < 3; ++k) {
      total += n_select(r, recs[k]->meta.n_tok);
      for (int t = 0; t < recs[k]->meta.n_tok; ++t) all.push_back({recs[k]->meta.scores[t], k, t});
    }
    std::stable_sort(all.begin(), all.end(),
                     [](const Cand& x, const Cand& y) { return x.s > y.s; });
    std::vector<std::vector<int32_t>> want(3);
    for (int i = 0; i < total; ++i) want[all[i].c].push_back(all[i].t);
    for (auto& w : want) std::sort(w.begin(), w.end());
    EXPECT_EQ(rep.selected, want) << "r " << r;
    // ...and, for each chunk, a prefix of its stored order (one contiguous read of the rest).
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(rep.selected[k], top_of_order(recs[k]->meta.order, (int)want[k].size()));
    }
  }
  // Records without the probe ranking are refused with the reason.
  const ChunkKV lf = encode_chunk(*model_, test::random_byte_tokens(20, 26), lowfreq_options());
  InMemoryChunk slf(lf);
  ComposedRequest bad{
      test::random_byte_tokens(3, 24), {&sa, &slf}, test::random_byte_tokens(4, 25)};
  SelectiveOptions so;
  so.policy.kind = &find_policy("probe-shared");
  KVCache kv = model_->make_cache(layout_request(bad).n_total);
  Workspace ws;
  EXPECT_THROW(selective_prefill(*model_, bad, so, kv, ws), Error);
}

TEST_F(OfflinePolicyTest, ProbePosWeighsEachChunkByItsPosition) {
  // Two copies of one chunk: equal probe scores, so probe-shared gives the earlier copy every
  // tie, while probe-pos weighs the later copy by ln(1 + its middle position) and gives it more.
  const ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(40, 41), probe_options());
  InMemoryChunk sa(a);
  ComposedRequest req{test::random_byte_tokens(2, 42), {&sa, &sa}, test::random_byte_tokens(4, 43)};
  const RequestLayout lay = layout_request(req);
  const double r = 0.2;
  const int total = 2 * n_select(r, 40);
  auto run = [&](const char* name) {
    SelectiveOptions so;
    so.policy.kind = &find_policy(name);
    so.policy.ratio = r;
    KVCache kv = model_->make_cache(lay.n_total);
    Workspace ws;
    SelectionReport rep;
    selective_prefill(*model_, req, so, kv, ws, nullptr, &rep);
    return rep.selected;
  };
  const auto shared = run("probe-shared"), pos = run("probe-pos");
  EXPECT_GE(shared[0].size(), shared[1].size());
  EXPECT_GT(pos[1].size(), pos[0].size());
  EXPECT_EQ((int)(pos[0].size() + pos[1].size()), total);
  // The same selection as a brute force over the weighted scores, each a prefix of the order.
  struct Cand {
    float s;
    int c, t;
  };
  std::vector<Cand> all;
  for (int c = 0; c < 2; ++c) {
    const float w = (float)std::log1p(lay.chunk_offset[c] + 0.5 * 40);
    for (int t = 0; t < 40; ++t) all.push_back({a.meta.scores[t] * w, c, t});
  }
  std::stable_sort(all.begin(), all.end(), [](const Cand& x, const Cand& y) { return x.s > y.s; });
  std::vector<std::vector<int32_t>> want(2);
  for (int i = 0; i < total; ++i) want[all[i].c].push_back(all[i].t);
  for (auto& w : want) std::sort(w.begin(), w.end());
  EXPECT_EQ(pos, want);
  for (int c = 0; c < 2; ++c) EXPECT_EQ(pos[c], top_of_order(a.meta.order, (int)pos[c].size()));
}

TEST_F(OfflinePolicyTest, ProbeScoresShareOneScaleAcrossChunks) {
  // The mean score of a chunk is its mean probe drift (not 1, as a per-chunk normalisation
  // would make it), so chunks differ; the order within a chunk follows the scores.
  std::vector<double> means;
  for (uint64_t seed : {31, 32, 33}) {
    const ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(30, seed), probe_options());
    double m = 0;
    for (float v : a.meta.scores) m += v;
    means.push_back(m / a.meta.n_tok);
    EXPECT_GT(means.back(), 0.0);
  }
  EXPECT_FALSE(std::fabs(means[0] - means[1]) < 1e-6 && std::fabs(means[1] - means[2]) < 1e-6);
  EXPECT_EQ(probe_params(ProbeOptions()).rfind("probe2:", 0), 0u);
}

// attention_received's weights against the documented formula, computed here from the sums:
// a short chunk (every row tapped) and a long one (the last kAttentionRows rows).
TEST(AttentionWeights, FollowTheDocumentedShrinkageFormula) {
  for (int n : {6, kAttentionRows + 37}) {
    SCOPED_TRACE(n);
    std::vector<float> sums(n);
    for (int j = 0; j < n; ++j) sums[j] = (float)((j * 7919) % 13) * 0.25f;
    sums[0] = 10.0f * (float)n;  // far above any other token's share
    const int L = 2, first = std::max(0, n - kAttentionRows);
    EXPECT_EQ(attention_first_row(n), first);
    double total = 0, seen = 0;
    for (int j = 0; j < n; ++j) {
      total += sums[j] / L;
      seen += n - std::max(j, first);
    }
    const double mean = total / seen;
    const std::vector<float> w = attention_received(sums.data(), n, L);
    ASSERT_EQ(w.size(), (size_t)n);
    for (int j = 0; j < n; ++j) {
      const double want = (sums[j] / L + 16 * mean) / (n - std::max(j, first) + 16) / mean;
      EXPECT_NEAR(w[j], want, 1e-6 * want) << j;
    }
    EXPECT_EQ(attention_rank(w).order[0], 0);  // given far the most
  }
  // By hand: two tokens, one layer, sums {1, 1}: token 0 is seen by 2 rows, token 1 by 1; the
  // mean is 2 / 3, so a_0 = (1 + 16 * 2/3) / 18 and a_1 = (1 + 16 * 2/3) / 17, over 2/3.
  const std::vector<float> two = {1.0f, 1.0f};
  const std::vector<float> w2 = attention_received(two.data(), 2, 1);
  EXPECT_NEAR(w2[0], (1 + 32.0 / 3) / 18 * 1.5, 1e-6);
  EXPECT_NEAR(w2[1], (1 + 32.0 / 3) / 17 * 1.5, 1e-6);
  const std::vector<float> zero(4, 0.0f);
  EXPECT_EQ(attention_received(zero.data(), 4, 3), std::vector<float>(4, 1.0f));
  const std::vector<float> bad = {1.0f, -1.0f};
  EXPECT_THROW(attention_received(bad.data(), 2, 1), Error);
  const std::vector<float> nan = {1.0f, std::nanf("")};
  EXPECT_THROW(attention_received(nan.data(), 2, 1), Error);
}

// The attn ranking is the attention the chunk's last rows give each chunk token in the isolated
// encoding (the sink key left out): the reference runs the plain layer loop with the attention
// tap from the chunk's row attention_first_row(n), for a chunk shorter and one longer than the
// tapped rows.
TEST_F(OfflinePolicyTest, AttnRankingIsTheAttentionOfTheIsolatedEncoding) {
  const ModelConfig& c = model_->config();
  for (auto [sink, len] :
       {std::pair{true, 31}, std::pair{false, 31}, std::pair{true, kAttentionRows + 20}}) {
    SCOPED_TRACE(std::string(sink ? "sink " : "no sink ") + std::to_string(len));
    const auto toks = test::random_byte_tokens(len, 17);
    const int n = (int)toks.size();
    EncodeOptions eo;
    eo.sink = sink;
    eo.rank.mode = RankMode::kAttn;
    const ChunkKV a = encode_chunk(*model_, toks, eo);
    EXPECT_EQ(a.meta.rank_mode, "attn");
    EXPECT_EQ(a.meta.rank_params, "attn2:last=64:prior=16");

    std::vector<int32_t> iso;
    if (sink) iso.push_back(model_->tokenizer().bos() >= 0 ? model_->tokenizer().bos() : 0);
    iso.insert(iso.end(), toks.begin(), toks.end());
    const int ni = (int)iso.size(), off = sink ? 1 : 0;
    KVCache kv(c.n_layer, ni, c.kv_dim());
    Workspace ws;
    std::vector<float> x((size_t)ni * c.n_embd), probs(ni, 0.0f);
    model_->embed(iso.data(), ni, x.data());
    std::vector<int32_t> pos(ni);
    std::iota(pos.begin(), pos.end(), 0);
    for (int l = 0; l < c.n_layer; ++l) {
      LayerTap tap;
      tap.probs_accum = probs.data();
      tap.probs_from_row = off + std::max(0, n - kAttentionRows);
      cpu::forward_layer(*model_, l, x.data(), pos.data(), ni, kv, ws, &tap);
    }
    // Each tapped row's head-averaged probabilities sum to 1 over all keys (the sink included),
    // in every layer.
    double total = 0;
    for (float v : probs) total += v;
    EXPECT_NEAR(total, (double)c.n_layer * std::min(n, kAttentionRows), 1e-3 * c.n_layer);
    const std::vector<float> want = attention_received(probs.data() + off, n, c.n_layer);
    ASSERT_EQ(a.meta.scores.size(), (size_t)n);
    for (int j = 0; j < n; ++j) EXPECT_NEAR(a.meta.scores[j], want[j], 1e-5f * want[j]) << j;
    const auto [mn, mx] = std::minmax_element(want.begin(), want.end());
    EXPECT_LT(*mn, *mx);  // the tiny model attends unevenly
  }
}

// probe-attn: the probe scores times the attention weights, stored with its own rank mode and
// parameters (so its own id), the same whether stored or computed beside another ranking; each
// of the three selects exactly its budget from its ranking's top.
TEST_F(OfflinePolicyTest, ProbeAttnWeighsTheProbeDriftByAttention) {
  const auto toks = test::random_byte_tokens(45, 19);
  EncodeOptions pa = probe_options();
  pa.rank.mode = RankMode::kProbeAttn;
  const ChunkKV p = encode_chunk(*model_, toks, probe_options());
  EncodeOptions at = probe_options();
  at.rank.mode = RankMode::kAttn;
  const ChunkKV w = encode_chunk(*model_, toks, at);
  const ChunkKV a = encode_chunk(*model_, toks, pa);
  EXPECT_EQ(a.meta.rank_mode, "probe-attn");
  EXPECT_EQ(a.meta.rank_params, probe_params(ProbeOptions()) + ":" + attention_params());
  EXPECT_NE(a.meta.id, p.meta.id);
  EXPECT_NE(a.meta.id, w.meta.id);
  for (int j = 0; j < 45; ++j) {
    EXPECT_FLOAT_EQ(a.meta.scores[j], p.meta.scores[j] * w.meta.scores[j]) << j;
  }
  EXPECT_TRUE(is_permutation_of_n(a.meta.order, 45));
  EXPECT_NE(a.meta.order, p.meta.order);  // the weighting changes the ranking
  // Computed beside a stored low-frequency ranking: the same three rankings.
  EncodeOptions lf = lowfreq_options();
  for (RankMode m : {RankMode::kProbe, RankMode::kAttn, RankMode::kProbeAttn}) {
    RankOptions r;
    r.mode = m;
    lf.also.push_back(r);
  }
  EncodeExtras ex;
  const ChunkKV l = encode_chunk(*model_, toks, lf, &ex);
  ASSERT_EQ(ex.rankings.size(), 3u);
  EXPECT_EQ(ex.rankings[0].order, p.meta.order);
  EXPECT_EQ(ex.rankings[1].order, w.meta.order);
  EXPECT_EQ(ex.rankings[2].order, a.meta.order);
  // The policies read the stored ranking, or one remembered for the record; else they say how
  // to ingest.
  InMemoryChunk sl(l);
  PolicyOptions po;
  po.kind = &find_policy("probe-attn");
  EXPECT_THROW(select_offline(sl, po), Error);
  remember_ranking(l.meta.id, "probe-attn", ex.rankings[2]);
  remember_ranking(l.meta.id, "attn", ex.rankings[1]);
  InMemoryChunk sa(a), sw(w);
  for (double r : {0.0, 0.15, 0.5, 1.0}) {
    po.ratio = r;
    const int k = n_select(r, 45);
    for (const auto& [name, src, order] :
         {std::tuple{"probe-attn", &sa, &a.meta.order},
          std::tuple{"probe-attn", &sl, &a.meta.order}, std::tuple{"attn", &sw, &w.meta.order},
          std::tuple{"attn", &sl, &w.meta.order}}) {
      po.kind = &find_policy(name);
      std::vector<int32_t> top(order->begin(), order->begin() + k);
      std::sort(top.begin(), top.end());
      EXPECT_EQ(select_offline(*src, po), top) << name << " r=" << r;
    }
  }
  EXPECT_EQ(find_policy("probe-attn").ingest_rankings(),
            std::vector<RankMode>{RankMode::kProbeAttn});
  EXPECT_EQ(parse_rank_mode("probe-attn"), RankMode::kProbeAttn);
  EXPECT_EQ(parse_rank_mode("attn"), RankMode::kAttn);
}

}  // namespace
}  // namespace ct
