// Tokenizer behaviour on small hand-built vocabularies (no model file): pre-tokenizer splitting,
// merges by rank, byte fallback, special token partition, decoding and chat templates.
#include "model/tokenizer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/gguf.h"
#include "model/unicode.h"

namespace ct {
namespace {

using unicode::CpClass;
using unicode::PreSplit;

std::vector<std::string> split(const std::string& text, PreSplit mode = PreSplit::kDigitsGpt2) {
  std::vector<unicode::Piece> pieces;
  unicode::pre_split(text, mode, &pieces);
  std::vector<std::string> out;
  for (const auto& p : pieces) out.push_back(text.substr(p.begin, p.end - p.begin));
  return out;
}

using Strings = std::vector<std::string>;

TEST(UnicodeTest, ClassesOfSampleCodePoints) {
  EXPECT_EQ(unicode::cp_class('a'), CpClass::kLetter);
  EXPECT_EQ(unicode::cp_class('Z'), CpClass::kLetter);
  EXPECT_EQ(unicode::cp_class('7'), CpClass::kNumber);
  EXPECT_EQ(unicode::cp_class(' '), CpClass::kSpace);
  EXPECT_EQ(unicode::cp_class('\n'), CpClass::kSpace);
  EXPECT_EQ(unicode::cp_class('\''), CpClass::kOther);
  EXPECT_EQ(unicode::cp_class(0x00E9), CpClass::kLetter);   // é
  EXPECT_EQ(unicode::cp_class(0x00BD), CpClass::kNumber);   // ½ (No)
  EXPECT_EQ(unicode::cp_class(0x0663), CpClass::kNumber);   // Arabic-Indic three
  EXPECT_EQ(unicode::cp_class(0x2167), CpClass::kNumber);   // Roman numeral eight (Nl)
  EXPECT_EQ(unicode::cp_class(0x4E2D), CpClass::kLetter);   // 中
  EXPECT_EQ(unicode::cp_class(0x00A0), CpClass::kSpace);    // no-break space
  EXPECT_EQ(unicode::cp_class(0x3000), CpClass::kSpace);    // ideographic space
  EXPECT_EQ(unicode::cp_class(0x001C), CpClass::kOther);    // isspace() in Python, not \s here
  EXPECT_EQ(unicode::cp_class(0x200B), CpClass::kOther);    // zero-width space is Cf
  EXPECT_EQ(unicode::cp_class(0x0301), CpClass::kMark);     // combining acute (Mn)
  EXPECT_EQ(unicode::cp_class(0x0903), CpClass::kMark);     // Devanagari visarga (Mc)
  EXPECT_EQ(unicode::cp_class(0x1F600), CpClass::kOther);   // 😀
  EXPECT_EQ(unicode::cp_class(0x20000), CpClass::kLetter);  // CJK extension B
  EXPECT_EQ(unicode::cp_class(0x10FFFF), CpClass::kOther);
  // The tables follow Unicode 15.1, as llama.cpp's do: letters new in 15.0 and 15.1 are letters,
  // one new in 16.0 is not yet.
  EXPECT_STREQ(unicode::kUnicodeVersion, "15.1.0");
  EXPECT_EQ(unicode::cp_class(0x1E030), CpClass::kLetter);
  EXPECT_EQ(unicode::cp_class(0x2EBF0), CpClass::kLetter);
  EXPECT_EQ(unicode::cp_class(0x0558), CpClass::kOther);
  EXPECT_EQ(unicode::cp_class(unicode::kInvalidCp), CpClass::kOther);
}

TEST(UnicodeTest, RangeTableIsSortedAndDisjoint) {
  ASSERT_GT(unicode::kNumCpRanges, 0u);
  for (size_t i = 0; i < unicode::kNumCpRanges; ++i) {
    EXPECT_LE(unicode::kCpRanges[i].first, unicode::kCpRanges[i].last);
    if (i > 0) {
      EXPECT_LT(unicode::kCpRanges[i - 1].last, unicode::kCpRanges[i].first);
    }
  }
}

TEST(UnicodeTest, Utf8DecodeIsAsLenientAsLlamaCpp) {
  struct Case {
    std::string bytes;
    size_t len;
    uint32_t cp;
  };
  const Case cases[] = {
      {"A", 1, 'A'},
      {"\xC3\xA9", 2, 0xE9},
      {"\xF0\x9F\x98\x80", 4, 0x1F600},
      {"\xC0\x80", 2, 0},                            // overlong, accepted
      {"\xE0\x80\xAF", 3, 0x2F},                     // overlong, accepted
      {"\xED\xA0\x80", 3, 0xD800},                   // surrogate, accepted
      {"\xF4\x90\x80\x80", 4, unicode::kInvalidCp},  // above U+10FFFF: one invalid unit
      {"\xF8\x88\x80\x80\x80", 1, unicode::kInvalidCp},
      {"\x80", 1, unicode::kInvalidCp},
      {"\xFF", 1, unicode::kInvalidCp},
      {"\xC3", 1, unicode::kInvalidCp},  // truncated
      {"\xE2\x82", 1, unicode::kInvalidCp},
      {"\xE2\x82"
       "A",
       1, unicode::kInvalidCp},
  };
  for (const Case& c : cases) {
    uint32_t cp = 0;
    EXPECT_EQ(unicode::utf8_decode(c.bytes, 0, &cp), c.len) << c.bytes;
    EXPECT_EQ(cp, c.cp) << c.bytes;
  }
}

TEST(UnicodeTest, NormalizeReplacesUndecodableBytes) {
  EXPECT_EQ(unicode::utf8_normalize("caf\xC3\xA9 \xF0\x9F\x98\x80"),
            "caf\xC3\xA9 \xF0\x9F\x98\x80");
  EXPECT_EQ(unicode::utf8_normalize("a\xFF\xFE"
                                    "b"),
            "a\xEF\xBF\xBD\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(unicode::utf8_normalize(std::string("\xC0\x80", 2)), std::string(1, '\0'));
  EXPECT_EQ(unicode::utf8_normalize("\xED\xA0\x80"), "\xED\xA0\x80");
  EXPECT_EQ(unicode::utf8_normalize("\xF4\x90\x80\x80"), "\xEF\xBF\xBD");
}

TEST(PreSplitTest, DigitsAreSeparatePieces) {
  EXPECT_EQ(split("12345"), (Strings{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split("12345", PreSplit::kGpt2), (Strings{"12345"}));
  // The digit split runs first, so a space before a number is not joined to it.
  EXPECT_EQ(split("a 123"), (Strings{"a", " ", "1", "2", "3"}));
  EXPECT_EQ(split("a 123", PreSplit::kGpt2), (Strings{"a", " 123"}));
  EXPECT_EQ(split("x2y"), (Strings{"x", "2", "y"}));
  EXPECT_EQ(split("\xD9\xA3\xD9\xA4"), (Strings{"\xD9\xA3", "\xD9\xA4"}));  // ٣٤
}

TEST(PreSplitTest, ContractionsAreLowercaseOnly) {
  EXPECT_EQ(split("don't I'll WE'RE"), (Strings{"don", "'t", " I", "'ll", " WE", "'", "RE"}));
  EXPECT_EQ(split("they're we've I'm he'd it's"),
            (Strings{"they", "'re", " we", "'ve", " I", "'m", " he", "'d", " it", "'s"}));
  // A run of punctuation is taken whole, even when an apostrophe inside could start "'s".
  EXPECT_EQ(split("''s''"), (Strings{"''", "s", "''"}));
  EXPECT_EQ(split("'"), (Strings{"'"}));
}

TEST(PreSplitTest, WhitespaceBeforeAWordKeepsItsLastSpaceForTheWord) {
  EXPECT_EQ(split("a b"), (Strings{"a", " b"}));
  EXPECT_EQ(split("a  b"), (Strings{"a", " ", " b"}));
  EXPECT_EQ(split("a   b"), (Strings{"a", "  ", " b"}));
  EXPECT_EQ(split("a\n\nb"), (Strings{"a", "\n", "\n", "b"}));
  EXPECT_EQ(split("a\t\tb"), (Strings{"a", "\t", "\t", "b"}));
  EXPECT_EQ(split("a \n b"), (Strings{"a", " \n", " b"}));
  EXPECT_EQ(split("a, b"), (Strings{"a", ",", " b"}));
  EXPECT_EQ(split("a ,b"), (Strings{"a", " ,", "b"}));
}

TEST(PreSplitTest, TrailingAndLoneWhitespaceIsOnePiece) {
  EXPECT_EQ(split("end   "), (Strings{"end", "   "}));
  EXPECT_EQ(split("\n\n"), (Strings{"\n\n"}));
  EXPECT_EQ(split(" "), (Strings{" "}));
  EXPECT_EQ(split(" \t \n "), (Strings{" \t \n "}));
  EXPECT_EQ(split(""), (Strings{}));
}

TEST(PreSplitTest, NonAsciiLettersAndSymbols) {
  EXPECT_EQ(split("caf\xC3\xA9 na\xC3\xAFve"), (Strings{"caf\xC3\xA9", " na\xC3\xAFve"}));
  EXPECT_EQ(split("\xD0\x9F\xD1\x80\xD0\xB8, \xD0\xBC\xD0\xB8\xD1\x80!"),  // При, мир!
            (Strings{"\xD0\x9F\xD1\x80\xD0\xB8", ",", " \xD0\xBC\xD0\xB8\xD1\x80", "!"}));
  EXPECT_EQ(split("\xE4\xB8\xAD\xE6\x96\x87\xE3\x80\x82"),  // 中文。
            (Strings{"\xE4\xB8\xAD\xE6\x96\x87", "\xE3\x80\x82"}));
  EXPECT_EQ(split("hi \xF0\x9F\x98\x80\xF0\x9F\x8E\x89"),
            (Strings{"hi", " \xF0\x9F\x98\x80\xF0\x9F\x8E\x89"}));
  // A combining mark is not a letter, so it ends the word it follows.
  EXPECT_EQ(split("e\xCC\x81t"), (Strings{"e", "\xCC\x81", "t"}));
  // No-break space is whitespace but never the optional ' ' of a word.
  EXPECT_EQ(split("a\xC2\xA0"
                  "b"),
            (Strings{"a", "\xC2\xA0", "b"}));
}

TEST(PreSplitTest, InvalidBytesAreOtherCharacters) {
  EXPECT_EQ(split("a\xFF\xFE!b"), (Strings{"a", "\xFF\xFE!", "b"}));
  EXPECT_EQ(split(" \x80"), (Strings{" \x80"}));
}

TEST(PreSplitTest, PiecesCoverRandomBytesExactly) {
  std::mt19937 rng(7);
  const std::string alphabet[] = {"a",
                                  "Z",
                                  "1",
                                  " ",
                                  "  ",
                                  "\n",
                                  "\t",
                                  "'",
                                  "'s",
                                  "!",
                                  "\xC3\xA9",
                                  "\xE4\xB8\xAD",
                                  "\xF0\x9F\x98\x80",
                                  "\xFF",
                                  "\xC3",
                                  "\xE2\x82",
                                  "\r\n",
                                  "\xCC\x81",
                                  "'T"};
  for (int iter = 0; iter < 500; ++iter) {
    std::string text;
    const int n = (int)(rng() % 30);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % std::size(alphabet)];
    for (PreSplit mode : {PreSplit::kGpt2, PreSplit::kDigitsGpt2, PreSplit::kLlama3,
                          PreSplit::kQwen2, PreSplit::kQwen35}) {
      std::string joined;
      for (const std::string& p : split(text, mode)) {
        EXPECT_FALSE(p.empty());
        joined += p;
      }
      EXPECT_EQ(joined, text);
    }
  }
}

// A vocabulary with three control tokens, one user-defined token, the 256 byte tokens and the
// results of `merges`, in that order.
struct TinyVocab {
  std::vector<std::string> tokens{"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tag>"};
  std::vector<int32_t> types{3, 3, 3, 4};
  std::vector<std::string> merges;

  explicit TinyVocab(std::vector<std::string> m) : merges(std::move(m)) {
    for (int b = 0; b < 256; ++b) add(unicode::byte_to_unicode((uint8_t)b));
    for (const std::string& merge : merges) {
      const size_t sp = merge.find(' ');
      add(merge.substr(0, sp) + merge.substr(sp + 1));
    }
  }
  void add(const std::string& text, int32_t type = 1) {
    for (const std::string& t : tokens) {
      if (t == text) return;
    }
    tokens.push_back(text);
    types.push_back(type);
  }
  VocabSpec spec(const std::string& tmpl = "", const std::string& pre = "smollm") const {
    VocabSpec s;
    s.pre = pre;
    s.tokens = tokens;
    s.token_types = types;
    s.merges = merges;
    s.chat_template = tmpl;
    s.eos = 0;
    return s;
  }
  Tokenizer build(const std::string& tmpl = "", const std::string& pre = "smollm") const {
    return Tokenizer::from_vocab(spec(tmpl, pre));
  }
};

// Token texts of the ids, for readable expectations.
Strings texts(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  Strings out;
  for (int32_t id : ids) out.push_back(tok.token_to_piece(id, true));
  return out;
}

TEST(TokenizerTest, MergesApplyInRankOrder) {
  // "b c" outranks "a b": abc -> a + bc.
  Tokenizer first_bc = TinyVocab({"b c", "a b"}).build();
  EXPECT_EQ(texts(first_bc, first_bc.encode("abc", false)), (Strings{"a", "bc"}));
  Tokenizer first_ab = TinyVocab({"a b", "b c"}).build();
  EXPECT_EQ(texts(first_ab, first_ab.encode("abc", false)), (Strings{"ab", "c"}));
  // Equal pairs merge leftmost first, and a merge result merges further.
  Tokenizer aa = TinyVocab({"a a", "aa a", "aa aa"}).build();
  EXPECT_EQ(texts(aa, aa.encode("aaa", false)), (Strings{"aaa"}));
  EXPECT_EQ(texts(aa, aa.encode("aaaa", false)), (Strings{"aaaa"}));
  // aaaaa: a+a at 0 and 2 (leftmost first, rank 0), then aa+a (rank 1) before aa+aa (rank 2).
  EXPECT_EQ(texts(aa, aa.encode("aaaaa", false)), (Strings{"aa", "aaa"}));
}

TEST(TokenizerTest, MergesStayInsidePreTokenizerPieces) {
  // "Ġ" is the byte-level form of ' '.
  Tokenizer tok = TinyVocab({"\xC4\xA0 w", "o r", "\xC4\xA0w or", "\xC4\xA0wor d", "1 2"}).build();
  EXPECT_EQ(texts(tok, tok.encode("word word", false)), (Strings{"w", "or", "d", " word"}));
  // Digits are separate pieces, so "1 2" never applies.
  EXPECT_EQ(texts(tok, tok.encode("12", false)), (Strings{"1", "2"}));
  Tokenizer gpt2 = TinyVocab({"1 2"}).build("", "gpt2");
  EXPECT_EQ(texts(gpt2, gpt2.encode("12", false)), (Strings{"12"}));
}

TEST(TokenizerTest, ValidUtf8RoundTrips) {
  Tokenizer tok = TinyVocab({"h e", "l l", "he ll"}).build();
  EXPECT_EQ(texts(tok, tok.encode("hello", false)), (Strings{"hell", "o"}));
  EXPECT_TRUE(tok.encode("", true).empty());
  std::mt19937 rng(3);
  const uint32_t starts[] = {0x0, 0x80, 0x800, 0x10000};
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    for (int i = (int)(rng() % 40); i > 0; --i) {
      const int plane = (int)(rng() % 4);
      uint32_t cp = starts[plane] + rng() % (plane == 0 ? 0x80 : 0x700);
      if (cp >= 0xD800 && cp < 0xE000) cp = 'x';
      unicode::utf8_append(&text, cp);
    }
    EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
  }
}

TEST(TokenizerTest, UndecodableBytesBecomeReplacementCharacters) {
  Tokenizer tok = TinyVocab({}).build();
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(tok.decode(tok.encode("a\xFF\xFE"
                                  "b\x80",
                                  false)),
            "a" + fffd + fffd + "b" + fffd);
  EXPECT_EQ(tok.decode(tok.encode("x\xE2\x82", false)), "x" + fffd + fffd);
  // Lenient forms come back in their shortest encoding, as llama.cpp re-encodes code points.
  EXPECT_EQ(tok.decode(tok.encode("\xC1\xBF", false)), "\x7F");
  EXPECT_EQ(tok.decode(tok.encode("\xED\xA0\x80", false)), "\xED\xA0\x80");
  std::mt19937 rng(5);
  for (int iter = 0; iter < 200; ++iter) {
    std::string text(rng() % 40, '\0');
    for (char& c : text) c = (char)(rng() % 256);
    EXPECT_EQ(tok.decode(tok.encode(text, false)), unicode::utf8_normalize(text));
  }
}

TEST(TokenizerTest, BytesWithoutATokenAreDroppedButStillSeparate) {
  // No token for 0x04; "a b" would merge "ab" if 0x04 did not sit between them.
  TinyVocab v({"a b"});
  const std::string b04 = unicode::byte_to_unicode(0x04);
  v.types.erase(v.types.begin() +
                (std::find(v.tokens.begin(), v.tokens.end(), b04) - v.tokens.begin()));
  v.tokens.erase(std::find(v.tokens.begin(), v.tokens.end(), b04));
  Tokenizer tok = v.build();
  EXPECT_EQ(texts(tok, tok.encode("ab", false)), (Strings{"ab"}));
  EXPECT_EQ(texts(tok, tok.encode("a\x04"
                                  "b",
                                  false)),
            (Strings{"a", "b"}));
  EXPECT_TRUE(tok.encode("\x04", false).empty());
}

TEST(TokenizerTest, SpecialTokensNeedParseSpecialExceptUserDefined) {
  Tokenizer tok = TinyVocab({}).build();
  const int32_t im_start = tok.find_token("<|im_start|>"), tag = tok.find_token("<tag>");
  ASSERT_EQ(im_start, 1);
  ASSERT_EQ(tag, 3);
  std::vector<int32_t> on = tok.encode("x<|im_start|>y<tag>", true);
  EXPECT_EQ(texts(tok, on), (Strings{"x", "<|im_start|>", "y", "<tag>"}));
  std::vector<int32_t> off = tok.encode("x<|im_start|>y<tag>", false);
  EXPECT_EQ(std::count(off.begin(), off.end(), im_start), 0);
  EXPECT_EQ(std::count(off.begin(), off.end(), tag), 1);  // user-defined: always recognised
  EXPECT_EQ(tok.decode(off), "x<|im_start|>y<tag>");
  // Pieces on either side of a special token are pre-tokenized separately.
  EXPECT_EQ(texts(tok, tok.encode("a <|im_end|> b<|im_end|><|im_end|>", true)),
            (Strings{"a", " ", "<|im_end|>", " ", "b", "<|im_end|>", "<|im_end|>"}));
  EXPECT_EQ(texts(tok, tok.encode("<|im_start|", true)).size(), 11u);
}

TEST(TokenizerTest, LongerSpecialTokensWin) {
  TinyVocab v({});
  v.add("<x>", 3);
  v.add("<x>y", 3);
  Tokenizer tok = v.build();
  EXPECT_EQ(texts(tok, tok.encode("<x>y<x>z<x>y", true)), (Strings{"<x>y", "<x>", "z", "<x>y"}));
}

TEST(TokenizerTest, DecodeRendersControlTokensOnlyOnRequest) {
  Tokenizer tok = TinyVocab({}).build();
  std::vector<int32_t> ids = tok.encode("<|im_start|>hi<|im_end|>", true);
  EXPECT_EQ(tok.decode(ids), "hi");
  EXPECT_EQ(tok.decode(ids, true), "<|im_start|>hi<|im_end|>");
  EXPECT_THROW(tok.decode({tok.n_vocab()}), Error);
  EXPECT_THROW(tok.token_to_piece(-1), Error);
}

TEST(TokenizerTest, EndOfGenerationTokens) {
  Tokenizer tok = TinyVocab({}).build();
  EXPECT_TRUE(tok.is_eog(0));  // eos, also <|endoftext|>
  EXPECT_TRUE(tok.is_eog(2));  // <|im_end|>
  EXPECT_FALSE(tok.is_eog(1));
  EXPECT_FALSE(tok.is_eog(100));
  EXPECT_EQ(tok.eos(), 0);
  EXPECT_EQ(tok.bos(), -1);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.find_token("no such token"), -1);
}

// The SmolLM2 GGUF template (its newlines are real newline characters inside Jinja literals).
const char kSmolTemplate[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

TEST(ChatTemplateTest, ChatMlWithTheTemplatesDefaultSystemMessage) {
  Tokenizer tok = TinyVocab({}).build(kSmolTemplate);
  EXPECT_EQ(tok.apply_chat_template({{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tok.apply_chat_template({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Yo"}},
                                    false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nYo<|im_end|>\n");
  EXPECT_EQ(tok.apply_chat_template({}, true), "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, DefaultSystemMessageComesOnlyFromALiteral) {
  // Escaped newlines in the literal, as templates stored from JSON may have them.
  Tokenizer escaped = TinyVocab({}).build(
      "{{ '<|im_start|>system\\nYou are Bob.<|im_end|>\\n' }}"
      "{{ '<|im_start|>' + m['role'] }}");
  EXPECT_EQ(escaped.apply_chat_template({{"user", "x"}}, false),
            "<|im_start|>system\nYou are Bob.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n");
  // A system turn built from an expression is not a default message.
  Tokenizer expr =
      TinyVocab({}).build("{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}");
  EXPECT_EQ(expr.apply_chat_template({{"user", "x"}}, false), "<|im_start|>user\nx<|im_end|>\n");
  Tokenizer none = TinyVocab({}).build("");
  EXPECT_EQ(none.apply_chat_template({{"user", "x"}}, true),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Llama3Format) {
  Tokenizer tok = TinyVocab({}).build(
      "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}");
  EXPECT_EQ(tok.apply_chat_template({{"system", "S"}, {"user", "  Hi \n"}}, true),
            "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(TokenizerTest, RejectsUnsupportedOrInconsistentInput) {
  TinyVocab v({"a b"});
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { v.build("", "deepseek-llm"); }).find("'deepseek-llm'"),
            std::string::npos);
  VocabSpec bad = v.spec();
  bad.model = "t5";
  EXPECT_NE(message([&] { Tokenizer::from_vocab(bad); }).find("'t5'"), std::string::npos);
  bad = v.spec();
  bad.merges = {"a zz"};
  EXPECT_NE(message([&] { Tokenizer::from_vocab(bad); }).find("merges[0] is 'a zz'"),
            std::string::npos);
  bad = v.spec();
  bad.token_types = {1, 1};
  EXPECT_THROW(Tokenizer::from_vocab(bad), Error);
  bad = v.spec();
  bad.scores = {0.0f};
  EXPECT_THROW(Tokenizer::from_vocab(bad), Error);
  EXPECT_THROW(Tokenizer::from_vocab(VocabSpec{}), Error);
  bad = v.spec();
  bad.bos = 1 << 20;
  EXPECT_THROW(Tokenizer::from_vocab(bad), Error);
  // An unknown chat template still tokenises; rendering it is refused, naming the template.
  VocabSpec gemma = v.spec("{{ '<start_of_turn>' + role }}");
  gemma.source = "gemma.gguf";
  Tokenizer tok = Tokenizer::from_vocab(gemma);
  EXPECT_EQ(texts(tok, tok.encode("ab", false)), (Strings{"ab"}));
  const std::string msg = message([&] { tok.apply_chat_template({{"user", "x"}}, true); });
  EXPECT_NE(msg.find("gemma.gguf"), std::string::npos) << msg;
  EXPECT_NE(msg.find("<start_of_turn>"), std::string::npos) << msg;
}

TEST(PreSplitTest, Llama3GroupsDigitsInThreesAndFoldsContractions) {
  const PreSplit l3 = PreSplit::kLlama3, qw = PreSplit::kQwen2;
  EXPECT_EQ(split("1234567", l3), (Strings{"123", "456", "7"}));
  EXPECT_EQ(split("1234567", qw), (Strings{"1", "2", "3", "4", "5", "6", "7"}));
  // Qwen3.5 keeps a combining mark with its word; the other regexes end the word there.
  EXPECT_EQ(split("e\xCC\x81t \xCC\x81!", PreSplit::kQwen35),
            (Strings{"e\xCC\x81t", " \xCC\x81", "!"}));
  EXPECT_EQ(split("e\xCC\x81t", qw), (Strings{"e", "\xCC\x81t"}));
  // A space before a number is never joined to it (there is no ' ?\p{N}').
  EXPECT_EQ(split("a 12", l3), (Strings{"a", " ", "12"}));
  // Contractions ignore case, unlike GPT-2's.
  EXPECT_EQ(split("DON'T I'LL", l3), (Strings{"DON", "'T", " I", "'LL"}));
  EXPECT_EQ(split("DON'T", PreSplit::kGpt2), (Strings{"DON", "'", "T"}));
  // Any one character but a newline or number joins the letters after it.
  EXPECT_EQ(split("(word\tx \xC2\xA0y", l3), (Strings{"(word", "\tx", " ", "\xC2\xA0y"}));
  EXPECT_EQ(split("\nword", l3), (Strings{"\n", "word"}));
  // Punctuation takes one leading space and the newlines after it.
  EXPECT_EQ(split("a !!\n\nb", l3), (Strings{"a", " !!\n\n", "b"}));
  EXPECT_EQ(split("a.\r\nb", qw), (Strings{"a", ".\r\n", "b"}));
  // A whitespace run with newlines ends at its last newline; without, it leaves its last
  // character to the word after it, and at the end of the text it is one piece.
  EXPECT_EQ(split("a \n \n  b", l3), (Strings{"a", " \n \n", " ", " b"}));
  EXPECT_EQ(split("a   b  ", l3), (Strings{"a", "  ", " b", "  "}));
  EXPECT_EQ(split("x  1", l3), (Strings{"x", " ", " ", "1"}));
}

TEST(TokenizerTest, Llama3EmitsAPieceThatIsATokenWithoutMerging) {
  // The merges make "ab" + "c" of "abc", but "abc" is a token: Llama 3 ("ignore_merges") takes
  // it whole, Qwen2 merges.
  TinyVocab v({"a b"});
  v.add("abc");
  Tokenizer llama3 = v.build("", "llama-bpe");
  EXPECT_EQ(texts(llama3, llama3.encode("abc", false)), (Strings{"abc"}));
  Tokenizer qwen2 = v.build("", "qwen2");
  EXPECT_EQ(texts(qwen2, qwen2.encode("abc", false)), (Strings{"ab", "c"}));
  // Llama 3 adds BOS unless the file says otherwise; Qwen2 does not.
  VocabSpec s = v.spec("", "llama-bpe");
  s.bos = 1;
  EXPECT_TRUE(Tokenizer::from_vocab(s).add_bos());
  s.add_bos = false;
  EXPECT_FALSE(Tokenizer::from_vocab(s).add_bos());
  EXPECT_FALSE(qwen2.add_bos());
}

// A SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then `pieces` with their
// scores ("\u2581" is the escaped space).
const std::string kSp = "\xE2\x96\x81";
Tokenizer spm_vocab(const std::vector<std::pair<std::string, float>>& pieces,
                    const std::string& tmpl = "") {
  VocabSpec s;
  s.model = "llama";
  s.tokens = {"<unk>", "<s>", "</s>"};
  s.token_types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    s.tokens.push_back(fmt::format("<0x{:02X}>", b));
    s.token_types.push_back(6);
  }
  s.scores.assign(s.tokens.size(), 0.0f);
  for (const auto& [text, score] : pieces) {
    s.tokens.push_back(text);
    s.token_types.push_back(1);
    s.scores.push_back(score);
  }
  s.bos = 1;
  s.eos = 2;
  s.chat_template = tmpl;
  return Tokenizer::from_vocab(s);
}

TEST(SpmTokenizerTest, HighestScoringPairMergesFirst) {
  // "ab" -> "\u2581ab": the pairs are "\u2581a" and "ab"; the higher score wins.
  Tokenizer a_first = spm_vocab({{kSp, -3}, {"a", -3}, {"b", -3}, {kSp + "a", -1}, {"ab", -2}});
  EXPECT_EQ(texts(a_first, a_first.encode("ab", false)), (Strings{" a", "b"}));
  Tokenizer ab_first = spm_vocab({{kSp, -3}, {"a", -3}, {"b", -3}, {kSp + "a", -2}, {"ab", -1}});
  EXPECT_EQ(texts(ab_first, ab_first.encode("ab", false)), (Strings{" ", "ab"}));
  // Equal scores: leftmost first; a merge result merges further.
  Tokenizer tie = spm_vocab({{"a", -3}, {"aa", -1}, {"aaa", -0.5}, {kSp, -3}});
  EXPECT_EQ(texts(tie, tie.encode("aaaa", false, /*starts_text=*/false)), (Strings{"aaa", "a"}));
  EXPECT_TRUE(tie.is_spm());
  EXPECT_TRUE(tie.add_bos());
}

TEST(SpmTokenizerTest, CharactersWithoutATokenFallBackToBytes) {
  Tokenizer tok = spm_vocab({{kSp, -3}, {"a", -3}, {kSp + "a", -1}});
  // é (C3 A9) and 😀 (F0 9F 98 80) have no token: their bytes' tokens are used.
  const std::vector<int32_t> ids = tok.encode("a\xC3\xA9\xF0\x9F\x98\x80", false);
  EXPECT_EQ(texts(tok, ids), (Strings{" a", "\xC3", "\xA9", "\xF0", "\x9F", "\x98", "\x80"}));
  EXPECT_EQ(ids[1], 3 + 0xC3);
  EXPECT_EQ(tok.decode(ids), " a\xC3\xA9\xF0\x9F\x98\x80");
  // A truncated sequence is one symbol as its lead byte says (not validated, as in llama.cpp).
  EXPECT_EQ(tok.encode("\xE2\x82", false, false), (std::vector<int32_t>{3 + 0xE2, 3 + 0x82}));
  EXPECT_TRUE(tok.encode("", false).empty());  // no space prefix for empty text
}

TEST(SpmTokenizerTest, SpacePrefixAtTheStartAndAfterSpecialTokens) {
  Tokenizer tok = spm_vocab({{kSp, -3}, {"a", -3}, {"b", -3}, {kSp + "a", -1}, {kSp + "b", -1}});
  EXPECT_EQ(texts(tok, tok.encode("a b", false)), (Strings{" a", " b"}));
  EXPECT_EQ(texts(tok, tok.encode("a b", false, /*starts_text=*/false)), (Strings{"a", " b"}));
  EXPECT_EQ(texts(tok, tok.encode("a</s>b", true)), (Strings{" a", "</s>", " b"}));
  // Without parse_special "</s>" is text: '<' '/' 's' '>' fall back to bytes.
  EXPECT_EQ(tok.encode("</s>", false).size(), 5u);
  EXPECT_TRUE(tok.is_eog(2));
}

// Qwen2.5's template as its GGUF stores it: the default system message is a literal in the
// branch without tools.
const char kQwen25Template[] = R"qwen({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)qwen";

TEST(ChatTemplateTest, QwenDefaultSystemMessage) {
  Tokenizer tok = TinyVocab({}).build(kQwen25Template, "qwen2");
  EXPECT_EQ(tok.apply_chat_template({{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tok.apply_chat_template({{"system", "S"}, {"user", "Hi"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplateTest, MistralAndLlama2Formats) {
  const std::vector<ChatMessage> chat = {
      {"system", "S"}, {"user", "U1"}, {"assistant", " A1 "}, {"user", "U2"}};
  // Mistral-7B-Instruct-v0.2: the Llama 2 format without <<SYS>>.
  Tokenizer v02 = TinyVocab({}).build(
      "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' "
      "+ message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token}}{% endif "
      "%}{% endfor %}");
  EXPECT_EQ(v02.apply_chat_template(chat, true), "[INST] S\nU1 [/INST] A1 </s>[INST] U2 [/INST]");
  Tokenizer llama2 = TinyVocab({}).build("[INST] <<SYS>>\\n' + system_message + '\\n<</SYS>>");
  EXPECT_EQ(llama2.apply_chat_template(chat, true),
            "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s>[INST] U2 [/INST]");
  Tokenizer v1 = TinyVocab({}).build("[AVAILABLE_TOOLS] [INST]'");
  EXPECT_EQ(v1.apply_chat_template(chat, true),
            " [INST] S\n\nU1 [/INST]  A1 </s> [INST] U2 [/INST]");
  Tokenizer v3 = TinyVocab({}).build("[AVAILABLE_TOOLS]'[INST]'");  // assistant text trimmed
  EXPECT_EQ(v3.apply_chat_template(chat, true), "[INST] S\n\nU1[/INST] A1</s>[INST] U2[/INST]");
  Tokenizer tekken = TinyVocab({}).build("[AVAILABLE_TOOLS]\"[INST]\"");
  EXPECT_EQ(tekken.apply_chat_template(chat, true), "[INST]S\n\nU1[/INST] A1 </s>[INST]U2[/INST]");
  Tokenizer v7 = TinyVocab({}).build("[SYSTEM_PROMPT][INST]");
  EXPECT_EQ(v7.apply_chat_template(chat, true),
            "[SYSTEM_PROMPT] S[/SYSTEM_PROMPT][INST] U1[/INST]  A1 </s>[INST] U2[/INST]");
}

TEST(ChatTemplateTest, UnknownTemplatesAreRefusedWhenRendered) {
  for (const char* tmpl : {"{{'<|user|>' + '\\n' + message['content'] + '<|end|>'}}<|assistant|>",
                           "<start_of_turn>user", "<|im_start|><|im_sep|>"}) {
    VocabSpec s = TinyVocab({}).spec(tmpl);
    s.source = "m.gguf";
    Tokenizer tok = Tokenizer::from_vocab(s);
    try {
      tok.apply_chat_template({{"user", "x"}}, true);
      ADD_FAILURE() << "accepted " << tmpl;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("m.gguf: tokenizer.chat_template"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::string(tmpl).substr(0, 10)), std::string::npos) << msg;
    }
  }
}

TEST(TokenizerTest, EndOfTurnTokensBecomeControlTokens) {
  // "<|eot_id|>" written as a normal token is treated as control and ends generation, as in
  // llama.cpp; so are eot/eom ids the file names.
  TinyVocab v({});
  v.add("<|eot_id|>", 1);
  v.add("<|eom_id|>", 4);
  v.add("<|custom|>", 3);
  VocabSpec s = v.spec();
  s.eot = (int32_t)v.tokens.size() - 1;
  Tokenizer tok = Tokenizer::from_vocab(s);
  const int32_t eot = tok.find_token("<|eot_id|>"), eom = tok.find_token("<|eom_id|>");
  EXPECT_TRUE(tok.is_eog(eot));
  EXPECT_TRUE(tok.is_eog(eom));
  EXPECT_TRUE(tok.is_eog(tok.find_token("<|custom|>")));  // named by eot_token_id
  EXPECT_FALSE(tok.is_eog(tok.find_token("<|im_start|>")));
  EXPECT_EQ(std::count(tok.eog_ids().begin(), tok.eog_ids().end(), eot), 1);
  // Control now: not parsed without parse_special, not rendered without render_special.
  const std::vector<int32_t> plain = tok.encode("<|eot_id|>", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
  EXPECT_EQ(tok.encode("<|eot_id|>", true), (std::vector<int32_t>{eot}));
  EXPECT_EQ(tok.decode({eot}), "");
}

TEST(TokenizerTest, Phi3DropsWhitespaceAfterSpecialTokens) {
  // llama.cpp keys this on general.name: after a special token (but <s>, <unk>, <|endoftext|>)
  // whitespace is dropped.
  VocabSpec s = TinyVocab({"h i", "\xC4\xA0 x"}).spec();
  s.tokens.push_back("<|user|>");
  s.token_types.push_back(4);
  s.name = "Phi3";
  Tokenizer phi3 = Tokenizer::from_vocab(s);
  EXPECT_EQ(texts(phi3, phi3.encode("<|user|>\n hi<|endoftext|> x", true)),
            (Strings{"<|user|>", "hi", "<|endoftext|>", " x"}));
  s.name = "other";
  Tokenizer other = Tokenizer::from_vocab(s);
  EXPECT_EQ(texts(other, other.encode("<|user|>\nhi", true)), (Strings{"<|user|>", "\n", "hi"}));
}

TEST(TokenizerTest, BuildsFromAVocabularyOnlyGguf) {
  // A SentencePiece file with tokens, types and scores only: no tensors, no BOS/EOS keys (llama.cpp
  // then assumes <s> = 1 and </s> = 2), no template.
  GgufWriter w;
  w.set_str("general.name", "tiny-spm");
  w.set_str("tokenizer.ggml.model", "llama");
  w.set_str_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", kSp, "a", kSp + "a"});
  w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1});
  w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0, -2, -2, -1});
  const std::string path = ::testing::TempDir() + "/ct_tokenizer_vocab_only.gguf";
  w.write(path);
  const auto f = GgufFile::open(path);
  EXPECT_TRUE(f->tensors().empty());
  const Tokenizer tok = Tokenizer::from_gguf(*f);
  std::remove(path.c_str());
  EXPECT_TRUE(tok.is_spm());
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(texts(tok, tok.encode("a a", false)), (Strings{" a", " a"}));
}

}  // namespace
}  // namespace ct
