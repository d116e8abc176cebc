// Unicode support for the byte-level BPE tokenizer: lossless UTF-8 decoding, the code point
// classes of the pre-tokenizer regexes, the pre-tokenizers themselves (GPT-2, Llama 3, Qwen2), and
// GPT-2's byte<->unicode mapping. Private to src/model (the tokenizer and its tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ct::unicode {

// The classes the pre-tokenizer regexes distinguish; mutually exclusive (no White_Space code point
// is a letter, number or mark).
enum class CpClass : uint8_t {
  kOther = 0,   // everything else, including unassigned code points and invalid UTF-8 bytes
  kLetter = 1,  // \p{L}: Lu Ll Lt Lm Lo
  kNumber = 2,  // \p{N}: Nd Nl No
  kSpace = 3,   // \s: the White_Space property
  kMark = 4,    // \p{M}: Mn Mc Me; only Qwen3.5's regex names it, the others see kOther
};

struct CpRange {
  uint32_t first, last;  // inclusive
  CpClass cls;
};

// Generated table (unicode_tables.cc): sorted, non-overlapping ranges.
extern const CpRange kCpRanges[];
extern const size_t kNumCpRanges;
extern const char kUnicodeVersion[];

CpClass cp_class(uint32_t cp);

// Code point value of an undecodable sequence. It lies outside Unicode, so it is kOther and never
// equals a character the regexes test for.
inline constexpr uint32_t kInvalidCp = 0x110000;

// Decodes one code point at text[pos] (pos < text.size()) and returns its length in bytes, with
// llama.cpp's leniency: the lead byte fixes the length and continuation bytes are only checked for
// their 10xxxxxx form, so overlong forms and surrogates decode. A stray continuation byte, a lead
// byte F8..FF, or a truncated sequence is invalid: kInvalidCp, length 1. A 4-byte sequence above
// U+10FFFF is kInvalidCp with length 4 (llama.cpp aborts on those).
size_t utf8_decode(std::string_view text, size_t pos, uint32_t* cp);
// Appends the shortest UTF-8 form of cp (cp <= U+10FFFF; surrogates are encoded like others).
void utf8_append(std::string* out, uint32_t cp);
// Re-encodes text code point by code point, as llama.cpp does before pre-tokenizing: undecodable
// sequences become U+FFFD and lenient forms their shortest encoding. Valid UTF-8 is unchanged.
std::string utf8_normalize(std::string_view text);

// Pre-tokenizer flavours, named by what llama.cpp applies for a tokenizer.ggml.pre value.
enum class PreSplit {
  kGpt2,        // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kDigitsGpt2,  // first \p{N} (each number character its own piece), then kGpt2 inside pieces
  // Llama 3, one regex: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
  //                    | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  kQwen2,  // kLlama3 with \p{N} instead of \p{N}{1,3}: every number character is its own piece
  // Qwen3.5: kQwen2 with [\p{L}\p{M}]+ for \p{L}+ and [^\s\p{L}\p{M}\p{N}] for [^\s\p{L}\p{N}]:
  // combining marks belong to the word they follow.
  kQwen35,
};

// A piece of the input: text.substr(begin, end - begin).
struct Piece {
  size_t begin, end;
};

// Splits `text` into pieces that together cover it exactly, in order. Matching is over code
// points as utf8_decode yields them; undecodable bytes count as kOther code points.
void pre_split(std::string_view text, PreSplit mode, std::vector<Piece>* pieces);

// GPT-2 bytes_to_unicode: each byte maps to a printable code point (printable Latin-1 bytes map to
// themselves, the others to U+0100 onwards, in byte order). Returns the UTF-8 of that code point.
const std::string& byte_to_unicode(uint8_t b);
// Inverse mapping; returns -1 when `cp` is not the image of a byte.
int unicode_to_byte(uint32_t cp);

}  // namespace ct::unicode
