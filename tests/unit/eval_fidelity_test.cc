// Fidelity measures of the evaluation (src/eval/fidelity.h): KL and cosine on hand-checked cases,
// Recall@r on known sets, drift on synthetic K/V and on a tiny random model (an isolated chunk
// re-encoded in the same context has no drift; a different preceding context does), the
// capture pass against selective prefill's query attention, and the re-ranked record copy.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "eval/chunk_cache.h"
#include "eval/fidelity.h"
#include "reuse/encoder.h"
#include "reuse/freq_rank.h"
#include "reuse/selective.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

TEST(EvalKl, IdenticalIsZeroAndShiftInvariant) {
  const std::vector<float> p = {1.0f, -2.0f, 0.5f, 3.0f};
  EXPECT_EQ(kl_from_logits(p.data(), p.data(), 4), 0.0);
  std::vector<float> q = p;
  for (float& x : q) x += 7.0f;  // softmax unchanged
  EXPECT_NEAR(kl_from_logits(p.data(), q.data(), 4), 0.0, 1e-12);
}

TEST(EvalKl, KnownTwoClassCase) {
  // P = (0.5, 0.5), Q = (0.8, 0.2): KL = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2).
  const std::vector<float> p = {0.0f, 0.0f};
  const std::vector<float> q = {(float)std::log(0.8), (float)std::log(0.2)};
  const double want = 0.5 * std::log(0.5 / 0.8) + 0.5 * std::log(0.5 / 0.2);
  EXPECT_NEAR(kl_from_logits(p.data(), q.data(), 2), want, 1e-7);
  // Not symmetric: KL(Q || P) = 0.8 ln(0.8/0.5) + 0.2 ln(0.2/0.5).
  const double back = 0.8 * std::log(0.8 / 0.5) + 0.2 * std::log(0.2 / 0.5);
  EXPECT_NEAR(kl_from_logits(q.data(), p.data(), 2), back, 1e-7);
}

