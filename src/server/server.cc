// HTTP transport of the OpenAI-compatible server (cpp-httplib); the format is in api.cc.
#include "server/server.h"

#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "reuse/prompt.h"
#include "server/auth.h"
#include "server/http_server.h"
#include "server/task_queue.h"

namespace ct::server {
namespace {

using nlohmann::json;

// Dumps with invalid UTF-8 replaced (U+FFFD) rather than throwing: generated text is bytes.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& msg,
                const std::string& param = "") {
  send_json(res, status, error_body(status, msg, param));
}

// Thrown from the streaming callback when the client has gone; ends generation early.
struct ClientGone {};

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool peer_has_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

std::string take_complete_utf8(std::string& pending) {
  // Walk back over at most 3 continuation bytes to the last lead byte; keep it (and what
  // follows) if its sequence is not complete yet.
  size_t n = pending.size();
  size_t i = n;
  int back = 0;
  while (i > 0 && back < 4) {
    const unsigned char c = static_cast<unsigned char>(pending[i - 1]);
    if ((c & 0xC0) != 0x80) {  // ASCII or a lead byte
      const int need = c < 0x80           ? 1
                       : (c >> 5) == 0x6  ? 2
                       : (c >> 4) == 0xE  ? 3
                       : (c >> 3) == 0x1E ? 4
                                          : 1;
      if (static_cast<int>(n - (i - 1)) < need) n = i - 1;  // incomplete: hold it back
      break;
    }
    --i;
    ++back;
  }
  std::string out = pending.substr(0, n);
  pending.erase(0, n);
  return out;
}

struct Server::Impl {
  Engine& engine;
  ServerOptions opt;
  HttpServer http;
  ServerMetrics metrics;  // before batcher: its step observer writes here until it stops
  Scheduler batcher;      // drives the engine: every engine call goes through it
  std::atomic<uint64_t> next_id{0};
  std::atomic<uint64_t> cancelled{0};  // requests stopped because their client had gone
  int port = -1;
  const int64_t started = unix_now();

  std::atomic<uint64_t> http_rejected{0};  // 503s of the connection queue's overflow worker

  Impl(Engine& e, ServerOptions o) : engine(e), opt(std::move(o)), batcher(e, opt.batching) {
    // A request's n choices run together and queue together: at most what the scheduler runs
    // at once (on CUDA its GPU slots) and what its queue takes.
    opt.limits.max_choices =
        std::max(1, std::min({opt.limits.max_choices, batcher.options().max_running,
                              batcher.options().max_queue}));
    const size_t n = (size_t)std::max(2, opt.http_threads);
    const size_t q = (size_t)std::max(0, opt.http_queue);
    http.new_task_queue = [n, q] { return new BoundedTaskQueue(n, q); };
    metrics.collect_pool(engine);
    http.set_request_timeout(opt.request_timeout_s);
    metrics.collect_server([this] { return cancelled.load(); },
                           [this] { return http.timed_out_connections(); },
                           [this] { return http_rejected.load(); });
    batcher.set_step_observer([this](const StepRows& rows, double seconds) {
      metrics.record_step(rows, seconds);
      if (opt.log_steps) {
        std::fprintf(stderr, "cachetune: step decode=%d prefill=%d encode=%d work=%.0f ms=%.1f\n",
                     rows.decode, rows.prefill, rows.encode, rows.work, seconds * 1e3);
      }
    });
    metrics.registry.add_collector([this] {
      const SchedulerStats st = batcher.stats();
      metrics.queue_length.set(st.queued);
      metrics.running_sequences.set(st.running);
      metrics.kv_budget_bytes_in_use.set((double)st.kv_in_use);
    });
  }

  std::string new_id(const char* prefix) {
    return fmt::format("{}-{:x}-{}", prefix, started, next_id.fetch_add(1));
  }

