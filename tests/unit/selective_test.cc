// Selective recomputation on tiny random models: r = 1 equals full recompute in any chunk
// order, r = 0 on a lone chunk at offset 0 equals plain prefill, deferred RoPE equals keys
// computed in place, reordering leaves chunk records untouched, and every policy's budget. Every
// test runs on three shapes: llama (adjacent-pair RoPE), qwen2 (Q/K/V biases, NEOX rotation,
// rope base 1e6, as Qwen2.5) and llama with Llama 3.1's rope_freqs.weight plus linear scaling.
#include "reuse/selective.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>

#include "backend/cpu_forward.h"
#include "core/error.h"
#include "core/sha256.h"
#include "reuse/encoder.h"
#include "reuse/freq_rank.h"
#include "support/chunk_fixtures.h"
#include "support/random_data.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

// The model shapes every test runs on (the test parameter).
test::TinyModelOptions variant_options(const std::string& variant) {
  test::TinyModelOptions o;
  o.n_layer = 4;
  if (variant == "qwen2") {
    o.arch = "qwen2";
    o.rope_theta = 1e6f;
  } else if (variant == "llama31_rope_freqs") {
    o.rope_theta = 500000.0f;
    o.rope_freq_factors = {1.0f, 1.0f, 1.5f, 2.0f, 3.0f, 5.0f, 8.0f, 8.0f};  // [head_dim / 2]
    o.rope_scaling_type = "linear";
    o.rope_scaling_factor = 2.0f;
  } else {
    CT_ASSERT(variant == "llama", "unknown test variant {}", variant);
  }
  return o;
}

class SelectiveTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    for (const char* v : {"llama", "qwen2", "llama31_rope_freqs"}) {
      const std::string path = test::temp_path("ct_selective_tiny_" + std::string(v) + ".gguf");
      test::write_tiny_model(path, variant_options(v));
      models_[v] = Model::load(path);
    }
  }
  static void TearDownTestSuite() {
    models_.clear();
    model_ = nullptr;
  }
  void SetUp() override {
    model_ = models_.at(GetParam()).get();
    // The variant really has the shape it is named for (a silently plain model proves nothing).
    const ModelConfig& c = model_->config();
    EXPECT_EQ(c.has_qkv_bias, GetParam() == "qwen2");
    EXPECT_EQ(c.rope_style == cpu::RopeStyle::kNeox, GetParam() == "qwen2");
    EXPECT_EQ(c.rope_freq_factors.empty(), GetParam() != "llama31_rope_freqs");
  }

  static std::vector<float> full_logits(const std::vector<int32_t>& toks) {
    KVCache kv = model_->make_cache((int)toks.size());
    Workspace ws;
    return cpu::prefill(*model_, toks.data(), (int)toks.size(), 0, kv, ws);
  }

  static std::vector<float> run(const ComposedRequest& req, const Policy* kind, double r,
                                SelectionReport* rep = nullptr, PrefixCache* pc = nullptr) {
    const RequestLayout lay = layout_request(req);
    KVCache kv = model_->make_cache(lay.n_total);
    Workspace ws;
    SelectiveOptions opt;
    opt.policy.kind = kind;
    opt.policy.ratio = r;
    opt.prefix_cache = pc;
    return selective_prefill(*model_, req, opt, kv, ws, nullptr, rep);
  }

  // Request sources for records; wrappers live as long as the test fixture.
  static const ChunkSource* src(const ChunkKV& c) {
    static std::vector<std::unique_ptr<InMemoryChunk>> keep;
    keep.push_back(std::make_unique<InMemoryChunk>(c));
    return keep.back().get();
  }

  static float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    return test::max_abs_diff(a, b);
  }

  // The largest difference between two caches' K and V of layer l over their first n rows.
  static float max_kv_diff(const KVCache& a, const KVCache& b, int l, int n) {
    const size_t cells = (size_t)n * a.kv_dim();
    float d = 0;
    for (size_t i = 0; i < cells; ++i) {
      d = std::max(d, std::fabs(a.k(l)[i] - b.k(l)[i]));
      d = std::max(d, std::fabs(a.v(l)[i] - b.v(l)[i]));
    }
    return d;
  }

  static std::string record_hash(const ChunkKV& c) {
    Sha256 h;
    for (int l = 0; l < c.meta.n_layer; ++l) {
      h.update(c.k[l].data(), c.k[l].size());
      h.update(c.v[l].data(), c.v[l].size());
    }
    h.update(c.meta.order.data(), c.meta.order.size() * 4);
    return h.hex_digest();
  }

  static std::map<std::string, std::unique_ptr<Model>> models_;
  static Model* model_;  // the current test's variant
};
std::map<std::string, std::unique_ptr<Model>> SelectiveTest::models_;
Model* SelectiveTest::model_ = nullptr;

