// Continuous batching over one Engine: requests from any number of threads are queued, admitted
// while the KV budget allows (one per step), and stepped together: each step is one batched
// forward pass over a decode row of every generating request plus, with the engine's chunked
// prefill (EngineOptions::prefill_chunk), the chunk lookups and encodings of admitted requests
// and budgeted slices of the prefill rows of those still prefilling (Engine::advance). Without
// it a request's chunks are encoded and its prefill runs whole when it is admitted. A request leaves the batch at its last token, or at the next token once its client
// has gone (its on_piece throws), or between two slices of its prefill when
// AnswerOptions::cancelled says so. One thread, the scheduler's, drives the engine;
// other engine work (chunk ingestion) runs there too, between steps (run()).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"

namespace ct {

struct SchedulerOptions {
  // Host bytes of K/V all running requests may hold together (each holds
  // Generation::kv_bytes_for(cache type, prompt, max_tokens) from its admission to its last
  // token).
  size_t kv_budget_bytes = size_t(4) << 30;
  int max_running = 16;  // requests admitted at once (prefilling in slices or decoding)
  int max_queue = 64;    // requests waiting for admission (>= 1); more are refused
};

// A request the scheduler will not take. too_large: it needs more K/V than the whole budget
// (HTTP 400); otherwise the queue is full (HTTP 503, retry after retry_after_s).
class AdmissionError : public std::runtime_error {
 public:
  AdmissionError(bool too_large, const std::string& msg, int retry_after_s = 0)
      : std::runtime_error(msg), too_large_(too_large), retry_after_s_(retry_after_s) {}
  bool too_large() const { return too_large_; }
  int retry_after_s() const { return retry_after_s_; }

 private:
  bool too_large_;
  int retry_after_s_;
};

struct SchedulerStats {
  int queued = 0;            // waiting for admission
  int running = 0;           // admitted: prefilling in slices or decoding
  size_t kv_in_use = 0;      // bytes reserved by running requests
  size_t kv_budget = 0;      // SchedulerOptions::kv_budget_bytes
  uint64_t steps = 0;        // engine steps run
  uint64_t step_rows = 0;    // rows over all steps, decode and prefill (mean = step_rows / steps)
  int max_rows = 0;          // largest step
  uint64_t prefill_rows = 0;  // of step_rows, prefill rows (chunked prefill)
  uint64_t mixed_steps = 0;   // steps with both decode rows and prefill rows
  uint64_t completed = 0;    // requests finished (answered, failed or cancelled)
  uint64_t cancelled_queued = 0;  // of those, dropped before their prefill (client gone)
  uint64_t refused = 0;      // AdmissionError thrown
};

class Scheduler {
 public:
  Scheduler(Engine& engine, SchedulerOptions opt);
  ~Scheduler();  // finishes running requests' current step, fails queued ones, joins
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Engine::answer through the batch: blocks until the request's last token. on_piece runs on
  // the scheduler's thread and must be quick; if it throws, the request stops there and answer()
  // rethrows that exception. Throws AdmissionError when refused, RequestCancelled when
  // opt.cancelled() said so before the prefill, and whatever the prefill threw.
  Answer answer(const RagPromptTokens& prompt, const SelectiveOptions& sel,
                const GenerateOptions& gen, const AnswerOptions& opt = {});
  // Several generations of one prompt (a request's n choices; gens[i] and opts[i] each), queued
  // together or refused together (AdmissionError: the queue cannot take all of them), then run
  // as the scheduler admits them; blocks until the last has ended. The prompt is prefilled once:
  // the first generation's prefill, whose rows the others copy (SharedPrefill, engine.h; each
  // answer is what it would be alone). Each outcome holds its answer or what ended it (as
  // answer() would throw it).
  struct Outcome {
    Answer answer;
    std::exception_ptr error;
  };
  std::vector<Outcome> answer_all(const RagPromptTokens& prompt, const SelectiveOptions& sel,
                                  const std::vector<GenerateOptions>& gens,
                                  const std::vector<AnswerOptions>& opts);
  // Throws the AdmissionError answer_all() would throw now for n requests of this size (a
  // streamed response checks before its headers go out; answer() checks again).
  void check_admission(int n_prompt, int max_tokens, int n = 1) const;
  // Runs fn on the scheduler's thread between steps (engine work that is not a generation,
  // e.g. Engine::ensure_chunk) and returns when it has; rethrows what fn threw.
  void run(const std::function<void()>& fn);

  SchedulerStats stats() const;
  // Called on the scheduler's thread after each step that did work (rows of any kind, chunk
  // encoding included) with the step's rows and its wall time in seconds.
  using StepObserver = std::function<void(const StepRows& rows, double seconds)>;
  void set_step_observer(StepObserver f);
  const SchedulerOptions& options() const { return opt_; }

 private:
  struct Job;
  void loop();
  // Throws AdmissionError for n requests of kv_cost bytes each (caller holds mu_).
  void refuse_if_full(size_t kv_cost, int n_prompt, int max_tokens, int n = 1) const;
  Engine& engine_;
  SchedulerOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;  // generations waiting for admission, FIFO
  std::deque<std::shared_ptr<Job>> tasks_;  // run() work
  bool stopping_ = false;
  SchedulerStats stats_;
  mutable uint64_t refused_ = 0;  // under mu_
  StepObserver observer_;
  std::thread thread_;
};

}  // namespace ct
