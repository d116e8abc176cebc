// The batch shape of the per-layer contract (LayerBackend::begin_batch, backend/backend.h): one
// pass over the rows of several sequences, as a continuous-batching step holds them, gives every
// sequence exactly what a pass of its own gives. The step mixes two decode rows (two sequences,
// one token each), the prefill rows of a third sequence and the selective rows of a fourth over
// reused, deferred-RoPE rows; logits and every layer's cache rows are compared bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "backend/backend.h"
#include "backend/cpu_forward.h"
#include "core/error.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

constexpr int kCtx = 64;

class BackendBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test::TinyModelOptions o;
    o.weight_type = GgmlType::Q8_0;  // the decode rows take the quantised kernels
    o.head_dim = 32;                 // whole Q8_0 blocks per head, for Q8_0 caches
    m_ = Model::load(test::write_tiny_model(test::temp_path("backend_batch.gguf"), o));
  }
  // Pre-RoPE K and V of `toks` encoded alone at positions 0.. (a chunk's stored rows), per layer.
  void encode_chunk(const std::vector<int32_t>& toks) {
    const ModelConfig& c = m_->config();
    const int n = (int)toks.size(), KV = c.kv_dim();
    KVCache kv = m_->make_cache(kCtx);
    Workspace ws;
    std::vector<float> x((size_t)n * c.n_embd);
    m_->embed(toks.data(), n, x.data());
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    chunk_k_.assign(c.n_layer, std::vector<float>((size_t)n * KV));
    chunk_v_.assign(c.n_layer, std::vector<float>((size_t)n * KV));
    for (int l = 0; l < c.n_layer; ++l) {
      LayerTap tap;
      tap.k_pre_rope = chunk_k_[l].data();
      tap.v = chunk_v_[l].data();
      cpu::forward_layer(*m_, l, x.data(), pos.data(), n, kv, ws, &tap);
    }
  }
  void reused_rows_rounded_once(KvDtype type);
  // The chunk's rows placed at positions 0..n-1 (F32 as stored here).
  ReusedRows chunk_rows(int n) const {
    ReusedRows r;
    r.segments.push_back({KvDtype::F32, n, "chunk"});
    r.pos.resize(n);
    std::iota(r.pos.begin(), r.pos.end(), 0);
    const size_t bytes = (size_t)n * m_->config().kv_dim() * sizeof(float);
    r.read = [this, bytes](int l, int, void* k, void* v) {
      std::memcpy(k, chunk_k_[l].data(), bytes);
      std::memcpy(v, chunk_v_[l].data(), bytes);
    };
    return r;
  }
  static void expect_same_cache(const KVCache& a, const KVCache& b, int n_pos, const char* what) {
    ASSERT_EQ(a.dtype(), b.dtype());
    for (int l = 0; l < a.n_layer(); ++l) {
      const size_t bytes = (size_t)n_pos * a.row_bytes();
      EXPECT_EQ(std::memcmp(a.k_data(l), b.k_data(l), bytes), 0) << what << ": K of layer " << l;
      EXPECT_EQ(std::memcmp(a.v_data(l), b.v_data(l), bytes), 0) << what << ": V of layer " << l;
    }
  }
  void mixed_pass_gives_each_sequence_its_own(KvDtype t);

  std::unique_ptr<Model> m_;
  std::vector<std::vector<float>> chunk_k_, chunk_v_;
};