INSTANTIATE_TEST_SUITE_P(Shapes, SelectiveTest,
                         ::testing::Values("llama", "qwen2", "llama31_rope_freqs"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

TEST_P(SelectiveTest, FullRatioEqualsFullRecomputeInAnyOrder) {
  EncodeOptions eo;
  ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(37, 1), eo);
  ChunkKV b = encode_chunk(*model_, test::random_byte_tokens(50, 2), eo);
  ChunkKV c = encode_chunk(*model_, test::random_byte_tokens(21, 3), eo);
  const auto prefix = test::random_byte_tokens(5, 4), query = test::random_byte_tokens(7, 5);
  for (std::vector<const ChunkSource*> order :
       {std::vector<const ChunkSource*>{src(a), src(b), src(c)},
        std::vector<const ChunkSource*>{src(c), src(a), src(b)},
        std::vector<const ChunkSource*>{src(b), src(b), src(a)}}) {
    ComposedRequest req{prefix, order, query};
    const auto want = full_logits(layout_request(req).tokens);
    EXPECT_LT(max_abs_diff(run(req, &find_policy("cachetune"), 1.0), want), 1e-4f);
    EXPECT_LT(max_abs_diff(run(req, &find_policy("full"), 0.15), want), 1e-4f);
  }
}

TEST_P(SelectiveTest, ZeroRatioLoneChunkAtOffsetZeroEqualsPlainPrefill) {
  EncodeOptions eo;
  eo.dtype = KvDtype::F32;
  eo.sink = false;  // encoded exactly as it sits in the request: position 0, no sink
  const auto toks = test::random_byte_tokens(64, 6), query = test::random_byte_tokens(6, 7);
  ChunkKV a = encode_chunk(*model_, toks, eo);
  ComposedRequest req{{}, {src(a)}, query};
  const auto want = full_logits(layout_request(req).tokens);
  EXPECT_LT(max_abs_diff(run(req, &find_policy("cachetune"), 0.0), want), 1e-4f);
  EXPECT_LT(max_abs_diff(run(req, &find_policy("reuse"), 0.0), want), 1e-4f);
  // And with F16 storage the difference is only the storage rounding.
  eo.dtype = KvDtype::F16;
  ChunkKV a16 = encode_chunk(*model_, toks, eo);
  ComposedRequest req16{{}, {src(a16)}, query};
  EXPECT_LT(max_abs_diff(run(req16, &find_policy("reuse"), 0.0), want), 2e-2f);
}

TEST_P(SelectiveTest, DeferredRopeEqualsKeysComputedAtThePosition) {
  // Layer-0 keys depend only on the token, so stored pre-RoPE keys rotated to global position p
  // must equal the keys a full prefill computes at p.
  EncodeOptions eo;
  eo.dtype = KvDtype::F32;
  const auto prefix = test::random_byte_tokens(29, 8), toks = test::random_byte_tokens(40, 9);
  ChunkKV a = encode_chunk(*model_, toks, eo);
  std::vector<int32_t> all = prefix;
  all.insert(all.end(), toks.begin(), toks.end());
  KVCache kv = model_->make_cache((int)all.size());
  Workspace ws;
  cpu::prefill(*model_, all.data(), (int)all.size(), 0, kv, ws);
  const int KV = model_->config().kv_dim(), off = (int)prefix.size();
  const ChunkKVF32 f = unpack_text_order(a);
  std::vector<float> rotated(f.k.begin(), f.k.begin() + (size_t)a.meta.n_tok * KV);
  std::vector<float> buf((size_t)(off + a.meta.n_tok) * KV);
  std::copy(rotated.begin(), rotated.end(), buf.begin() + (size_t)off * KV);
  std::vector<int32_t> pos(a.meta.n_tok);
  for (int t = 0; t < a.meta.n_tok; ++t) pos[t] = off + t;
  std::vector<float> cs, sn;
  model_->rope().angle_table(pos.data(), a.meta.n_tok, cs, sn);
  model_->rope().apply_at_positions(buf.data(), KV, model_->config().n_head_kv, pos.data(),
                                    a.meta.n_tok, cs.data(), sn.data());
  float worst = 0;
  for (int t = 0; t < a.meta.n_tok; ++t) {
    for (int i = 0; i < KV; ++i) {
      worst = std::max(
          worst, std::fabs(buf[(size_t)(off + t) * KV + i] - kv.k(0)[(size_t)(off + t) * KV + i]));
    }
  }
  EXPECT_LT(worst, 1e-5f);
}

TEST_P(SelectiveTest, ReorderingChangesOnlyPositions) {
  EncodeOptions eo;
  ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(45, 10), eo);
  ChunkKV b = encode_chunk(*model_, test::random_byte_tokens(33, 11), eo);
  const std::string ha = record_hash(a), hb = record_hash(b);
  const auto query = test::random_byte_tokens(5, 12);
  SelectionReport r1, r2;
  run(ComposedRequest{test::random_byte_tokens(3, 13), {src(a), src(b)}, query},
      &find_policy("cachetune"), 0.2, &r1);
  run(ComposedRequest{test::random_byte_tokens(300, 14), {src(b), src(a)}, query},
      &find_policy("cachetune"), 0.2, &r2);
  EXPECT_EQ(record_hash(a), ha);
  EXPECT_EQ(record_hash(b), hb);
  EXPECT_EQ(r1.selected[0], r2.selected[1]);
  EXPECT_EQ(r1.selected[1], r2.selected[0]);
  // The same text gets the same id wherever it appears; a different setting, another id.
  EXPECT_EQ(a.meta.id, encode_chunk(*model_, a.meta.tokens, eo).meta.id);
  EncodeOptions other = eo;
  other.rank.alpha = 0.3;
  EXPECT_NE(a.meta.id, chunk_id(model_->fingerprint(), a.meta.tokens, other));
}

