// `cachetune bench`: prefill tokens/s at several prompt lengths, decode tokens/s, the FLOP rate
// this implies, and the machine's OpenBLAS SGEMM rate measured in the same run (for the ratio).
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/blas_core.h"
#include "backend/cpu_forward.h"
#include "core/error.h"
#include "core/timer.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "tools/cli/commands.h"
#include "tools/cli/engine_flags.h"

namespace ct::cli {
namespace {

struct BenchArgs {
  std::string model;  // a registry name or a path; empty: the default model
  std::vector<int> prompt_lengths = {512, 2048, 4096};
  int decode_tokens = 64;
  int repeats = 2;
  // Batched decoding (cpu::decode_batch): tokens/s of B sequences decoding together, for each
  // B, next to B = 1 measured in the same run. Empty: skipped.
  std::vector<int> batch_sizes;
  std::string json_out;
  std::string cache_type = kv_dtype_name(EngineOptions().kv_type);  // the live K/V caches' type
  int decode_context = 128;  // tokens prefilled before the decode steps (each sequence's)
  // Prefill of step_context tokens in blocks of step_block rows, each block timed: the cost of
  // a row as a function of the keys it attends over (the engine's step budget, RowWork).
  int step_block = 0;
  int step_context = 4096;
};

// Times a prefill of n tokens in blocks of `block` rows (best of `repeats` per block) and fits
// each block's time per row as a + b * (its rows' mean key count): a is a row's weights, b one
// key of its attention, a / b the keys whose attention costs as much as the row's weights.
nlohmann::json step_cost(const Model& model, int n, int block, int repeats, KvDtype kv_type,
                         Workspace& ws, std::mt19937& rng) {
  const ModelConfig& c = model.config();
  CT_THROW_IF_NOT(block >= 1 && n >= 2 * block && n <= c.n_ctx_train,
                  "--step-block {} with --step-context {}: expected two blocks or more within "
                  "the model's context of {}",
                  block, n, c.n_ctx_train);
  std::uniform_int_distribution<int> tok(100, c.n_vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = tok(rng);
  const int nb = n / block;
  std::vector<double> best(nb, 1e30);
  for (int r = 0; r < repeats; ++r) {
    KVCache kv = model.make_cache(n, kv_type);
    for (int i = 0; i < nb; ++i) {
      Timer tm;
      cpu::prefill(model, t.data() + (size_t)i * block, block, i * block, kv, ws);
      best[i] = std::min(best[i], tm.seconds());
    }
  }
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  nlohmann::json blocks = nlohmann::json::array();
  for (int i = 0; i < nb; ++i) {
    const double keys = i * block + (block + 1) / 2.0, per_row = best[i] / block * 1e3;
    sx += keys;
    sy += per_row;
    sxx += keys * keys;
    sxy += keys * per_row;
    blocks.push_back({{"first_row", i * block}, {"mean_keys", keys}, {"ms_per_row", per_row}});
  }
  const double b = (nb * sxy - sx * sy) / (nb * sxx - sx * sx), a = (sy - b * sx) / nb;
  return {{"block", block}, {"context", n}, {"blocks", blocks}, {"ms_per_row", a},
          {"ms_per_key", b}, {"keys_per_row", b > 0 ? a / b : 0.0}};
}

// FLOPs of one prefill of n tokens: the projections and MLP of every layer, attention's two
// products (causal: about n^2/2 pairs per head), and one row of the output head.
double prefill_flops(const ModelConfig& c, int n) {
  const double E = c.n_embd, Q = c.q_dim(), KV = c.kv_dim(), F = c.n_ff;
  const double per_tok = 2 * E * (Q + 2 * KV) + 2 * Q * E + 2 * E * 2 * F + 2 * F * E;
  const double attn = 2.0 * 2.0 * c.n_head * c.head_dim * ((double)n * (n + 1) / 2);
  return c.n_layer * (per_tok * n + attn) + 2 * E * c.n_vocab;
}

// Best-of-3 SGEMM rate (GFLOP/s) on a shape typical of prefill: [m x k] * [k x n]^T.
double sgemm_gflops(int m, int k, int n) {
  std::vector<float> a((size_t)m * k, 0.5f), b((size_t)n * k, 0.25f), c((size_t)m * n);
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    Timer t;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k,
                0.0f, c.data(), n);
    best = std::max(best, 2.0 * m * n * k / t.seconds() / 1e9);
  }
  return best;
}

void run_bench(const BenchArgs& a) {
  const std::string model_path = resolve_model(a.model);
  auto model = Model::load(model_path);
  const ModelConfig& c = model->config();
  const KvDtype kv_type = parse_kv_dtype(a.cache_type);
  CT_THROW_IF_NOT(a.repeats >= 1, "--repeats {}: expected at least 1", a.repeats);
  CT_THROW_IF_NOT(a.decode_context >= 1 && a.decode_context + a.decode_tokens < c.n_ctx_train,
                  "--decode-context {} plus --decode-tokens {}: expected at least 1 and below the "
                  "model's context of {}",
                  a.decode_context, a.decode_tokens, c.n_ctx_train);
  nlohmann::json out;
  out["cache_type"] = a.cache_type;
  out["model"] = model_path;
  out["engine"] = "cachetune";
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tok(100, c.n_vocab - 1);
  const double sg = sgemm_gflops(2048, c.n_embd, 2 * c.n_ff);
  out["sgemm_gflops"] = sg;
  out["blas_core"] = cpu::blas_core_name();
  Workspace ws;
  out["prefill_kernel"] = cpu::prefill_kernel_name(ws.prefill_kernel);
  std::printf("OpenBLAS SGEMM [2048x%d]x[%dx%d]: %.1f GFLOP/s (%s kernels); prefill kernel %s\n",
              c.n_embd, c.n_embd, 2 * c.n_ff, sg, out["blas_core"].get<std::string>().c_str(),
              out["prefill_kernel"].get<std::string>().c_str());
  {
    // One untimed prefill first: the first pass over the weights faults in the mapped file's
    // pages and sizes the workspace, which no later prompt pays.
    std::vector<int32_t> t(std::min(64, c.n_ctx_train));
    for (auto& x : t) x = tok(rng);
    KVCache kv = model->make_cache((int)t.size(), kv_type);
    cpu::prefill(*model, t.data(), (int)t.size(), 0, kv, ws);
  }
  for (int n : a.prompt_lengths) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = tok(rng);
    double best = 1e30;
    for (int r = 0; r < a.repeats; ++r) {
      KVCache kv = model->make_cache(n, kv_type);
      Timer tm;
      cpu::prefill(*model, t.data(), n, 0, kv, ws);
      best = std::min(best, tm.seconds());
    }
    const double gf = prefill_flops(c, n) / best / 1e9;
    std::printf("prefill %5d tokens: %7.1f tok/s  %6.1f GFLOP/s (%.0f%% of SGEMM)\n", n, n / best,
                gf, 100 * gf / sg);
    out["prefill"].push_back(
        {{"n_prompt", n}, {"seconds", best}, {"tok_per_s", n / best}, {"gflops", gf}});
  }
  {
    const int n = a.decode_context;
    std::vector<int32_t> t(n);
    for (auto& x : t) x = tok(rng);
    KVCache kv = model->make_cache(n + a.decode_tokens + 1, kv_type);
    auto logits = cpu::prefill(*model, t.data(), n, 0, kv, ws);
    Timer tm;
    for (int i = 0; i < a.decode_tokens; ++i) {
      const int32_t id = argmax(logits.data(), c.n_vocab);
      logits = cpu::prefill(*model, &id, 1, kv.n_pos, kv, ws);
    }
    const double tps = a.decode_tokens / tm.seconds();
    std::printf("decode after %d tokens: %.1f tok/s\n", n, tps);
    out["decode"] = {{"n_context", n}, {"n_tokens", a.decode_tokens}, {"tok_per_s", tps}};
    // Sampling one token from the last logits as the server samples (OpenAI's fields: top-p,
    // no top-k), against the reference that sorts the vocabulary.
    SamplingParams sp;
    sp.temperature = 0.8f;
    sp.top_k = 0;
    sp.top_p = 0.95f;
    sp.seed = 1;
    Sampler sampler(sp);
    Timer ts;
    size_t kept = 0;
    for (int i = 0; i < 20; ++i) kept = sampler.candidates(logits.data(), c.n_vocab).ids.size();
    const double fast_ms = ts.ms() / 20;
    Timer tr;
    for (int i = 0; i < 3; ++i) sample_candidates_ref(logits.data(), c.n_vocab, sp);
    const double ref_ms = tr.ms() / 3;
    std::printf("sampling (temperature 0.8, top-p 0.95) from %d logits: %.3f ms a token, %zu "
                "candidates (sorting the vocabulary: %.3f ms)\n",
                c.n_vocab, fast_ms, kept, ref_ms);
    out["sampling"] = {{"n_vocab", c.n_vocab}, {"ms", fast_ms}, {"candidates", kept},
                       {"sort_ms", ref_ms}};
  }
  if (a.step_block > 0) {
    nlohmann::json sc = step_cost(*model, a.step_context, a.step_block, a.repeats, kv_type, ws, rng);
    for (const auto& b : sc["blocks"])
      std::printf("prefill block from row %5d: %.3f ms a row\n", b["first_row"].get<int>(),
                  b["ms_per_row"].get<double>());
    const double est = default_step_attn_keys(c);
    std::printf("a row costs %.3f ms + %.3g ms a key: its attention over %.0f keys costs as much "
                "as its weights (the engine's estimate for this model: %.0f; serve "
                "--step-attn-keys N sets it)\n",
                sc["ms_per_row"].get<double>(), sc["ms_per_key"].get<double>(),
                sc["keys_per_row"].get<double>(), est);
    sc["engine_estimate"] = est;
    out["step_cost"] = sc;
  }
  // Batched decoding: every size's sequences are prefilled first, then the sizes take their
  // decode steps in turn (the order flipping step by step), each size's steps timed on their
  // own. A shared machine's slow and fast moments (tens of percent within seconds here) fall on
  // every size alike, so the ratios to one sequence measure the engine, not when each size ran.
  struct Batch {
    int size;
    std::vector<KVCache> kvs;
    std::vector<KVCache*> ptrs;
    std::vector<int32_t> ids;
    double seconds = 0;
  };
  std::vector<Batch> batches;
  for (int b : a.batch_sizes) {
    CT_THROW_IF_NOT(b >= 1, "--batch {}: expected sizes >= 1", b);
    Batch& bt = batches.emplace_back();
    bt.size = b;
    const int n = a.decode_context;
    for (int s = 0; s < b; ++s) {
      std::vector<int32_t> t(n);
      for (auto& x : t) x = tok(rng);
      bt.kvs.push_back(model->make_cache(n + a.decode_tokens + 1, kv_type));
      const auto l = cpu::prefill(*model, t.data(), n, 0, bt.kvs.back(), ws);
      bt.ids.push_back(argmax(l.data(), c.n_vocab));
    }
    for (auto& kv : bt.kvs) bt.ptrs.push_back(&kv);
  }
  std::vector<float> l;
  for (int i = 0; i < a.decode_tokens; ++i) {
    for (size_t k = 0; k < batches.size(); ++k) {
      Batch& bt = batches[i % 2 == 0 ? k : batches.size() - 1 - k];
      Timer tm;
      cpu::decode_batch(*model, bt.ids.data(), bt.ptrs.data(), bt.size, ws, l);
      for (int s = 0; s < bt.size; ++s) {
        bt.ids[s] = argmax(l.data() + (size_t)s * c.n_vocab, c.n_vocab);
      }
      bt.seconds += tm.seconds();
    }
  }
  double one_seq = 0;
  for (const Batch& bt : batches) {
    const int b = bt.size, n = a.decode_context;
    const double tps = (double)b * a.decode_tokens / bt.seconds;
    if (b == 1) one_seq = tps;
    std::printf("batched decode, %2d sequences after %d tokens: %7.1f tok/s", b, n, tps);
    if (one_seq > 0 && b > 1) std::printf("  (%.2fx one sequence)", tps / one_seq);
    std::printf("\n");
    out["batched_decode"].push_back({{"sequences", b},
                                     {"n_context", n},
                                     {"n_tokens", a.decode_tokens},
                                     {"tok_per_s", tps},
                                     {"vs_one", one_seq > 0 ? tps / one_seq : 0.0}});
  }
  out["peak_rss_mib"] = peak_rss_bytes() / 1048576.0;
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out);
    CT_THROW_IF_NOT(f.good(), "cannot write '{}'", a.json_out);
    f << out.dump(2) << "\n";
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* c = app.add_subcommand("bench", "Prefill/decode speed and the SGEMM reference rate");
  add_model_option(c, &a->model);
  c->add_option("--prompt-lengths", a->prompt_lengths, "Prompt lengths to time")
      ->capture_default_str();
  c->add_option("--decode-tokens", a->decode_tokens, "Tokens to decode")->capture_default_str();
  c->add_option("--decode-context", a->decode_context,
                "Tokens of context each sequence decodes after (its prefilled prompt)")
      ->capture_default_str();
  c->add_option("--repeats", a->repeats, "Repeats per length (best is kept)")
      ->capture_default_str();
  c->add_option("--batch", a->batch_sizes,
                "Also time batched decoding of this many sequences at once (e.g. --batch 1 8; the "
                "sizes take their steps in turn, each timed on its own); give 1 first for the "
                "ratios");
  c->add_option("--json", a->json_out, "Also write the results as JSON to this file");
  c->add_option("--step-block", a->step_block,
                "Also time a prefill of --step-context tokens in blocks of this many rows and fit "
                "a row's cost against the keys it attends over (0: skipped)");
  c->add_option("--step-context", a->step_context, "Tokens of the --step-block prefill")
      ->capture_default_str();
  add_cache_type_option(c, &a->cache_type);
  c->callback([a] { run_bench(*a); });
}

}  // namespace ct::cli
