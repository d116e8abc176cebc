// libFuzzer target: the BPE tokenizer on arbitrary input. Byte 0 picks the operation: encode of
// the rest as text (with or without special-token parsing, or with the plain ranges chat requests
// use), or decode of the rest read as int32 ids, some outside [0, n_vocab) on purpose (those must
// be a ct::Error). For valid UTF-8 text whose bytes all have tokens, encode without special
// parsing must round-trip through decode (SPM: up to its space handling, see round_trips). The
// tokenizer is the tests' tiny vocabulary, or the GGUF named by CT_FUZZ_TOKENIZER_GGUF (the SmolLM2
// file, or one of llama.cpp's vocabulary-only files: qwen2, llama-bpe, llama-spm), built once.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "core/error.h"
#include "fuzz_common.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "support/tiny_model.h"

namespace {

struct Fixture {
  std::unique_ptr<ct::Tokenizer> tok;
  // Bytes that have a token of their own. encode drops a byte without one, as llama.cpp does
  // (SmolLM2 lacks 21 ASCII control bytes and some UTF-8 lead bytes, e.g. 0xF2), so only text
  // made of such bytes must survive decode(encode(text)).
  bool byte_ok[256] = {};
};

const Fixture& fixture() {
  static const Fixture fx = [] {
    Fixture f;
    if (const char* path = std::getenv("CT_FUZZ_TOKENIZER_GGUF"); path && *path) {
      const auto g = ct::GgufFile::open(path);
      f.tok = std::make_unique<ct::Tokenizer>(ct::Tokenizer::from_gguf(*g));
      std::fprintf(stderr, "tokenizer_fuzz: %s, %d tokens\n", path, f.tok->n_vocab());
    } else {
      const ct::test::TinyVocab v = ct::test::tiny_vocab();
      ct::VocabSpec spec;
      spec.pre = "smollm";
      spec.tokens = v.tokens;
      spec.token_types = v.token_type;
      spec.merges = v.merges;
      spec.chat_template = ct::test::kTinyChatTemplate;
      spec.bos = v.im_start;
      spec.eos = v.im_end;
      spec.add_bos = false;
      f.tok = std::make_unique<ct::Tokenizer>(ct::Tokenizer::from_vocab(std::move(spec)));
    }
    for (int32_t id = 0; id < f.tok->n_vocab(); ++id) {
      const std::string piece = f.tok->token_to_piece(id);
      if (piece.size() == 1) f.byte_ok[(unsigned char)piece[0]] = true;
    }
    return f;
  }();
  return fx;
}

// Strict UTF-8 (no overlongs, no surrogates, at most U+10FFFF).
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = (unsigned char)s[i];
    int len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const auto d = (unsigned char)s[i + k];
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// Whether `back` = decode(encode(text)) gives the text back. Byte-level BPE: exactly. SPM: spaces
// travel as U+2581 and come back as spaces, so a U+2581 written in the text also comes back as a
// space, and the space prefix llama.cpp adds may lead (its rule is the tokenizer's to test, in
// tests/unit/vocab_ref_test.cc; here only that nothing else changed).
bool round_trips(const ct::Tokenizer& tok, std::string_view text, const std::string& back) {
  if (!tok.is_spm()) return back == text;
  std::string want;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
      want += ' ';
      i += 2;
    } else {
      want += text[i];
    }
  }
  return back == want || back == " " + want;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& fx = fixture();
  const ct::Tokenizer& tok = *fx.tok;
  ct::fuzz::Bytes in(data, size);
  const uint8_t op = in.take<uint8_t>();
  const std::string_view text(reinterpret_cast<const char*>(in.data()), in.size());
  const int32_t n_vocab = tok.n_vocab();
  auto check_ids = [&](const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
      if (id < 0 || id >= n_vocab) ct::fuzz::finding("encode produced an id outside the vocab");
    }
  };
  switch (op % 4) {
    case 0:
    case 1: {
      const bool parse_special = op % 4 == 1;
      const std::vector<int32_t> ids = tok.encode(text, parse_special);
      check_ids(ids);
      const std::string back = tok.decode(ids, true);
      bool all_bytes_have_tokens = true;
      for (char c : text) all_bytes_have_tokens = all_bytes_have_tokens && fx.byte_ok[(unsigned char)c];
      if (!parse_special && all_bytes_have_tokens && valid_utf8(text) && !round_trips(tok, text, back)) {
        ct::fuzz::finding("decode(encode(text)) != text for valid UTF-8");
      }
      break;
    }
    case 2: {
      // Plain ranges from the next bytes, as a chat request marks user text.
      std::vector<std::pair<size_t, size_t>> plain;
      const size_t n = text.size();
      for (int k = 0; k < 2 && n > 0; ++k) {
        const size_t b = (size_t)(op >> 2) * (k + 1) % (n + 1);
        const size_t e = b + (n - b) / 2;
        plain.push_back({b, e});
      }
      check_ids(tok.encode(text, plain));
      break;
    }
    case 3: {
      std::vector<int32_t> ids;
      bool out_of_range = false;
      while (in.size() >= 4) {
        const int32_t raw = in.take<int32_t>();
        // Mostly in range (ids near 0 and near n_vocab), sometimes just outside on either side.
        const int64_t span = (int64_t)n_vocab + 8;
        const int32_t id = (int32_t)(((int64_t)raw % span + span) % span) - 4;
        out_of_range |= id < 0 || id >= n_vocab;
        ids.push_back(id);
      }
      try {
        (void)tok.decode(ids, (op >> 2) & 1);
        if (out_of_range) ct::fuzz::finding("decode accepted an id outside [0, n_vocab)");
      } catch (const ct::Error&) {
        if (!out_of_range) ct::fuzz::finding("decode refused ids inside the vocab");
      }
      for (size_t k = 0; k < ids.size() && k < 16; ++k) {
        if (ids[k] >= 0 && ids[k] < n_vocab) (void)tok.token_to_piece(ids[k], true);
      }
      break;
    }
  }
  return 0;
}
