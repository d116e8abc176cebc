// JSON Schema patterns (model/json_pattern.h): the automaton against std::regex (an independent
// ECMAScript engine) on every short string and on random ones, the character classes of ECMA-262
// on non-ASCII text, the formats against their RFCs' grammars (tests/support/json_schema_ref.h),
// and the compiler's refusals by name.
#include "model/json_pattern.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/errors.h"
#include "support/json_schema_ref.h"

namespace ct {
namespace {

// Patterns of the kinds schemas carry, each with the alphabet its test strings are drawn from.
struct Case {
  const char* pattern;
  const char* alphabet;
};
const Case kCases[] = {
    {"^[a-z]+$", "ab1_"},
    {"abc", "abcx"},
    {"^a|b$", "abc"},
    {"^(ab|a)*c?$", "abc"},
    {"^\\d{3}-\\d{2,4}$", "19-a"},
    {"^[A-Z][a-z]{0,3}( [A-Z][a-z]{0,3})?$", "Aa b"},
    {"^(?:x|yz){2,}$", "xyz"},
    {"colou?r", "colur"},
    {"^\\w+@\\w+\\.c$", "a_@.c"},
    {"^[^0-9\\s]+$", "a1 \t"},
    {"^\\S\\s\\S$", "a \tb"},
    {"^(a|ab)(c|bcd)(d*)$", "abcd"},
    {"^[-.a]+$", "-.ab"},
    {"^[\\-\\]x]*$", "-]xa"},
    {"^.{2}$", "ab\n\r"},
    {"^\\x41\\u0042[\\x30-\\x32]$", "AB01x"},
    {"^a{2}b{0,1}c{1,}$", "abc"},
    {"^a+?b*?$", "ab"},
    {"^[^]$", "a\n"},
    {"^(a|)+$", "ab"},
    {"^\\.\\*\\+\\?$", ".*+?a"},
    {"^\\(\\)\\[\\]$", "()[]"},
    {"^\\{\\}\\|\\^$", "{}|^"},
    {"^\\$\\\\\\/$", "$\\/a"},
    {"^[.*+?()\\[\\]{}|^$\\\\/]{2}$", ".*+?()[]{}|^$\\/a"},
    {"^(([a-c])(d|e)){1,2}$", "acde"},
    {"^[\\d\\W]$", "1a!_"},
    {"^[\\t\\n]\\v\\f\\r\\0$", "\t\n\v\f\r"},
};

std::string random_string(std::mt19937& rng, const std::string& alphabet, int max_len) {
  std::string s;
  for (int n = rng() % (max_len + 1); n > 0; --n) s += alphabet[rng() % alphabet.size()];
  return s;
}

TEST(JsonPattern, AgreesWithStdRegexOnEveryShortStringAndOnRandomOnes) {
  std::mt19937 rng(5);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.pattern);
    const auto p = JsonPattern::compile(c.pattern);
    // Wide characters: the char instantiation of std::regex would interpose on the one inside
    // libcpp-httplib, which the TSan build does not instrument (false races in server tests).
    auto wide = [](const std::string& t) { return std::wstring(t.begin(), t.end()); };
    const std::wregex ref(wide(c.pattern), std::regex::ECMAScript);
    std::string alphabet = c.alphabet;
    if (std::string(c.pattern).find('\\') != std::string::npos) alphabet += std::string(1, '\0');
    // Every string of up to 5 characters, then random ones up to 12.
    std::vector<std::string> texts = {""};
    for (size_t from = 0, len = 0; len < 5; ++len) {
      const size_t to = texts.size();
      for (size_t i = from; i < to; ++i)
        for (char a : alphabet) texts.push_back(texts[i] + a);
      from = to;
    }
    for (int i = 0; i < 3000; ++i) texts.push_back(random_string(rng, alphabet, 12));
    int yes = 0;
    for (const std::string& t : texts) {
      const bool want = std::regex_search(wide(t), ref);
      ASSERT_EQ(p->matches(t), want) << "'" << t << "'";
      yes += want;
    }
    EXPECT_GT(yes, 0);
    EXPECT_LT(yes, (int)texts.size());
  }
}

