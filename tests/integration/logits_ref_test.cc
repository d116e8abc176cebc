// The model's logits against llama.cpp's, from fixtures written by tools/make_ref_logits.py for
// each registry model (each case skips when its model is not installed):
//  - f32:  llama.cpp on an exactly dequantised F32 copy of the GGUF. This isolates implementation
//          differences: for llama.cpp's 16 largest logits at every recorded position |ours -
//          llama.cpp| stays within max_abs and its mean within mean_abs, top-1 agrees wherever
//          llama.cpp's top-2 margin exceeds top1_margin, and the 64-token greedy continuation is
//          identical.
//          Our prefill runs dequantise + SGEMM (PrefillKernel::kSgemm) and our decode steps the
//          F32-input kernels (QgemvPath::kF32) here: the exact product with the dequantised
//          weights that llama.cpp computes on the copy.
//  - q4_1 / file: llama.cpp on the quantised file itself, where it quantises activations to 8 bits
//          inside its dot products; our default prefill kernel (qgemm where the CPU has VNNI,
//          else dequantise + SGEMM; CT_PREFILL_KERNEL picks one) and our decode steps (the
//          default path) round their inputs to 8 bits as llama.cpp does, in our own blocks and
//          order. So the tolerances are looser and the greedy continuation must
//          agree for a stated prefix, unless it diverges earlier at a near-tie: where our logit of
//          llama.cpp's token is within top1_margin of our top one (the first divergence and that
//          gap are printed; docs/ARCHITECTURE.md discusses it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/qgemv.h"
#include "backend/cpu_forward.h"
#include "engine/generate.h"
#include "support/model_fixture.h"

