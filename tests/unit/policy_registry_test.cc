// Policies as objects (issue 12 item 4): the registry knows every policy by a unique name and
// lists them on an unknown one; traits agree with stages; a hook of another stage is refused; and
// a policy written outside src/reuse (here, in the test) runs through selective_prefill's one
// layer loop without any change there, at each of the stages that use the loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <set>

#include "core/error.h"
#include "reuse/encoder.h"
#include "reuse/policy.h"
#include "reuse/selective.h"
#include "support/chunk_fixtures.h"
#include "support/random_data.h"
#include "support/tiny_model.h"

namespace ct {
namespace {


TEST(PolicyRegistry, EveryPolicyHasAUniqueFindableName) {
  std::set<std::string> names;
  for (const Policy* p : all_policies()) {
    EXPECT_TRUE(names.insert(p->name()).second) << "duplicate policy name " << p->name();
    EXPECT_EQ(&find_policy(p->name()), p);
    EXPECT_GT(std::string(p->summary()).size(), 10u) << p->name();
  }
  const std::set<std::string> want = {
      "full",   "reuse", "cachetune",    "prefix",    "cacheblend", "epic",
      "random", "l2",    "highfreq",     "lfonly",    "prophetkv",  "freq",
      "head",   "probe", "probe-shared", "probe-pos", "oracle",     "oracle-shared",
      "attn",   "probe-attn", "probe-attn-shared"};
  EXPECT_EQ(names, want);
  EXPECT_STREQ(default_policy().name(), "cachetune");
  EXPECT_EQ(PolicyOptions{}.kind, &default_policy());
}

TEST(PolicyRegistry, AnUnknownNameListsTheKnownOnes) {
  try {
    find_policy("magic");
    FAIL() << "no error for an unknown policy";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'magic'"), std::string::npos) << msg;
    for (const Policy* p : all_policies()) {
      EXPECT_NE(msg.find(p->name()), std::string::npos) << msg;
    }
  }
}

TEST(PolicyRegistry, TraitsAgreeWithStages) {
  for (const Policy* p : all_policies()) {
    SCOPED_TRACE(p->name());
    // Only a token-list policy places or reads rows of the host cache itself; the layer loop's
    // policies leave the cache to the backend.
    if (p->uses_host_cache()) {
      EXPECT_EQ(p->stage(), PolicyStage::kTokens);
    }
    // A token-list prefill has no per-chunk recompute set to score.
    if (p->stage() == PolicyStage::kTokens) {
      EXPECT_FALSE(p->scored());
    }
  }
  EXPECT_FALSE(find_policy("cachetune").uses_host_cache());
  EXPECT_FALSE(find_policy("cacheblend").uses_host_cache());
  EXPECT_TRUE(find_policy("oracle").eval_only());
  EXPECT_TRUE(find_policy("prefix").uses_host_cache());
  EXPECT_FALSE(find_policy("lfonly").uses_host_cache());
  EXPECT_TRUE(find_policy("prefix").uses_prefix_cache());
  EXPECT_EQ(find_policy("cacheblend").stage(), PolicyStage::kAfterLayer0);
  EXPECT_EQ(find_policy("lfonly").stage(), PolicyStage::kTokens);
}

class PolicyInterfaceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::TinyModelOptions o;
    o.n_layer = 4;
    const std::string path = test::temp_path("ct_policy_registry_tiny.gguf");
    test::write_tiny_model(path, o);
    model_ = Model::load(path);
    a_ = std::make_unique<ChunkKV>(encode_chunk(*model_, test::random_byte_tokens(41, 3), {}));
    b_ = std::make_unique<ChunkKV>(encode_chunk(*model_, test::random_byte_tokens(23, 4), {}));
    sa_ = std::make_unique<InMemoryChunk>(*a_);
    sb_ = std::make_unique<InMemoryChunk>(*b_);
  }
  static void TearDownTestSuite() {
    sa_.reset();
    sb_.reset();
    a_.reset();
    b_.reset();
    model_.reset();
  }
  static ComposedRequest request() {
    return {test::random_byte_tokens(5, 1), {sa_.get(), sb_.get()}, test::random_byte_tokens(6, 2)};
  }
  static std::vector<float> run(const Policy& p, SelectionReport* rep,
                                const std::vector<std::vector<float>>* drift = nullptr) {
    const ComposedRequest req = request();
    KVCache kv = model_->make_cache(layout_request(req).n_total);
    Workspace ws;
    SelectiveOptions so;
    so.policy.kind = &p;
    so.policy.ratio = 0.2;
    so.policy.drift = drift;
    return selective_prefill(*model_, req, so, kv, ws, nullptr, rep);
  }
  static std::unique_ptr<Model> model_;
  static std::unique_ptr<ChunkKV> a_, b_;
  static std::unique_ptr<InMemoryChunk> sa_, sb_;
};
std::unique_ptr<Model> PolicyInterfaceTest::model_;
std::unique_ptr<ChunkKV> PolicyInterfaceTest::a_, PolicyInterfaceTest::b_;
std::unique_ptr<InMemoryChunk> PolicyInterfaceTest::sa_, PolicyInterfaceTest::sb_;

// Not registered anywhere: the last ceil(r*N) tokens of each chunk.
class TailPolicy final : public Policy {
 public:
  TailPolicy() : Policy("tail", "the last ceil(r*N) tokens (test only)", PolicyStage::kChunk) {}
  std::vector<int32_t> select_chunk(const ChunkSource& c, const PolicyOptions& p) const override {
    const int n = c.meta().n_tok, k = n_select(p.ratio, n);
    std::vector<int32_t> s(k);
    std::iota(s.begin(), s.end(), n - k);
    return s;
  }
};

