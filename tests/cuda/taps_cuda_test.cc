// The GPU LayerBackend's taps and keep_rows against the CPU backend's, through the same contract
// (backend/backend.h) on tiny random models: keys before RoPE, values and the query rows'
// attention per layer; a pass that drops rows after layer 0 (CacheBlend's shape); the isolated
// chunk encoding on the device; and the layer-loop policies that need them (CacheBlend's
// selection after layer 0 from layer 1's projected K/V, ProphetKV's attention pass, the eval's query attention) selecting (nearly) the same
// rows as on the CPU. Skipped without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/gpu_decoder.h"
#include "cuda/compare.h"
#include "reuse/encoder.h"
#include "reuse/freq_rank.h"
#include "reuse/policy/probe.h"
#include "reuse/selective.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

using test::rel_max_diff;

constexpr double kTol = 2e-4;  // the GPU tests' tolerance (FP32 cuBLAS against OpenBLAS)

double rel(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  return rel_max_diff(got.data(), want.data(), std::min(got.size(), want.size()));
}

struct TapRun {
  std::vector<std::vector<float>> k, v;  // per layer, F32 [n][kv_dim]
  std::vector<float> attn;               // F32 [n_keys], summed over layers
  std::vector<float> logits;
  std::vector<float> k1, v1;  // with keep: layer 1's K/V of every row, projected after layer 0
};

// One pass of n rows at positions pos through backend be, every layer tapped; with keep, the
// rows at those positions are kept after layer 0.
TapRun tapped_pass(const Model& m, LayerBackend& be, const std::vector<int32_t>& toks,
                   const std::vector<int32_t>& pos, int probs_from_row,
                   const std::vector<int32_t>* keep) {
  const ModelConfig& c = m.config();
  TapRun r;
  r.attn.assign(pos.back() + 1, 0.0f);
  be.begin(toks.data(), pos.data(), (int)toks.size());
  int n = (int)toks.size(), from = probs_from_row;
  for (int l = 0; l < c.n_layer; ++l) {
    r.k.emplace_back((size_t)n * c.kv_dim());
    r.v.emplace_back((size_t)n * c.kv_dim());
    LayerTap tap;
    tap.k_pre_rope = r.k.back().data();
    tap.v = r.v.back().data();
    tap.probs_accum = r.attn.data();
    tap.probs_from_row = from;
    be.layer(l, &tap);
    if (l == 0 && keep) {
      r.k1.resize((size_t)n * c.kv_dim());
      r.v1.resize(r.k1.size());
      be.project_kv(1, r.k1.data(), r.v1.data());
      be.keep_rows(*keep);
      from = (int)keep->size() - (n - probs_from_row);  // the tapped rows are the last ones
      n = (int)keep->size();
    }
  }
  r.logits = be.finish();
  return r;
}

TEST(CudaTaps, KeysValuesAndAttentionMatchTheCpu) {
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  for (const std::string arch : {"llama", "qwen2"}) {
    SCOPED_TRACE(arch);
    test::TinyModelOptions o;
    o.arch = arch;
    const auto m = Model::load(test::write_tiny_model(dir.path() + "/" + arch + ".gguf", o));
    const int n = 40;
    const std::vector<int32_t> toks = test::random_byte_tokens(n, 11);
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    KVCache kv = m->make_cache(n), kv_host = m->make_cache(n);
    Workspace ws;
    auto cpu_be = make_cpu_layers(*m, kv, ws, PipelineOptions{});
    const TapRun cpu = tapped_pass(*m, *cpu_be, toks, pos, n - 6, nullptr);
    auto dev = make_device("cuda", *m, n);
    auto gpu_be = dev->layers(&kv_host);
    ASSERT_TRUE(gpu_be->caps().taps);
    const TapRun gpu = tapped_pass(*m, *gpu_be, toks, pos, n - 6, nullptr);
    for (int l = 0; l < m->config().n_layer; ++l) {
      EXPECT_LT(rel(gpu.k[l], cpu.k[l]), kTol) << "K before RoPE, layer " << l;
      EXPECT_LT(rel(gpu.v[l], cpu.v[l]), kTol) << "V, layer " << l;
    }
    EXPECT_LT(rel(gpu.attn, cpu.attn), kTol) << "query attention";
    // Each tapped row's probabilities sum to one per layer (averaged over heads).
    const double total = std::accumulate(gpu.attn.begin(), gpu.attn.end(), 0.0);
    EXPECT_NEAR(total, 6.0 * m->config().n_layer, 1e-3);
    EXPECT_LT(rel(gpu.logits, cpu.logits), kTol) << "logits";
  }
}