// The state after each character of a string, and the ranges can_step is asked about, agree
// with stepping each code point of the range alone.
TEST(JsonPattern, CanStepIsTheUnionOfSteps) {
  const auto p = JsonPattern::compile("^(\\d+|[\\u00e0-\\u00ff]x|\\u20ac|[^\\x00-\\uffff])$");
  const JsonPattern::State s0 = p->start();
  auto brute = [&](const JsonPattern::State& s, uint32_t lo, uint32_t hi) {
    for (uint32_t c = lo; c <= hi; ++c)
      if ((c < 0xD800 || c > 0xDFFF) && !p->step(s, c).empty()) return true;
    return false;
  };
  const std::pair<uint32_t, uint32_t> ranges[] = {
      {0, 0x7F}, {'0', '9'}, {'a', 'z'}, {0x80, 0xDF}, {0xE0, 0xE0}, {0x100, 0x7FF},
      {0x800, 0xFFFF}, {0x20AC, 0x20AC}, {0x20AD, 0xFFFF}, {0xD800, 0xDFFF}, {0x10000, 0x10FFFF}};
  const JsonPattern::State s1 = p->step(s0, 0xE9);
  for (const auto& [lo, hi] : ranges) {
    EXPECT_EQ(p->can_step(s0, lo, hi), brute(s0, lo, hi)) << lo << ".." << hi;
    EXPECT_EQ(p->can_step(s1, lo, hi), brute(s1, lo, hi)) << lo << ".." << hi;
  }
  EXPECT_TRUE(p->matches("\xc3\xa9x"));       // U+00E9 then x
  EXPECT_TRUE(p->matches("\xe2\x82\xac"));    // U+20AC
  EXPECT_TRUE(p->matches("\xf0\x9f\x98\x80"));  // U+1F600: beyond U+FFFF
  EXPECT_FALSE(p->matches("\xc3\xa9"));
  EXPECT_FALSE(p->matches("\xe2\x82"));  // not UTF-8
}

// Characters are code points (as with the u flag, or Python's re); \s, \w, \d and '.' as
// ECMA-262 defines them on non-ASCII text.
TEST(JsonPattern, ClassesFollowEcma262OnNonAsciiText) {
  auto m = [](const char* re, const char* s) { return JsonPattern::compile(re)->matches(s); };
  for (const char* space : {"\xc2\xa0", "\xe2\x80\xa8", "\xe3\x80\x80", "\xef\xbb\xbf", "\t"})
    EXPECT_TRUE(m("^\\s$", space)) << space;
  EXPECT_FALSE(m("^\\s$", "\xc2\x85"));  // NEL is not white space in ECMA-262
  EXPECT_FALSE(m("^\\w$", "\xc3\xa9"));  // \w is ASCII
  EXPECT_FALSE(m("^\\d$", "\xd9\xa3"));  // so is \d (ARABIC-INDIC DIGIT THREE)
  EXPECT_TRUE(m("^.$", "\xf0\x9f\x98\x80"));     // one character, not two code units
  EXPECT_FALSE(m("^.$", "\xe2\x80\xa9"));        // U+2029 ends a line
  EXPECT_TRUE(m("^[\xc3\xa0-\xc3\xbf]+$", "\xc3\xa9\xc3\xbc"));  // a range of UTF-8 characters
  EXPECT_TRUE(m("^\\ud83d\\ude00$", "\xf0\x9f\x98\x80"));  // an escaped pair is one character
  EXPECT_TRUE(m("^[^a]$", "\xf0\x9f\x98\x80"));
}

