// StopMatcher (see stop_matcher.h). Invariant between calls: held_ is the longest suffix of the
// text seen so far that is a proper prefix of some stop sequence, and no stop sequence occurs in
// the text seen so far. Then an occurrence completed by a new piece starts inside held_ + piece,
// so searching that string alone finds the first occurrence.
#include "model/stop_matcher.h"

#include <algorithm>

#include "core/error.h"

namespace ct {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  CT_THROW_IF_NOT(stops_.size() <= kMaxSequences, "{} stop sequences given; at most {} are allowed",
                  stops_.size(), kMaxSequences);
  for (size_t i = 0; i < stops_.size(); ++i) {
    CT_THROW_IF_NOT(!stops_[i].empty(), "stop sequence {} is empty; expected a non-empty string",
                    i);
    CT_THROW_IF_NOT(stops_[i].size() <= kMaxBytes,
                    "stop sequence {} has {} bytes; at most {} are allowed", i, stops_[i].size(),
                    kMaxBytes);
  }
}

StopMatcher::Step StopMatcher::feed(std::string_view piece) {
  Step out;
  if (stopped_) {
    out.stopped = true;
    return out;
  }
  held_.append(piece);
  // The earliest occurrence of any sequence ends the text there.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    out.text = held_.substr(0, first);
    out.stopped = stopped_ = true;
    held_.clear();
    emitted_ += out.text;
    return out;
  }
  // Keep the longest suffix that some sequence starts with; emit the rest.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t most = std::min(held_.size(), s.size() - 1);
    for (size_t n = most; n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  out.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  emitted_ += out.text;
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  emitted_ += out;
  return out;
}

}  // namespace ct
