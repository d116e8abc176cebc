// The GPU decoder (backend/cuda/decoder) against the CPU backend's cpu::prefill on tiny random
// models: last-row logits and every layer's K/V cache rows, for grouped-query attention, Qwen2's
// QKV biases with NeoX RoPE, a SmolLM2-shaped head layout, quantised weights (Q4_K, Q6_K, Q5_0
// matrices, Q8_0 embedding, untied output) and a prefill split in two calls (rows at positions
// > 0 attending over cache rows of the earlier call). Skipped without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu_forward.h"
#include "backend/gpu_decoder.h"
#include "cuda/compare.h"
#include "reuse/freq_rank.h"
#include "support/chunk_fixtures.h"
#include "support/tiny_model.h"

namespace ct {
namespace {

#define CT_REQUIRE_CUDA_DEVICE() \
  if (!cuda_ranking_available()) GTEST_SKIP() << "no CUDA device"

double rel_max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  return test::rel_max_diff(a.data(), b.data(), std::min(a.size(), b.size()));
}

int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

struct Case {
  std::string name;
  test::TinyModelOptions opt;
  int n_tok;
  int split;  // 0: one call; else the first call takes [0, split)
  // Quantised weights: the CPU side runs its reference path (each matrix dequantised to F32,
  // F32 activations), which is what the decoder computes from the F32 weights it uploads; the
  // fast CPU kernels round the activations to 8 bits and would differ by more than 2e-4.
  bool cpu_reference = false;
};

void check_case(const Case& c) {
  SCOPED_TRACE(c.name);
  test::TempDir dir;
  const auto m = Model::load(test::write_tiny_model(dir.path() + "/m.gguf", c.opt));
  const std::vector<int32_t> toks = test::random_byte_tokens(c.n_tok, 7);
  const int n_ctx = c.n_tok + 4;

  KVCache kv = m->make_cache(n_ctx);
  Workspace ws;
  ws.use_reference = c.cpu_reference;
  auto dec = make_cuda_decoder(*m, n_ctx);
  std::vector<float> cpu, gpu;
  if (c.split == 0) {
    cpu = cpu::prefill(*m, toks.data(), c.n_tok, 0, kv, ws);
    gpu = cuda_prefill(*dec, *m, toks.data(), c.n_tok, 0);
  } else {
    const std::vector<float> cpu0 = cpu::prefill(*m, toks.data(), c.split, 0, kv, ws);
    const std::vector<float> gpu0 = cuda_prefill(*dec, *m, toks.data(), c.split, 0);
    EXPECT_LT(rel_max_diff(gpu0, cpu0), 2e-4) << "first part";
    cpu = cpu::prefill(*m, toks.data() + c.split, c.n_tok - c.split, c.split, kv, ws);
    gpu = cuda_prefill(*dec, *m, toks.data() + c.split, c.n_tok - c.split, c.split);
  }
  EXPECT_LT(rel_max_diff(gpu, cpu), 2e-4) << "logits";
  EXPECT_EQ(argmax(gpu), argmax(cpu));
  const int KV = m->config().kv_dim();
  std::vector<float> k(static_cast<size_t>(c.n_tok) * KV), v(k.size());
  for (int l = 0; l < m->config().n_layer; ++l) {
    dec->read_kv(l, c.n_tok, k.data(), v.data());
    const std::vector<float> ck(kv.k(l), kv.k(l) + k.size()), cv(kv.v(l), kv.v(l) + v.size());
    EXPECT_LT(rel_max_diff(k, ck), 2e-4) << "K of layer " << l;
    EXPECT_LT(rel_max_diff(v, cv), 2e-4) << "V of layer " << l;
  }
}

TEST(CudaDecoder, MatchesCpuPrefill) {
  CT_REQUIRE_CUDA_DEVICE();
  std::vector<Case> cases;
  cases.push_back({"llama gqa", {}, 37, 0});
  cases.push_back({"llama split 20 + 17", {}, 37, 20});
  Case qwen{"qwen2 biases + neox", {}, 41, 0};
  qwen.opt.arch = "qwen2";
  cases.push_back(qwen);
  Case smol{"smollm2 head layout", {}, 300, 123};
  smol.opt.n_layer = 2;
  smol.opt.n_embd = 576;
  smol.opt.n_head = 9;
  smol.opt.n_head_kv = 3;
  smol.opt.head_dim = 64;
  smol.opt.n_ff = 1536;
  smol.opt.context_length = 1024;
  cases.push_back(smol);
  // Weights kept in their file encoding on the host, dequantised once for the upload
  // (make_cuda_decoder): K-quant and Q8_0 matrices, a Q8_0 embedding and an untied output.
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0}) {
    Case q{std::string("qwen2 ") + ggml_type_name(t) + " weights", {}, 29, 0};
    q.opt.arch = "qwen2";
    q.opt.n_embd = 256;
    q.opt.n_head = 4;
    q.opt.n_head_kv = 2;
    q.opt.head_dim = 64;
    q.opt.n_ff = 512;
    q.opt.weight_type = t;
    q.opt.token_embd_type = GgmlType::Q8_0;
    q.opt.tied_output = false;
    q.cpu_reference = true;
    cases.push_back(q);
  }
  for (const Case& c : cases) check_case(c);
}

TEST(CudaDecoder, RejectsBadPositionsAndTokens) {
  CT_REQUIRE_CUDA_DEVICE();
  test::TempDir dir;
  const auto m = Model::load(test::write_tiny_model(dir.path() + "/m.gguf", {}));
  auto dec = make_cuda_decoder(*m, 16);
  const std::vector<int32_t> toks = {1, 2, 3};
  EXPECT_THROW(cuda_prefill(*dec, *m, toks.data(), 3, 14), Error);  // rows 14..16 past n_ctx
  const std::vector<int32_t> bad = {1, m->config().n_vocab, 3};
  EXPECT_THROW(cuda_prefill(*dec, *m, bad.data(), 3, 0), Error);
}

}  // namespace
}  // namespace ct
