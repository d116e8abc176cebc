// Stop sequences as OpenAI defines them: generation ends before the first occurrence of any of
// the strings, and that text is never returned. Independent of any decode loop: feed each new
// token's text, emit what comes back, stop when told; text that might be the start of a stop
// sequence is held back until the next pieces decide it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ct {

class StopMatcher {
 public:
  // Most sequences and longest sequence a request may give (OpenAI allows up to 4).
  static constexpr size_t kMaxSequences = 4;
  static constexpr size_t kMaxBytes = 256;

  // Throws ct::Error for an empty sequence, more than kMaxSequences, or one over kMaxBytes.
  // With no sequences every piece is returned as it comes.
  explicit StopMatcher(std::vector<std::string> stops = {});

  struct Step {
    std::string text;      // safe to emit now (never part of a stop sequence)
    bool stopped = false;  // a stop sequence completed: generation must end
  };
  // Appends the next piece of generated text (raw bytes; a UTF-8 character may be split across
  // pieces). After a stop, further pieces are ignored and return {"", true}.
  Step feed(std::string_view piece);
  // At the end of generation without a stop: the held-back text (a prefix of a stop sequence
  // that never completed), now safe to emit. Empty after a stop.
  std::string flush();

  bool stopped() const { return stopped_; }
  // Everything returned so far by feed() and flush(): the answer text.
  const std::string& emitted() const { return emitted_; }
  const std::vector<std::string>& sequences() const { return stops_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // not yet emitted: the longest suffix that is a proper prefix of a stop
  std::string emitted_;
  bool stopped_ = false;
};

}  // namespace ct
