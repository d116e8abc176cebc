// The scheduler's thread: one loop that runs queued engine tasks, admits at most one request per
// iteration (its prefill, or with chunked prefill its chunk lookups and selection), then one
// engine step over every running request.
#include "engine/scheduler.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/timer.h"

namespace ct {

struct Scheduler::Job {
  // A generation request (prompt set) or a task (fn set).
  const RagPromptTokens* prompt = nullptr;
  SelectiveOptions sel;
  GenerateOptions gen;
  AnswerOptions opt;
  Timer arrival;
  size_t kv_cost = 0;
  bool admitted = false;  // kv_cost is counted in kv_in_use
  std::unique_ptr<Generation> g;
  std::function<void()> fn;
  // Set under the scheduler's lock when the job is over.
  bool finished = false;
  Answer answer;
  std::exception_ptr error;
  std::condition_variable done_cv;
};

Scheduler::Scheduler(Engine& engine, SchedulerOptions opt) : engine_(engine), opt_(opt) {
  CT_THROW_IF_NOT(opt_.kv_budget_bytes > 0, "scheduler: KV budget of 0 bytes");
  CT_THROW_IF_NOT(opt_.max_running >= 1, "scheduler: max_running = {}; expected >= 1",
                  opt_.max_running);
  CT_THROW_IF_NOT(opt_.max_queue >= 1, "scheduler: max_queue = {}; expected >= 1",
                  opt_.max_queue);
  // A CUDA engine has EngineOptions::gpu_seqs sequence slots: at most that many requests run.
  if (engine_.options().cuda) {
    opt_.max_running = std::min(opt_.max_running, engine_.options().gpu_seqs);
  }
  stats_.kv_budget = opt_.kv_budget_bytes;
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Answer Scheduler::answer(const RagPromptTokens& prompt, const SelectiveOptions& sel,
                         const GenerateOptions& gen, const AnswerOptions& opt) {
  std::vector<Outcome> out = answer_all(prompt, sel, {gen}, {opt});
  if (out[0].error) std::rethrow_exception(out[0].error);
  return std::move(out[0].answer);
}

std::vector<Scheduler::Outcome> Scheduler::answer_all(const RagPromptTokens& prompt,
                                                      const SelectiveOptions& sel,
                                                      const std::vector<GenerateOptions>& gens,
                                                      const std::vector<AnswerOptions>& opts) {
  CT_THROW_IF_NOT(!gens.empty() && gens.size() == opts.size(),
                  "answer_all: {} generation options for {} answer options", gens.size(),
                  opts.size());
  std::vector<std::shared_ptr<Job>> jobs;
  size_t largest = 0;
  int max_tokens = 0;
  // One prefill for all: the first leads, the others copy its rows (SharedPrefill), when any of
  // them would (one that scores its prompt or generates nothing does not: Engine::begin).
  bool followers = false;
  for (size_t i = 1; i < gens.size(); ++i)
    followers = followers || (gens[i].max_tokens > 0 && gens[i].prompt_logprobs < 0);
  auto share = followers ? std::make_shared<SharedPrefill>() : nullptr;
  for (size_t i = 0; i < gens.size(); ++i) {
    auto job = std::make_shared<Job>();  // arrival: TTFT includes the time spent queued
    job->prompt = &prompt;
    job->sel = sel;
    job->gen = gens[i];
    job->opt = opts[i];
    job->opt.shared_prefill = share;
    job->opt.leads_prefill = i == 0;
    job->kv_cost = Generation::kv_bytes_for(engine_.model().config(), engine_.options().kv_type,
                                            prompt.n_tokens(), std::max(0, gens[i].max_tokens));
    if (job->kv_cost > largest) {
      largest = job->kv_cost;
      max_tokens = gens[i].max_tokens;
    }
    jobs.push_back(std::move(job));
  }
  std::unique_lock<std::mutex> lk(mu_);
  refuse_if_full(largest, prompt.n_tokens(), max_tokens, (int)jobs.size());
  CT_THROW_IF_NOT(!stopping_, "server shutting down");
  for (const auto& job : jobs) queue_.push_back(job);
  share.reset();  // the jobs hold it (a copy of the prompt's rows lives while one may need it)
  cv_.notify_all();
  std::vector<Outcome> out(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& job = *jobs[i];
    job.done_cv.wait(lk, [&] { return job.finished; });
    out[i].answer = std::move(job.answer);
    out[i].error = job.error;
  }
  return out;
}

void Scheduler::refuse_if_full(size_t kv_cost, int n_prompt, int max_tokens, int n) const {
  if (kv_cost > opt_.kv_budget_bytes) {
    ++refused_;
    throw AdmissionError(
        true, fmt::format("request needs {} bytes of K/V cache ({} prompt tokens + {} new tokens), "
                          "more than the server's whole KV budget of {} bytes (--kv-budget)",
                          kv_cost, n_prompt, max_tokens, opt_.kv_budget_bytes));
  }
  if ((int)queue_.size() + n > opt_.max_queue) {
    ++refused_;
    throw AdmissionError(false,
                         n == 1 ? fmt::format("server busy: {} requests waiting (--max-queue {}); "
                                              "retry later",
                                              queue_.size(), opt_.max_queue)
                                : fmt::format("server busy: {} requests waiting and {} choices to "
                                              "queue (--max-queue {}); retry later",
                                              queue_.size(), n, opt_.max_queue),
                         1);
  }
}

void Scheduler::check_admission(int n_prompt, int max_tokens, int n) const {
  std::lock_guard<std::mutex> lk(mu_);
  refuse_if_full(Generation::kv_bytes_for(engine_.model().config(), engine_.options().kv_type,
                                          n_prompt, std::max(0, max_tokens)),
                 n_prompt, max_tokens, n);
}

void Scheduler::run(const std::function<void()>& fn) {
  auto job = std::make_shared<Job>();
  job->fn = fn;
  std::unique_lock<std::mutex> lk(mu_);
  CT_THROW_IF_NOT(!stopping_, "server shutting down");
  tasks_.push_back(job);
  cv_.notify_all();
  job->done_cv.wait(lk, [&] { return job->finished; });
  if (job->error) std::rethrow_exception(job->error);
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  SchedulerStats s = stats_;
  s.queued = (int)queue_.size();
  s.refused = refused_;
  return s;
}

void Scheduler::set_step_observer(StepObserver f) {
  std::lock_guard<std::mutex> lk(mu_);
  observer_ = std::move(f);
}

void Scheduler::loop() {
  std::vector<std::shared_ptr<Job>> running;
  // Ends a job (under mu_): its K/V reservation goes back, its caller wakes.
  auto complete = [&](Job& j, std::exception_ptr err) {
    // A leader that ended before its generation began (cancelled, refused, shut down): its
    // followers prefill on their own.
    if (j.opt.shared_prefill && j.opt.leads_prefill &&
        j.opt.shared_prefill->state == SharedPrefill::State::kPending) {
      j.opt.shared_prefill->state = SharedPrefill::State::kFailed;
    }
    j.opt.shared_prefill.reset();
    if (j.g) {
      if (!err) err = j.g->error();
      if (!err) j.answer = j.g->take_answer();
      j.g.reset();
    }
    if (j.admitted) stats_.kv_in_use -= j.kv_cost;
    j.admitted = false;
    j.error = err;
    j.finished = true;
    if (j.prompt) ++stats_.completed;
    j.done_cv.notify_all();
  };
  for (;;) {
    std::shared_ptr<Job> task, admit;
    {
      std::unique_lock<std::mutex> lk(mu_);
      auto admissible = [&] {
        return !queue_.empty() && (int)running.size() < opt_.max_running &&
               stats_.kv_in_use + queue_.front()->kv_cost <= opt_.kv_budget_bytes;
      };
      cv_.wait(lk, [&] { return stopping_ || !tasks_.empty() || !running.empty() || admissible(); });
      if (stopping_) {
        const auto stopped = std::make_exception_ptr(Error("server shutting down"));
        for (auto& j : running) complete(*j, stopped);
        for (auto& j : queue_) complete(*j, stopped);
        for (auto& j : tasks_) complete(*j, stopped);
        queue_.clear();
        tasks_.clear();
        stats_.running = 0;
        return;
      }
      if (!tasks_.empty()) {
        task = tasks_.front();
        tasks_.pop_front();
      }
      if (admissible()) {
        admit = queue_.front();
        queue_.pop_front();
        stats_.kv_in_use += admit->kv_cost;
        admit->admitted = true;
      }
    }
    if (task) {
      std::exception_ptr err;
      try {
        task->fn();
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(mu_);
      complete(*task, err);
    }
    if (admit) {
      std::exception_ptr err;
      try {
        if (admit->opt.cancelled && admit->opt.cancelled()) {
          std::lock_guard<std::mutex> lk(mu_);
          ++stats_.cancelled_queued;
          throw RequestCancelled("before");
        }
        admit->g = engine_.begin(*admit->prompt, admit->sel, admit->gen, admit->opt,
                                 admit->arrival);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (err || admit->g->done()) {
        complete(*admit, err);
      } else {
        // The generation holds its share of the prefill now; a queued job's copy would keep a
        // leader's rows alive until the whole request ends.
        admit->opt.shared_prefill.reset();
        running.push_back(admit);
        stats_.running = (int)running.size();
      }
    }
    if (running.empty()) continue;
    std::vector<Generation*> gens;
    for (auto& j : running) gens.push_back(j->g.get());
    std::exception_ptr err;
    StepRows step;
    const Timer step_time;
    try {
      step = engine_.advance(gens.data(), (int)gens.size());
    } catch (...) {
      err = std::current_exception();  // an engine failure: every request in the step fails
    }
    const double step_s = step_time.seconds();
    const int rows = step.decode + step.prefill;
    StepObserver observer;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (rows > 0) {
        ++stats_.steps;
        stats_.step_rows += rows;
        stats_.prefill_rows += step.prefill;
        stats_.mixed_steps += step.decode > 0 && step.prefill > 0;
        stats_.max_rows = std::max(stats_.max_rows, rows);
      }
      std::vector<std::shared_ptr<Job>> still;
      for (auto& j : running) {
        if (j->g->done()) {
          // Finished within this step: its own outcome, even if a later row's step failed.
          complete(*j, nullptr);
        } else if (err) {
          complete(*j, err);
        } else {
          still.push_back(j);
        }
      }
      running.swap(still);
      stats_.running = (int)running.size();
      observer = observer_;
    }
    if (observer && (rows > 0 || step.encode > 0 || step.select > 0)) {
      try {
        observer(step, step_s);
      } catch (...) {  // an observer's failure must not end the scheduler's thread
      }
    }
  }
}

}  // namespace ct