// Caches of type t throughout (the F32 chunk rows are converted as they are placed).
void BackendBatchTest::mixed_pass_gives_each_sequence_its_own(KvDtype t) {
  const int V = m_->config().n_vocab;
  const int PA = 24, PB = 13, NC = 17, NS = 20, NQ = 8;  // prompts, prefill rows, chunk, active
  const std::vector<int32_t> a = test::random_byte_tokens(PA + 1, 1);
  const std::vector<int32_t> b = test::random_byte_tokens(PB + 1, 2);
  const std::vector<int32_t> p = test::random_byte_tokens(NC, 3);
  const std::vector<int32_t> s = test::random_byte_tokens(NS + NQ, 4);
  encode_chunk({s.begin(), s.begin() + NS});
  const PipelineOptions opt;

  // Alone: two decode steps after their prompts, one prefill, one selective pass.
  Workspace ws;
  KVCache ka = m_->make_cache(kCtx, t), kb = m_->make_cache(kCtx, t),
          kp = m_->make_cache(kCtx, t), ks = m_->make_cache(kCtx, t);
  cpu::prefill(*m_, a.data(), PA, 0, ka, ws);
  cpu::prefill(*m_, b.data(), PB, 0, kb, ws);
  const std::vector<float> la = cpu::prefill(*m_, &a[PA], 1, PA, ka, ws);
  const std::vector<float> lb = cpu::prefill(*m_, &b[PB], 1, PB, kb, ws);
  const std::vector<float> lp = cpu::prefill(*m_, p.data(), NC, 0, kp, ws);
  std::vector<int32_t> spos(NQ);
  std::iota(spos.begin(), spos.end(), NS);
  std::vector<float> ls;
  {
    const auto be = make_cpu_layers(*m_, ks, ws, opt);
    be->begin(s.data() + NS, spos.data(), NQ);
    be->set_reused(chunk_rows(NS), 0);
    for (int l = 0; l < m_->config().n_layer; ++l) be->layer(l, nullptr);
    ls = be->finish();
  }

  // Together, in one pass per layer.
  Workspace ws2;
  KVCache ka2 = m_->make_cache(kCtx, t), kb2 = m_->make_cache(kCtx, t),
          kp2 = m_->make_cache(kCtx, t), ks2 = m_->make_cache(kCtx, t),
          unused = m_->make_cache(1, t);
  cpu::prefill(*m_, a.data(), PA, 0, ka2, ws2);
  cpu::prefill(*m_, b.data(), PB, 0, kb2, ws2);
  std::vector<int32_t> toks = {a[PA], b[PB]}, pos = {PA, PB};
  toks.insert(toks.end(), p.begin(), p.end());
  for (int i = 0; i < NC; ++i) pos.push_back(i);
  toks.insert(toks.end(), s.begin() + NS, s.end());
  pos.insert(pos.end(), spos.begin(), spos.end());
  const std::vector<BatchSeq> seqs = {
      {&ka2, 1, true}, {&kb2, 1, true}, {&kp2, NC, false}, {&ks2, NQ, false}};
  const auto be = make_cpu_layers(*m_, unused, ws2, opt);
  EXPECT_EQ(be->caps().max_seqs, 0);
  be->begin_batch(toks.data(), pos.data(), (int)toks.size(), seqs);
  be->set_reused_for(3, chunk_rows(NS), 0);
  for (int l = 0; l < m_->config().n_layer; ++l) be->layer(l, nullptr);
  EXPECT_THROW(be->finish(), Error);  // one sequence's call on a pass of four
  const std::vector<float> all = be->finish_batch();
  ASSERT_EQ(all.size(), (size_t)4 * V);

  const std::vector<float>* want[] = {&la, &lb, &lp, &ls};
  const char* names[] = {"decode row a", "decode row b", "prefill rows", "selective rows"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(std::memcmp(all.data() + (size_t)i * V, want[i]->data(), V * sizeof(float)), 0)
        << names[i] << ": logits differ from the sequence's own pass";
  }
  expect_same_cache(ka, ka2, PA + 1, names[0]);
  expect_same_cache(kb, kb2, PB + 1, names[1]);
  expect_same_cache(kp, kp2, NC, names[2]);
  expect_same_cache(ks, ks2, NS + NQ, names[3]);
}

TEST_F(BackendBatchTest, APassOverSeveralSequencesGivesEachWhatItsOwnPassGives) {
  mixed_pass_gives_each_sequence_its_own(KvDtype::F32);
}

TEST_F(BackendBatchTest, APassOverSeveralSequencesGivesEachWhatItsOwnPassGivesOnF16Caches) {
  mixed_pass_gives_each_sequence_its_own(KvDtype::F16);
}

TEST_F(BackendBatchTest, APassOverSeveralSequencesGivesEachWhatItsOwnPassGivesOnQ8Caches) {
  mixed_pass_gives_each_sequence_its_own(KvDtype::Q8_0);
}

// Reused rows from F16 records (the default record type) placed and rotated in an F16 or Q8_0
// cache are the F32 cache's rows rounded once: the record converts exactly, both rotate in F32
// alike, and the key is packed after its rotation. Layer 0's recomputed rows are too (the layers
// above see attention over rounded rows).
TEST_F(BackendBatchTest, F16CacheHoldsTheF32CachesReusedRowsRoundedOnce) {
  reused_rows_rounded_once(KvDtype::F16);
}

TEST_F(BackendBatchTest, Q8CacheHoldsTheF32CachesReusedRowsRoundedOnce) {
  reused_rows_rounded_once(KvDtype::Q8_0);
}