TEST_P(SelectiveTest, EncodingAndRankingAreDeterministic) {
  EncodeOptions eo;
  const auto toks = test::random_byte_tokens(80, 15);
  ChunkKV a = encode_chunk(*model_, toks, eo), b = encode_chunk(*model_, toks, eo);
  EXPECT_EQ(record_hash(a), record_hash(b));
  EXPECT_EQ(a.meta.scores, b.meta.scores);
  // alpha = 1 keeps every frequency bin: the ranking is the L2 ranking.
  RankOptions all_bins{RankMode::kLowFreq, 1.0}, l2{RankMode::kL2, 0.5};
  const ChunkRanking r1 = rank_stored_chunk(a, all_bins), r2 = rank_stored_chunk(a, l2);
  for (int t = 0; t < a.meta.n_tok; ++t) EXPECT_NEAR(r1.scores[t], r2.scores[t], 1e-4f);
}

// The isolated encoding runs through the backend contract (CPU LayerBackend, taps); its stored
// K/V are the plain layer loop's pre-RoPE keys and values of the chunk after its sink, bit for bit.
TEST_P(SelectiveTest, EncodingThroughTheBackendEqualsThePlainLayerLoop) {
  const ModelConfig& c = model_->config();
  const int KV = c.kv_dim();
  const auto toks = test::random_byte_tokens(33, 16);
  EncodeOptions eo;
  eo.dtype = KvDtype::F32;
  const ChunkKVF32 got = unpack_text_order(encode_chunk(*model_, toks, eo));
  std::vector<int32_t> all{model_->tokenizer().bos() >= 0 ? model_->tokenizer().bos() : 0};
  all.insert(all.end(), toks.begin(), toks.end());
  const int nt = (int)all.size();
  std::vector<int32_t> pos(nt);
  for (int i = 0; i < nt; ++i) pos[i] = i;
  KVCache kv = model_->make_cache(nt);
  Workspace ws;
  std::vector<float> x((size_t)nt * c.n_embd), k((size_t)nt * KV), v((size_t)nt * KV);
  model_->embed(all.data(), nt, x.data());
  for (int l = 0; l < c.n_layer; ++l) {
    LayerTap tap;
    tap.k_pre_rope = k.data();
    tap.v = v.data();
    cpu::forward_layer(*model_, l, x.data(), pos.data(), nt, kv, ws, &tap);
    const size_t at = (size_t)l * (nt - 1) * KV, cells = (size_t)(nt - 1) * KV;
    EXPECT_EQ(0, std::memcmp(got.k.data() + at, k.data() + KV, cells * sizeof(float)))
        << "K, layer " << l;
    EXPECT_EQ(0, std::memcmp(got.v.data() + at, v.data() + KV, cells * sizeof(float)))
        << "V, layer " << l;
  }
}

