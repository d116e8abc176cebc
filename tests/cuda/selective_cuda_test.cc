// Selective prefill with the layers computed on the GPU decoder (SelectiveOptions::device)
// against the same prefill on the CPU: every offline policy, chunks in any order with a prefix
// and a query, every stored K/V type, sparse loading on and off (reused rows copied as stored and
// unpacked and rotated on the device), and the token-stage policies (prefix caching with a hit,
// lfonly). The first-token logits and the whole K/V cache handed back to the host must match.
// Skipped without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuda/compare.h"
#include "backend/gpu_decoder.h"
#include "reuse/encoder.h"
#include "reuse/freq_rank.h"
#include "reuse/selective.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

using test::rel_max_diff;

// The device's prefill against the CPU's: logits within 2e-4 of their largest value and the same
// argmax, the same rows computed and loaded, and the first n_pos rows of every layer's K/V.
void expect_same_prefill(const Model& m, const std::vector<float>& cpu,
                         const std::vector<float>& gpu, const PrefillBreakdown& cpu_bd,
                         const PrefillBreakdown& gpu_bd, const KVCache& cpu_kv,
                         const KVCache& gpu_kv, int n_pos) {
  ASSERT_EQ(cpu.size(), gpu.size());
  EXPECT_LT(rel_max_diff(gpu.data(), cpu.data(), cpu.size()), 2e-4) << "logits";
  EXPECT_EQ(std::max_element(gpu.begin(), gpu.end()) - gpu.begin(),
            std::max_element(cpu.begin(), cpu.end()) - cpu.begin());
  EXPECT_EQ(gpu_bd.n_active, cpu_bd.n_active);
  EXPECT_EQ(gpu_bd.n_loaded, cpu_bd.n_loaded);
  const size_t n = static_cast<size_t>(n_pos) * m.config().kv_dim();
  for (int l = 0; l < m.config().n_layer; ++l) {
    EXPECT_LT(rel_max_diff(gpu_kv.k(l), cpu_kv.k(l), n), 2e-4) << "K of layer " << l;
    EXPECT_LT(rel_max_diff(gpu_kv.v(l), cpu_kv.v(l), n), 2e-4) << "V of layer " << l;
  }
}

TEST(CudaSelective, MatchesCpuForEveryOfflinePolicy) {
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  test::TinyModelOptions o;
  o.context_length = 1024;
  const auto m = Model::load(test::write_tiny_model(dir.path() + "/m.gguf", o));
  for (KvDtype dtype : {KvDtype::F16, KvDtype::BF16, KvDtype::F32}) {
    EncodeOptions eo;
    eo.dtype = dtype;
    const ChunkKV a = encode_chunk(*m, test::random_byte_tokens(70, 1), eo);
    const ChunkKV b = encode_chunk(*m, test::random_byte_tokens(45, 2), eo);
    const InMemoryChunk ca(a), cb(b);
    ComposedRequest req;
    req.prefix = test::random_byte_tokens(9, 3);
    req.chunks = {&cb, &ca, &cb};  // any order, a chunk twice
    req.query = test::random_byte_tokens(12, 4);
    const int n_total = layout_request(req).n_total;
    auto dev = make_device("cuda", *m, n_total + 8);
    for (const Policy* kind :
         {&find_policy("full"), &find_policy("reuse"), &find_policy("cachetune"), &find_policy("epic"),
          &find_policy("random"), &find_policy("l2"), &find_policy("highfreq"),
          &find_policy("head"), &find_policy("probe"), &find_policy("probe-shared")}) {
      for (bool sparse : {true, false}) {
        SCOPED_TRACE(std::string(kind->name()) + " " + kv_dtype_name(dtype) +
                     (sparse ? " sparse" : " dense"));
        SelectiveOptions so;
        so.policy.kind = kind;
        so.policy.ratio = 0.15;
        so.pipeline.sparse = sparse;
        KVCache cpu_kv = m->make_cache(n_total + 8), gpu_kv = m->make_cache(n_total + 8);
        Workspace ws;
        PrefillBreakdown cpu_bd, gpu_bd;
        const std::vector<float> cpu = selective_prefill(*m, req, so, cpu_kv, ws, &cpu_bd);
        so.device = dev.get();
        const std::vector<float> gpu = selective_prefill(*m, req, so, gpu_kv, ws, &gpu_bd);
        EXPECT_EQ(gpu_kv.n_pos, n_total);
        expect_same_prefill(*m, cpu, gpu, cpu_bd, gpu_bd, cpu_kv, gpu_kv, n_total);
      }
    }
  }
}

