// The GPU decoder (backend/cuda/decoder) against the CPU backend's cpu::prefill on tiny random
// models: last-row logits and every layer's K/V cache rows, for grouped-query attention, Qwen2's
// QKV biases with NeoX RoPE, a SmolLM2-shaped head layout, quantised weights (Q4_K, Q6_K, Q5_0
// matrices, Q8_0 embedding, untied output) and a prefill split in two calls (rows at positions
// > 0 attending over cache rows of the earlier call); and the batched decode step over several
// sequence slots against each sequence alone. Skipped without a device.
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

// decode_batch: three sequences of different lengths in the slots of one decoder, two decode
// steps over all of them at once (rows in another order than the slots), against each sequence
// alone on a one-slot decoder: logits of every row, and the slots' caches afterwards (so no row
// wrote into another's slot, and prefilling slots 1 and 2 left slot 0 alone).
TEST(CudaDecoder, BatchedDecodeMatchesEachSequenceAlone) {
  CT_REQUIRE_CUDA_DEVICE();
  test::TempDir dir;
  test::TinyModelOptions o;
  o.arch = "qwen2";  // QKV biases and NeoX rotation; grouped-query attention
  const auto m = Model::load(test::write_tiny_model(dir.path() + "/m.gguf", o));
  const int n_ctx = 48, V = m->config().n_vocab, KV = m->config().kv_dim();
  const std::vector<int> lens = {5, 30, 17};
  std::vector<std::vector<int32_t>> prompts, next;
  for (int s = 0; s < 3; ++s) {
    prompts.push_back(test::random_byte_tokens(lens[s], 20 + s));
    next.push_back(test::random_byte_tokens(2, 40 + s));
  }
  auto batched = make_cuda_decoder(*m, n_ctx, 3);
  EXPECT_EQ(batched->n_seq(), 3);
  for (int s = 0; s < 3; ++s) {
    batched->select(s);
    cuda_prefill(*batched, *m, prompts[s].data(), lens[s], 0);
  }
  const std::vector<int32_t> order = {2, 0, 1};  // row i decodes slot order[i]
  std::vector<std::vector<float>> got(2);
  for (int step = 0; step < 2; ++step) {
    std::vector<int32_t> toks, pos;
    for (int s : order) {
      toks.push_back(next[s][step]);
      pos.push_back(lens[s] + step);
    }
    got[step] = cuda_decode_batch(*batched, *m, toks.data(), pos.data(), order.data(), 3);
    ASSERT_EQ(got[step].size(), static_cast<size_t>(3) * V);
  }
  for (int i = 0; i < 3; ++i) {
    const int s = order[i];
    SCOPED_TRACE("slot " + std::to_string(s));
    auto alone = make_cuda_decoder(*m, n_ctx);
    cuda_prefill(*alone, *m, prompts[s].data(), lens[s], 0);
    for (int step = 0; step < 2; ++step) {
      const std::vector<float> want = cuda_prefill(*alone, *m, &next[s][step], 1, lens[s] + step);
      const std::vector<float> row(got[step].begin() + (size_t)i * V,
                                   got[step].begin() + (size_t)(i + 1) * V);
      EXPECT_LT(rel_max_diff(row, want), 2e-4) << "step " << step;
      EXPECT_EQ(argmax(row), argmax(want)) << "step " << step;
    }
    const int n_pos = lens[s] + 2;
    std::vector<float> k(static_cast<size_t>(n_pos) * KV), v(k.size()), ka(k.size()), va(k.size());
    batched->select(s);
    alone->select(0);
    for (int l = 0; l < m->config().n_layer; ++l) {
      batched->read_kv(l, n_pos, k.data(), v.data());
      alone->read_kv(l, n_pos, ka.data(), va.data());
      EXPECT_LT(rel_max_diff(k, ka), 2e-4) << "K of layer " << l;
      EXPECT_LT(rel_max_diff(v, va), 2e-4) << "V of layer " << l;
    }
  }
  // Bad batches are refused by name.
  const std::vector<int32_t> t2 = {1, 2}, p2 = {7, 7}, same = {1, 1}, far = {0, 3};
  EXPECT_THROW(cuda_decode_batch(*batched, *m, t2.data(), p2.data(), same.data(), 2), Error);
  EXPECT_THROW(cuda_decode_batch(*batched, *m, t2.data(), p2.data(), far.data(), 2), Error);
  EXPECT_THROW(batched->select(3), Error);
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
