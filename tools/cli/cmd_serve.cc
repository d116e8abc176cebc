// `cachetune serve`: the OpenAI-compatible HTTP server (src/server, docs/SERVER.md) over an
// engine built from the usual engine flags. Ctrl-C / SIGTERM stop it cleanly.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "core/error.h"
#include "core/paths.h"
#include "server/server.h"
#include "tools/cli/commands.h"
#include "tools/cli/engine_flags.h"

namespace ct::cli {
namespace {

struct ServeArgs {
  EngineFlags engine;
  server::ServerOptions server;
  std::string policy = "cachetune";
  std::string ratio;  // empty: the model's r_min
  std::string calibration;
  std::string max_body = "8M";
  std::string kv_budget = "4G";
  std::string max_header = "64K";
  int prefill_chunk = 512;
  double step_attn_keys = EngineOptions().step_attn_keys;  // the model's estimate
};

std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) { g_stop_requested = true; }

void run_serve(ServeArgs a) {
  EngineOptions eo = a.engine.options();
  eo.calibration_path = a.calibration;
  CT_THROW_IF_NOT(a.prefill_chunk >= 0, "--prefill-chunk {}; expected >= 0 (0: whole prefills)",
                  a.prefill_chunk);
  eo.prefill_chunk = a.prefill_chunk;
  eo.step_attn_keys = a.step_attn_keys;
  bool auto_ratio = false;
  const double ratio = parse_ratio_flag(a.ratio, eo.r_min, &auto_ratio);
  server::ServerOptions so = a.server;
  so.max_body_bytes = parse_bytes(a.max_body);
  so.batching.kv_budget_bytes = parse_bytes(a.kv_budget);
  CT_THROW_IF_NOT(so.batching.kv_budget_bytes >= 1, "--kv-budget {}; expected at least one byte",
                  a.kv_budget);
  CT_THROW_IF_NOT(so.batching.max_running >= 1, "--max-batch {}; expected >= 1",
                  so.batching.max_running);
  CT_THROW_IF_NOT(so.batching.max_queue >= 1, "--max-queue {}; expected >= 1",
                  so.batching.max_queue);
  so.max_header_bytes = parse_bytes(a.max_header);
  // The key from the environment keeps it out of `ps` and shell history; the flag wins.
  if (so.api_key.empty()) {
    if (const char* k = std::getenv("CACHETUNE_API_KEY")) so.api_key = k;
  }
  so.limits.default_policy.kind = &find_policy(a.policy);
  CT_THROW_IF_NOT(!so.limits.default_policy.kind->eval_only(),
                  "--policy {}: this policy needs the full prefill's true drift and runs only in "
                  "`cachetune eval`",
                  a.policy);
  so.limits.default_policy.ratio = ratio;
  so.limits.default_policy.alpha = a.engine.alpha;
  so.limits.default_auto_ratio = auto_ratio;
  // A request's n choices decode together: up to --max-batch (the server lowers it to the GPU's
  // slots and to --max-queue).
  so.limits.max_choices = so.batching.max_running;
  const server::ApiLimits& check = so.limits;
  CT_THROW_IF_NOT(check.max_tokens_limit >= 1, "--max-tokens-limit {}; expected >= 1",
                  check.max_tokens_limit);
  CT_THROW_IF_NOT(
      check.default_max_tokens >= 1 && check.default_max_tokens <= check.max_tokens_limit,
      "--default-max-tokens {}; expected 1 .. --max-tokens-limit ({})", check.default_max_tokens,
      check.max_tokens_limit);
  CT_THROW_IF_NOT(check.max_chunks >= 0, "--max-chunks {}; expected >= 0", check.max_chunks);
  // Every running or queued request holds a worker; /health, /metrics and the 503s need more.
  const int min_threads = so.batching.max_running + so.batching.max_queue + 8;
  CT_THROW_IF_NOT(so.http_threads >= min_threads,
                  "--http-threads {}; expected at least --max-batch + --max-queue + 8 = {} (each "
                  "running or waiting request holds a connection worker)",
                  so.http_threads, min_threads);
  CT_THROW_IF_NOT(so.http_queue >= 0, "--http-queue {}; expected >= 0", so.http_queue);
  CT_THROW_IF_NOT(so.request_timeout_s >= 0 && std::isfinite(so.request_timeout_s),
                  "--request-timeout {}; expected seconds >= 0", so.request_timeout_s);
  CT_THROW_IF_NOT(so.max_body_bytes >= 1, "--max-body {}; expected at least one byte", a.max_body);
  CT_THROW_IF_NOT(so.max_header_bytes >= 1024, "--max-header {}; expected at least 1K",
                  a.max_header);
  Engine eng(std::move(eo));
  if (so.model_id.empty()) {
    const std::string path =
        eng.options().model_path.empty() ? default_model_path() : eng.options().model_path;
    so.model_id = std::filesystem::path(path).stem().string();
  }
  server::Server srv(eng, so);
  const int port = srv.bind();
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  std::atomic<bool> done{false};
  // Signal handlers may only set a flag; this thread turns it into a clean stop.
  // It keeps asking until serve() has returned: a stop() that lands before the listener runs
  // would otherwise be lost.
  std::thread watcher([&] {
    while (!done) {
      if (g_stop_requested) srv.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::fprintf(stderr,
               "cachetune serve: http://%s:%d  model %s, policy %s, ratio %s, API key %s "
               "(Ctrl-C stops)\n",
               so.host.c_str(), port, so.model_id.c_str(), a.policy.c_str(),
               a.ratio.empty() ? fmt::format("{:.2f} (r_min)", ratio).c_str() : a.ratio.c_str(),
               so.api_key.empty() ? "none" : "required");
  const bool loopback = so.host == "127.0.0.1" || so.host == "::1" || so.host == "localhost";
  if (!loopback && so.api_key.empty()) {
    std::fprintf(stderr,
                 "cachetune serve: warning: listening on %s without an API key; anyone who can "
                 "reach this address can use the server (set --api-key or CACHETUNE_API_KEY)\n",
                 so.host.c_str());
  }
  const ModelConfig& mc = eng.model().config();
  std::fprintf(stderr,
               "cachetune serve: KV budget %zu bytes (%zu bytes per token, %s; %d requests run "
               "at once, %d may wait; prefill chunk %d rows of work%s)\n",
               so.batching.kv_budget_bytes,
               2 * mc.n_layer * kv_bytes(eng.options().kv_type, mc.kv_dim()),
               kv_dtype_name(eng.options().kv_type),
               eng.options().cuda ? 1 : so.batching.max_running, so.batching.max_queue,
               eng.options().prefill_chunk,
               eng.options().step_attn_keys > 0
                   ? fmt::format(", a row at position p counting 1 + (p + 1) / {:.0f}",
                                 eng.options().step_attn_keys)
                         .c_str()
                   : ", rows counted alone");
  srv.serve();
  done = true;
  watcher.join();
  std::fprintf(stderr, "cachetune serve: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  a->server.model_id.clear();  // default: the model file's name
  CLI::App* c = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server with chunk-aware requests (docs/SERVER.md)");
  a->engine.add(c);
  add_rmin_option(c, &a->engine.r_min);
  c->add_option("--host", a->server.host, "Address to listen on")->capture_default_str();
  c->add_option("--port", a->server.port, "Port (0: any free port)")->capture_default_str();
  c->add_option("--policy", a->policy, "Default reuse policy of requests without one: " + policy_names())
      ->capture_default_str();
  c->add_option("-r,--ratio", a->ratio,
                "Default recompute ratio, or 'auto' (the calibrated ratio of the chunks' tier). "
                "Default: r_min (--rmin)");
  c->add_option("--calibration", a->calibration, "Calibration store for --ratio auto");
  c->add_option("--model-id", a->server.model_id,
                "Model name in responses (default: the GGUF file's name)");
  c->add_option("--max-body", a->max_body, "Largest request body (e.g. 8M)")->capture_default_str();
  c->add_option("--kv-budget", a->kv_budget,
                "Host K/V cache memory all running requests share (e.g. 4G); a request waits "
                "until its prompt + max_tokens fit, one larger than the whole budget gets 400")
      ->capture_default_str();
  c->add_option("--max-batch", a->server.batching.max_running,
                "Most requests running together (prefilling in slices or decoding) in one batch")
      ->capture_default_str();
  c->add_option("--prefill-chunk", a->prefill_chunk,
                "Chunked prefill: most prompt rows prefilled (and chunk rows encoded) per engine "
                "step, beside the decode rows of running requests, later rows counting more "
                "(--step-attn-keys; 0: each prefill runs whole when admitted)")
      ->capture_default_str();
  add_step_attn_keys_option(c, &a->step_attn_keys);
  c->add_option("--max-queue", a->server.batching.max_queue,
                "Most requests waiting for admission; more get 503 with Retry-After")
      ->capture_default_str();
  c->add_option("--max-header", a->max_header,
                "Largest request line plus headers (431 beyond it; e.g. 64K)")
      ->capture_default_str();
  c->add_option("--api-key", a->server.api_key,
                "Require 'Authorization: Bearer KEY' on every route but /health (default: "
                "$CACHETUNE_API_KEY; none: no key needed)");
  c->add_option("--http-threads", a->server.http_threads,
                "Connection worker threads (a slow client holds at most one)")
      ->capture_default_str();
  c->add_option("--http-queue", a->server.http_queue,
                "Accepted connections that may wait for a worker; beyond them each request is "
                "answered 503 with Retry-After")
      ->capture_default_str();
  c->add_option("--request-timeout", a->server.request_timeout_s,
                "Seconds one request (line, headers and body) may take to arrive before its "
                "connection is closed (0: no limit beyond 5 s per read)")
      ->capture_default_str();
  c->add_flag("--log-steps", a->server.log_steps,
              "Print each engine step's decode, prefill and chunk-encoding rows and its time to "
              "stderr");
  c->add_option("--allow-origin", a->server.allowed_origins,
                "Browser Origin allowed to call the API (repeatable; '*' for any). Requests "
                "with any other Origin header are refused (403)");
  c->add_option("--max-tokens-limit", a->server.limits.max_tokens_limit,
                "Largest max_tokens a request may ask for")
      ->capture_default_str();
  c->add_option("--default-max-tokens", a->server.limits.default_max_tokens,
                "max_tokens of requests that give none (at most --max-tokens-limit)")
      ->capture_default_str();
  c->add_option("--max-chunks", a->server.limits.max_chunks, "Most chunks in one request")
      ->capture_default_str();
  c->callback([a, c] {
    // Without an explicit default, a lower --max-tokens-limit lowers the default with it.
    if (c->count("--default-max-tokens") == 0) {
      a->server.limits.default_max_tokens =
          std::min(a->server.limits.default_max_tokens, a->server.limits.max_tokens_limit);
    }
    run_serve(*a);
  });
}

}  // namespace ct::cli
