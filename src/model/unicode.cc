// UTF-8 decoding, code point classes and the pre-tokenizers, written to split text exactly as
// llama.cpp's pre-tokenizers do for the pre types the tokenizer accepts (see unicode.h).
#include "model/unicode.h"

#include <algorithm>
#include <array>

namespace ct::unicode {

namespace {

CpClass cp_class_search(uint32_t cp) {
  const CpRange* end = kCpRanges + kNumCpRanges;
  const CpRange* it = std::upper_bound(kCpRanges, end, cp,
                                       [](uint32_t v, const CpRange& r) { return v < r.first; });
  if (it == kCpRanges) return CpClass::kOther;
  --it;
  return cp <= it->last ? it->cls : CpClass::kOther;
}

// Latin-1 is most of the text the engine sees, so it skips the binary search.
const std::array<CpClass, 256>& latin1_classes() {
  static const std::array<CpClass, 256> table = [] {
    std::array<CpClass, 256> t{};
    for (uint32_t cp = 0; cp < 256; ++cp) t[cp] = cp_class_search(cp);
    return t;
  }();
  return table;
}

bool is_cont(uint8_t b) { return (b & 0xC0) == 0x80; }

struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 0x144> from_unicode;  // every image is below U+0144
};

const ByteMap& byte_map() {
  static const ByteMap map = [] {
    ByteMap m;
    m.from_unicode.fill(-1);
    auto self_mapped = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = self_mapped(b) ? (uint32_t)b : next++;
      utf8_append(&m.to_unicode[b], cp);
      m.from_unicode[cp] = (int16_t)b;
    }
    return m;
  }();
  return map;
}

// Splits code points [s, e) with the GPT-2 regex. The alternatives are tried in the regex's order
// at every position; a match never extends past e, which is how llama.cpp confines the second
// regex of a sequence to the pieces of the first.
void split_gpt2(const std::vector<uint32_t>& cps, const std::vector<CpClass>& cls,
                const std::vector<size_t>& offs, size_t s, size_t e, std::vector<Piece>* pieces) {
  size_t pos = s;
  auto emit = [&](size_t end) {
    pieces->push_back({offs[pos], offs[end]});
    pos = end;
  };
  while (pos < e) {
    const uint32_t c = cps[pos];
    // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive, as in the GPT-2 pattern)
    if (c == '\'' && pos + 1 < e) {
      const uint32_t c1 = cps[pos + 1];
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        emit(pos + 2);
        continue;
      }
      if (pos + 2 < e) {
        const uint32_t c2 = cps[pos + 2];
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          emit(pos + 3);
          continue;
        }
      }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional leading space joins the run of
    // the class that follows it.
    const size_t head = (c == ' ' && pos + 1 < e) ? pos + 1 : pos;
    const CpClass run_cls = cls[head];
    if (run_cls != CpClass::kSpace) {
      size_t end = head + 1;
      while (end < e && cls[end] == run_cls) ++end;
      emit(end);
      continue;
    }
    // '\s+(?!\S)' then '\s+': a whitespace run followed by a non-space gives its last character to
    // the next piece (so " word" keeps its space), unless the run is a single character.
    size_t end = pos;
    while (end < e && cls[end] == CpClass::kSpace) ++end;
    if (end - pos > 1 && end < e) --end;
    emit(end);
  }
}

// Splits code points [s, e) with the Llama 3 regex, or Qwen2's when max_digits is 1 (the two
// differ only in how many number characters one piece takes). As in split_gpt2 the alternatives
// are tried in order at every position and a match never extends past e.
void split_llama3(const std::vector<uint32_t>& cps, const std::vector<CpClass>& cls,
                  const std::vector<size_t>& offs, size_t s, size_t e, size_t max_digits,
                  std::vector<Piece>* pieces) {
  size_t pos = s;
  auto emit = [&](size_t end) {
    pieces->push_back({offs[pos], offs[end]});
    pos = end;
  };
  // (?i:...) only ever compares with ASCII letters, and no other code point lower-cases to one of
  // s t m d r e v l, so ASCII case folding is the whole of it.
  auto lower = [&](size_t i) { return cps[i] >= 'A' && cps[i] <= 'Z' ? cps[i] + 32 : cps[i]; };
  auto is_newline = [&](size_t i) { return cps[i] == '\r' || cps[i] == '\n'; };
  while (pos < e) {
    const CpClass c = cls[pos];
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (cps[pos] == '\'' && pos + 1 < e) {
      const uint32_t c1 = lower(pos + 1);
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        emit(pos + 2);
        continue;
      }
      if (pos + 2 < e) {
        const uint32_t c2 = lower(pos + 2);
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          emit(pos + 3);
          continue;
        }
      }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+: any one character but a newline or number (a space, a tab, a
    // bracket) joins the letters after it.
    if (!is_newline(pos) && c != CpClass::kNumber &&
        (c == CpClass::kLetter || (pos + 1 < e && cls[pos + 1] == CpClass::kLetter))) {
      size_t end = pos + 1;
      while (end < e && cls[end] == CpClass::kLetter) ++end;
      emit(end);
      continue;
    }
    // \p{N}{1,max_digits}
    if (c == CpClass::kNumber) {
      size_t end = pos + 1;
      while (end < e && end - pos < max_digits && cls[end] == CpClass::kNumber) ++end;
      emit(end);
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*': a punctuation run takes an optional leading space and the
    // newlines that follow it.
    const size_t head = (cps[pos] == ' ' && pos + 1 < e) ? pos + 1 : pos;
    if (cls[head] == CpClass::kOther) {
      size_t end = head + 1;
      while (end < e && cls[end] == CpClass::kOther) ++end;
      while (end < e && is_newline(end)) ++end;
      emit(end);
      continue;
    }
    // Whitespace: '\s*[\r\n]+' takes the run up to its last newline; otherwise '\s+(?!\S)'
    // leaves the run's last character to what follows, and '\s+' takes a run at the end whole.
    size_t end = pos, after_newline = 0;
    while (end < e && cls[end] == CpClass::kSpace) {
      if (is_newline(end)) after_newline = end + 1;
      ++end;
    }
    if (after_newline > 0) {
      emit(after_newline);
    } else if (end - pos > 1 && end < e) {
      emit(end - 1);
    } else {
      // A single whitespace character, a trailing run, or (unreachable: every class is handled
      // above) a character no alternative matches, which the regex would skip as one piece.
      emit(std::max(end, pos + 1));
    }
  }
}

}  // namespace

