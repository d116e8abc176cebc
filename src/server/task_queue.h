// The HTTP layer's connection queue, bounded. cpp-httplib hands every accepted connection to a
// TaskQueue; its own ThreadPool queues without limit, so under overload a connection could wait
// for a worker for as long as the requests ahead of it run, with no answer. BoundedTaskQueue runs
// connections on n workers with at most max_queued waiting; a connection beyond that goes to one
// overflow worker instead, on which in_overflow() is true, and the server answers each of its
// requests at once with 503 and Retry-After (server.cc). (httplib 0.11's enqueue cannot refuse a
// task, and the task owns the socket, so the refusal is an answer, not a drop.)
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ct::server {

class BoundedTaskQueue final : public httplib::TaskQueue {
 public:
  BoundedTaskQueue(size_t n_workers, size_t max_queued);
  ~BoundedTaskQueue() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;
  // True on the overflow worker: the connection it runs arrived while the queue was full.
  static bool in_overflow();

 private:
  void work(bool overflow);
  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_, overflow_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ct::server