TEST(CudaSelective, MixedKvTypesAreRefused) {
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  const auto m = Model::load(test::write_tiny_model(dir.path() + "/m.gguf", {}));
  EncodeOptions e16, e32;
  e32.dtype = KvDtype::F32;
  const ChunkKV a = encode_chunk(*m, test::random_byte_tokens(20, 1), e16);
  const ChunkKV b = encode_chunk(*m, test::random_byte_tokens(20, 2), e32);
  const InMemoryChunk ca(a), cb(b);
  ComposedRequest req{test::random_byte_tokens(3, 3), {&ca, &cb}, test::random_byte_tokens(4, 4)};
  auto dev = make_device("cuda", *m, 64);
  KVCache kv = m->make_cache(64);
  Workspace ws;
  SelectiveOptions so;
  so.device = dev.get();
  EXPECT_THROW(selective_prefill(*m, req, so, kv, ws), Error);
}

TEST(CudaSelective, FullPolicyEqualsThePlainGpuPrefill) {
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  const auto m = Model::load(test::write_tiny_model(dir.path() + "/m.gguf", {}));
  const ChunkKV a = encode_chunk(*m, test::random_byte_tokens(40, 5), EncodeOptions{});
  const InMemoryChunk ca(a);
  ComposedRequest req;
  req.prefix = test::random_byte_tokens(5, 6);
  req.chunks = {&ca};
  req.query = test::random_byte_tokens(7, 7);
  const RequestLayout lay = layout_request(req);
  auto dev = make_device("cuda", *m, lay.n_total);
  SelectiveOptions so;
  so.policy.kind = &find_policy("full");
  so.device = dev.get();
  KVCache kv = m->make_cache(lay.n_total);
  Workspace ws;
  const std::vector<float> sel = selective_prefill(*m, req, so, kv, ws);
  const std::vector<float> plain = dev->prefill(lay.tokens.data(), lay.n_total, 0);
  EXPECT_EQ(sel, plain);  // the same kernels on the same rows: bit for bit
}

// The token-stage policies prefill their list on the device over the rows they placed in the host
// cache. The device's cache is filled with other rows before each pass, so rows that were not
// uploaded would show.
TEST(CudaSelective, TokenStagePoliciesMatchTheCpu) {
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  const auto m = Model::load(test::write_tiny_model(dir.path() + "/m.gguf", {}));
  const ChunkKV a = encode_chunk(*m, test::random_byte_tokens(40, 8), EncodeOptions{});
  const ChunkKV b = encode_chunk(*m, test::random_byte_tokens(30, 11), EncodeOptions{});
  const InMemoryChunk ca(a), cb(b);
  // The second request repeats the first's prefix and first chunk: prefix caching reuses them.
  const ComposedRequest first{test::random_byte_tokens(3, 9), {&ca, &cb},
                              test::random_byte_tokens(4, 10)};
  const ComposedRequest second{first.prefix, {&ca}, test::random_byte_tokens(5, 12)};
  const int n_ctx = 96;
  auto dev = make_device("cuda", *m, n_ctx);
  int n_token_stage = 0;
  for (const Policy* kind : all_policies()) {
    if (kind->stage() != PolicyStage::kTokens) continue;
    ++n_token_stage;
    PrefixCache cpu_prefixes, gpu_prefixes;
    for (const ComposedRequest* req : {&first, &second}) {
      SCOPED_TRACE(std::string(kind->name()) + (req == &first ? " first" : " second"));
      SelectiveOptions so;
      so.policy.kind = kind;
      so.policy.ratio = 0.15;
      KVCache cpu_kv = m->make_cache(n_ctx), gpu_kv = m->make_cache(n_ctx);
      Workspace ws;
      PrefillBreakdown cpu_bd, gpu_bd;
      so.prefix_cache = &cpu_prefixes;
      const std::vector<float> cpu = selective_prefill(*m, *req, so, cpu_kv, ws, &cpu_bd);
      so.prefix_cache = &gpu_prefixes;
      so.device = dev.get();
      const std::vector<int32_t> other = test::random_byte_tokens(n_ctx - 1, 99);
      dev->prefill(other.data(), n_ctx - 1, 0);
      // Prefix caching gets the host cache back regardless (uses_host_cache); lfonly when asked.
      so.device_kv_to_host = !kind->uses_host_cache();
      const std::vector<float> gpu = selective_prefill(*m, *req, so, gpu_kv, ws, &gpu_bd);
      if (kind->uses_prefix_cache() && req == &second) {
        EXPECT_EQ(gpu_bd.n_loaded, 43);  // the prefix and chunk a
      }
      ASSERT_EQ(gpu_kv.n_pos, cpu_kv.n_pos);
      expect_same_prefill(*m, cpu, gpu, cpu_bd, gpu_bd, cpu_kv, gpu_kv, cpu_kv.n_pos);
    }
  }
  EXPECT_GE(n_token_stage, 2);  // prefix and lfonly
}

}  // namespace
}  // namespace ct