TEST(CudaTaps, KeepRowsAndProjectKvAfterLayerZeroMatchTheCpu) {
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  const auto m = Model::load(test::write_tiny_model(dir.path() + "/m.gguf", {}));
  const int n = 50;
  const std::vector<int32_t> toks = test::random_byte_tokens(n, 12);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<int32_t> keep;  // every third row, then the last four (the "query")
  for (int i = 0; i < n - 4; i += 3) keep.push_back(i);
  for (int i = n - 4; i < n; ++i) keep.push_back(i);
  // The dropped rows' cache entries stay as layer 0 left them in both backends; from layer 1 on
  // the kept rows attend over the rows they can see, which are the same on both.
  KVCache kv = m->make_cache(n), kv_host = m->make_cache(n);
  Workspace ws;
  auto cpu_be = make_cpu_layers(*m, kv, ws, PipelineOptions{});
  const TapRun cpu = tapped_pass(*m, *cpu_be, toks, pos, n - 4, &keep);
  auto dev = make_device("cuda", *m, n);
  auto gpu_be = dev->layers(&kv_host);
  ASSERT_TRUE(gpu_be->caps().keep_rows);
  const TapRun gpu = tapped_pass(*m, *gpu_be, toks, pos, n - 4, &keep);
  for (int l = 0; l < m->config().n_layer; ++l) {
    EXPECT_LT(rel(gpu.k[l], cpu.k[l]), kTol) << "K before RoPE, layer " << l;
    EXPECT_LT(rel(gpu.v[l], cpu.v[l]), kTol) << "V, layer " << l;
  }
  EXPECT_LT(rel(gpu.k1, cpu.k1), kTol) << "layer 1's K, projected after layer 0";
  EXPECT_LT(rel(gpu.v1, cpu.v1), kTol) << "layer 1's V, projected after layer 0";
  EXPECT_LT(rel(gpu.attn, cpu.attn), kTol) << "query attention";
  EXPECT_LT(rel(gpu.logits, cpu.logits), kTol) << "logits";
  const size_t cells = (size_t)n * m->config().kv_dim();
  for (int l = 0; l < m->config().n_layer; ++l) {
    EXPECT_LT(rel_max_diff(kv_host.k(l), kv.k(l), cells), kTol) << "K cache, layer " << l;
    EXPECT_LT(rel_max_diff(kv_host.v(l), kv.v(l), cells), kTol) << "V cache, layer " << l;
  }
}

TEST(CudaTaps, ChunkEncodingOnTheDeviceMatchesTheCpu) {
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  test::TinyModelOptions o;
  o.context_length = 1024;
  const auto m = Model::load(test::write_tiny_model(dir.path() + "/m.gguf", o));
  const std::vector<int32_t> toks = test::random_byte_tokens(60, 13);
  // Room for the probe context before the chunk: the probe ranking's pass runs there too.
  auto dev = make_device("cuda", *m, 512);
  // The attention rankings tap the last kAttentionRows rows: a longer chunk has rows before them.
  const std::vector<int32_t> long_toks = test::random_byte_tokens(kAttentionRows + 40, 15);
  for (RankMode mode : {RankMode::kProbe, RankMode::kHead, RankMode::kLowFreq, RankMode::kAttn,
                        RankMode::kProbeAttn}) {
    SCOPED_TRACE(rank_mode_name(mode));
    EncodeOptions eo;
    eo.dtype = KvDtype::F32;
    eo.rank.mode = mode;
    const auto& chunk = mode == RankMode::kAttn || mode == RankMode::kProbeAttn ? long_toks : toks;
    const ChunkKV cpu = encode_chunk(*m, chunk, eo);
    eo.device = dev.get();
    const ChunkKV gpu = encode_chunk(*m, chunk, eo);
    EXPECT_EQ(gpu.meta.id, cpu.meta.id);  // the device is not part of the record's identity
    const ChunkKVF32 a = unpack_text_order(cpu), b = unpack_text_order(gpu);
    EXPECT_LT(rel(b.k, a.k), kTol) << "K";
    EXPECT_LT(rel(b.v, a.v), kTol) << "V";
    ASSERT_EQ(gpu.meta.scores.size(), cpu.meta.scores.size());
    EXPECT_LT(rel(gpu.meta.scores, cpu.meta.scores), 1e-3) << "ranking scores";
    if (mode == RankMode::kHead) {
      EXPECT_EQ(gpu.meta.order, cpu.meta.order);
    }
  }
  {
    auto small = make_device("cuda", *m, 64);
    EncodeOptions eo;
    eo.device = small.get();
    // 60 tokens and the sink fit; the probe context does not, so its pass runs on the CPU.
    const ChunkKV gpu = encode_chunk(*m, toks, eo);
    const ChunkKV cpu = encode_chunk(*m, toks, EncodeOptions{});
    ASSERT_EQ(gpu.meta.scores.size(), cpu.meta.scores.size());
    EXPECT_LT(rel(gpu.meta.scores, cpu.meta.scores), 1e-3)
        << "ranking scores, probe pass on the CPU";
    EXPECT_THROW(encode_chunk(*m, test::random_byte_tokens(64, 14), eo), Error)
        << "64 tokens and the sink do not fit 64 positions";
  }
}

