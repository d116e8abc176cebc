// QA F1 and ROUGE-L, written to agree with the Python references character for character: the
// Unicode details (str.lower(), \b, str.split()) are reproduced because evaluation answers do
// contain accented names, Cyrillic, CJK and typographic quotes.
#include "eval/metrics.h"

#include <locale.h>
#include <wctype.h>

#include <algorithm>
#include <array>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace ct {
namespace {

// ---- Unicode helpers ---------------------------------------------------------------------------

// UTF-8 -> code points. An invalid byte b becomes U+DC00+b (a lone surrogate, as Python's
// surrogateescape does): it has no case, is not whitespace and is not a word character.
std::u32string decode_utf8(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned b = p[i];
    int len = 0;
    char32_t cp = 0, min = 0;
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2, cp = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, cp = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, cp = b & 0x07, min = 0x10000;
    }
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      ok = (p[i + k] & 0xC0) == 0x80;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    ok = ok && cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp < 0xE000);
    if (ok) {
      out.push_back(cp);
      i += len;
    } else {
      out.push_back(0xDC00 + b);
      ++i;
    }
  }
  return out;
}

// glibc's C.UTF-8 ctype tables. glibc 2.36 and Python 3.11 both implement Unicode 14, and
// towlower_l then equals Python's single-character str.lower() for every code point except
// U+0130 (checked exhaustively when this was written). A locale_t object, not setlocale(), so
// the process locale is untouched and calls are thread-safe.
struct Utf8Ctype {
  locale_t loc = nullptr;
  wctype_t combining = 0;
  Utf8Ctype() {
    loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
    if (loc != nullptr) combining = wctype_l("combining", loc);
  }
};

const Utf8Ctype& ctype() {
  static const Utf8Ctype c;
  CT_THROW_IF_NOT(c.loc != nullptr && c.combining != 0,
                  "metrics: the C.UTF-8 locale (glibc) is not available; it provides the Unicode "
                  "case and character tables that qa_f1 needs (Debian: package libc-bin)");
  return c;
}