TEST(JsonPattern, FormatsAgreeWithTheirGrammars) {
  std::mt19937 rng(9);
  const std::vector<std::pair<std::string, std::vector<std::string>>> formats = {
      {"date", {"2024-02-29", "2023-02-28", "1999-12-31", "2000-02-29", "1900-04-30"}},
      {"time", {"23:59:59Z", "00:00:00.5+05:30", "12:34:56-23:59", "07:08:09z"}},
      {"date-time", {"2024-02-29T23:59:59Z", "1970-01-01t00:00:00.000+00:00"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-abcd-ef0123456789"}},
      {"ipv4", {"192.168.0.1", "0.0.0.0", "255.255.255.255", "10.1.20.200"}},
      {"email", {"a.b+c@example.com", "x_y%z@mail.sub.example.org", "q@a-b.cd"}},
      {"duration", {"P1Y2M3DT4H5M6S", "PT5S", "P3W", "P1M", "PT1H30M", "P12D", "P1YT2S"}},
      {"hostname", {"example.com", "localhost", "a-b.c-d.e1", "api.eu-west-1.amazonaws.com"}},
      {"ipv6",
       {"2001:db8::1", "::1", "::", "fe80::1:2", "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
        "1:2:3:4:5:6:7:8", "a::b:c:d", "ABCD:ef01::9"}},
  };
  // Mutations of valid values: digits, separators and letters swapped in, characters dropped or
  // doubled, so that both verdicts are common.
  const std::string swaps = "0123456789-:.T+Z@ax_%PYMWDHS";
  for (const auto& [f, valid] : formats) {
    SCOPED_TRACE(f);
    const auto p = JsonPattern::compile(JsonPattern::format_pattern(f));
    int yes = 0, no = 0;
    for (const std::string& v : valid) EXPECT_TRUE(p->matches(v)) << v;
    for (int i = 0; i < 20000; ++i) {
      std::string v = valid[rng() % valid.size()];
      for (int k = rng() % 3; k >= 0; --k) {
        const size_t at = rng() % v.size();
        switch (rng() % 4) {
          case 0: v[at] = swaps[rng() % swaps.size()]; break;
          case 1: v.erase(at, 1); break;
          case 2: v.insert(at, 1, v[at]); break;
          default: v[at] = (char)('0' + rng() % 10); break;
        }
        if (v.empty()) v = "0";
      }
      const bool got = p->matches(v);
      // The pattern may be stricter than the grammar (no leap second, at most four domain
      // labels of 22 characters, a host name's six, a duration's numbers of at most 6 digits,
      // at most three groups on either side of an ipv6 address's "::"): it must never accept
      // what the grammar refuses.
      if (got) {
        ASSERT_TRUE(test::format_valid(f, v)) << v;
      }
      size_t run = 0, longest = 0;  // the longest run of digits
      for (char c : v) longest = std::max(longest, run = c >= '0' && c <= '9' ? run + 1 : 0);
      size_t label = 0, longest_label = 0;  // a host name's longest label
      for (char c : v) longest_label = std::max(longest_label, label = c != '.' ? label + 1 : 0);
      const size_t dots = std::count(v.begin(), v.end(), '.');
      if (f != "time" && f != "date-time" && f != "email" && f != "ipv6" &&
          (f != "duration" || longest <= 6) &&
          (f != "hostname" || (dots <= 5 && longest_label <= 22))) {
        ASSERT_EQ(got, test::format_valid(f, v)) << v;
      }
      (got ? yes : no) += 1;
    }
    EXPECT_GT(yes, 200);
    EXPECT_GT(no, 200);
  }
  EXPECT_FALSE(JsonPattern::compile(JsonPattern::format_pattern("date"))->matches("2023-02-29"));
  EXPECT_FALSE(JsonPattern::compile(JsonPattern::format_pattern("date"))->matches("1900-02-29"));
  const auto duration = JsonPattern::compile(JsonPattern::format_pattern("duration"));
  EXPECT_TRUE(duration->matches("P999999Y999999M999999DT999999H999999M999999S"));
  EXPECT_FALSE(duration->matches("P1000000D"));  // 7 digits: the RFC's, not this subset's
  EXPECT_TRUE(test::format_valid("duration", "P1000000D"));
  for (const char* no : {"P", "PT", "P1Y2D", "PT1H2S", "P1DT", "P1W2D", "P1.5S", "PT1D", "1D"})
    EXPECT_FALSE(duration->matches(no) || test::format_valid("duration", no)) << no;
  // The subsets' edges: a host name of six labels, not seven; ipv6 with three groups on each
  // side of "::", not four (which RFC 4291 allows), and no IPv4 tail.
  const auto host = JsonPattern::compile(JsonPattern::format_pattern("hostname"));
  EXPECT_TRUE(host->matches("a.b.c.d.e.f"));
  EXPECT_FALSE(host->matches("a.b.c.d.e.f.g"));
  for (const char* no : {"-a.com", "a-.com", "a..com", "a.com.", "", "a_b.com"})
    EXPECT_FALSE(host->matches(no) || test::format_valid("hostname", no)) << no;
  const auto ip6 = JsonPattern::compile(JsonPattern::format_pattern("ipv6"));
  EXPECT_TRUE(ip6->matches("1:2:3::4:5:6"));
  EXPECT_FALSE(ip6->matches("1:2:3:4::5"));
  EXPECT_TRUE(test::format_valid("ipv6", "1:2:3:4::5"));
  EXPECT_FALSE(ip6->matches("::ffff:1.2.3.4"));
  for (const char* no : {"1:2:3:4:5:6:7", "1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", ":1", "g::"})
    EXPECT_FALSE(ip6->matches(no) || test::format_valid("ipv6", no)) << no;
  EXPECT_TRUE(JsonPattern::format_pattern("uri").empty());
}

TEST(JsonPattern, RefusesWhatItDoesNotSupportByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"(?=a)b", "lookaround"},
      {"(?i)a", "inline flags"},
      // The u flag's syntax: what Annex B would read as the character itself is refused, so
      // that no pattern means one thing here and another to its writer ({,3} is {0,3} to
      // Python's re, the text "{,3}" to Annex B).
      {"^a{,3}$", "does not form a quantifier"},
      {"^\\d{1,2$", "does not form a quantifier"},
      {"a{b", "does not form a quantifier"},
      {"a}", "a bare '}'"},
      {"a]", "a bare ']'"},
      {"\\-", "unknown escape \\-"},
      {"\\_", "unknown escape \\_"},
      {"\\\"", "unknown escape"},
      {"\\\xc3\xa9", "unknown escape"},
      {"(?<n>a)", "named groups"},
      {"(a)\\1", "backreferences"},
      {"\\bword", "word boundary"},
      {"a^b", "^ is supported only"},
      {"(^a)", "^ is supported only"},
      {"a$b", "$ is supported only"},
      {"\\p{L}", "Unicode property"},
      {"\\ud800", "lone surrogate"},
      {"\\q", "unknown escape"},
      {"a{3,2}", "n above m"},
      {"a{1001}", "repetition count"},
      {"a**", "nothing to repeat"},
      {"*a", "nothing to repeat"},
      {"(ab", "missing ')'"},
      {"ab)", "unmatched ')'"},
      {"[ab", "missing ']'"},
      {"[z-a]", "out of order"},
      {"[\\d-z]", "class escape"},
      {"^[]$", "matches no string"},
      {"^a{256}$", "more than 255"},
      {"((){1000}){1000}", "too large"},
      {"\xff", "not UTF-8"},
  };
  for (const auto& c : cases) {
    const std::string& re = c.first;
    const std::string& what = c.second;
    const std::string err = test::error_of([&] { JsonPattern::compile(re); });
    EXPECT_NE(err.find(what), std::string::npos) << re << ": " << err;
  }
  EXPECT_EQ(JsonPattern::compile("^a{255}$")->positions(), 256);  // the most that fit
  EXPECT_TRUE(JsonPattern::compile("^[]$", /*allow_empty=*/true)->matches_nothing());
  EXPECT_TRUE(JsonPattern::compile("^[\\-\\/]\\/$")->matches("-/"));  // '-' escaped in a class
}

}  // namespace
}  // namespace ct