TEST(CudaTaps, LayerLoopPoliciesSelectAsOnTheCpu) {
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  test::TinyModelOptions o;
  o.context_length = 1024;
  const auto m = Model::load(test::write_tiny_model(dir.path() + "/m.gguf", o));
  const ChunkKV a = encode_chunk(*m, test::random_byte_tokens(70, 21), EncodeOptions{});
  const ChunkKV b = encode_chunk(*m, test::random_byte_tokens(45, 22), EncodeOptions{});
  const InMemoryChunk ca(a), cb(b);
  ComposedRequest req;
  req.prefix = test::random_byte_tokens(9, 23);
  req.chunks = {&cb, &ca};
  req.query = test::random_byte_tokens(12, 24);
  const int n_total = layout_request(req).n_total;
  auto dev = make_device("cuda", *m, n_total + 8);
  for (const char* name : {"cacheblend", "prophetkv", "cachetune"}) {
    SCOPED_TRACE(name);
    SelectiveOptions so;
    so.policy.kind = &find_policy(name);
    so.policy.ratio = 0.15;
    std::vector<float> cpu_attn, gpu_attn;
    so.query_attention = &cpu_attn;
    KVCache cpu_kv = m->make_cache(n_total + 8), gpu_kv = m->make_cache(n_total + 8);
    Workspace ws;
    SelectionReport cpu_sel, gpu_sel;
    const std::vector<float> cpu =
        selective_prefill(*m, req, so, cpu_kv, ws, nullptr, &cpu_sel);
    so.device = dev.get();
    so.query_attention = &gpu_attn;
    const std::vector<float> gpu =
        selective_prefill(*m, req, so, gpu_kv, ws, nullptr, &gpu_sel);
    // The same budget; the same tokens for the offline ranking. CacheBlend ranks by how far the
    // fresh layer-1 K/V (project_kv) lie from the stored copy, and ProphetKV by attention
    // scores, so a token at the cut may swap under the backends' ~1e-7 differences: at most one
    // per chunk is allowed there, and then the logits are not compared.
    ASSERT_EQ(gpu_sel.selected.size(), cpu_sel.selected.size());
    bool same = true;
    for (size_t b = 0; b < cpu_sel.selected.size(); ++b) {
      const auto& g = gpu_sel.selected[b];
      const auto& h = cpu_sel.selected[b];
      ASSERT_EQ(g.size(), h.size()) << "chunk " << b;
      int common = 0;
      for (int32_t t : g) common += std::count(h.begin(), h.end(), t) > 0;
      if (std::string(name) == "cachetune") {
        EXPECT_EQ(g, h) << "chunk " << b;
      } else {
        EXPECT_GE(common + 1, (int)h.size()) << "chunk " << b;
      }
      same = same && common == (int)h.size();
    }
    if (!same) continue;
    EXPECT_LT(rel(gpu, cpu), kTol) << "logits";
    EXPECT_LT(rel(gpu_attn, cpu_attn), kTol) << "query attention";
    for (int l = 0; l < m->config().n_layer; ++l) {
      const size_t cells = (size_t)n_total * m->config().kv_dim();
      EXPECT_LT(rel_max_diff(gpu_kv.k(l), cpu_kv.k(l), cells), kTol) << "K of layer " << l;
      EXPECT_LT(rel_max_diff(gpu_kv.v(l), cpu_kv.v(l), cells), kTol) << "V of layer " << l;
    }
  }
}

}  // namespace
}  // namespace ct