void BackendBatchTest::reused_rows_rounded_once(KvDtype type) {
  const int NS = 20, NQ = 8, KV = m_->config().kv_dim();
  const std::vector<int32_t> s = test::random_byte_tokens(NS + NQ, 4);
  encode_chunk({s.begin(), s.begin() + NS});
  std::vector<std::vector<uint16_t>> k16, v16;
  for (int l = 0; l < m_->config().n_layer; ++l) {
    k16.emplace_back(chunk_k_[l].size());
    v16.emplace_back(chunk_v_[l].size());
    kv_pack(KvDtype::F16, chunk_k_[l].data(), k16.back().data(), chunk_k_[l].size());
    kv_pack(KvDtype::F16, chunk_v_[l].data(), v16.back().data(), chunk_v_[l].size());
  }
  // Two segments (two reads), and one row read but not placed (a recomputed token inside a
  // range read whole): the placed rows' keys and angles must stay paired.
  ReusedRows rows;
  constexpr int kSplit = 7, kHole = 4;
  rows.segments.push_back({KvDtype::F16, kSplit, "chunk a"});
  rows.segments.push_back({KvDtype::F16, NS - kSplit, "chunk b"});
  rows.pos.resize(NS);
  std::iota(rows.pos.begin(), rows.pos.end(), 0);
  rows.pos[kHole] = -1;
  rows.read = [&](int l, int seg, void* k, void* v) {
    const size_t r0 = seg == 0 ? 0 : kSplit, n = seg == 0 ? kSplit : NS - kSplit;
    std::memcpy(k, k16[l].data() + r0 * KV, n * KV * 2);
    std::memcpy(v, v16[l].data() + r0 * KV, n * KV * 2);
  };
  std::vector<int32_t> qpos(NQ);
  std::iota(qpos.begin(), qpos.end(), NS);
  // Loaded on the calling thread, and by the loader thread with RoPE on the compute thread (an
  // F16 cache's placed keys rotated there; a Q8_0 cache overrides it: its keys are rotated
  // before they are packed, by the loader).
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "loader thread" : "no loader thread");
    KVCache c32 = m_->make_cache(kCtx, KvDtype::F32), c16 = m_->make_cache(kCtx, type);
    for (KVCache* kv : {&c32, &c16}) {
      Workspace ws;
      PipelineOptions opt;
      opt.overlap = overlap;
      opt.rope_in_loader = !overlap;
      const auto be = make_cpu_layers(*m_, *kv, ws, opt);
      be->begin(s.data() + NS, qpos.data(), NQ);
      be->set_reused(rows, 0);
      for (int l = 0; l < m_->config().n_layer; ++l) be->layer(l, nullptr);
      be->finish();
    }
    const size_t rb = c16.row_bytes();
    std::vector<uint8_t> want_k(rb), want_v(rb);
    for (int l = 0; l < m_->config().n_layer; ++l) {
      for (int p = 0; p < (l == 0 ? NS + NQ : NS); ++p) {
        kv_pack(type, c32.k(l) + (size_t)p * KV, want_k.data(), KV);
        kv_pack(type, c32.v(l) + (size_t)p * KV, want_v.data(), KV);
        const char* k = static_cast<const char*>(c16.k_data(l)) + rb * p;
        const char* v = static_cast<const char*>(c16.v_data(l)) + rb * p;
        ASSERT_EQ(std::memcmp(k, want_k.data(), rb), 0) << "K of layer " << l << " row " << p;
        ASSERT_EQ(std::memcmp(v, want_v.data(), rb), 0) << "V of layer " << l << " row " << p;
      }
    }
    // The reused keys were rotated (row NS-1 is not its stored, position-0 form); values not.
    const size_t last = (size_t)(NS - 1) * KV;
    std::vector<float> stored(KV);
    kv_unpack(KvDtype::F16, &k16[1][last], stored.data(), KV);
    kv_pack(type, stored.data(), want_k.data(), KV);
    kv_unpack(KvDtype::F16, &v16[1][last], stored.data(), KV);
    kv_pack(type, stored.data(), want_v.data(), KV);
    EXPECT_NE(std::memcmp(static_cast<const char*>(c16.k_data(1)) + rb * (NS - 1), want_k.data(),
                          rb),
              0);
    EXPECT_EQ(std::memcmp(static_cast<const char*>(c16.v_data(1)) + rb * (NS - 1), want_v.data(),
                          rb),
              0);
  }
}