// Python's str.isspace() set, which str.split() splits on.
bool is_py_space(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Code points of general category No (other numbers: superscripts, fractions, circled digits,
// ancient numerals) that Python counts as alphanumeric but glibc does not put in alnum.
constexpr std::array<std::pair<char32_t, char32_t>, 71> kOtherNumbers = {{
    {0xB2, 0xB3},       {0xB9, 0xB9},       {0xBC, 0xBE},       {0x9F4, 0x9F9},
    {0xB72, 0xB77},     {0xBF0, 0xBF2},     {0xC78, 0xC7E},     {0xD58, 0xD5E},
    {0xD70, 0xD78},     {0xF2A, 0xF33},     {0x1369, 0x137C},   {0x17F0, 0x17F9},
    {0x19DA, 0x19DA},   {0x2070, 0x2070},   {0x2074, 0x2079},   {0x2080, 0x2089},
    {0x2150, 0x215F},   {0x2189, 0x2189},   {0x2460, 0x249B},   {0x24EA, 0x24FF},
    {0x2776, 0x2793},   {0x2CFD, 0x2CFD},   {0x3192, 0x3195},   {0x3220, 0x3229},
    {0x3248, 0x324F},   {0x3251, 0x325F},   {0x3280, 0x3289},   {0x32B1, 0x32BF},
    {0xA830, 0xA835},   {0x10107, 0x10133}, {0x10175, 0x10178}, {0x1018A, 0x1018B},
    {0x102E1, 0x102FB}, {0x10320, 0x10323}, {0x10858, 0x1085F}, {0x10879, 0x1087F},
    {0x108A7, 0x108AF}, {0x108FB, 0x108FF}, {0x10916, 0x1091B}, {0x109BC, 0x109BD},
    {0x109C0, 0x109CF}, {0x109D2, 0x109FF}, {0x10A40, 0x10A48}, {0x10A7D, 0x10A7E},
    {0x10A9D, 0x10A9F}, {0x10AEB, 0x10AEF}, {0x10B58, 0x10B5F}, {0x10B78, 0x10B7F},
    {0x10BA9, 0x10BAF}, {0x10CFA, 0x10CFF}, {0x10E60, 0x10E7E}, {0x10F1D, 0x10F26},
    {0x10F51, 0x10F54}, {0x10FC5, 0x10FCB}, {0x11052, 0x11065}, {0x111E1, 0x111F4},
    {0x1173A, 0x1173B}, {0x118EA, 0x118F2}, {0x11C5A, 0x11C6C}, {0x11FC0, 0x11FD4},
    {0x16B5B, 0x16B61}, {0x16E80, 0x16E96}, {0x1D2E0, 0x1D2F3}, {0x1D360, 0x1D378},
    {0x1E8C7, 0x1E8CF}, {0x1EC71, 0x1ECAB}, {0x1ECAD, 0x1ECAF}, {0x1ECB1, 0x1ECB4},
    {0x1ED01, 0x1ED2D}, {0x1ED2F, 0x1ED3D}, {0x1F100, 0x1F10C},
}};

// Python's regex word character (\w on str: str.isalnum() or '_'), which decides \b. glibc's
// alnum agrees once combining marks (alnum in glibc, category M in Python), the circled Latin
// letters U+24B6..U+24E9 (So in Python) and kOtherNumbers are corrected for; with glibc 2.36
// this matched Python 3.11 on every code point.
bool is_word(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  if (c >= 0x24B6 && c <= 0x24E9) return false;
  const auto it = std::upper_bound(kOtherNumbers.begin(), kOtherNumbers.end(), c,
                                   [](char32_t v, const auto& r) { return v < r.first; });
  if (it != kOtherNumbers.begin() && c <= std::prev(it)->second) return true;
  const Utf8Ctype& ct = ctype();
  return iswalnum_l(c, ct.loc) && !iswctype_l(c, ct.combining, ct.loc);
}

bool is_cased(char32_t c, locale_t loc) {
  return iswupper_l(c, loc) || iswlower_l(c, loc) || towlower_l(c, loc) != static_cast<wint_t>(c) ||
         towupper_l(c, loc) != static_cast<wint_t>(c);
}

// Unicode Case_Ignorable, approximated: combining marks, format characters, modifier letters
// and symbols, and the apostrophes/dots that may sit inside a word. Only used for final sigma.
bool is_case_ignorable(char32_t c, const Utf8Ctype& ct) {
  switch (c) {
    case '\'':
    case '.':
    case ':':
    case '^':
    case '`':
    case 0xA8:
    case 0xAD:
    case 0xAF:
    case 0xB4:
    case 0xB7:
    case 0xB8:
    case 0x2018:
    case 0x2019:
    case 0x2024:
    case 0x2027:
    case 0xFEFF:
      return true;
    default:
      break;
  }
  return (c >= 0x2B0 && c <= 0x2FF) || (c >= 0x200B && c <= 0x200F) ||
         (c >= 0x202A && c <= 0x202E) || (c >= 0x2060 && c <= 0x2064) ||
         iswctype_l(c, ct.combining, ct.loc);
}

// Python's str.lower(): the simple mapping, plus the two context rules Python applies: U+0130
// becomes "i" + U+0307, and capital sigma becomes final sigma at the end of a word.
std::u32string py_lower(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  bool have_ctype = false;
  const Utf8Ctype* ct = nullptr;
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
      continue;
    }
    if (!have_ctype) {
      ct = &ctype();
      have_ctype = true;
    }
    if (c == 0x130) {
      out.push_back('i');
      out.push_back(0x307);
    } else if (c == 0x3A3) {
      // Final when preceded by a cased letter and not followed by one (skipping case-ignorables).
      size_t j = i;
      while (j > 0 && is_case_ignorable(s[j - 1], *ct)) --j;
      bool final_sigma = j > 0 && is_cased(s[j - 1], ct->loc);
      if (final_sigma) {
        size_t k = i + 1;
        while (k < s.size() && is_case_ignorable(s[k], *ct)) ++k;
        final_sigma = k == s.size() || !is_cased(s[k], ct->loc);
      }
      out.push_back(final_sigma ? 0x3C2 : 0x3C3);
    } else if (c >= 0xD800 && c < 0xE000) {
      out.push_back(c);
    } else {
      out.push_back(static_cast<char32_t>(towlower_l(c, ct->loc)));
    }
  }
  return out;
}

// ---- QA F1 -------------------------------------------------------------------------------------

bool is_ascii_punct(char32_t c) {
  return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
         (c >= 0x7B && c <= 0x7E);
}