namespace ct {
namespace {

struct Tolerance {
  const char* model;    // registry name
  const char* fixture;  // file name under tests/fixtures
  const char* variant;
  float max_abs;
  double mean_abs;
  float top1_margin;
  size_t greedy_prefix;    // required identical greedy tokens (SIZE_MAX: all)
  int first_position = 0;  // positions below are not compared (see the 1.5B file variant)
};

// The live KV cache's type: F32 for the f32 variants (the exact reference), F16 for the files,
// as the engine serves them by default (EngineOptions::kv_type) and as llama.cpp's own default
// cache (type_k = type_v = f16) ran when it wrote every fixture. CT_REF_CACHE_TYPE=f16|f32 runs
// every variant with one type instead (the comparison in docs/ARCHITECTURE.md).
KvDtype cache_type(const Tolerance& t) {
  if (const char* e = std::getenv("CT_REF_CACHE_TYPE")) return parse_kv_dtype(e);
  return std::string(t.variant) == "f32" ? KvDtype::F32 : KvDtype::F16;
}
constexpr Tolerance kTolerances[] = {
    {"smollm2-135m", "ref_logits_smollm2_f32.json", "f32", 0.1f, 0.01, 0.05f, SIZE_MAX},
    // top1_margin 0.4 for the quantised files: their logits differ from llama.cpp's by up to 1.3
    // (SmolLM2) and 1.1 (Qwen) under either prefill kernel, so near-ties flip. Under qgemm two
    // did above 0.3: SmolLM2 "doc" position 6 at a margin of 0.348, Qwen-1.5B "long" position
    // 1048 at 0.316 (dequantise + SGEMM: none above 0.3). docs/STATUS.md, twelfth session.
    {"smollm2-135m", "ref_logits_smollm2_q4_1.json", "q4_1", 1.5f, 0.3, 0.4f, 12},
    // The Qwen2.5 files mix Q5_0, Q4_K, Q6_K and Q8_0 (0.5B) or Q4_K and Q6_K (1.5B); llama.cpp
    // quantises activations to 8 bits (Q8_0 / Q8_K) in all of their dot products.
    {"qwen2.5-coder-0.5b", "ref_logits_qwen2.5-coder-0.5b_f32.json", "f32", 0.1f, 0.01, 0.05f,
     SIZE_MAX},
    {"qwen2.5-coder-0.5b", "ref_logits_qwen2.5-coder-0.5b_file.json", "file", 1.5f, 0.3, 0.4f, 12},
    {"qwen2.5-coder-1.5b", "ref_logits_qwen2.5-coder-1.5b_f32.json", "f32", 0.1f, 0.01, 0.05f,
     SIZE_MAX},
    // Position 0 is left out here: llama.cpp's own runs on this file and on its F32 copy differ
    // there by up to 7 (both fixtures, any prompt), because the first token's hidden state has
    // outliers of several hundred that an 8-bit block scale flattens. Our position 0 is checked
    // against the F32 copy by the f32 case above (and matches it to 0.02).
    {"qwen2.5-coder-1.5b", "ref_logits_qwen2.5-coder-1.5b_file.json", "file", 1.5f, 0.3, 0.4f, 12,
     1},
};

// gtest prints this instead of the struct's bytes in test listings.
void PrintTo(const Tolerance& t, std::ostream* os) { *os << t.fixture; }

nlohmann::json load_fixture(const Tolerance& tol) {
  // CT_REF_FIXTURE_DIR: fixtures of the same names from elsewhere (e.g. written by
  // make_ref_logits.py --cache-type q8_0, for the comparison in docs/PERFORMANCE.md).
  const char* dir = std::getenv("CT_REF_FIXTURE_DIR");
  const std::string path = std::string(dir ? dir : CT_FIXTURE_DIR) + "/" + tol.fixture;
  std::ifstream f(path);
  if (!f) ADD_FAILURE() << "cannot open " << path;
  nlohmann::json j = nlohmann::json::parse(f);
  if (j.contains("model")) {
    EXPECT_EQ(j["model"].get<std::string>(), tol.model) << path;
  }
  return j;
}

class LogitsVsLlamaCpp : public ::testing::TestWithParam<Tolerance> {};

TEST_P(LogitsVsLlamaCpp, AllPromptsWithinTolerance) {
  const Tolerance tol = GetParam();
  CT_REQUIRE_REGISTRY_MODEL(m, tol.model);
  const auto fx = load_fixture(tol);
  const int V = m->config().n_vocab, E = m->config().n_embd;
  for (const auto& c : fx["cases"]) {
    const std::vector<int32_t> toks = c["tokens"].get<std::vector<int32_t>>();
    const std::vector<int32_t> pos = c["positions"].get<std::vector<int32_t>>();
    const int n = (int)toks.size();
    KVCache kv = m->make_cache(n + 1, cache_type(tol));
    Workspace ws;
    if (std::string(tol.variant) == "f32") ws.prefill_kernel = cpu::PrefillKernel::kSgemm;
    std::vector<float> x((size_t)n * E);
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[i] = i;
    m->embed(toks.data(), n, x.data());
    for (int l = 0; l < m->config().n_layer; ++l)
      cpu::forward_layer(*m, l, x.data(), p.data(), n, kv, ws);
    std::vector<float> rows((size_t)pos.size() * E), logits((size_t)pos.size() * V);
    for (size_t j = 0; j < pos.size(); ++j) {
      std::copy_n(x.begin() + (size_t)pos[j] * E, E, rows.begin() + j * E);
    }
    cpu::logits(*m, rows.data(), (int)pos.size(), logits.data(), ws);
    double sum_abs = 0;
    int n_cmp = 0, n_fail = 0, n_top1_fail = 0;
    float worst = 0;
    for (size_t j = 0; j < pos.size(); ++j) {
      if (pos[j] < tol.first_position) continue;
      const auto ids = c["top_ids"][j].get<std::vector<int32_t>>();
      const auto ref = c["top_logits"][j].get<std::vector<float>>();
      const float* row = logits.data() + j * V;
      for (size_t t = 0; t < ids.size(); ++t) {
        const float d = std::fabs(row[ids[t]] - ref[t]);
        sum_abs += d;
        ++n_cmp;
        worst = std::max(worst, d);
        if (d > tol.max_abs && n_fail++ < 5) {
          ADD_FAILURE() << c["name"] << " position " << pos[j] << " token " << ids[t] << ": ours "
                        << row[ids[t]] << " llama.cpp " << ref[t];
        }
      }
      int best = 0;
      for (int t = 1; t < V; ++t) best = row[t] > row[best] ? t : best;
      if (ref[0] - ref[1] > tol.top1_margin && best != ids[0] && n_top1_fail++ < 5) {
        ADD_FAILURE() << c["name"] << " position " << pos[j] << ": our top-1 " << best
                      << ", llama.cpp top-1 " << ids[0] << " (margin " << ref[0] - ref[1] << ")";
      }
    }
    const double mean_abs = sum_abs / n_cmp;
    std::printf(
        "[ logits ] %-18s %-4s %-6s cache %s n=%4d positions=%4zu max|d|=%.4f mean|d|=%.4f\n",
        tol.model, tol.variant, c["name"].get<std::string>().c_str(),
        kv_dtype_name(cache_type(tol)), n, pos.size(), worst, mean_abs);
    EXPECT_LE(mean_abs, tol.mean_abs) << c["name"];
  }
}

TEST_P(LogitsVsLlamaCpp, GreedyContinuationMatches) {
  const Tolerance tol = GetParam();
  CT_REQUIRE_REGISTRY_MODEL(m, tol.model);
  const auto fx = load_fixture(tol);
  for (const auto& c : fx["cases"]) {
    const std::vector<int32_t> toks = c["tokens"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = c["greedy"].get<std::vector<int32_t>>();
    const bool f32 = std::string(tol.variant) == "f32";
    KVCache kv = m->make_cache((int)toks.size() + 70, cache_type(tol));
    Workspace ws;
    if (f32) {
      ws.decode_path = cpu::QgemvPath::kF32;
      ws.prefill_kernel = cpu::PrefillKernel::kSgemm;
    }
    auto logits = cpu::prefill(*m, toks.data(), (int)toks.size(), 0, kv, ws);
    const std::vector<float> first_logits = logits;
    GenerateOptions opt;
    opt.max_tokens = 64;
    const DecodeResult r = decode(*m, kv, ws, logits, opt);
    size_t first_diff = 0;
    while (first_diff < want.size() && first_diff < r.tokens.size() &&
           want[first_diff] == r.tokens[first_diff]) {
      ++first_diff;
    }
    const bool identical = r.tokens == want;
    // At the first divergence: how far below our top logit our logit of llama.cpp's token is
    // (teacher-forced through the shared prefix, so these are the logits decode saw).
    float gap = 0;
    if (!identical && first_diff < want.size() && first_diff < r.tokens.size()) {
      KVCache kv2 = m->make_cache((int)toks.size() + 70, cache_type(tol));
      Workspace ws2;
      ws2.decode_path = ws.decode_path;
      cpu::prefill(*m, toks.data(), (int)toks.size(), 0, kv2, ws2);
      const std::vector<int32_t> prefix(want.begin(), want.begin() + (long)first_diff + 1);
      const auto forced = forced_decode_logits(*m, kv2, ws2, first_logits, prefix);
      const float* row = forced.data() + first_diff * (size_t)m->config().n_vocab;
      gap = row[r.tokens[first_diff]] - row[want[first_diff]];
    }
    std::printf(
        "[ greedy ] %-18s %-4s %-6s cache %s %s (first divergence at generated token %zu of %zu, "
        "gap %.4f)\n",
        tol.model, tol.variant, c["name"].get<std::string>().c_str(),
        kv_dtype_name(cache_type(tol)),
        identical ? "identical" : "differs", first_diff, want.size(), gap);
    if (tol.greedy_prefix == SIZE_MAX) {
      EXPECT_TRUE(identical) << c["name"] << ": first divergence at generated token " << first_diff
                             << "; ours: '" << r.text << "' llama.cpp: '"
                             << m->tokenizer().decode(want) << "'";
    } else {
      const bool near_tie = gap < tol.top1_margin;
      EXPECT_TRUE(first_diff >= std::min(tol.greedy_prefix, want.size()) || near_tie)
          << c["name"] << ": first divergence at " << first_diff << ", logit gap " << gap
          << "; ours: '" << r.text << "' llama.cpp: '" << m->tokenizer().decode(want) << "'";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LogitsVsLlamaCpp, ::testing::ValuesIn(kTolerances),
                         [](const auto& info) {
                           std::string s = std::string(info.param.model) + "_" + info.param.variant;
                           for (char& ch : s) {
                             if (!isalnum((unsigned char)ch)) ch = '_';
                           }
                           return s;
                         });

}  // namespace
}  // namespace ct