// project_kv (CacheBlend's check layer): layer l's K/V of the pass's rows from their residual
// stream, before layer l runs, are what layer l's tap then gives for the same rows, bit for bit,
// and the call changes nothing the layer computes after it.
TEST_F(BackendBatchTest, ProjectedKvAreTheNextLayersTap) {
  const ModelConfig& c = m_->config();
  ASSERT_GE(c.n_layer, 2);
  const int n = 23;
  const std::vector<int32_t> toks = test::random_byte_tokens(n, 41);
  std::vector<int32_t> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = i;
  const size_t cells = (size_t)n * c.kv_dim();
  std::vector<float> pk(cells), pv(cells), tk(cells), tv(cells);
  KVCache kv = m_->make_cache(kCtx), plain = m_->make_cache(kCtx);
  Workspace ws;
  std::vector<float> with, without;
  for (bool project : {true, false}) {
    const auto be = make_cpu_layers(*m_, project ? kv : plain, ws, PipelineOptions());
    be->begin(toks.data(), pos.data(), n);
    be->layer(0, nullptr);
    LayerTap tap;
    if (project) {
      be->project_kv(1, pk.data(), pv.data());
      tap.k_pre_rope = tk.data();
      tap.v = tv.data();
    }
    for (int l = 1; l < c.n_layer; ++l) be->layer(l, l == 1 && project ? &tap : nullptr);
    (project ? with : without) = be->finish();
  }
  EXPECT_EQ(0, std::memcmp(pk.data(), tk.data(), cells * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(pv.data(), tv.data(), cells * sizeof(float)));
  EXPECT_EQ(with, without);
  const auto be = make_cpu_layers(*m_, kv, ws, PipelineOptions());
  be->begin(toks.data(), pos.data(), n);
  EXPECT_THROW(be->project_kv(c.n_layer, pk.data(), pv.data()), Error);
}

TEST_F(BackendBatchTest, ASequenceCountThePassCannotTakeIsRefused) {
  KVCache kv = m_->make_cache(kCtx), kv2 = m_->make_cache(kCtx);
  Workspace ws;
  const auto be = make_cpu_layers(*m_, kv, ws, PipelineOptions());
  const std::vector<int32_t> toks = {1, 2, 3}, pos = {0, 1, 2};
  EXPECT_THROW(be->begin_batch(toks.data(), pos.data(), 3, {{&kv, 2, false}, {&kv2, 2, false}}),
               Error);  // 4 rows named for a pass of 3
  EXPECT_THROW(be->begin_batch(toks.data(), pos.data(), 3, {{&kv, 2, false}, {nullptr, 1, false}}),
               Error);  // a sequence without a cache
  be->begin_batch(toks.data(), pos.data(), 3, {{&kv, 2, false}, {&kv2, 1, true}});
  EXPECT_THROW(be->set_reused_for(2, ReusedRows(), 0), Error);
  LayerTap tap;
  EXPECT_THROW(be->layer(0, &tap), Error);  // taps need a pass of one sequence
  EXPECT_THROW(be->keep_rows({0}), Error);
  std::vector<float> pk((size_t)3 * m_->config().kv_dim()), pv(pk.size());
  EXPECT_THROW(be->project_kv(1, pk.data(), pv.data()), Error);  // so does project_kv

  // A backend of one sequence per pass (the GPU's today) refuses more through the defaults.
  struct OneSeq final : LayerBackend {
    BackendCaps caps() const override { return {"one", false, false, 1}; }
    void begin(const int32_t*, const int32_t*, int n) override { begun = n; }
    void set_reused(const ReusedRows&, int) override {}
    void layer(int, LayerTap*) override {}
    void keep_rows(const std::vector<int32_t>&) override {}
    void project_kv(int, float*, float*) override {}
    std::vector<float> finish() override { return {1.0f}; }
    int begun = 0;
  } one;
  EXPECT_THROW(
      one.begin_batch(toks.data(), pos.data(), 3, {{nullptr, 2, false}, {nullptr, 1, false}}),
      Error);
  one.begin_batch(toks.data(), pos.data(), 3, {{nullptr, 3, false}});
  EXPECT_EQ(one.begun, 3);
  EXPECT_THROW(one.set_reused_for(1, ReusedRows(), 0), Error);
  EXPECT_EQ(one.finish_batch(), std::vector<float>{1.0f});
}

}  // namespace
}  // namespace ct