  // A browser page on another site can POST to a local server without a CORS preflight
  // (text/plain bodies), so requests that carry a foreign Origin are refused unless allowed.
  bool origin_allowed(const httplib::Request& req) const {
    if (!req.has_header("Origin")) return true;  // not a browser's cross-site request
    const std::string origin = req.get_header_value("Origin");
    for (const std::string& a : opt.allowed_origins)
      if (a == "*" || a == origin) return true;
    return false;
  }

  // A request with a body is refused only after the HTTP layer has read the body: refused before,
  // the unread body would be parsed as the connection's next request (a keep-alive client
  // retrying with the right key would get a 400), and a large one would block the client's send.
  // The connection ends after this response, and the client is told so.
  static void end_connection(httplib::Response& res) {
    if (!res.has_header("Connection")) res.set_header("Connection", "close");
    HttpServer::close_after_response();
  }
  static bool has_body(const httplib::Request& req) {
    return req.get_header_value("Transfer-Encoding") == "chunked" ||
           (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
  }
  bool key_refused(const httplib::Request& req, httplib::Response& res) const {
    if (opt.api_key.empty() || route_is_public(req.path)) return false;
    std::optional<std::string> h;
    if (req.has_header("Authorization")) h = req.get_header_value("Authorization");
    const std::string why = api_key_refusal(h, opt.api_key);
    if (why.empty()) return false;
    send_json(res, 401, api_key_error_body(why));
    res.set_header("WWW-Authenticate", "Bearer");
    return true;
  }

  // Checks made before routing, in order: header size (431), browser origin (403), API key (401;
  // for a request with a body, in the route's handler or the 404 handler instead). True when the
  // request was refused (the error is in res).
  bool refused(const httplib::Request& req, httplib::Response& res) const {
    size_t header_bytes = req.method.size() + req.target.size() + req.version.size() + 4;
    for (const auto& [name, value] : req.headers) header_bytes += name.size() + value.size() + 4;
    if (header_bytes > opt.max_header_bytes) {
      send_error(res, 431,
                 fmt::format("request line and headers take {} bytes; this server takes at most {}",
                             header_bytes, opt.max_header_bytes));
      return true;
    }
    if (!origin_allowed(req)) {
      send_error(res, 403,
                 fmt::format("cross-origin request from Origin '{}' refused; start the server "
                             "with --allow-origin '{}' (or '*') to allow it",
                             req.get_header_value("Origin"), req.get_header_value("Origin")));
      return true;
    }
    return !has_body(req) && key_refused(req, res);
  }

  void routes() {
    http.set_payload_max_length(opt.max_body_bytes);
    http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      metrics.count_request(req.path, res.status);
      // Answered before its body was read (refused before routing, 413, ...): the body is still
      // on the connection and would be parsed as the next request, so the connection ends here.
      if (has_body(req) && req.body.empty()) end_connection(res);
    });
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (BoundedTaskQueue::in_overflow()) {
        // Arrived while every worker was busy and the connection queue full (task_queue.h).
        ++http_rejected;
        res.set_header("Retry-After", "1");
        end_connection(res);
        send_error(res, 503,
                   fmt::format("server overloaded: all {} connection workers are busy and {} "
                               "connections are waiting; retry later",
                               std::max(2, opt.http_threads), opt.http_queue));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (refused(req, res)) return httplib::Server::HandlerResponse::Handled;
      if (req.has_header("Origin"))
        res.set_header("Access-Control-Allow-Origin", req.get_header_value("Origin"));
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler already wrote a JSON error
      if (res.status == 404 && key_refused(req, res)) return;  // no route list without the key
      std::string msg;
      const std::string type = req.get_header_value("Content-Type");
      if (res.status == 413 && type.rfind("application/x-www-form-urlencoded", 0) == 0 &&
          req.body.size() <= opt.max_body_bytes) {
        // The HTTP layer caps form-encoded bodies at 8 KiB; `curl -d` sends JSON as a form.
        msg =
            "request body sent as application/x-www-form-urlencoded (curl -d does this) is "
            "limited to 8192 bytes by the HTTP layer; send it with the header "
            "'Content-Type: application/json'";
      } else if (res.status == 413) {
        msg =
            fmt::format("request body exceeds this server's limit of {} bytes", opt.max_body_bytes);
      } else if (res.status == 404) {
        msg = fmt::format(
            "no route for {} {}; expected GET /health, GET /metrics, GET /v1/models, POST "
            "/v1/chat/completions, POST /v1/completions, POST /v1/chunks, POST /tokenize or POST "
            "/detokenize",
            req.method, req.path);
      } else {
        msg = fmt::format("HTTP {} for {} {}", res.status, req.method, req.path);
      }
      send_error(res, res.status, msg);
    });
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string msg = "internal error";
          try {
            std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            msg = e.what();
          } catch (...) {
          }
          send_error(res, 500, msg);
        });

    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, {{"status", "ok"}, {"model", opt.model_id}});
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.status = 200;
      res.set_content(metrics.registry.exposition(), kMetricsContentType);
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200,
                {{"object", "list"},
                 {"data",
                  {{{"id", opt.model_id},
                    {"object", "model"},
                    {"created", started},
                    {"owned_by", "cachetune"}}}}});
    });
    http.Post("/v1/chunks", [this](const httplib::Request& req, httplib::Response& res) {
      if (!key_refused(req, res)) handle(res, [&] { ingest(req, res); });
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      if (!key_refused(req, res)) handle(res, [&] { complete(req, res, false); });
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      if (!key_refused(req, res)) handle(res, [&] { complete(req, res, true); });
    });
    // Tokenisation as the two routes above lay prompts out (vLLM's and llama-server's paths).
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      if (key_refused(req, res)) return;
      handle(res, [&] {
        const Model& m = engine.model();
        send_json(res, 200,
                  tokenize_body(parse_json_body(req.body), opt.limits, m.tokenizer(),
                                m.config().n_ctx_train, req.body));
      });
    });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      if (key_refused(req, res)) return;
      handle(res, [&] {
        send_json(res, 200, detokenize_body(parse_json_body(req.body), engine.model().tokenizer()));
      });
    });
  }

  // Maps errors onto HTTP: a refused request keeps its status (requests are checked before the
  // engine runs: fields, prompt length, tier names); anything the engine throws afterwards
  // (I/O, GPU memory, an unreadable chunk after re-encoding) is the server's failure, 500.
  template <typename F>
  void handle(httplib::Response& res, F&& f) {
    try {
      f();
    } catch (const RequestError& e) {
      send_error(res, e.status(), e.what(), e.param());
    } catch (const AdmissionError& e) {
      if (!e.too_large()) res.set_header("Retry-After", std::to_string(e.retry_after_s()));
      send_error(res, e.too_large() ? 400 : 503, e.what(), e.too_large() ? "max_tokens" : "");
    } catch (const Error& e) {
      send_error(res, 500, e.what());
    }
  }

  // Tokenises the prompt as the engine will lay it out and checks that it leaves room for
  // max_tokens in the model's context, before anything is encoded or streamed (the model and
  // tokenizer are immutable, so no engine lock is needed). The engine answers from these tokens.
  RagPromptTokens prompt_of(const ChatRequest& r) const {
    const Model& m = engine.model();
    return prompt_tokens(r, m.tokenizer(), m.config().n_ctx_train);
  }

  void ingest(const httplib::Request& req, httplib::Response& res) {
    const json body = parse_json_body(req.body);
    if (!body.is_object() || !body.contains("chunks")) {
      throw RequestError(400, "chunks", "expected {\"chunks\": [\"document text\", ...]}");
    }
    const std::vector<std::string> docs = parse_chunks(body["chunks"], opt.limits);
    std::string tier;
    if (body.contains("tier")) {
      if (!body["tier"].is_string()) throw RequestError(400, "tier", "'tier' must be a string");
      tier = body["tier"].get<std::string>();
      if (engine.find_tier(tier) < 0) {
        throw RequestError(400, "tier",
                           fmt::format("tier '{}' is not one of this server's tiers: {}", tier,
                                       engine.tier_names()));
      }
    }
    std::vector<std::vector<int32_t>> tokens;
    const int ctx = engine.model().config().n_ctx_train;
    for (size_t i = 0; i < docs.size(); ++i) {
      tokens.push_back(tokenize_chunk(engine.model().tokenizer(), docs[i]));
      // The chunk is encoded after a sink token, so it needs one position more than its length.
      if ((int)tokens.back().size() + 1 > ctx) {
        throw RequestError(400, fmt::format("chunks[{}]", i),
                           fmt::format("chunk {} has {} tokens, more than the model context of {} "
                                       "tokens leaves for one chunk ({})",
                                       i, tokens.back().size(), ctx, ctx - 1));
      }
    }
    json data = json::array();
    // One scheduler task per block of an encoding (Engine::ingest_step), so running requests
    // decode a step between two blocks.
    for (const std::vector<int32_t>& toks : tokens) {
      Engine::ChunkIngest in{toks, tier, {}, nullptr};
      bool done = false;
      while (!done) batcher.run([&] { done = engine.ingest_step(in); });
      const ChunkInfo& c = in.info;
      metrics.record_chunks({c});
      data.push_back({{"id", c.id},
                      {"n_tok", c.n_tok},
                      {"hit", c.hit},
                      {"tier", c.tier},
                      {"encode_ms", c.encode_ms},
                      {"rank_ms", c.rank_ms}});
    }
    send_json(res, 200, {{"object", "list"}, {"data", data}});
  }

  // A chat completion, or with `raw` a completion of a raw prompt (/v1/completions).
  void complete(const httplib::Request& req, httplib::Response& res, bool raw) {
    const json body = parse_json_body(req.body);
    auto r = std::make_shared<ChatRequest>(raw ? parse_completion_request(body, opt.limits)
                                               : parse_chat_request(body, opt.limits, req.body));
    auto prompt = std::make_shared<const RagPromptTokens>(prompt_of(*r));
    // Refused now (400 / 503) rather than as an event after a stream's headers.
    batcher.check_admission(prompt->n_tokens(), r->gen.max_tokens, r->best_of);
    const std::string id = new_id(raw ? "cmpl" : "chatcmpl");
    const int64_t created = unix_now();
    // A client that has gone (closed its connection) cancels the request at the next token
    // instead of holding the engine until max_tokens.
    const int fd = HttpServer::current_socket();
    if (!r->stream) {
      std::atomic<bool> stop{false};
      std::vector<Answer> answers, generated;
      try {
        if (r->best_of > r->n) {
          // best_of choices, each with its tokens' logprobs (to rank them), the n best returned;
          // usage counts every one generated.
          ChatRequest all = *r;
          all.n = r->best_of;
          all.gen.logprobs = std::max(all.gen.logprobs, 0);
          generated = run_choices(all, *prompt, fd, nullptr, nullptr, stop);
          answers = best_answers(generated, r->n);  // (logprobs shown only if asked: r->gen)
          // Choice 0 scored an echoed prompt (run_choices) for all.
          answers[0].prompt_logprobs = generated[0].prompt_logprobs;
        } else {
          answers = run_choices(*r, *prompt, fd, nullptr, nullptr, stop);
        }
      } catch (const RequestCancelled&) {
        cancelled.fetch_add(1);
        res.status = 499;
        return;
      } catch (const ClientGone&) {
        cancelled.fetch_add(1);
        res.status = 499;  // nobody reads it; the connection is closed
        return;
      }
      json body = response_body(answers, *r, engine.model().tokenizer(), *prompt, id, opt.model_id,
                                created);
      if (!generated.empty()) {
        body["usage"] = usage(generated);
        body["cachetune"] = answer_stats(generated[0], *r);  // the prefill's own figures
      }
      send_json(res, 200, body);
      return;
    }
    // Server-sent events (stream()): for chat a role delta, then deltas as tokens arrive (whole
    // UTF-8 characters only), a last event with finish_reason, usage and the cachetune figures,
    // then [DONE].
    // The provider runs on this connection's worker, so fd stays this connection's until it ends.
    res.set_chunked_content_provider(
        "text/event-stream", [this, r, prompt, id, created, fd](size_t, httplib::DataSink& sink) {
          return stream(*r, *prompt, id, created, fd, sink);
        });
  }

  // The r.n choices of a request, each a generation of its own in the scheduler (so they decode
  // together, one row each), queued together and prefilled once (Scheduler::answer_all), choice
  // i with seed + i.
  // on_piece(i, piece), when given, gets choice i's text as it is produced, and on_logprob(i, e)
  // the logprobs entry of each of its tokens just before that token's piece (both on the
  // scheduler's thread). Every choice ends at its next token once `stop` is set or the client has
  // gone. Returns the answers in choice order, or rethrows the first failure of a choice's own (not
  // one that ended because the client went or `stop` was set) once all have ended.
  std::vector<Answer> run_choices(const ChatRequest& r, const RagPromptTokens& prompt, int fd,
                                  const std::function<void(int, const std::string&)>& on_piece,
                                  const std::function<void(int, const TokenLogprob&)>& on_logprob,
                                  std::atomic<bool>& stop) {
    std::vector<GenerateOptions> gens(r.n, r.gen);
    std::vector<AnswerOptions> opts(r.n, r.answer);
    // One clock per choice: its gaps are between its own tokens.
    std::vector<std::unique_ptr<TokenClock>> clocks;
    for (int i = 0; i < r.n; ++i) {
      clocks.push_back(std::make_unique<TokenClock>(metrics.inter_token));
      gens[i].sampling.seed += static_cast<uint64_t>(i);
      if (i > 0) gens[i].prompt_logprobs = -1;  // one choice scores the prompt for all
      TokenClock* clock = clocks.back().get();
      opts[i].on_piece = [&stop, &on_piece, fd, clock, i](const std::string& piece) {
        clock->tick();
        if (stop || peer_has_closed(fd)) throw ClientGone{};
        if (on_piece) on_piece(i, piece);
      };
      opts[i].cancelled = [&stop, fd] { return stop.load() || peer_has_closed(fd); };
      if (on_logprob) {
        opts[i].on_logprob = [&on_logprob, i](const TokenLogprob& e) { on_logprob(i, e); };
      }
    }
    std::vector<Scheduler::Outcome> out = batcher.answer_all(prompt, r.sel, gens, opts);
    std::exception_ptr consequence;
    std::vector<Answer> answers;
    for (Scheduler::Outcome& o : out) {
      if (o.error) {
        try {
          std::rethrow_exception(o.error);
        } catch (const ClientGone&) {
          consequence = o.error;
          continue;
        } catch (const RequestCancelled&) {
          consequence = o.error;
          continue;
        } catch (...) {
          std::rethrow_exception(o.error);  // a choice's own failure
        }
      }
      metrics.record_answer(o.answer);
      answers.push_back(std::move(o.answer));
    }
    if (consequence) std::rethrow_exception(consequence);
    return answers;
  }

  // Generation runs on its own thread (the choices waiting in the scheduler) and hands pieces (and
  // logprobs entries) over through a queue; this connection's thread writes them out, each
  // choice's text cut at UTF-8 boundaries on its own. An event carries the logprobs of the tokens
  // that came since the choice's last event: those whose text it brings, and those of tokens whose
  // text is still held back (part of a UTF-8 character or of a possible stop sequence) wait for
  // the next event that brings text, or the choice's end. A slow reader delays only its own stream,
  // not the engine, and a closed connection cancels generation at the next token.
  bool stream(const ChatRequest& r, const RagPromptTokens& prompt, const std::string& id,
              int64_t created, int fd, httplib::DataSink& sink) {
    struct Item {
      int choice;
      std::string piece;  // empty for a logprobs entry
      std::optional<TokenLogprob> entry;
    };
    struct Shared {
      std::mutex mu;
      std::condition_variable cv;
      std::deque<Item> pieces;
      bool finished = false;
      std::atomic<bool> cancel{false};
      std::vector<Answer> answers;
      std::exception_ptr error;
    };
    auto st = std::make_shared<Shared>();
    std::thread gen([this, &r, &prompt, st, fd] {
      try {
        std::vector<Answer> a = run_choices(
            r, prompt, fd,
            [st](int i, const std::string& piece) {
              std::lock_guard<std::mutex> lk(st->mu);
              st->pieces.push_back({i, piece, std::nullopt});
              st->cv.notify_one();
            },
            [st](int i, const TokenLogprob& e) {
              std::lock_guard<std::mutex> lk(st->mu);
              st->pieces.push_back({i, std::string(), e});
            },
            st->cancel);
        std::lock_guard<std::mutex> lk(st->mu);
        st->answers = std::move(a);
      } catch (const RequestCancelled&) {
        cancelled.fetch_add(1);
      } catch (const ClientGone&) {
        cancelled.fetch_add(1);
      } catch (...) {
        std::lock_guard<std::mutex> lk(st->mu);
        st->error = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(st->mu);
      st->finished = true;
      st->cv.notify_one();
    });
    auto send_raw = [&](const std::string& s) {
      if (!sink.write(s.data(), s.size())) throw ClientGone{};
    };
    auto send = [&](const json& j) { send_raw("data: " + dump(j) + "\n\n"); };
    bool client_gone = false;
    try {
      if (!r.completion) {
        for (int i = 0; i < r.n; ++i) {
          send(chat_chunk(id, opt.model_id, created, std::string(), std::string("assistant"), "",
                          i));
        }
      }
      std::vector<std::string> pending(r.n);
      std::vector<std::vector<TokenLogprob>> entries(r.n);  // not yet sent, per choice
      std::vector<size_t> offsets(r.n, 0);                  // completions' text_offset
      // Reading tool calls: each choice's text so far and the bytes of it sent as content.
      const bool tools = !r.completion && r.reads_tool_calls();
      std::vector<std::string> whole(r.n);
      std::vector<size_t> sent(r.n, 0);
      const Tokenizer& tok = engine.model().tokenizer();
      // The logprobs of choice i's entries not yet sent (null without logprobs), then none.
      auto take_logprobs = [&](int i) -> json {
        if (r.gen.logprobs < 0) return nullptr;
        json out = logprobs_body(r, entries[i], tok, offsets[i]);
        entries[i].clear();
        return out;
      };
      for (bool finished = false; !finished;) {
        std::deque<Item> batch;
        {
          std::unique_lock<std::mutex> lk(st->mu);
          st->cv.wait(lk, [&] { return !st->pieces.empty() || st->finished; });
          batch.swap(st->pieces);
          finished = st->finished;  // set after the last piece was queued
        }
        for (Item& it : batch) {
          const int i = it.choice;
          if (it.entry) {
            entries[i].push_back(std::move(*it.entry));
            continue;
          }
          pending[i] += it.piece;
          std::string ready = take_complete_utf8(pending[i]);
          if (tools) {  // content up to a possible tool call; the rest waits for the end
            whole[i] += ready;
            const size_t n = tool_stream_ready(whole[i], sent[i], r.forces_tool_call());
            ready = n > sent[i] ? whole[i].substr(sent[i], n - sent[i]) : std::string();
            sent[i] = std::max(sent[i], n);
          }
          if (!ready.empty()) {
            send(stream_event(r, id, opt.model_id, created, ready, "", i, take_logprobs(i)));
          }
        }
      }
      if (st->error) std::rethrow_exception(st->error);
      if ((int)st->answers.size() != r.n) throw ClientGone{};  // cancelled: nobody reads on
      for (int i = 0; i < r.n; ++i) {
        std::string end_reason = finish_reason(st->answers[i], r);
        if (tools) {
          // The calls whole, in one event; or, where the text holds none, the rest as content.
          const ToolCallsParsed p = parse_tool_calls(st->answers[i].text, r.forces_tool_call());
          if (!p.calls.empty()) {
            json ev =
                stream_event(r, id, opt.model_id, created, std::nullopt, "", i, take_logprobs(i));
            ev["choices"][0]["delta"]["tool_calls"] = tool_calls_body(p.calls, r, id, i);
            send(ev);
            end_reason = "tool_calls";
            pending[i].clear();
          } else {
            pending[i] = (whole[i] + pending[i]).substr(std::min(sent[i], whole[i].size()));
          }
        }
        if (!pending[i].empty() || !entries[i].empty()) {
          send(stream_event(r, id, opt.model_id, created, pending[i], "", i, take_logprobs(i)));
        }
        json last = stream_event(r, id, opt.model_id, created, std::nullopt, end_reason, i);
        if (i + 1 == r.n) {  // the whole response's figures, with the last choice's end
          // With include_usage the usage comes once, in its own event, as OpenAI sends it.
          if (!r.include_usage) last["usage"] = usage(st->answers);
          last["cachetune"] = answer_stats(st->answers[0], r);
        }
        send(last);
      }
      if (r.include_usage) send(usage_event(st->answers, r, id, opt.model_id, created));
      send_raw("data: [DONE]\n\n");
    } catch (const ClientGone&) {
      client_gone = true;
    } catch (const std::exception& e) {
      // Headers are gone already: report the failure as an event, then end the stream. The
      // request was checked before streaming began, so what fails now is the server's side.
      try {
        const bool busy = dynamic_cast<const AdmissionError*>(&e) != nullptr;
        send(error_body(busy ? 503 : 500, e.what()));
      } catch (const ClientGone&) {
        client_gone = true;
      }
    }
    st->cancel = true;  // generation stops at its next token if it is still running
    gen.join();
    if (client_gone) return false;
    sink.done();
    return true;
  }
};