// An encoding in row slices (ChunkEncoding::step, what the engine runs beside other requests'
// steps) gives the whole encoding's record: the same id, tokens and K/V up to the rounding of the
// slices' products, and the same rankings' scores, the attention tap's included when its first
// row falls inside a slice. Slices end before, on and after that row.
TEST_P(SelectiveTest, AnEncodingInSlicesEqualsTheWholeEncoding) {
  const auto toks = test::random_byte_tokens(80, 17);
  EncodeOptions eo;
  eo.dtype = KvDtype::F32;
  eo.also = {RankOptions{RankMode::kAttn, 0.5}, RankOptions{RankMode::kProbeAttn, 0.5},
             RankOptions{RankMode::kLowFreq, 0.5}};
  eo.probe.layers = 3;  // of 4: a probe row is 3/4 of a row
  ASSERT_EQ(model_->config().n_layer, 4);
  ASSERT_GT(attention_first_row(80), 0);  // the tap starts inside the chunk
  EncodeExtras want_ex;
  const ChunkKV want = encode_chunk(*model_, toks, eo, &want_ex);
  const ChunkKVF32 want_kv = unpack_text_order(want);
  const auto close = [](const std::vector<float>& a, const std::vector<float>& b, float tol) {
    EXPECT_EQ(a.size(), b.size());
    float scale = 1e-6f;
    for (float x : b) scale = std::max(scale, std::fabs(x));
    EXPECT_LE(test::max_abs_diff(a, b), tol * scale);
  };
  const int L = model_->config().n_layer, layers = probe_layers(eo.probe, L);
  ASSERT_EQ(layers, 3);
  // Rows alone: the isolated pass's rows (chunk and sink), then the probe pass's, each 3/4 of a
  // whole-model row. With keys_per_row 40, a row at position p counts 1 + (p + 1) / 40: the
  // isolated rows sit at 0..80, the probe's after its context.
  const int P = probe_context_length(*model_, eo.probe, eo.sink);
  double attn_work = 0;
  for (int p = 0; p <= 80; ++p) attn_work += 1 + (p + 1) / 40.0;
  for (int p = P; p < P + 80; ++p) attn_work += 0.75 * (1 + (p + 1) / 40.0);
  for (const auto& [keys, slice] : std::vector<std::pair<double, int>>{
           {0, 1}, {0, 6}, {0, 17}, {0, 200}, {40, 1}, {40, 6}, {40, 17}, {40, 1000}}) {
    SCOPED_TRACE("slices of " + std::to_string(slice) + " rows of work, keys_per_row " +
                 std::to_string(keys));
    const double want_work = keys > 0 ? attn_work : 81 + 60;
    ChunkEncoding enc(*model_, toks, eo, RowWork{keys});
    ASSERT_EQ(enc.rows(), 81);  // the chunk and its sink
    ASSERT_NEAR(enc.work_left(), want_work, 1e-9 * want_work);
    EXPECT_THROW(enc.finish(), Error);  // work is left
    EXPECT_THROW(enc.step(0), Error);
    int steps = 0, rows = 0;
    double done = 0;
    while (enc.work_left() > 0 && steps < 1000) {
      const double left = enc.work_left();
      const int rows_before = enc.rows_done();
      const double did = enc.step(slice);
      const int ran = enc.rows_done() - rows_before;
      EXPECT_GE(ran, 1);
      // Within the slice, unless one row alone is more (a slice of 1 late in the chunk).
      if (ran > 1) {
        EXPECT_LE(did, slice + 1e-9);
      }
      EXPECT_NEAR(enc.work_left(), left - did, 1e-9 * want_work);
      done += did;
      rows += ran;
      ++steps;
    }
    EXPECT_NEAR(done, want_work, 1e-9 * want_work);
    EXPECT_EQ(rows, 81 + 80);
    if (slice >= want_work) {
      EXPECT_EQ(steps, 1);
    }
    EXPECT_THROW(enc.step(1), Error);
    EncodeExtras ex;
    const ChunkKV got = enc.finish(&ex);
    EXPECT_THROW(enc.finish(), Error);  // once
    EXPECT_EQ(got.meta.id, want.meta.id);
    EXPECT_EQ(got.meta.tokens, want.meta.tokens);
    const ChunkKVF32 got_kv = unpack_text_order(got);
    close(got_kv.k, want_kv.k, 1e-5f);
    close(got_kv.v, want_kv.v, 1e-5f);
    close(got.meta.scores, want.meta.scores, 1e-3f);
    ASSERT_EQ(ex.rankings.size(), want_ex.rankings.size());
    for (size_t i = 0; i < ex.rankings.size(); ++i) {
      SCOPED_TRACE(rank_mode_name(eo.also[i].mode));
      close(ex.rankings[i].scores, want_ex.rankings[i].scores, 1e-3f);
    }
  }
  // The probe pass is the ranking's work: nothing after the isolated pass for a spectral one.
  EncodeOptions spectral;
  spectral.rank = RankOptions{RankMode::kLowFreq, 0.5};
  EXPECT_EQ(ChunkEncoding(*model_, toks, spectral).work_left(), 81);
  EXPECT_NEAR(ChunkEncoding(*model_, toks, spectral, RowWork{40}).work_left(),
              81 + 81 * 82 / 2 / 40.0, 1e-9);
}