// normalize_answer(s).split() of the LongBench/SQuAD scripts.
std::vector<std::u32string> qa_tokens(const std::string& text) {
  std::u32string s = py_lower(decode_utf8(text));
  std::erase_if(s, is_ascii_punct);
  // re.sub(r"\b(a|an|the)\b", " ", s): a match is exactly a maximal run of word characters equal
  // to an article; it becomes one space.
  std::u32string t;
  t.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (!is_word(s[i])) {
      t.push_back(s[i++]);
      continue;
    }
    size_t j = i;
    while (j < s.size() && is_word(s[j])) ++j;
    const std::u32string_view run(s.data() + i, j - i);
    if (run == U"a" || run == U"an" || run == U"the") {
      t.push_back(' ');
    } else {
      t.append(run);
    }
    i = j;
  }
  std::vector<std::u32string> tokens;
  for (size_t i = 0; i < t.size();) {
    while (i < t.size() && is_py_space(t[i])) ++i;
    size_t j = i;
    while (j < t.size() && !is_py_space(t[j])) ++j;
    if (j > i) tokens.emplace_back(t, i, j - i);
    i = j;
  }
  return tokens;
}

// ---- ROUGE-L -----------------------------------------------------------------------------------

// rouge-score's default tokenizer: lower-case, every character outside [a-z0-9] separates. Only
// ASCII letters and digits survive, so UTF-8 can be scanned bytewise; the two non-ASCII code
// points whose Python lower-case contains one are U+0130 -> "i" U+0307 and U+212A -> "k".
std::vector<std::string> rouge_tokens(const std::string& text) {
  std::vector<std::string> tokens;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) tokens.push_back(std::move(cur));
    cur.clear();
  };
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const unsigned char b = p[i];
    if ((b >= 'a' && b <= 'z') || (b >= '0' && b <= '9')) {
      cur.push_back(static_cast<char>(b));
    } else if (b >= 'A' && b <= 'Z') {
      cur.push_back(static_cast<char>(b + 32));
    } else if (b == 0xC4 && i + 1 < n && p[i + 1] == 0xB0) {  // U+0130
      cur.push_back('i');
      flush();  // the U+0307 that follows is a separator
      ++i;
    } else if (b == 0xE2 && i + 2 < n && p[i + 1] == 0x84 && p[i + 2] == 0xAA) {  // U+212A
      cur.push_back('k');
      i += 2;
    } else {
      flush();
    }
  }
  flush();
  return tokens;
}

// Length of the longest common subsequence, two-row dynamic programme over token ids.
int lcs_length(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
  for (int x : a) {
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = x == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

double qa_f1(const std::string& prediction, const std::string& gold) {
  const std::vector<std::u32string> pred = qa_tokens(prediction);
  const std::vector<std::u32string> ref = qa_tokens(gold);
  std::unordered_map<std::u32string, int> count;
  for (const auto& t : ref) ++count[t];
  int n_same = 0;
  for (const auto& t : pred) {
    auto it = count.find(t);
    if (it != count.end() && it->second > 0) {
      --it->second;
      ++n_same;
    }
  }
  if (n_same == 0) return 0.0;
  // Same operation order as the Python reference, so results agree to the last bit.
  const double precision = 1.0 * n_same / static_cast<double>(pred.size());
  const double recall = 1.0 * n_same / static_cast<double>(ref.size());
  return (2 * precision * recall) / (precision + recall);
}

double qa_f1_max(const std::string& prediction, const std::vector<std::string>& golds) {
  double best = 0.0;
  for (const auto& g : golds) best = std::max(best, qa_f1(prediction, g));
  return best;
}

double rouge_l_f(const std::string& prediction, const std::string& reference) {
  const std::vector<std::string> pred = rouge_tokens(prediction);
  const std::vector<std::string> ref = rouge_tokens(reference);
  if (pred.empty() || ref.empty()) return 0.0;
  std::unordered_map<std::string, int> id;
  auto ids = [&](const std::vector<std::string>& toks) {
    std::vector<int> out;
    out.reserve(toks.size());
    for (const auto& t : toks)
      out.push_back(id.emplace(t, static_cast<int>(id.size())).first->second);
    return out;
  };
  const std::vector<int> ref_ids = ids(ref);
  const std::vector<int> pred_ids = ids(pred);
  const int lcs = lcs_length(ref_ids, pred_ids);
  const double precision = static_cast<double>(lcs) / static_cast<double>(pred.size());
  const double recall = static_cast<double>(lcs) / static_cast<double>(ref.size());
  if (precision + recall <= 0.0) return 0.0;
  return 2 * precision * recall / (precision + recall);
}

double rouge_l_f_max(const std::string& prediction, const std::vector<std::string>& references) {
  double best = 0.0;
  for (const auto& r : references) best = std::max(best, rouge_l_f(prediction, r));
  return best;
}

}  // namespace ct