// Not registered: from the check layer's fresh K/V, the token whose key has the largest first
// channel.
class Layer0Policy final : public Policy {
 public:
  Layer0Policy()
      : Policy("layer0-argmax", "largest check-layer key channel 0 (test only)",
               PolicyStage::kAfterLayer0) {}
  std::vector<int32_t> select_after_layer0(const ChunkSource& c, int layer, const float* k,
                                           const float*, const PolicyOptions&) const override {
    const int n = c.meta().n_tok, KV = c.meta().kv_dim;
    int best = 0;
    for (int t = 1; t < n; ++t) {
      if (k[(size_t)t * KV] > k[(size_t)best * KV]) best = t;
    }
    seen.push_back(best);
    layers.push_back(layer);
    k_rows.emplace_back(k, k + (size_t)n * KV);
    return {best};
  }
  mutable std::vector<int32_t> seen, layers;
  mutable std::vector<std::vector<float>> k_rows;  // per call, the rows the hook was given
};

TEST_F(PolicyInterfaceTest, AnUnregisteredChunkPolicyRunsThroughTheLayerLoop) {
  TailPolicy tail;
  SelectionReport rep;
  const std::vector<float> got = run(tail, &rep);
  ASSERT_EQ(rep.selected.size(), 2u);
  EXPECT_EQ(rep.selected[0], tail.select_chunk(*sa_, PolicyOptions{&tail, 0.2}));
  EXPECT_EQ(rep.selected[1], tail.select_chunk(*sb_, PolicyOptions{&tail, 0.2}));
  // The same selection made by the registered oracle (a drift of 1 on exactly those tokens)
  // gives the same logits, bit for bit: one layer loop serves both.
  std::vector<std::vector<float>> drift;
  for (size_t c = 0; c < 2; ++c) {
    drift.emplace_back(request().chunks[c]->meta().n_tok, 0.0f);
    for (int32_t t : rep.selected[c]) drift[c][t] = 1.0f;
  }
  SelectionReport orep;
  const std::vector<float> want = run(find_policy("oracle"), &orep, &drift);
  EXPECT_EQ(orep.selected, rep.selected);
  EXPECT_EQ(got, want);
}

TEST_F(PolicyInterfaceTest, AnUnregisteredLayer0PolicyChoosesFromLayerOnesFreshKeys) {
  Layer0Policy p;
  SelectionReport rep;
  run(p, &rep);
  ASSERT_EQ(p.seen.size(), 2u);  // called once per chunk
  ASSERT_EQ(rep.selected.size(), 2u);
  EXPECT_EQ(rep.selected[0], std::vector<int32_t>{p.seen[0]});
  EXPECT_EQ(rep.selected[1], std::vector<int32_t>{p.seen[1]});
  EXPECT_EQ(p.layers, (std::vector<int32_t>{Policy::kCheckLayer, Policy::kCheckLayer}));
  // The hook got layer 1's keys of each chunk's own positions as a full prefill of the request
  // computes them (layer 0 ran on every row), not the stored ones of the chunk encoded alone:
  // layer 1's keys see the context, which in the request is another one. (Layer 0's keys depend
  // on the token alone: ranking them, as this hook's first version did, ranks rounding.)
  const ComposedRequest req = request();
  const RequestLayout lay = layout_request(req);
  const int N = lay.n_total, KV = model_->config().kv_dim(), L = model_->config().n_layer;
  std::vector<float> k((size_t)L * N * KV), v(k.size());
  tapped_prefill(*model_, lay.tokens.data(), N, nullptr, k.data(), v.data());
  for (int c = 0; c < 2; ++c) {
    const ChunkKV& rec = c == 0 ? *a_ : *b_;
    const int n = rec.meta.n_tok;
    const float* want = k.data() + ((size_t)Policy::kCheckLayer * N + lay.chunk_offset[c]) * KV;
    const ChunkKVF32 f = unpack_text_order(rec);
    const float* stored = f.k_layer(Policy::kCheckLayer, n, KV);
    ASSERT_EQ(p.k_rows[c].size(), (size_t)n * KV);
    float worst = 0, apart = 0, scale = 0;
    for (size_t i = 0; i < p.k_rows[c].size(); ++i) {
      worst = std::max(worst, std::fabs(p.k_rows[c][i] - want[i]));
      apart = std::max(apart, std::fabs(p.k_rows[c][i] - stored[i]));
      scale = std::max(scale, std::fabs(want[i]));
    }
    EXPECT_LE(worst, 1e-5f * scale) << "chunk " << c << ", key scale " << scale;
    EXPECT_GT(apart, 0.05f * scale) << "chunk " << c << ", key scale " << scale;
  }
}

TEST_F(PolicyInterfaceTest, HooksOfAnotherStageAreRefused) {
  const PolicyOptions po;
  EXPECT_THROW(find_policy("cacheblend").select_chunk(*sa_, po), Error);
  EXPECT_THROW(find_policy("prophetkv").select_chunk(*sa_, po), Error);
  EXPECT_THROW(find_policy("cachetune").select_after_layer0(*sa_, 1, nullptr, nullptr, po), Error);
  // The oracle without the true drift names what is missing.
  SelectionReport rep;
  EXPECT_THROW(run(find_policy("oracle"), &rep), Error);
}

}  // namespace
}  // namespace ct