Server::Server(Engine& engine, ServerOptions opt)
    : impl_(std::make_unique<Impl>(engine, std::move(opt))) {
  impl_->routes();
}

Server::~Server() { stop(); }

int Server::bind() {
  Impl& s = *impl_;
  if (s.opt.port == 0) {
    s.port = s.http.bind_to_any_port(s.opt.host);
  } else {
    s.port = s.http.bind_to_port(s.opt.host, s.opt.port) ? s.opt.port : -1;
  }
  CT_THROW_IF_NOT(s.port > 0,
                  "serve: cannot listen on {}:{} (address in use, or not a local "
                  "address)",
                  s.opt.host, s.opt.port);
  // The HTTP layer listens with a backlog of 5, so bursts of connections were reset; listen()
  // again on the same socket raises it (Linux takes a second listen() as a backlog change).
  ::listen(s.http.listen_socket(), std::max(1, s.opt.listen_backlog));
  return s.port;
}

int Server::port() const { return impl_->port; }

uint64_t Server::cancelled_requests() const { return impl_->cancelled.load(); }

void Server::serve() {
  Impl& s = *impl_;
  CT_THROW_IF_NOT(s.port > 0, "serve: bind() first");
  s.http.listen_after_bind();
}

void Server::stop() { impl_->http.stop(); }

uint64_t Server::slow_connections_closed() const { return impl_->http.timed_out_connections(); }
uint64_t Server::overload_rejected() const { return impl_->http_rejected.load(); }

SchedulerStats Server::batch_stats() const { return impl_->batcher.stats(); }

Scheduler& Server::scheduler() { return impl_->batcher; }

ServerMetrics& Server::metrics() { return impl_->metrics; }

}  // namespace ct::server