// RowWork (the engine's step budget): a row at position p counts 1 + (p + 1) / keys_per_row,
// rows alone without keys_per_row; fit() is the most rows within a work, contiguous or at given
// positions, and agrees with rows() by brute force.
TEST(RowWork, CountsEachRowWithItsAttentionAndFitsTheMostRows) {
  EXPECT_EQ(RowWork{}.rows(1000, 7), 7.0);
  EXPECT_EQ(RowWork{}.rows(1000, 8, 0.25), 2.0);
  EXPECT_DOUBLE_EQ(RowWork{100}.rows(0, 1), 1.01);
  EXPECT_DOUBLE_EQ(RowWork{100}.rows(99, 1), 2.0);
  EXPECT_DOUBLE_EQ(RowWork{100}.rows(10, 3), 3 + (11 + 12 + 13) / 100.0);
  EXPECT_DOUBLE_EQ(RowWork{100}.rows(10, 3, 0.5), 0.5 * (3 + (11 + 12 + 13) / 100.0));
  EXPECT_EQ(RowWork{100}.rows(10, 0), 0.0);
  const std::vector<int32_t> run = {10, 11, 12, 13, 14};  // contiguous: the closed form's rows
  EXPECT_NEAR(RowWork{100}.rows_at(run.data(), 5), RowWork{100}.rows(10, 5), 1e-12);
  for (double keys : {0.0, 7.0, 300.0}) {
    const RowWork w{keys};
    for (int first : {0, 5, 900}) {
      for (double work : {0.5, 1.0, 8.0, 64.0}) {
        for (double share : {1.0, 0.25}) {
          int want = 0;
          while (want < 50 && w.rows(first, want + 1, share) <= work) ++want;
          EXPECT_EQ(w.fit(first, 50, work, share), want)
              << keys << " " << first << " " << work << " " << share;
        }
        std::vector<int32_t> pos;  // ascending, with gaps (a selective prefill's active rows)
        for (int i = 0; i < 50; ++i) pos.push_back(first + 3 * i);
        int want = 0;
        while (want < 50 && w.rows_at(pos.data(), want + 1) <= work) ++want;
        EXPECT_EQ(w.fit_at(pos.data(), 50, work), want) << keys << " " << first << " " << work;
      }
    }
  }
}

