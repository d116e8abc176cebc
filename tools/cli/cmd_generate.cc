// `cachetune generate`: answer a prompt with the model and print a timing line.
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backend/cpu_forward.h"
#include "core/error.h"
#include "core/timer.h"
#include "engine/generate.h"
#include "model/json_constraint.h"
#include "reuse/prompt.h"
#include "tools/cli/commands.h"
#include "tools/cli/engine_flags.h"
#include "tools/cli/progress.h"

namespace ct::cli {
namespace {

struct GenerateArgs {
  std::string model;  // a registry name or a path; empty: the default model
  std::string prompt;
  std::string prompt_file;
  std::string system;
  bool raw = false;
  bool json = false;
  std::string json_schema;  // a file holding a JSON Schema
  int max_tokens = 128;
  SamplingParams sampling;  // --temperature, --top-k, --top-p, --min-p, --seed, the penalties
  // Chunk mode
  EngineFlags engine;
  std::vector<std::string> chunks;
  std::string question;
  std::vector<std::string> policies = {"cachetune"};
  // A number in [0, 1], "auto" (the tier's calibrated ratio) or empty: the model's r_min.
  std::string ratio;
  std::string calibration;
  std::string instruction = kQaInstruction;
  int prefill_chunk = 0;
  double step_attn_keys = EngineOptions().step_attn_keys;  // the model's estimate
};

std::string read_file(const std::string& path, const char* what = "prompt") {
  std::ifstream f(path, std::ios::binary);
  CT_THROW_IF_NOT(f.good(), "cannot open {} file '{}'", what, path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// --json / --json-schema FILE: the answer's JSON constraint, the schema compiled (and refused
// with its reason) before any model loads.
void set_json_output(const GenerateArgs& a, GenerateOptions& gen) {
  CT_THROW_IF_NOT(!(a.json && !a.json_schema.empty()), "--json and --json-schema: give one");
  gen.json_object = a.json;
  if (a.json_schema.empty()) return;
  nlohmann::json schema;
  try {
    schema = nlohmann::json::parse(read_file(a.json_schema, "JSON Schema"));
  } catch (const nlohmann::json::exception& e) {
    CT_THROW("--json-schema '{}': not JSON: {}", a.json_schema, e.what());
  }
  try {
    gen.json_schema = JsonSchema::compile(schema);
  } catch (const Error& e) {
    CT_THROW("--json-schema '{}': {}", a.json_schema, e.what());
  }
}

// Chunk mode: documents are reused from (or encoded into) the cache pool; each policy answers
// and its TTFT breakdown is printed; with several policies the speedups over the first.
void run_chunked(const GenerateArgs& a) {
  CT_THROW_IF_NOT(!a.question.empty(), "chunk mode needs --question TEXT");
  EngineFlags ef = a.engine;
  if (!a.model.empty() && ef.model.empty()) ef.model = a.model;
  EngineOptions eo = ef.options();
  eo.calibration_path = a.calibration;
  CT_THROW_IF_NOT(a.prefill_chunk >= 0, "--prefill-chunk {}; expected >= 0", a.prefill_chunk);
  eo.prefill_chunk = a.prefill_chunk;
  eo.step_attn_keys = a.step_attn_keys;
  const double ratio = parse_ratio_flag(a.ratio, eo.r_min, &eo.auto_ratio);
  Engine eng(std::move(eo));
  std::vector<std::string> docs;
  for (const auto& f : a.chunks) docs.push_back(read_file(f));
  // Offline stage first, so that TTFT measures requests over cached chunks. A chunk no tier
  // takes (a full or read-only disk, Redis down) does not stop the command: each request below
  // encodes it again and serves it from memory, as the server does.
  Timer enc;
  int n_new = 0, n_unstored = 0;
  for (const auto& d : docs) {
    std::optional<ChunkKV> unplaced;
    const ChunkInfo c =
        eng.ensure_chunk(tokenize_chunk(eng.model().tokenizer(), d), "", nullptr, &unplaced);
    n_new += !c.hit;
    if (unplaced) {
      ++n_unstored;
      std::fprintf(stderr, "  not stored: %s\n", c.note.c_str());
    }
  }
  std::fprintf(stderr, "%zu chunks ready (%d encoded now, %.2f s, offline)\n", docs.size(), n_new,
               enc.seconds());
  if (n_unstored > 0)
    std::fprintf(stderr,
                 "%d chunks could not be stored; every request below encodes them again (their "
                 "encoding counts in its TTFT)\n",
                 n_unstored);
  GenerateOptions gen;
  gen.max_tokens = a.max_tokens;
  gen.sampling = a.sampling;
  set_json_output(a, gen);
  double first_ttft = 0;
  for (size_t i = 0; i < a.policies.size(); ++i) {
    SelectiveOptions sel;
    sel.policy.kind = &find_policy(a.policies[i]);
    sel.policy.ratio = ratio;
    sel.policy.alpha = a.engine.alpha;
    std::printf("[%s r=%s] ", a.policies[i].c_str(),
                eng.options().auto_ratio ? "auto" : fmt::format("{:.2f}", ratio).c_str());
    std::fflush(stdout);
    AnswerOptions ao;
    ao.instruction = a.instruction;
    ao.on_piece = [](const std::string& p) {
      std::fwrite(p.data(), 1, p.size(), stdout);
      std::fflush(stdout);
    };
    Answer ans = eng.answer(docs, a.question, sel, gen, ao);
    std::printf("\n");
    std::fflush(stdout);
    if (!ans.ratio_note.empty()) std::fprintf(stderr, "  ratio: %s\n", ans.ratio_note.c_str());
    const PrefillBreakdown& b = ans.prefill;
    std::fprintf(stderr,
                 "  [%s] prompt %d tokens, recomputed %d rows/layer, loaded %d | TTFT %.1f ms = "
                 "lookup %.1f + select %.1f + recompute %.1f + load wait %.1f (loader %.1f) + "
                 "logits %.1f | decode %.1f tok/s\n",
                 ans.device.c_str(), ans.n_prompt, b.n_active, b.n_loaded, ans.ttft_ms,
                 ans.lookup_ms, b.select_ms, b.compute_ms, b.load_wait_ms, b.load_ms, b.logits_ms,
                 ans.tokens.size() > 1 ? (ans.tokens.size() - 1) / (ans.decode_ms / 1e3) : 0.0);
    if (i == 0) {
      first_ttft = ans.ttft_ms;
    } else {
      std::fprintf(stderr, "  TTFT speedup of %s over %s: %.2fx\n", a.policies[i].c_str(),
                   a.policies[0].c_str(), first_ttft / ans.ttft_ms);
    }
  }
}

void run_generate(const GenerateArgs& a) {
  if (!a.chunks.empty()) return run_chunked(a);
  CT_THROW_IF_NOT(!a.prompt.empty() || !a.prompt_file.empty(),
                  "give a prompt with --prompt TEXT or --prompt-file FILE");
  // A plain prompt runs on the CPU: a GPU asked for is refused rather than ignored.
  CT_THROW_IF_NOT(a.engine.device == "cpu" && a.engine.rank_device == "cpu",
                  "--device {} --rank-device {}: a plain prompt runs on the CPU; the GPU runs "
                  "chunk mode (--chunk FILE ... -q QUESTION) or `cachetune serve --device cuda`",
                  a.engine.device, a.engine.rank_device);
  std::string text = a.prompt.empty() ? read_file(a.prompt_file) : a.prompt;
  Timer load_t;
  const std::string model_path = resolve_model(a.model);
  std::fprintf(stderr, "loading %s ...\n", model_path.c_str());
  auto model = Model::load(model_path);
  std::fprintf(stderr, "loaded in %.2fs (%d layers, %.0f MiB of weights)\n", load_t.seconds(),
               model->config().n_layer, model->weight_bytes() / 1048576.0);
  const Tokenizer& tok = model->tokenizer();
  Timer t;  // TTFT counts from here: templating, tokenising, prefill, first sample
  std::vector<ChatMessage> msgs;
  if (!a.system.empty()) msgs.push_back({"system", a.system});
  msgs.push_back({"user", text});
  const std::string prompt = a.raw ? text : tok.apply_chat_template(msgs, true);
  // BOS where the model's tokenizer adds one (Llama 2/3, Mistral); templates leave it out.
  std::vector<int32_t> ids;
  if (tok.add_bos() && tok.bos() >= 0) ids.push_back(tok.bos());
  const std::vector<int32_t> body = tok.encode(prompt, /*parse_special=*/!a.raw);
  CT_THROW_IF_NOT(!body.empty(), "the prompt is empty after tokenisation");
  ids.insert(ids.end(), body.begin(), body.end());
  const int n_ctx = (int)ids.size() + a.max_tokens + 1;
  CT_THROW_IF_NOT(n_ctx <= model->config().n_ctx_train,
                  "prompt of {} tokens plus {} new tokens exceeds the model's context of {}",
                  ids.size(), a.max_tokens, model->config().n_ctx_train);
  KVCache kv = model->make_cache(n_ctx, parse_kv_dtype(a.engine.cache_type));
  Workspace ws;
  Progress prog("prefill: layer");
  auto logits = cpu::prefill(*model, ids.data(), (int)ids.size(), 0, kv, ws, false,
                             [&](int l, int n) { prog.update(l, n); });
  prog.done();
  const double prefill_s = t.seconds();
  GenerateOptions opt;
  opt.max_tokens = a.max_tokens;
  opt.sampling = a.sampling;
  set_json_output(a, opt);
  double ttft = -1;
  DecodeResult r = decode(*model, kv, ws, std::move(logits), opt, [&](const std::string& piece) {
    if (ttft < 0) ttft = t.seconds();
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  if (ttft < 0) ttft = t.seconds();
  std::printf("\n");
  std::fflush(stdout);
  const int n_dec = (int)r.tokens.size();
  std::fprintf(stderr,
               "prompt %zu tokens | TTFT %.1f ms | prefill %.1f tok/s | decode %.1f tok/s (%d "
               "tokens) | peak RSS %.0f MiB\n",
               ids.size(), ttft * 1e3, ids.size() / prefill_s,
               n_dec > 1 ? (n_dec - 1) / r.decode_s : 0.0, n_dec, peak_rss_bytes() / 1048576.0);
}

}  // namespace

void register_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* c = app.add_subcommand(
      "generate", "Answer a prompt (or a question over cached chunks) and print TTFT and tokens/s");
  add_model_option(c, &a->model);
  c->add_option("--chunk", a->chunks, "Document file reused as a chunk (repeatable; chunk mode)");
  c->add_option("-q,--question", a->question, "Question over the chunks (chunk mode)");
  c->add_option("--policy", a->policies,
                "Reuse policies to run in turn, first is the speedup baseline: " + policy_names())
      ->delimiter(',')
      ->capture_default_str();
  c->add_option("-r,--ratio", a->ratio,
                "Recompute ratio r, or 'auto': the ratio `cachetune calibrate` stored for the "
                "tier holding the chunks (r_min when there is none). Default: r_min (--rmin)");
  c->add_option("--calibration", a->calibration,
                "Calibration store for --ratio auto (default: $CACHETUNE_CALIBRATION or "
                "~/.cache/cachetune/calibration.json)");
  c->add_option("--instruction", a->instruction, "Instruction before the documents");
  c->add_option("--prefill-chunk", a->prefill_chunk,
                "Prefill in slices of this many rows of work, as `serve` steps them (chunk "
                "mode; --step-attn-keys; 0: whole)")
      ->capture_default_str();
  add_step_attn_keys_option(c, &a->step_attn_keys);
  c->add_option("--tiers", a->engine.tiers, "Cache tiers, top first (see `cachetune ingest`)");
  add_kv_dtype_option(c, &a->engine.dtype);
  add_cache_type_option(c, &a->engine.cache_type);
  c->add_option("--alpha", a->engine.alpha, "Low-frequency fraction kept by the ranking");
  add_rmin_option(c, &a->engine.r_min);
  a->engine.add_encoding(c);
  c->add_option("--device", a->engine.device,
                "Chunk mode: where prefill and decoding run, cpu or cuda (a prompt longer than "
                "the GPU's sequence runs on the CPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  c->add_option("--rank-device", a->engine.rank_device, "Where new chunks are ranked: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  c->add_option("-p,--prompt", a->prompt, "Prompt text");
  c->add_option("-f,--prompt-file", a->prompt_file, "Read the prompt from a file");
  c->add_option("--system", a->system, "System message (chat mode)");
  c->add_flag("--raw", a->raw, "Use the prompt as is, without the chat template");
  c->add_flag("--json", a->json,
              "Answer with one JSON object (the server's response_format json_object)");
  c->add_option("--json-schema", a->json_schema,
                "Answer with one JSON value that the JSON Schema in this file accepts (the "
                "server's response_format json_schema; supported keywords: docs/SERVER.md)");
  c->add_option("-n,--max-tokens", a->max_tokens, "Maximum new tokens")->capture_default_str();
  SamplingParams& sp = a->sampling;
  c->add_option("--temperature", sp.temperature, "0 = greedy")->capture_default_str();
  c->add_option("--top-k", sp.top_k, "Top-k (0 = off)")->capture_default_str();
  c->add_option("--top-p", sp.top_p, "Top-p (1 = off)")->capture_default_str();
  c->add_option("--seed", sp.seed, "Sampling seed")->capture_default_str();
  c->add_option("--min-p", sp.min_p,
                "Keep candidates at least this share of the most likely one's probability (0 = off)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  c->add_option("--frequency-penalty", sp.frequency_penalty,
                "Subtracted from a token's logit per earlier occurrence in the answer")
      ->check(CLI::Range(-2.0, 2.0))
      ->capture_default_str();
  c->add_option("--presence-penalty", sp.presence_penalty,
                "Subtracted from the logit of a token the answer already holds")
      ->check(CLI::Range(-2.0, 2.0))
      ->capture_default_str();
  c->callback([a] { run_generate(*a); });
}

}  // namespace ct::cli