TEST(EvalKl, MeanOverPositions) {
  // Row 0 identical, row 1 the two-class case above: mean = half of it.
  const std::vector<float> p = {0.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<float> q = {0.0f, 0.0f, (float)std::log(0.8), (float)std::log(0.2)};
  const double one = 0.5 * std::log(0.5 / 0.8) + 0.5 * std::log(0.5 / 0.2);
  EXPECT_NEAR(mean_kl_from_logits(p, q, 2, 2), one / 2, 1e-7);
  EXPECT_EQ(mean_kl_from_logits(p, q, 2, 1), 0.0);
  EXPECT_THROW(mean_kl_from_logits(p, q, 2, 3), Error);
  EXPECT_THROW(mean_kl_from_logits(p, q, 2, 0), Error);
}

TEST(EvalCosine, KnownCases) {
  const std::vector<float> a = {1, 0, 0}, b = {0, 2, 0}, c = {3, 4, 0}, z = {0, 0, 0};
  EXPECT_DOUBLE_EQ(cosine_similarity(a.data(), a.data(), 3), 1.0);
  EXPECT_DOUBLE_EQ(cosine_similarity(a.data(), b.data(), 3), 0.0);
  EXPECT_NEAR(cosine_similarity(a.data(), c.data(), 3), 0.6, 1e-12);
  EXPECT_EQ(cosine_similarity(a.data(), z.data(), 3), 0.0);
  std::vector<float> s = c;
  for (float& x : s) x *= 0.25f;  // scale-invariant
  EXPECT_NEAR(cosine_similarity(c.data(), s.data(), 3), 1.0, 1e-12);
}

TEST(EvalRecall, KnownSets) {
  // 10 tokens, r = 0.2 -> reference = the 2 largest drifts: tokens 7 and 2.
  std::vector<float> drift(10, 1.0f);
  drift[7] = 9.0f;
  drift[2] = 5.0f;
  EXPECT_EQ(recall_at({2, 7}, drift, 0.2).hits, 2);
  EXPECT_EQ(recall_at({2, 7}, drift, 0.2).n_ref, 2);
  EXPECT_DOUBLE_EQ(recall_at({7, 0}, drift, 0.2).recall(), 0.5);
  EXPECT_DOUBLE_EQ(recall_at({}, drift, 0.2).recall(), 0.0);
  // Ties go to the lower index: with all drifts equal the reference is {0, 1}.
  const std::vector<float> flat(10, 1.0f);
  EXPECT_EQ(recall_at({0, 1}, flat, 0.2).hits, 2);
  EXPECT_EQ(recall_at({8, 9}, flat, 0.2).hits, 0);
  // n_select rounds up: 0.15 of 10 is 2 tokens.
  EXPECT_EQ(recall_at({}, drift, 0.15).n_ref, 2);
  EXPECT_THROW(recall_at({10}, drift, 0.2), Error);
  // Pooling over chunks sums hits and reference sizes.
  RecallCount pooled = recall_at({7}, drift, 0.2);
  pooled += recall_at({0, 1}, flat, 0.2);
  EXPECT_EQ(pooled.hits, 3);
  EXPECT_EQ(pooled.n_ref, 4);
  EXPECT_DOUBLE_EQ(pooled.recall(), 0.75);
}

TEST(EvalDrift, SyntheticLayersWeighByTheirScale) {
  // 2 layers, 3 tokens, kv_dim 2. Every key row has norm 1 in layer 0 and 100 in layer 1. The
  // context turns token 0's key in layer 0 and token 2's key in layer 1 by 90 degrees: a change
  // of sqrt(2) times the layer's scale in both, so both tokens get 0.5 * sqrt(2). V (norm 1)
  // is unchanged.
  const int n = 3, d = 2;
  const std::vector<float> iso0 = {1, 0, 1, 0, 1, 0}, ctx0 = {0, 1, 1, 0, 1, 0};
  const std::vector<float> iso1 = {100, 0, 100, 0, 100, 0}, ctx1 = {100, 0, 100, 0, 0, 100};
  const std::vector<const float*> ki = {iso0.data(), iso1.data()}, kc = {ctx0.data(), ctx1.data()};
  const std::vector<const float*> v = {iso0.data(), iso0.data()};
  const auto drift = kv_drift(ki, v, kc, v, n, d);
  ASSERT_EQ(drift.size(), 3u);
  EXPECT_NEAR(drift[0], 0.5 * std::sqrt(2.0), 1e-6);
  EXPECT_NEAR(drift[1], 0.0f, 1e-6);
  EXPECT_NEAR(drift[2], 0.5 * std::sqrt(2.0), 1e-6);
  EXPECT_NEAR(kv_max_abs_diff(ki, v, kc, v, n, d), 100.0, 1e-9);
  // A layer whose context rows are all zero contributes nothing.
  const std::vector<float> zeros(n * d, 0.0f);
  const auto z = kv_drift({iso0.data()}, {iso0.data()}, {zeros.data()}, {zeros.data()}, n, d);
  for (float x : z) EXPECT_EQ(x, 0.0f);
  EXPECT_THROW(kv_drift(ki, v, {ctx0.data()}, v, n, d), Error);
}

class EvalTinyModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::temp_path("ct_eval_fidelity_tiny.gguf");
    test::TinyModelOptions o;
    o.n_layer = 3;
    test::write_tiny_model(path, o);
    model_ = Model::load(path).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static Model* model_;
};
Model* EvalTinyModelTest::model_ = nullptr;

TEST_F(EvalTinyModelTest, DriftIsZeroInTheEncodingContextAndPositiveElsewhere) {
  const Model& m = *model_;
  EncodeOptions eo;
  eo.dtype = KvDtype::F32;  // no storage rounding: the same context must give the same K/V
  const auto chunk = test::random_byte_tokens(40, 1);
  const ChunkKV rec = encode_chunk(m, chunk, eo);
  // The encoding context is [sink][chunk]: the same rows in a longer prompt do not change
  // (causal attention), so the drift is zero up to kernel rounding.
  std::vector<int32_t> same = {m.tokenizer().bos() >= 0 ? m.tokenizer().bos() : 0};
  same.insert(same.end(), chunk.begin(), chunk.end());
  const auto tail = test::random_byte_tokens(5, 2);
  same.insert(same.end(), tail.begin(), tail.end());
  double diff_same = 0;
  const auto drift_same = chunk_drift(rec, capture_prefill_kv(m, same), 1, &diff_same);
  EXPECT_LT(diff_same, 1e-4);
  EXPECT_THROW(chunk_drift(rec, capture_prefill_kv(m, same), 10), Error);  // rows 10..49 of 46
  // After 30 other tokens every layer above the first sees a different context.
  std::vector<int32_t> other = test::random_byte_tokens(30, 3);
  other.insert(other.end(), chunk.begin(), chunk.end());
  double diff_other = 0;
  const auto drift = chunk_drift(rec, capture_prefill_kv(m, other), 30, &diff_other);
  EXPECT_GT(diff_other, 1e-3);
  double sum = 0, sum_same = 0;
  for (size_t t = 0; t < drift.size(); ++t) {
    EXPECT_TRUE(std::isfinite(drift[t]));
    EXPECT_GE(drift[t], 0.0f);
    sum += drift[t];
    sum_same += drift_same[t];
  }
  EXPECT_GT(sum, 0.01 * drift.size());
  EXPECT_GT(sum, 1000 * sum_same);
}