// Chunked prefill (SlicedPrefill, the engine's continuous batching): the active rows stepped in
// slices through the CPU backend, every other pass beside another sequence's decode row, give
// the whole prefill's logits and cache; the first slice places the reused rows of every layer.
TEST_P(SelectiveTest, SlicedPrefillEqualsTheWholePrefill) {
  const ModelConfig& c = model_->config();
  const int V = c.n_vocab;
  EncodeOptions eo;
  ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(40, 30), eo);
  ChunkKV b = encode_chunk(*model_, test::random_byte_tokens(25, 31), eo);
  const ComposedRequest req{
      test::random_byte_tokens(5, 32), {src(a), src(b), src(a)}, test::random_byte_tokens(7, 33)};
  const RequestLayout lay = layout_request(req);
  Workspace ws;
  // The prefix policy's cache holds an earlier request with the same prefix and first chunk, so
  // that it has rows to place; each run gets its own copy.
  PrefixCache primed;
  {
    const ComposedRequest earlier{req.prefix, {src(a)}, test::random_byte_tokens(4, 35)};
    KVCache kv = model_->make_cache(layout_request(earlier).n_total);
    SelectiveOptions opt;
    opt.policy.kind = &find_policy("prefix");
    opt.prefix_cache = &primed;
    selective_prefill(*model_, earlier, opt, kv, ws);
  }
  // The loader's settings: overlapped with RoPE on the loader (the default) or on the compute
  // thread, and not overlapped, reading whole chunks.
  PipelineOptions rope_on_caller, serial;
  rope_on_caller.rope_in_loader = false;
  serial.overlap = false;
  serial.sparse = false;
  for (const PipelineOptions& pipe : {PipelineOptions{}, rope_on_caller, serial})
  for (const char* name :
       {"cachetune", "full", "reuse", "head", "prophetkv", "cacheblend", "prefix", "lfonly"}) {
    SCOPED_TRACE(std::string("overlap ") + (pipe.overlap ? "on" : "off") + ", rope in loader " +
                 (pipe.rope_in_loader ? "on" : "off"));
    SelectiveOptions opt;
    opt.policy.kind = &find_policy(name);
    opt.policy.ratio = 0.3;
    opt.pipeline = pipe;
    ASSERT_TRUE(SlicedPrefill::supports(opt)) << name;
    PrefixCache want_pc = primed;
    opt.prefix_cache = &want_pc;
    KVCache want_kv = model_->make_cache(lay.n_total);
    PrefillBreakdown want_bd;
    const std::vector<float> want = selective_prefill(*model_, req, opt, want_kv, ws, &want_bd);
    const bool tokens_stage = opt.policy.kind->stage() == PolicyStage::kTokens;
    if (std::string(name) == "prefix") {
      ASSERT_GT(want_bd.n_loaded, 0);
    }
    for (int chunk : {1, 6, 1000}) {
      SCOPED_TRACE(std::string(name) + ", slices of " + std::to_string(chunk) + " rows");
      PrefixCache pc = primed;
      opt.prefix_cache = &pc;
      KVCache kv = model_->make_cache(lay.n_total);
      // The other sequence, and the same one decoding alone: its rows must not notice the slices.
      KVCache other = model_->make_cache(256), alone = model_->make_cache(256);
      const auto other_prompt = test::random_byte_tokens(3, 34);
      cpu::prefill(*model_, other_prompt.data(), 3, 0, other, ws);
      cpu::prefill(*model_, other_prompt.data(), 3, 0, alone, ws);
      SlicedPrefill sp(*model_, req, opt, kv);
      // A layer-0 or two-pass policy's selection pass first, in blocks of the same size, each
      // a pass of its own: no slice before it has run.
      const bool layer0 = opt.policy.kind->stage() == PolicyStage::kAfterLayer0;
      const bool reuse_pass = opt.policy.kind->reads_reuse_pass();
      int non_chunk = 0;
      for (int8_t c : lay.is_chunk) non_chunk += !c;
      const int sel_rows = layer0 ? lay.n_total : reuse_pass ? non_chunk : 0;
      EXPECT_EQ(sp.select_rows_left(), sel_rows);
      EXPECT_FALSE(sp.done());
      if (sel_rows > 0) {
        std::vector<int32_t> t, p;
        std::vector<BatchSeq> sq;
        EXPECT_THROW(sp.add_slice(1, t, p, sq), Error);
        EXPECT_EQ(sp.rows_left(), 0);
      }
      int blocks = 0;
      for (; sp.select_rows_left() > 0; ++blocks) sp.select_step(chunk, ws);
      EXPECT_EQ(blocks, (sel_rows + chunk - 1) / chunk);
      EXPECT_EQ(sp.rows_left(), want_bd.n_active);
      EXPECT_EQ(sp.reused_from_layer(), std::string(name) == "cacheblend" ? 1 : 0);
      int passes = 0;
      while (!sp.done()) {
        std::vector<int32_t> toks, pos;
        std::vector<BatchSeq> seqs;
        const bool with_decode = passes % 2 == 1;
        if (with_decode) {
          toks.push_back(9);
          pos.push_back(other.n_pos);
          seqs.push_back(BatchSeq{&other, 1, true});
        }
        const int n = std::min(chunk, sp.rows_left());
        const ReusedRows* rows = sp.add_slice(n, toks, pos, seqs);
        // A token-stage policy's reused rows are in the cache before the first slice.
        EXPECT_EQ(rows != nullptr, passes == 0 && !tokens_stage);
        const auto be = make_cpu_layers(*model_, kv, ws, pipe);
        be->begin_batch(toks.data(), pos.data(), (int)toks.size(), seqs);
        if (rows) be->set_reused_for((int)seqs.size() - 1, *rows, sp.reused_from_layer());
        for (int l = 0; l < c.n_layer; ++l) be->layer(l, nullptr);
        const std::vector<float> lg = be->finish_batch();
        ASSERT_EQ(lg.size(), seqs.size() * V);
        if (with_decode) {
          ++other.n_pos;
          const int32_t t = 9;
          const std::vector<float> solo = cpu::prefill(*model_, &t, 1, alone.n_pos, alone, ws);
          ASSERT_EQ(0, std::memcmp(lg.data(), solo.data(), V * sizeof(float)))
              << "the decode row's logits, pass " << passes;
        }
        sp.slice_done(n, lg.data() + (seqs.size() - 1) * V, be->times());
        ++passes;
      }
      EXPECT_EQ(passes, (want_bd.n_active + chunk - 1) / chunk);
      EXPECT_EQ(kv.n_pos, want_kv.n_pos);
      EXPECT_EQ(sp.breakdown().n_loaded, want_bd.n_loaded);
      const std::vector<float> got = sp.take_logits();
      float scale = 0;
      for (float x : want) scale = std::max(scale, std::fabs(x));
      EXPECT_LE(max_abs_diff(got, want), 1e-5f * scale);
      for (int l = 0; l < c.n_layer; ++l) {
        EXPECT_LE(max_kv_diff(kv, want_kv, l, want_kv.n_pos), 1e-4f) << "layer " << l;
      }
      // The prefix policy remembered the finished request, with its finished cache, as the
      // whole prefill does.
      const auto [n_got, e_got] = pc.longest_match(lay.tokens);
      const auto [n_want, e_want] = want_pc.longest_match(lay.tokens);
      ASSERT_EQ(n_got, n_want);
      if (n_got > 0) {
        KVCache kept = model_->make_cache(lay.n_total), kept_want = model_->make_cache(lay.n_total);
        pc.copy_rows(e_got, n_got, kept);
        want_pc.copy_rows(e_want, n_want, kept_want);
        float d = 0;
        for (int l = 0; l < c.n_layer; ++l) d = std::max(d, max_kv_diff(kept, kept_want, l, n_got));
        EXPECT_LE(d, 1e-4f) << "the remembered cache";
      }
    }
  }
  // A device or query attention runs whole, and says so when asked to slice.
  {
    SelectiveOptions opt;
    std::vector<float> attn;
    opt.query_attention = &attn;
    EXPECT_FALSE(SlicedPrefill::supports(opt));
    KVCache kv = model_->make_cache(lay.n_total);
    try {
      SlicedPrefill sp(*model_, req, opt, kv);
      ADD_FAILURE() << "a prefill with query attention was sliced";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("whole"), std::string::npos) << e.what();
    }
  }
}