CpClass cp_class(uint32_t cp) { return cp < 256 ? latin1_classes()[cp] : cp_class_search(cp); }

size_t utf8_decode(std::string_view text, size_t pos, uint32_t* cp) {
  const size_t n = text.size() - pos;
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + pos;
  const uint8_t b0 = p[0];
  *cp = kInvalidCp;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  // Sequence length from the lead byte; 0 for a continuation byte or F8..FF.
  const size_t len = b0 < 0xC0 ? 0 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : b0 < 0xF8 ? 4 : 0;
  if (len == 0 || n < len) return 1;
  uint32_t v = b0 & (0x7Fu >> len);
  for (size_t i = 1; i < len; ++i) {
    if (!is_cont(p[i])) return 1;
    v = (v << 6) | (p[i] & 0x3Fu);
  }
  if (v <= 0x10FFFF) *cp = v;
  return len;
}

void utf8_append(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back((char)cp);
  } else if (cp < 0x800) {
    out->push_back((char)(0xC0 | (cp >> 6)));
    out->push_back((char)(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back((char)(0xE0 | (cp >> 12)));
    out->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back((char)(0x80 | (cp & 0x3F)));
  } else {
    out->push_back((char)(0xF0 | (cp >> 18)));
    out->push_back((char)(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back((char)(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_normalize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    uint32_t cp;
    const size_t len = utf8_decode(text, pos, &cp);
    utf8_append(&out, cp == kInvalidCp ? 0xFFFD : cp);
    pos += len;
  }
  return out;
}

void pre_split(std::string_view text, PreSplit mode, std::vector<Piece>* pieces) {
  pieces->clear();
  // Per code point: value, class, and byte offset (offs has one extra entry: text.size()).
  std::vector<uint32_t> cps;
  std::vector<CpClass> cls;
  std::vector<size_t> offs;
  cps.reserve(text.size());
  cls.reserve(text.size());
  offs.reserve(text.size() + 1);
  for (size_t pos = 0; pos < text.size();) {
    uint32_t cp;
    const size_t len = utf8_decode(text, pos, &cp);
    cps.push_back(cp);
    CpClass c = cp == kInvalidCp ? CpClass::kOther : cp_class(cp);
    // Qwen3.5's regex puts marks wherever it puts letters; every other regex ignores \p{M}.
    if (c == CpClass::kMark) c = mode == PreSplit::kQwen35 ? CpClass::kLetter : CpClass::kOther;
    cls.push_back(c);
    offs.push_back(pos);
    pos += len;
  }
  offs.push_back(text.size());
  const size_t n = cps.size();

  if (mode == PreSplit::kGpt2) {
    split_gpt2(cps, cls, offs, 0, n, pieces);
    return;
  }
  if (mode == PreSplit::kLlama3 || mode == PreSplit::kQwen2 || mode == PreSplit::kQwen35) {
    split_llama3(cps, cls, offs, 0, n, mode == PreSplit::kLlama3 ? 3 : 1, pieces);
    return;
  }
  // kDigitsGpt2: '\p{N}' makes every number character a piece of its own; the text between them
  // is split by the GPT-2 regex without looking across the digits.
  size_t start = 0;
  for (size_t i = 0; i < n; ++i) {
    if (cls[i] != CpClass::kNumber) continue;
    split_gpt2(cps, cls, offs, start, i, pieces);
    pieces->push_back({offs[i], offs[i + 1]});
    start = i + 1;
  }
  split_gpt2(cps, cls, offs, start, n, pieces);
}

const std::string& byte_to_unicode(uint8_t b) { return byte_map().to_unicode[b]; }

int unicode_to_byte(uint32_t cp) {
  return cp < byte_map().from_unicode.size() ? byte_map().from_unicode[cp] : -1;
}

}  // namespace ct::unicode
