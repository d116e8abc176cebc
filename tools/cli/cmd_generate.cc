// `cachetune generate`: answer a prompt with the model and print a timing line.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/paths.h"
#include "core/timer.h"
#include "model/generate.h"
#include "tools/cli/commands.h"
#include "tools/cli/progress.h"

namespace ct::cli {
namespace {

struct GenerateArgs {
  std::string model = default_model_path();
  std::string prompt;
  std::string prompt_file;
  std::string system;
  bool raw = false;
  int max_tokens = 128;
  float temperature = 0.0f;
  int top_k = 40;
  float top_p = 0.95f;
  uint64_t seed = 0;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  CT_THROW_IF_NOT(f.good(), "cannot open prompt file '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void run_generate(const GenerateArgs& a) {
  CT_THROW_IF_NOT(!a.prompt.empty() || !a.prompt_file.empty(),
                  "give a prompt with --prompt TEXT or --prompt-file FILE");
  std::string text = a.prompt.empty() ? read_file(a.prompt_file) : a.prompt;
  Timer load_t;
  std::fprintf(stderr, "loading %s ...\n", a.model.c_str());
  auto model = Model::load(a.model);
  std::fprintf(stderr, "loaded in %.2fs (%d layers, %.0f MiB of F32 weights)\n", load_t.seconds(),
               model->config().n_layer, model->weight_bytes() / 1048576.0);
  const Tokenizer& tok = model->tokenizer();
  Timer t;  // TTFT counts from here: templating, tokenising, prefill, first sample
  std::vector<ChatMessage> msgs;
  if (!a.system.empty()) msgs.push_back({"system", a.system});
  msgs.push_back({"user", text});
  const std::string prompt = a.raw ? text : tok.apply_chat_template(msgs, true);
  const std::vector<int32_t> ids = tok.encode(prompt, /*parse_special=*/!a.raw);
  CT_THROW_IF_NOT(!ids.empty(), "the prompt is empty after tokenisation");
  const int n_ctx = (int)ids.size() + a.max_tokens + 1;
  CT_THROW_IF_NOT(n_ctx <= model->config().n_ctx_train,
                  "prompt of {} tokens plus {} new tokens exceeds the model's context of {}",
                  ids.size(), a.max_tokens, model->config().n_ctx_train);
  KVCache kv = model->make_cache(n_ctx);
  Workspace ws;
  Progress prog("prefill: layer");
  auto logits = model->prefill(ids.data(), (int)ids.size(), 0, kv, ws, false,
                               [&](int l, int n) { prog.update(l, n); });
  prog.done();
  const double prefill_s = t.seconds();
  GenerateOptions opt;
  opt.max_tokens = a.max_tokens;
  opt.sampling = {a.temperature, a.top_k, a.top_p, a.seed};
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
  CLI::App* c = app.add_subcommand("generate", "Answer a prompt and print TTFT and tokens/s");
  c->add_option("-m,--model", a->model, "GGUF model file")->capture_default_str();
  c->add_option("-p,--prompt", a->prompt, "Prompt text");
  c->add_option("-f,--prompt-file", a->prompt_file, "Read the prompt from a file");
  c->add_option("--system", a->system, "System message (chat mode)");
  c->add_flag("--raw", a->raw, "Use the prompt as is, without the chat template");
  c->add_option("-n,--max-tokens", a->max_tokens, "Maximum new tokens")->capture_default_str();
  c->add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  c->add_option("--top-k", a->top_k, "Top-k (0 = off)")->capture_default_str();
  c->add_option("--top-p", a->top_p, "Top-p (1 = off)")->capture_default_str();
  c->add_option("--seed", a->seed, "Sampling seed")->capture_default_str();
  c->callback([a] { run_generate(*a); });
}

}  // namespace ct::cli