TEST_P(SelectiveTest, EveryPolicySelectsItsBudget) {
  // Probe records that also carry the attention rankings (as the eval harness leaves them).
  EncodeOptions eo;
  for (RankMode m : {RankMode::kAttn, RankMode::kProbeAttn}) {
    RankOptions ro;
    ro.mode = m;
    eo.also.push_back(ro);
  }
  std::vector<ChunkKV> recs;
  for (auto [n, seed] : {std::pair{61, 16}, std::pair{10, 17}}) {
    EncodeExtras ex;
    recs.push_back(encode_chunk(*model_, test::random_byte_tokens(n, seed), eo, &ex));
    for (size_t i = 0; i < eo.also.size(); ++i) {
      remember_ranking(recs.back().meta.id, rank_mode_name(eo.also[i].mode), ex.rankings[i]);
    }
  }
  const ChunkKV &a = recs[0], &b = recs[1];
  const double r = 0.15;
  ComposedRequest req{
      test::random_byte_tokens(4, 18), {src(a), src(b)}, test::random_byte_tokens(6, 19)};
  for (const Policy* k : all_policies()) {
    if (k == &find_policy("prefix")) continue;  // reuses whole prefixes, no per-chunk selection
    // The oracles need the true drift, and the shared budgets (request-stage policies over
    // stored rankings) give chunks unequal shares: both covered by offline_policy_test.cc.
    if (k->eval_only() || (k->stage() == PolicyStage::kRequest && !k->ingest_rankings().empty())) {
      continue;
    }
    SelectionReport rep;
    run(req, k, r, &rep);
    ASSERT_EQ(rep.selected.size(), 2u) << k->name();
    for (size_t i = 0; i < 2; ++i) {
      const int n = req.chunks[i]->meta().n_tok;
      int want = n_select(r, n);
      if (k == &find_policy("full")) want = n;
      if (k == &find_policy("reuse")) want = 0;
      if (k == &find_policy("epic")) want = std::min(16, n);  // EPIC: first k tokens, k = 16
      EXPECT_EQ((int)rep.selected[i].size(), want) << k->name() << " chunk " << i;
      EXPECT_TRUE(std::is_sorted(rep.selected[i].begin(), rep.selected[i].end()));
    }
  }
}

