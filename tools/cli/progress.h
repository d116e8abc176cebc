// A single-line progress indicator on stderr for work that takes more than a moment; silent
// when stderr is not a terminal unless forced, so logs stay clean.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

#include "core/timer.h"

namespace ct::cli {

class Progress {
 public:
  explicit Progress(std::string what, bool enabled = isatty(2))
      : what_(std::move(what)), enabled_(enabled) {}
  void update(long done, long total) {
    if (!enabled_ || t_.seconds() < 0.5) return;
    const double eta = done > 0 ? t_.seconds() / done * (total - done) : 0.0;
    std::fprintf(stderr, "\r%s %ld/%ld (%.0f%%, %.1fs, ETA %.1fs)   ", what_.c_str(), done, total,
                 100.0 * done / total, t_.seconds(), eta);
    std::fflush(stderr);
    shown_ = true;
  }
  void done() {
    if (shown_) std::fprintf(stderr, "\r%*s\r", 80, "");
    shown_ = false;
  }
  ~Progress() { done(); }

 private:
  std::string what_;
  bool enabled_;
  bool shown_ = false;
  Timer t_;
};

}  // namespace ct::cli
