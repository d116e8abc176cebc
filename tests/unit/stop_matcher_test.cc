// StopMatcher: text is cut before the first occurrence of any stop sequence, also when the
// sequence is split across pieces, when sequences overlap or share prefixes, and on UTF-8 split
// inside a character; held-back text is released as soon as it cannot start a match.
#include "model/stop_matcher.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace ct {
namespace {

// Feeds the pieces; returns everything emitted (flushed at the end unless stopped) and whether
// a sequence stopped it.
std::pair<std::string, bool> run(const std::vector<std::string>& stops,
                                 const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  std::string out;
  for (const std::string& p : pieces) {
    const StopMatcher::Step s = m.feed(p);
    out += s.text;
    if (s.stopped) {
      EXPECT_EQ(out, m.emitted());
      return {out, true};
    }
  }
  out += m.flush();
  EXPECT_EQ(out, m.emitted());
  return {out, false};
}

TEST(StopMatcher, NoSequencesPassesEverythingThrough) {
  StopMatcher m;
  EXPECT_EQ(m.feed("hello").text, "hello");
  EXPECT_EQ(m.feed(" world").text, " world");
  EXPECT_EQ(m.flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, CutsBeforeTheSequenceInOnePiece) {
  EXPECT_EQ(run({"END"}, {"abc", "dEND", "after"}), std::make_pair(std::string("abcd"), true));
  EXPECT_EQ(run({"\n"}, {"line one\nline two"}), std::make_pair(std::string("line one"), true));
  // At the very start: nothing is returned.
  EXPECT_EQ(run({"x"}, {"xyz"}), std::make_pair(std::string(""), true));
}

TEST(StopMatcher, FindsASequenceSplitAcrossPieces) {
  EXPECT_EQ(run({"STOP"}, {"ab", "S", "T", "O", "P", "tail"}),
            std::make_pair(std::string("ab"), true));
  EXPECT_EQ(run({"STOP"}, {"abST", "OPq"}), std::make_pair(std::string("ab"), true));
}

TEST(StopMatcher, HoldsBackOnlyWhatCouldStartASequence) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.feed("abS").text, "ab");  // "S" may begin STOP
  EXPECT_EQ(m.feed("T").text, "");      // "ST" may too
  EXPECT_EQ(m.feed("x").text, "STx");   // ruled out: released
  EXPECT_EQ(m.feed("ST").text, "");
  EXPECT_EQ(m.flush(), "ST");  // generation ended without the sequence
  EXPECT_EQ(m.emitted(), "abSTxST");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, OverlappingPrefixesAndRepeats) {
  // "aab" inside "aaab": the held suffix must restart at the second 'a', not give up.
  EXPECT_EQ(run({"aab"}, {"a", "a", "a", "b"}), std::make_pair(std::string("a"), true));
  EXPECT_EQ(run({"abab"}, {"ababa", "bab"}), std::make_pair(std::string(""), true));
  EXPECT_EQ(run({"abac"}, {"aba", "bac"}), std::make_pair(std::string("ab"), true));
}

TEST(StopMatcher, TheEarliestOfSeveralSequencesWins) {
  EXPECT_EQ(run({"world", "lo w"}, {"hello world"}), std::make_pair(std::string("hel"), true));
  // One sequence a prefix of another: the shorter one completes first.
  EXPECT_EQ(run({"abc", "ab"}, {"xa", "bc"}), std::make_pair(std::string("x"), true));
  // Streamed, the first sequence to complete decides: "bc" inside a longer "abcd".
  EXPECT_EQ(run({"abcd", "bc"}, {"a", "b", "c", "d"}), std::make_pair(std::string("a"), true));
  EXPECT_EQ(run({"bcd", "cdx"}, {"ab", "cd", "x"}), std::make_pair(std::string("a"), true));
}

TEST(StopMatcher, Utf8SequencesSplitInsideACharacter) {
  const std::string e_acute = "\xC3\xA9";  // é
  EXPECT_EQ(run({e_acute}, {"caf\xC3", "\xA9 au lait"}), std::make_pair(std::string("caf"), true));
  // A character sharing its lead byte with the stop sequence's is released whole.
  EXPECT_EQ(run({e_acute}, {"\xC3", "\xA8!"}), std::make_pair(std::string("\xC3\xA8!"), false));
  const std::string dots = "\xE2\x80\xA6";  // …
  EXPECT_EQ(run({"." + dots}, {"wait.", "\xE2\x80", "\xA6 more"}),
            std::make_pair(std::string("wait"), true));
}

TEST(StopMatcher, IgnoresPiecesAfterAStop) {
  StopMatcher m({"#"});
  EXPECT_TRUE(m.feed("a#b").stopped);
  const StopMatcher::Step s = m.feed("more");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "");
  EXPECT_EQ(m.flush(), "");
  EXPECT_EQ(m.emitted(), "a");
}

TEST(StopMatcher, RefusesBadSequences) {
  EXPECT_THROW(StopMatcher({""}), Error);
  EXPECT_THROW(StopMatcher({"a", "b", "c", "d", "e"}), Error);
  EXPECT_THROW(StopMatcher({std::string(StopMatcher::kMaxBytes + 1, 'x')}), Error);
  EXPECT_NO_THROW(StopMatcher({"a", "b", "c", "d"}));
}

}  // namespace
}  // namespace ct
