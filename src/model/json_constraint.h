// JSON-constrained decoding (OpenAI's `response_format: {"type": "json_object"}`): a byte-level
// recognizer of JSON text (RFC 8259, UTF-8) and a token constraint that lets the sampler choose
// only tokens whose bytes continue a valid JSON object, and an end-of-generation token only once
// the object is complete.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ct {

class Tokenizer;

// A pushdown recognizer of one JSON value: feed() takes the text byte by byte and refuses the
// first byte after which no continuation could be valid JSON; complete() says whether the text so
// far is a whole value. A small value type (24 bytes), copied freely to try continuations.
// A \u escape of a UTF-16 surrogate must be a high one followed by a low one's escape.
// Limits beyond RFC 8259 (a generator's, not a parser's): nesting depth at most kMaxDepth, and at
// most kMaxSpaces whitespace bytes in a row outside strings, so a constrained model cannot pad
// forever. Only an object at the top level with object_only.
class JsonRecognizer {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxSpaces = 32;
  explicit JsonRecognizer(bool object_only = true);
  // Whether byte c may come next; if so, the state moves past it (else it is unchanged).
  bool feed(uint8_t c);
  bool feed(std::string_view s);  // every byte, stopping at the first refused one
  bool complete() const;
  // Whether the text is a whole value after which nothing but whitespace could follow.
  bool done() const { return mode_ == kDone; }
  // Equal states take the same bytes from here on (the constraint reuses a mask by it).
  bool operator==(const JsonRecognizer&) const = default;

 private:
  enum Mode : uint8_t {
    kValue,       // a value next (after ':' or ',' in an array, or at the top)
    kArrayFirst,  // after '[': a value or ']'
    kObjectFirst, // after '{': a key or '}'
    kKey,         // after ',' in an object: a key
    kColon,       // after a key
    kAfter,       // after a value inside a container: ',' or its closing bracket
    kString,      // inside a string (key_ says which kind)
    kNumber,      // inside a number (num_ says where)
    kLiteral,     // inside true, false or null (lit_ and lit_pos_)
    kDone,        // after the top-level value
  };
  bool value_start(uint8_t c);
  bool end_value();  // a value ended: kAfter inside a container, kDone at the top
  bool close();      // the innermost container's closing bracket: it ended as a value
  bool space(uint8_t c);
  bool string_byte(uint8_t c);
  bool number_byte(uint8_t c);
  uint64_t stack_ = 0;  // bit i: container i is an object (1) or an array (0)
  uint8_t depth_ = 0;
  Mode mode_ = kValue;
  uint8_t spaces_ = 0;    // whitespace bytes in a row
  uint8_t esc_ = 0;       // in a string: 1 after '\', 2..5 hex digits of \u left + 1
  uint8_t sur_ = 0;       // in a \u escape: 1 its first digit was d, 2 it is a high surrogate
  bool want_low_ = false; // after a high surrogate's escape: a low one's must follow
  uint8_t utf8_ = 0;      // continuation bytes still due
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the next continuation byte's range
  uint8_t num_ = 0;       // number state (json_constraint.cc)
  uint8_t lit_ = 0, lit_pos_ = 0;
  bool key_ = false;      // the string is an object key
  bool object_only_ = true;
};

// The vocabulary as a trie of its tokens' bytes (Tokenizer::token_to_piece), built once per model
// and shared by every constrained request; special and control tokens (empty or unrendered
// pieces) are left out, end-of-generation tokens listed apart.
class VocabTrie {
 public:
  explicit VocabTrie(const Tokenizer& tok);
  int32_t n_vocab() const { return n_vocab_; }
  // Marks allowed[id] = 1 for every token whose bytes r accepts in full (allowed: n_vocab
  // entries, zeroed by the caller); returns how many.
  int allow(const JsonRecognizer& r, std::vector<uint8_t>& allowed) const;
  const std::vector<int32_t>& eog() const { return eog_; }
  const std::string& piece(int32_t id) const { return pieces_[id]; }

 private:
  struct Node {
    uint32_t first_child = 0;  // 0: none (the root is node 0 and never a child)
    uint32_t next_sibling = 0;
    uint32_t first_token = 0, n_tokens = 0;  // into tokens_
    uint8_t byte = 0;
  };
  int32_t n_vocab_ = 0;
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;  // the ids ending at each node, node by node
  std::vector<int32_t> eog_;
  std::vector<std::string> pieces_;
};

// A sampler's constraint (Sampler::set_constraint): which tokens may come next, and the chosen
// one, whose bytes move the recognizer on.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // allowed: resized to n_vocab, 1 for the tokens that may come next; returns how many. Throws
  // ct::Error when none may.
  virtual int allowed(std::vector<uint8_t>& allowed) = 0;
  virtual void accept(int32_t id) = 0;
};

// The json_object constraint: the answer is one JSON object, then an end-of-generation token.
class JsonObjectConstraint final : public TokenConstraint {
 public:
  explicit JsonObjectConstraint(std::shared_ptr<const VocabTrie> vocab)
      : vocab_(std::move(vocab)) {}
  int allowed(std::vector<uint8_t>& allowed) override;
  void accept(int32_t id) override;
  const JsonRecognizer& state() const { return r_; }
  int mask_walks() const { return walks_; }  // masks computed by a walk of the trie

 private:
  std::shared_ptr<const VocabTrie> vocab_;
  JsonRecognizer r_{true};
  // The masks of the last few states, most recent first: inside a string, or between an
  // object's members, the state repeats from token to token, and so does its mask.
  static constexpr size_t kMasks = 8;
  struct Mask {
    JsonRecognizer state;
    std::vector<uint8_t> allowed;
    int n = 0;
  };
  std::vector<Mask> masks_;
  int walks_ = 0;
};

}  // namespace ct
