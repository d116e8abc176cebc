// A JSON Schema `pattern` (or a `format` written as one) compiled for constrained decoding: a
// regular expression in ECMA-262 syntax (a subset, docs/SERVER.md), matched against a string's
// Unicode code points with the search semantics JSON Schema gives it (unanchored unless ^ / $),
// as a position (Glushkov) automaton whose state is a set of positions. The automaton keeps
// only positions from which a match can still be completed, so a non-empty state always has a
// continuation: a sampler that follows it is never stranded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ct {

class JsonPattern {
 public:
  // Character-class occurrences after {n,m} is expanded, plus the start and the implicit
  // [\s\S]* of an unanchored end: a state is a bit set of them.
  static constexpr int kMaxPositions = 256;
  // Bounds on what compile() reads from a request.
  static constexpr size_t kMaxSource = 4096;  // bytes of the pattern
  static constexpr uint32_t kMaxRepeat = 1000;  // n and m of {n,m}
  struct State {
    uint64_t w[kMaxPositions / 64] = {};
    bool empty() const;
    bool operator==(const State&) const = default;
  };
  using Range = std::pair<uint32_t, uint32_t>;  // code points lo..hi, both included

  // Throws ct::Error saying what in the pattern is not supported, or (unless allow_empty)
  // that it matches nothing; with allow_empty such a pattern compiles and matches_nothing().
  static std::shared_ptr<const JsonPattern> compile(std::string_view pattern,
                                                    bool allow_empty = false);
  // The pattern of a JSON Schema `format` this supports (date, time, date-time, duration, uuid,
  // ipv4, ipv6, hostname, email); empty for any other.
  static std::string format_pattern(std::string_view format);

  State start() const { return start_; }
  bool matches_nothing() const { return start_.empty(); }
  // The state after code point cp from s; empty when no match can go on from there.
  State step(const State& s, uint32_t cp) const;
  // Whether some code point in [lo, hi] (surrogates excluded) leads from s to a non-empty state.
  bool can_step(const State& s, uint32_t lo, uint32_t hi) const;
  // The union of the states some code point in [lo, hi] leads to from s (a state is a set of
  // positions, and what can follow a union is the union of what can follow its parts).
  State step_range(const State& s, uint32_t lo, uint32_t hi) const;
  // completions(n)[k], k = 0..n: the positions from which some string of exactly k more
  // characters completes a match. A state can complete in k characters iff it meets [k]; and
  // when it can in some k >= lo, it can in one of [lo, lo + positions()] (a longer path through
  // the automaton repeats a position, and its loop can be cut).
  std::vector<State> completions(int n) const;
  // Whether the string read to s matches.
  bool accepts(const State& s) const;
  // Whether a whole string (UTF-8) matches; false for text that is not UTF-8.
  bool matches(std::string_view utf8) const;
  int positions() const { return n_pos_; }

 private:
  friend class JsonPatternBuilder;
  State follow_of(const State& s) const;  // the positions that may come next, live ones only
  // can_step (out null: stops at the first code point that leads on) and step_range (out: the
  // union of where they lead).
  bool range_step(const State& s, uint32_t lo, uint32_t hi, State* out) const;
  int n_pos_ = 0;
  std::vector<uint32_t> cuts_;  // interval i is [cuts_[i], cuts_[i + 1]); cuts_[0] = 0
  std::vector<State> on_;       // per interval: the positions whose class holds it
  std::vector<State> follow_;   // per position
  State accept_, start_;
};

}  // namespace ct