TEST_P(SelectiveTest, CacheTuneRecomputesTheTopOfTheStoredRanking) {
  EncodeOptions eo;
  ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(100, 20), eo);
  SelectionReport rep;
  run(ComposedRequest{{}, {src(a)}, test::random_byte_tokens(3, 21)}, &find_policy("cachetune"), 0.1,
      &rep);
  std::vector<int32_t> top(a.meta.order.begin(), a.meta.order.begin() + 10);
  std::sort(top.begin(), top.end());
  EXPECT_EQ(rep.selected[0], top);
}

TEST_P(SelectiveTest, PrefixPolicyReusesAnEarlierRequestExactly) {
  EncodeOptions eo;
  ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(30, 22), eo);
  ChunkKV b = encode_chunk(*model_, test::random_byte_tokens(30, 23), eo);
  const auto prefix = test::random_byte_tokens(8, 24);
  PrefixCache pc(2);
  ComposedRequest first{prefix, {src(a), src(b)}, test::random_byte_tokens(5, 25)};
  ComposedRequest second{prefix, {src(a), src(b)}, test::random_byte_tokens(5, 26)};
  run(first, &find_policy("prefix"), 0, nullptr, &pc);
  const auto want = full_logits(layout_request(second).tokens);
  const RequestLayout lay = layout_request(second);
  KVCache kv = model_->make_cache(lay.n_total);
  Workspace ws;
  SelectiveOptions opt;
  opt.policy.kind = &find_policy("prefix");
  opt.prefix_cache = &pc;
  PrefillBreakdown bd;
  const auto got = selective_prefill(*model_, second, opt, kv, ws, &bd);
  EXPECT_EQ(bd.n_loaded, 8 + 60);  // system prefix and both chunks matched
  EXPECT_LT(max_abs_diff(got, want), 1e-4f);
}

TEST_P(SelectiveTest, BadRequestsAreRejectedWithAReason) {
  EncodeOptions eo;
  ChunkKV a = encode_chunk(*model_, test::random_byte_tokens(10, 27), eo);
  EXPECT_THROW(layout_request(ComposedRequest{{}, {src(a)}, {}}), Error);
  ComposedRequest req{{}, {src(a)}, test::random_byte_tokens(3, 28)};
  KVCache small = model_->make_cache(5);
  Workspace ws;
  SelectiveOptions opt;
  try {
    selective_prefill(*model_, req, opt, small, ws);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("13 tokens"), std::string::npos) << e.what();
  }
  ChunkKV wrong = a;
  wrong.meta.model_fingerprint = "0123456789abcdef";
  ComposedRequest req2{{}, {src(wrong)}, test::random_byte_tokens(3, 29)};
  KVCache kv = model_->make_cache(20);
  EXPECT_THROW(selective_prefill(*model_, req2, opt, kv, ws), Error);
  EXPECT_THROW(find_policy("magic"), Error);
}

}  // namespace
}  // namespace ct
