// JSON Schema patterns as position automata (json_pattern.h): a recursive-descent parser of the
// ECMA-262 subset into a small expression tree, and its Glushkov construction, in which every
// character class occurrence is a position and a state is the set of positions the text so far
// may end at.
#include "model/json_pattern.h"

#include <algorithm>
#include <bit>

#include "core/error.h"

namespace ct {

using Range = JsonPattern::Range;
using State = JsonPattern::State;

namespace {

using Class = std::vector<Range>;
constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr uint32_t kInf = UINT32_MAX;

Class normalized(Class c) {
  std::sort(c.begin(), c.end());
  Class out;
  for (const Range& r : c) {
    if (!out.empty() && r.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

Class complement(const Class& c) {
  Class out;
  uint32_t next = 0;
  for (const Range& r : normalized(c)) {
    if (r.first > next) out.push_back({next, r.first - 1});
    next = r.second + 1;
  }
  if (next <= kMaxCp) out.push_back({next, kMaxCp});
  return out;
}

// Surrogate code points are not characters: no JSON text writes one alone.
Class without_surrogates(const Class& c) {
  Class out;
  for (const Range& r : normalized(c)) {
    if (r.first < 0xD800) out.push_back({r.first, std::min<uint32_t>(r.second, 0xD7FF)});
    if (r.second > 0xDFFF) out.push_back({std::max<uint32_t>(r.first, 0xE000), r.second});
  }
  return out;
}

const Class kDigit = {{'0', '9'}};
const Class kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMA-262's WhiteSpace and LineTerminator (\s).
const Class kSpace = {{9, 13},         {32, 32},         {0xA0, 0xA0},     {0x1680, 0x1680},
                      {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                      {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Class kAny = {{0, kMaxCp}};
// '.': anything but a line terminator.
const Class& dot_class() {
  static const Class c = complement({{10, 10}, {13, 13}, {0x2028, 0x2029}});
  return c;
}

bool is_hex(uint32_t c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }
uint32_t hex_value(uint32_t c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }
bool is_digit(uint32_t c) { return c >= '0' && c <= '9'; }

// Decodes UTF-8 (RFC 3629) into code points; false for anything else.
bool decode_utf8(std::string_view s, std::vector<uint32_t>& out) {
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = (uint8_t)s[i];
    int n = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) {
      cp = c;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1, cp = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    for (int k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const uint8_t d = (uint8_t)s[i + k];
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (cp < min || cp > kMaxCp || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    out.push_back(cp);
    i += n + 1;
  }
  return true;
}

// At most 80 bytes of s for a message, cut where a UTF-8 character begins.
std::string shorten(std::string_view s) {
  if (s.size() <= 80) return std::string(s);
  size_t n = 80;
  while (n > 0 && ((uint8_t)s[n] & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "...";
}

// The parsed pattern. A repeated part is one node that the builder walks once per copy.
struct Re {
  enum Kind { kEmpty, kChar, kCat, kAlt, kRepeat };
  Kind kind = kEmpty;
  Class cls;              // kChar
  std::vector<Re> kids;   // kCat, kAlt; kRepeat: one
  uint32_t min = 0, max = 0;  // kRepeat (max kInf: unbounded)
};

Re char_node(Class c) {
  Re r;
  r.kind = Re::kChar;
  r.cls = std::move(c);
  return r;
}
Re repeat_node(Re kid, uint32_t min, uint32_t max) {
  Re r;
  r.kind = Re::kRepeat;
  r.min = min;
  r.max = max;
  r.kids.push_back(std::move(kid));
  return r;
}

class Parser {
 public:
  explicit Parser(std::string_view src) : src_(src) {
    if (src.size() > JsonPattern::kMaxSource)
      CT_THROW("pattern '{}': longer than {} bytes", shorten(src), JsonPattern::kMaxSource);
    if (!decode_utf8(src, cps_)) CT_THROW("pattern '{}': not UTF-8", shorten(src));
  }

  Re parse() {
    Re top = disjunction(0);
    if (more()) fail("unmatched ')'");
    return top;
  }

 private:
  static constexpr int kMaxGroups = 64;  // nesting of ( )

  struct Escape {
    Class cls;
    bool single = false;  // one character (may bound a range in a class)
  };

  [[noreturn]] void fail(const std::string& what) const {
    CT_THROW("pattern '{}': {} (at character {})", shorten(src_), what, i_);
  }
  bool more() const { return i_ < cps_.size(); }
  uint32_t peek(size_t ahead = 0) const { return i_ + ahead < cps_.size() ? cps_[i_ + ahead] : 0; }
  uint32_t next() { return cps_[i_++]; }

  Re disjunction(int depth) {
    Re alt;
    alt.kind = Re::kAlt;
    alt.kids.push_back(alternative(depth));
    while (more() && peek() == '|') {
      ++i_;
      alt.kids.push_back(alternative(depth));
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  // Terms up to '|' or ')'. At the top level ^ may open it and $ close it; without them the
  // search semantics put [\s\S]* before and after.
  Re alternative(int depth) {
    Re cat;
    cat.kind = Re::kCat;
    const size_t begin = i_;
    bool head = false, tail = false;
    while (more() && peek() != '|' && peek() != ')') {
      if (tail) fail("$ is supported only at the end of the pattern or of a top-level alternative");
      const uint32_t c = peek();
      if (c == '^' || c == '$') {
        if (depth > 0 || (c == '^' && i_ != begin))
          fail(std::string(1, (char)c) +
               " is supported only at the start (^) or end ($) of the pattern or of a "
               "top-level alternative");
        ++i_;
        (c == '^' ? head : tail) = true;
        uint32_t lo = 0, hi = 0;
        if (quantifier(lo, hi)) fail("a quantifier after an anchor");
        continue;
      }
      Re a = atom(depth);
      uint32_t lo = 0, hi = 0;
      if (quantifier(lo, hi)) {
        uint32_t lo2 = 0, hi2 = 0;
        if (quantifier(lo2, hi2)) fail("nothing to repeat (a quantifier after a quantifier)");
        a = repeat_node(std::move(a), lo, hi);
      }
      cat.kids.push_back(std::move(a));
    }
    if (depth == 0) {
      if (!head) cat.kids.insert(cat.kids.begin(), repeat_node(char_node(kAny), 0, kInf));
      if (!tail) cat.kids.push_back(repeat_node(char_node(kAny), 0, kInf));
    }
    return cat;
  }

  // *, +, ?, {n}, {n,}, {n,m}, each optionally lazy (the same strings match); false (nothing
  // read) for anything else. A '{' that does not form one is refused, as with the u flag
  // (without it, Annex B reads it as itself; Python users write {,n} for {0,n}).
  bool quantifier(uint32_t& lo, uint32_t& hi) {
    if (!more()) return false;
    const uint32_t c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++i_;
      lo = c == '+' ? 1 : 0;
      hi = c == '?' ? 1 : kInf;
    } else if (c == '{') {
      size_t j = i_ + 1;
      auto number = [&](uint32_t& v) {
        const size_t at = j;
        uint64_t x = 0;
        while (j < cps_.size() && is_digit(cps_[j])) x = std::min<uint64_t>(x * 10 + (cps_[j++] - '0'), 1u << 31);
        v = (uint32_t)x;
        return j > at;
      };
      const char* form = "'{' that does not form a quantifier {n}, {n,} or {n,m} (\\{ is the character)";
      if (!number(lo)) fail(form);
      hi = lo;
      if (j < cps_.size() && cps_[j] == ',') {
        ++j;
        if (!number(hi)) hi = kInf;
      }
      if (j >= cps_.size() || cps_[j] != '}') fail(form);
      i_ = j + 1;
      if (hi != kInf && lo > hi) fail("{n,m} with n above m");
      if (lo > JsonPattern::kMaxRepeat || (hi != kInf && hi > JsonPattern::kMaxRepeat))
        fail("a repetition count above " + std::to_string(JsonPattern::kMaxRepeat));
    } else {
      return false;
    }
    if (more() && peek() == '?') ++i_;
    return true;
  }

  Re atom(int depth) {
    const uint32_t c = next();
    switch (c) {
      case '.':
        return char_node(dot_class());
      case '(': {
        if (peek() == '?') {
          if (peek(1) != ':')
            fail("groups (? other than (?: are not supported (lookaround, named groups, inline "
                 "flags)");
          i_ += 2;
        }
        if (depth + 1 > kMaxGroups) fail("groups nested more than 64 deep");
        Re r = disjunction(depth + 1);
        if (!more() || next() != ')') fail("missing ')'");
        return r;
      }
      case '[':
        return char_node(klass());
      case '\\':
        return char_node(escape(false).cls);
      case '*':
      case '+':
      case '?':
        --i_;
        fail("nothing to repeat");
      case '{': {
        --i_;
        uint32_t lo = 0, hi = 0;
        quantifier(lo, hi);  // refuses a '{' that forms none
        fail("nothing to repeat");
      }
      case '}':
      case ']':
        --i_;
        fail(std::string("a bare '") + (char)c + "' (\\" + (char)c + " is the character)");
      default:
        return char_node({{c, c}});
    }
  }

  Escape escape(bool in_class) {
    if (!more()) fail("'\\' at the end");
    const uint32_t c = next();
    auto one = [](uint32_t v) { return Escape{{{v, v}}, true}; };
    switch (c) {
      case 'd': return {kDigit};
      case 'D': return {complement(kDigit)};
      case 'w': return {kWord};
      case 'W': return {complement(kWord)};
      case 's': return {kSpace};
      case 'S': return {complement(kSpace)};
      case 't': return one(9);
      case 'n': return one(10);
      case 'v': return one(11);
      case 'f': return one(12);
      case 'r': return one(13);
      case '0':
        if (is_digit(peek())) fail("octal escapes are not supported");
        return one(0);
      case 'b':
        if (in_class) return one(8);
        fail("\\b (a word boundary) is not supported");
      case 'B':
        fail("\\B (a word boundary) is not supported");
      case 'c': {
        const uint32_t l = peek() | 0x20;
        if (!more() || l < 'a' || l > 'z') fail("\\c must be followed by a letter");
        return one(next() % 32);
      }
      case 'x': {
        if (!is_hex(peek()) || !is_hex(peek(1))) fail("\\x must be followed by two hex digits");
        const uint32_t v = hex_value(next()) * 16;
        return one(v + hex_value(next()));
      }
      case 'u': {
        uint32_t v = hex4();
        if (v >= 0xD800 && v <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
          const size_t at = i_;
          i_ += 2;
          const uint32_t lo = hex4();
          if (lo >= 0xDC00 && lo <= 0xDFFF) return one(0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00));
          i_ = at;
        }
        if (v >= 0xD800 && v <= 0xDFFF) fail("a lone surrogate \\u escape");
        return one(v);
      }
      case 'k':
        fail("named backreferences are not supported");
      case 'p':
      case 'P':
        fail("\\p{...} Unicode property classes are not supported");
      default: {
        if (is_digit(c)) fail("backreferences are not supported");
        // As with the u flag: a syntax character, '/', or in a class '-', is itself; any other
        // escape is refused (without the flag Annex B reads \a as a, \_ as _).
        const std::u32string_view syntax = U"^$\\.*+?()[]{}|/";
        if (syntax.find((char32_t)c) != std::u32string_view::npos || (in_class && c == '-'))
          return one(c);
        --i_;
        fail(c < 0x80 ? std::string("unknown escape \\") + (char)c : "unknown escape");
      }
    }
  }

  uint32_t hex4() {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      if (!is_hex(peek())) fail("\\u must be followed by four hex digits");
      v = v * 16 + hex_value(next());
    }
    return v;
  }

  Class klass() {
    bool negate = false;
    if (more() && peek() == '^') {
      negate = true;
      ++i_;
    }
    Class out;
    for (;;) {
      if (!more()) fail("missing ']'");
      if (peek() == ']') {
        ++i_;
        break;
      }
      const Escape a = class_atom();
      if (peek() == '-' && i_ + 1 < cps_.size() && cps_[i_ + 1] != ']') {
        ++i_;
        const Escape b = class_atom();
        if (!a.single || !b.single)
          fail("a range bounded by a class escape such as \\d is not supported");
        if (a.cls[0].first > b.cls[0].first) fail("a class range out of order");
        out.push_back({a.cls[0].first, b.cls[0].first});
        continue;
      }
      out.insert(out.end(), a.cls.begin(), a.cls.end());
    }
    out = normalized(out);
    return negate ? complement(out) : out;
  }

  Escape class_atom() {
    const uint32_t c = next();
    if (c == '\\') return escape(true);
    return Escape{{{c, c}}, true};
  }

  std::string_view src_;
  std::vector<uint32_t> cps_;
  size_t i_ = 0;
};

bool any_bit(const State& s) {
  for (uint64_t w : s.w)
    if (w) return true;
  return false;
}
State operator&(const State& a, const State& b) {
  State r;
  for (size_t k = 0; k < std::size(r.w); ++k) r.w[k] = a.w[k] & b.w[k];
  return r;
}
State& operator|=(State& a, const State& b) {
  for (size_t k = 0; k < std::size(a.w); ++k) a.w[k] |= b.w[k];
  return a;
}
State operator|(State a, const State& b) { return a |= b; }
State bit(int p) {
  State s;
  s.w[p / 64] = uint64_t(1) << (p % 64);
  return s;
}
bool has(const State& s, int p) { return (s.w[p / 64] >> (p % 64)) & 1; }
template <class F>
void for_each_bit(const State& s, F f) {
  for (size_t k = 0; k < std::size(s.w); ++k)
    for (uint64_t w = s.w[k]; w; w &= w - 1) f((int)(k * 64 + std::countr_zero(w)));
}

}  // namespace

bool JsonPattern::State::empty() const { return !any_bit(*this); }

// The Glushkov construction: walk() gives each character of the tree (each copy of a repeated
// part) a position and returns the fragment's first and last positions and whether it matches
// the empty string, linking last to first where one fragment follows another.
class JsonPatternBuilder {
 public:
  JsonPatternBuilder(JsonPattern& p, std::string_view src) : p_(p), src_(src) {}

  void build(const Re& top, bool allow_empty) {
    classes_.emplace_back();  // position 0: the start
    p_.follow_.emplace_back();
    const Frag f = walk(top);
    p_.follow_[0] = f.first;
    State accept = f.last;
    if (f.nullable) accept |= bit(0);
    p_.n_pos_ = (int)classes_.size();
    // The intervals between every class bound, and the positions each lies in.
    std::vector<uint32_t> cuts = {0, kMaxCp + 1};
    for (const Class& c : classes_)
      for (const Range& r : c) {
        cuts.push_back(r.first);
        cuts.push_back(r.second + 1);
      }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    cuts.pop_back();  // kMaxCp + 1 ends the last interval
    p_.cuts_ = cuts;
    p_.on_.assign(cuts.size(), State{});
    State enterable;
    for (int q = 1; q < p_.n_pos_; ++q) {
      for (const Range& r : classes_[q]) {
        const size_t a = std::lower_bound(cuts.begin(), cuts.end(), r.first) - cuts.begin();
        for (size_t i = a; i < cuts.size() && cuts[i] <= r.second; ++i) p_.on_[i] |= bit(q);
      }
      if (!classes_[q].empty()) enterable |= bit(q);
    }
    // Live positions: from them a match can be completed (accepting, or followed by a live one).
    State live = accept & (enterable | bit(0));
    for (bool changed = true; changed;) {
      changed = false;
      for (int q = 0; q < p_.n_pos_; ++q) {
        if (has(live, q) || !(q == 0 || has(enterable, q))) continue;
        if (any_bit(p_.follow_[q] & live)) {
          live |= bit(q);
          changed = true;
        }
      }
    }
    if (!has(live, 0) && !allow_empty) CT_THROW("pattern '{}': it matches no string", shorten(src_));
    for (State& f2 : p_.follow_) f2 = f2 & live;
    p_.accept_ = accept & live;
    p_.start_ = has(live, 0) ? bit(0) : State{};
  }

 private:
  struct Frag {
    bool nullable = true;
    State first, last;
  };

  void link(const State& from, const State& to) {
    for_each_bit(from, [&](int q) { p_.follow_[q] |= to; });
  }
  Frag cat(const Frag& a, const Frag& b) {
    link(a.last, b.first);
    Frag f{a.nullable && b.nullable, a.first, b.last};
    if (a.nullable) f.first |= b.first;
    if (b.nullable) f.last |= a.last;
    return f;
  }

  Frag walk(const Re& r) {
    if (++walks_ > 100000) CT_THROW("pattern '{}': too large once its repetitions are expanded", shorten(src_));
    switch (r.kind) {
      case Re::kEmpty:
        return Frag{};
      case Re::kChar: {
        if ((int)classes_.size() >= JsonPattern::kMaxPositions)
          CT_THROW("pattern '{}': more than {} characters and classes once its repetitions are "
                   "expanded (with the implicit [\\s\\S]* of an unanchored start and end)",
                   shorten(src_), JsonPattern::kMaxPositions - 1);
        const int q = (int)classes_.size();
        classes_.push_back(without_surrogates(r.cls));
        p_.follow_.emplace_back();
        return Frag{false, bit(q), bit(q)};
      }
      case Re::kCat: {
        Frag f;
        for (const Re& k : r.kids) f = cat(f, walk(k));
        return f;
      }
      case Re::kAlt: {
        Frag f{false, {}, {}};
        for (const Re& k : r.kids) {
          const Frag g = walk(k);
          f.nullable = f.nullable || g.nullable;
          f.first |= g.first;
          f.last |= g.last;
        }
        return f;
      }
      case Re::kRepeat: {
        Frag f;
        for (uint32_t i = 0; i < r.min; ++i) f = cat(f, walk(r.kids[0]));
        if (r.max == kInf) {
          Frag g = walk(r.kids[0]);
          link(g.last, g.first);
          g.nullable = true;
          f = cat(f, g);
        } else {
          for (uint32_t i = r.min; i < r.max; ++i) {
            Frag g = walk(r.kids[0]);
            g.nullable = true;
            f = cat(f, g);
          }
        }
        return f;
      }
    }
    return Frag{};
  }

  JsonPattern& p_;
  std::string_view src_;
  std::vector<Class> classes_;
  size_t walks_ = 0;
};

std::shared_ptr<const JsonPattern> JsonPattern::compile(std::string_view pattern, bool allow_empty) {
  const Re top = Parser(pattern).parse();
  auto p = std::make_shared<JsonPattern>();
  JsonPatternBuilder(*p, pattern).build(top, allow_empty);
  return p;
}

State JsonPattern::follow_of(const State& s) const {
  State f;
  for_each_bit(s, [&](int q) { f |= follow_[q]; });
  return f;
}

State JsonPattern::step(const State& s, uint32_t cp) const {
  const size_t i = std::upper_bound(cuts_.begin(), cuts_.end(), cp) - cuts_.begin() - 1;
  return follow_of(s) & on_[i];
}

bool JsonPattern::range_step(const State& s, uint32_t lo, uint32_t hi, State* out) const {
  const State f = follow_of(s);
  if (f.empty()) return false;
  // No class holds a surrogate, so an interval holding one enters no position: the range is
  // scanned whole, without splitting it around them (this runs in the mask's trie walk).
  bool any = false;
  size_t i = std::upper_bound(cuts_.begin(), cuts_.end(), lo) - cuts_.begin() - 1;
  for (; i < cuts_.size() && cuts_[i] <= std::min(hi, kMaxCp); ++i) {
    const State g = f & on_[i];
    if (!any_bit(g)) continue;
    if (out == nullptr) return true;  // whether, not where: the first will do
    *out |= g;
    any = true;
  }
  return any;
}

bool JsonPattern::can_step(const State& s, uint32_t lo, uint32_t hi) const {
  return range_step(s, lo, hi, nullptr);
}

State JsonPattern::step_range(const State& s, uint32_t lo, uint32_t hi) const {
  State out;
  range_step(s, lo, hi, &out);
  return out;
}

std::vector<State> JsonPattern::completions(int n) const {
  std::vector<State> r(n + 1);
  r[0] = accept_;
  for (int k = 1; k <= n; ++k)
    for (int p = 0; p < n_pos_; ++p)
      if (any_bit(follow_[p] & r[k - 1])) r[k].w[p / 64] |= uint64_t(1) << (p % 64);
  return r;
}

bool JsonPattern::accepts(const State& s) const { return any_bit(s & accept_); }

bool JsonPattern::matches(std::string_view utf8) const {
  std::vector<uint32_t> cps;
  if (!decode_utf8(utf8, cps)) return false;
  State s = start_;
  for (uint32_t cp : cps) {
    s = step(s, cp);
    if (s.empty()) return false;
  }
  return accepts(s);
}

std::string JsonPattern::format_pattern(std::string_view format) {
  // RFC 3339 full-date, with each month's days and February's 29th in leap years only.
  static const std::string kDate =
      "([0-9]{4}-(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])"
      "|[0-9]{4}-(0[469]|11)-(0[1-9]|[12][0-9]|30)"
      "|[0-9]{4}-02-(0[1-9]|1[0-9]|2[0-8])"
      "|([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)";
  // RFC 3339 full-time (no leap second 60: a stricter reader refuses it).
  static const std::string kTime =
      "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
  static const std::string kOctet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
  static const std::string kLabel = "[A-Za-z0-9]([A-Za-z0-9-]{0,20}[A-Za-z0-9])?";
  if (format == "date") return "^" + kDate + "$";
  if (format == "time") return "^" + kTime + "$";
  if (format == "date-time") return "^" + kDate + "[Tt]" + kTime + "$";
  if (format == "uuid")
    return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
  if (format == "ipv4") return "^(" + kOctet + "\\.){3}" + kOctet + "$";
  // RFC 3339 (Appendix A) duration: P, then a date part (days; months and days; years, months
  // and days) with an optional time part, a time part alone, or weeks; whole numbers of at most
  // 6 digits each (the RFC has no bound: a model that wants "P8H" would otherwise write zeros
  // after "P8" for ever; 999,999 years is still a Python timedelta).
  if (format == "duration") {
    const std::string n = "[0-9]{1,6}";
    const std::string time =
        "T(" + n + "H(" + n + "M(" + n + "S)?)?|" + n + "M(" + n + "S)?|" + n + "S)";
    return "^P((" + n + "D|" + n + "M(" + n + "D)?|" + n + "Y(" + n + "M(" + n + "D)?)?)(" + time +
           ")?|" + time + "|" + n + "W)$";
  }
  // RFC 1123 host names: one to six labels (a subset: RFC 1035 allows up to 127 labels of up
  // to 63 characters; these are 22 at most, as the email domain's), no trailing dot.
  if (format == "hostname") return "^" + kLabel + "(\\." + kLabel + "){0,5}$";
  // RFC 4291 text forms (a subset): all eight groups, or "::" with at most three groups on each
  // side of it (the one or more zero groups it stands for then always exist); no IPv4 tail.
  if (format == "ipv6") {
    const std::string h = "[0-9a-fA-F]{1,4}";
    const std::string side = "(" + h + "(:" + h + "){0,2})?";
    return "^(" + h + "(:" + h + "){7}|" + side + "::" + side + ")$";
  }
  // A dot-atom local part at a domain of two to four labels (a subset of RFC 5321's addresses).
  if (format == "email")
    return "^[A-Za-z0-9_%+-]+(\\.[A-Za-z0-9_%+-]+){0,3}@" + kLabel + "(\\." + kLabel + "){1,3}$";
  return {};
}

}  // namespace ct
