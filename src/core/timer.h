// Wall-clock timing and process memory figures for the timing lines and benchmarks.
#pragma once

#include <sys/resource.h>

#include <chrono>
#include <cstddef>

namespace ct {

class Timer {
 public:
  Timer() : t0_(std::chrono::steady_clock::now()) {}
  void reset() { t0_ = std::chrono::steady_clock::now(); }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  double ms() const { return seconds() * 1e3; }

 private:
  std::chrono::steady_clock::time_point t0_;
};

// Peak resident set size of this process in bytes (getrusage ru_maxrss).
inline size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return (size_t)ru.ru_maxrss * 1024;
}

}  // namespace ct
