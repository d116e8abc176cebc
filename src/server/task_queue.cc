#include "server/task_queue.h"

#include "core/error.h"

namespace ct::server {

namespace {
thread_local bool t_overflow = false;
}

BoundedTaskQueue::BoundedTaskQueue(size_t n_workers, size_t max_queued) : max_queued_(max_queued) {
  CT_THROW_IF_NOT(n_workers >= 1, "the HTTP layer needs at least one worker, got {}", n_workers);
  for (size_t i = 0; i < n_workers; ++i) threads_.emplace_back([this] { work(false); });
  threads_.emplace_back([this] { work(true); });
}

BoundedTaskQueue::~BoundedTaskQueue() { shutdown(); }

bool BoundedTaskQueue::in_overflow() { return t_overflow; }

void BoundedTaskQueue::enqueue(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() < max_queued_) {
      queue_.push_back(std::move(fn));
    } else {
      overflow_.push_back(std::move(fn));
    }
  }
  cv_.notify_all();
}

void BoundedTaskQueue::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && threads_.empty()) return;
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

// Workers take from the main queue, the overflow worker from the overflow queue; at shutdown
// each finishes what is queued for it (every task owns a socket it must close).
void BoundedTaskQueue::work(bool overflow) {
  t_overflow = overflow;
  std::deque<std::function<void()>>& q = overflow ? overflow_ : queue_;
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !q.empty(); });
      if (q.empty()) return;  // stopping, nothing left
      fn = std::move(q.front());
      q.pop_front();
    }
    fn();
  }
}

}  // namespace ct::server