TEST_F(EvalTinyModelTest, CaptureAttentionMatchesSelectiveFullPrefill) {
  const Model& m = *model_;
  const ChunkKV a = encode_chunk(m, test::random_byte_tokens(24, 4), EncodeOptions{});
  const ChunkKV b = encode_chunk(m, test::random_byte_tokens(17, 5), EncodeOptions{});
  InMemoryChunk sa(a), sb(b);
  const ComposedRequest req{
      test::random_byte_tokens(6, 6), {&sa, &sb}, test::random_byte_tokens(5, 7)};
  const RequestLayout lay = layout_request(req);
  KVCache kv = m.make_cache(lay.n_total);
  Workspace ws;
  SelectiveOptions so;
  so.policy.kind = &find_policy("full");
  std::vector<float> attn;
  so.query_attention = &attn;
  selective_prefill(m, req, so, kv, ws);
  const PrefillKV cap = capture_prefill_kv(m, lay.tokens, lay.query_begin);
  ASSERT_EQ(cap.query_attention.size(), attn.size());
  EXPECT_NEAR(cosine_similarity(cap.query_attention.data(), attn.data(), lay.n_total), 1.0, 1e-6);
  double sum = 0;
  for (float x : cap.query_attention) sum += x;
  EXPECT_NEAR(sum, 1.0, 1e-4);  // mean of probability distributions
  // Full recompute's pre-RoPE keys of the chunk rows are the captured ones: KV cache holds them
  // rotated, so compare V, which RoPE does not touch.
  const int KV = m.config().kv_dim();
  double mx = 0;
  for (int l = 0; l < m.config().n_layer; ++l) {
    for (size_t i = 0; i < (size_t)lay.n_total * KV; ++i) {
      mx = std::max(mx, (double)std::fabs(kv.v(l)[i] - cap.v[(size_t)l * lay.n_total * KV + i]));
    }
  }
  EXPECT_LT(mx, 1e-4);
}

TEST_F(EvalTinyModelTest, RerankedRecordKeepsValuesAndFollowsTheNewRanking) {
  const Model& m = *model_;
  const ChunkKV rec = encode_chunk(m, test::random_byte_tokens(50, 8), EncodeOptions{});
  RankOptions ro;
  ro.alpha = 0.1;
  const ChunkKV re = rerank_record(rec, ro);
  EXPECT_EQ(re.meta.order, rank_stored_chunk(rec, ro).order);
  EXPECT_EQ(re.meta.alpha, 0.1);
  EXPECT_NE(re.meta.id, rec.meta.id);
  const ChunkKVF32 a = unpack_text_order(rec), b = unpack_text_order(re);
  EXPECT_EQ(a.k, b.k);  // bytes moved, never re-rounded
  EXPECT_EQ(a.v, b.v);
  // The top rows are the new ranking's first tokens: read rank row 0 of layer 1 through a
  // source and compare with the text-order row.
  InMemoryChunk src(re);
  const size_t row = kv_bytes(re.meta.dtype, re.meta.kv_dim);
  std::vector<uint8_t> k0(row), v0(row), want(row);
  src.read_rows(1, 0, 1, k0.data(), v0.data());
  std::vector<float> got(re.meta.kv_dim);
  kv_unpack(re.meta.dtype, k0.data(), got.data(), re.meta.kv_dim);
  const float* w =
      a.k_layer(1, re.meta.n_tok, re.meta.kv_dim) + (size_t)re.meta.order[0] * re.meta.kv_dim;
  for (int i = 0; i < re.meta.kv_dim; ++i) EXPECT_EQ(got[i], w[i]);
}

TEST_F(EvalTinyModelTest, ChunkCacheHitsAndEvictsByBytes) {
  const Model& m = *model_;
  const auto t1 = test::random_byte_tokens(20, 9), t2 = test::random_byte_tokens(20, 10);
  const size_t one = encode_chunk(m, t1, EncodeOptions{}).meta.kv_bytes();
  ChunkCache cache(m, EncodeOptions{}, one + one / 2);  // room for one record
  auto a = cache.get(t1);
  auto a2 = cache.get(t1);
  EXPECT_EQ(a.get(), a2.get());
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), 1);
  cache.get(t2);  // evicts t1
  EXPECT_EQ(cache.bytes(), one);
  auto a3 = cache.get(t1);
  EXPECT_EQ(cache.misses(), 3);
  EXPECT_EQ(a3->meta.id, a->meta.id);  // same content, same id
  EXPECT_EQ(a3->k, a->k);
}

}  // namespace
}  // namespace ct
