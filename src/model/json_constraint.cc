#include "model/json_constraint.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "model/tokenizer.h"

namespace ct {

namespace {

bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Number states (JsonRecognizer::num_); the final ones may end the number.
enum : uint8_t {
  kMinus = 1,     // after '-': a digit
  kZero,          // a leading 0 (final)
  kInt,           // digits of the integer part (final)
  kDot,           // after '.': a digit
  kFrac,          // digits of the fraction (final)
  kExp,           // after 'e' or 'E': a sign or a digit
  kExpSign,       // after the exponent's sign: a digit
  kExpDigits,     // digits of the exponent (final)
};
bool number_final(uint8_t s) { return s == kZero || s == kInt || s == kFrac || s == kExpDigits; }

constexpr const char* kLiterals[] = {"true", "false", "null"};

}  // namespace

template <class Ev>
BasicJsonRecognizer<Ev>::BasicJsonRecognizer(bool object_only, Ev ev)
    : object_only_(object_only), ev_(ev) {}

template <class Ev>
bool BasicJsonRecognizer<Ev>::complete() const {
  return mode_ == kDone || (mode_ == kNumber && depth_ == 0 && number_final(num_) && ev_.can_end());
}

template <class Ev>
bool BasicJsonRecognizer<Ev>::feed(std::string_view s) {
  for (char c : s) {
    if (!feed((uint8_t)c)) return false;
  }
  return true;
}

template <class Ev>
bool BasicJsonRecognizer<Ev>::space(uint8_t c) {
  if (!is_space(c) || spaces_ >= kMaxSpaces) return false;
  ++spaces_;
  return true;
}

template <class Ev>
bool BasicJsonRecognizer<Ev>::end_value() {
  mode_ = depth_ == 0 ? kDone : kAfter;
  return true;
}

template <class Ev>
bool BasicJsonRecognizer<Ev>::close() {
  --depth_;
  stack_ &= ~(uint64_t(1) << depth_);  // no stale bit: equal states compare equal
  return end_value();
}

template <class Ev>
bool BasicJsonRecognizer<Ev>::value_start(uint8_t c) {
  if (is_space(c)) return space(c);
  if (object_only_ && depth_ == 0 && c != '{') return false;
  if ((c == '{' || c == '[') && depth_ >= kMaxDepth) return false;
  if (!is_digit(c) && std::string_view("{[\"-tfn").find((char)c) == std::string_view::npos)
    return false;
  if (!ev_.value(c)) return false;
  switch (c) {
    case '{':
    case '[':
      if (c == '{') {
        stack_ |= uint64_t(1) << depth_;
      } else {
        stack_ &= ~(uint64_t(1) << depth_);
      }
      ++depth_;
      mode_ = c == '{' ? kObjectFirst : kArrayFirst;
      return true;
    case '"':
      mode_ = kString;
      key_ = false;
      return true;
    case '-':
      mode_ = kNumber;
      num_ = kMinus;
      return true;
    case 't':
    case 'f':
    case 'n':
      mode_ = kLiteral;
      lit_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
      lit_pos_ = 1;
      return true;
    default:
      mode_ = kNumber;
      num_ = c == '0' ? kZero : kInt;
      return true;
  }
}

template <class Ev>
bool BasicJsonRecognizer<Ev>::string_byte(uint8_t c) {
  if (utf8_ > 0) {  // a continuation byte of a multi-byte character
    if (c < utf8_lo_ || c > utf8_hi_) return false;
    --utf8_;
    utf8_lo_ = 0x80;
    utf8_hi_ = 0xBF;
    return true;
  }
  if (esc_ == 1) {  // after '\'
    if (c == 'u') {
      esc_ = 5;
      return true;
    }
    if (want_low_ || (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' &&
                      c != 'r' && c != 't'))
      return false;
    esc_ = 0;
    return true;
  }
  if (esc_ >= 2) {  // esc_ - 1 hex digits of \u left; surrogates decided as early as possible
    if (!is_hex(c)) return false;
    const int digit = 5 - esc_;
    const int v = is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
    if (digit == 0) {
      if (want_low_ && v != 0xD) return false;
      sur_ = v == 0xD ? 1 : 0;
    } else if (digit == 1 && sur_ == 1) {
      if (want_low_ ? v < 0xC : v >= 0xC) return false;  // a low one only after a high one
      sur_ = v >= 0x8 && v < 0xC ? 2 : 0;
    }
    if (esc_ > 2) {
      --esc_;
      return true;
    }
    esc_ = 0;
    want_low_ = !want_low_ && sur_ == 2;
    sur_ = 0;
    return true;
  }
  if (want_low_) {  // the low surrogate's escape, nothing else
    if (c != '\\') return false;
    esc_ = 1;
    return true;
  }
  if (c == '"') {
    if (key_) {
      mode_ = kColon;
      return true;
    }
    return end_value();
  }
  if (c == '\\') {
    esc_ = 1;
    return true;
  }
  if (c < 0x20) return false;  // control characters must be escaped
  if (c < 0x80) return true;
  // A UTF-8 lead byte (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
  utf8_lo_ = 0x80;
  utf8_hi_ = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    utf8_ = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    utf8_ = 2;
    if (c == 0xE0) utf8_lo_ = 0xA0;
    if (c == 0xED) utf8_hi_ = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    utf8_ = 3;
    if (c == 0xF0) utf8_lo_ = 0x90;
    if (c == 0xF4) utf8_hi_ = 0x8F;
  } else {
    return false;
  }
  return true;
}

template <class Ev>
bool BasicJsonRecognizer<Ev>::number_byte(uint8_t c) {
  if (number_step(c)) return ev_.scalar_byte(c);
  if (!number_final(num_)) return false;
  // The number ended: c is the next byte after a value.
  num_ = 0;
  if (!ev_.scalar_end()) return false;
  end_value();
  return feed(c);
}

// The number's next state after c, if c continues it (else false, num_ unchanged).
template <class Ev>
bool BasicJsonRecognizer<Ev>::number_step(uint8_t c) {
  switch (num_) {
    case kMinus:
      if (!is_digit(c)) return false;
      num_ = c == '0' ? kZero : kInt;
      return true;
    case kDot:
      if (!is_digit(c)) return false;
      num_ = kFrac;
      return true;
    case kExp:
      if (c == '+' || c == '-') {
        num_ = kExpSign;
        return true;
      }
      if (!is_digit(c)) return false;
      num_ = kExpDigits;
      return true;
    case kExpSign:
      if (!is_digit(c)) return false;
      num_ = kExpDigits;
      return true;
    default:
      break;
  }
  // A final state: the number goes on, or ends and c is the next byte after a value.
  if (is_digit(c) && num_ != kZero) return true;  // kInt, kFrac, kExpDigits
  if (c == '.' && (num_ == kZero || num_ == kInt)) {
    num_ = kDot;
    return true;
  }
  if ((c == 'e' || c == 'E') && num_ != kExpDigits) {
    num_ = kExp;
    return true;
  }
  return false;
}

template <class Ev>
bool BasicJsonRecognizer<Ev>::feed(uint8_t c) {
  const BasicJsonRecognizer before = *this;
  bool ok = false;
  const bool counts_space = mode_ != kString && mode_ != kNumber && mode_ != kLiteral;
  if (!counts_space || !is_space(c)) spaces_ = 0;
  const bool top_object = depth_ > 0 && ((stack_ >> (depth_ - 1)) & 1);
  switch (mode_) {
    case kValue:
      ok = value_start(c);
      break;
    case kArrayFirst:
      if (c == ']') {
        ok = ev_.close(false) && close();
      } else {
        ok = value_start(c);
      }
      break;
    case kObjectFirst:
    case kKey:
      if (c == '"') {
        mode_ = kString;
        key_ = true;
        ok = ev_.key_open();
      } else if (c == '}' && mode_ == kObjectFirst) {
        ok = ev_.close(true) && close();
      } else {
        ok = space(c);
      }
      break;
    case kColon:
      if (c == ':') {
        mode_ = kValue;
        ok = true;
      } else {
        ok = space(c);
      }
      break;
    case kAfter:
      if (c == ',') {
        mode_ = top_object ? kKey : kValue;
        ok = ev_.comma(top_object);
      } else if (c == (top_object ? '}' : ']')) {
        ok = ev_.close(top_object) && close();
      } else {
        ok = space(c);
      }
      break;
    case kString: {
      const bool key = key_;
      // c begins a character: not a continuation byte, not inside an escape or between a
      // surrogate pair's escapes, not the closing quote.
      const bool begins = utf8_ == 0 && esc_ == 0 && !want_low_ && c != '"';
      ok = string_byte(c);
      if (ok) {
        const bool closed = mode_ != kString;
        if (key) {
          ok = closed ? ev_.key_close() : ev_.key_byte(c);
        } else {
          ok = ev_.scalar_byte(c) && (!begins || ev_.string_char()) &&
               (!closed || ev_.scalar_end());
        }
      }
      break;
    }
    case kNumber:
      ok = number_byte(c);
      break;
    case kLiteral: {
      const char* lit = kLiterals[lit_];
      ok = c == (uint8_t)lit[lit_pos_] && ev_.scalar_byte(c);
      if (ok && lit[++lit_pos_] == '\0') ok = ev_.scalar_end() && end_value();
      break;
    }
    case kDone:
      ok = space(c);
      break;
  }
  if (!ok) *this = before;
  return ok;
}

VocabTrie::VocabTrie(const Tokenizer& tok) : n_vocab_(tok.n_vocab()) {
  pieces_.resize(n_vocab_);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < n_vocab_; ++id) {
    if (tok.is_eog(id)) {
      eog_.push_back(id);
      continue;
    }
    pieces_[id] = tok.token_to_piece(id);
    if (!pieces_[id].empty()) ids.push_back(id);
  }
  // Sorted by piece, each token shares its path with the one before as far as their common
  // prefix goes: the trie is built by appending, children in byte order.
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return pieces_[a] != pieces_[b] ? pieces_[a] < pieces_[b] : a < b;
  });
  nodes_.push_back(Node{});
  std::vector<uint32_t> path = {0};  // path[i]: the node of the previous piece's first i bytes
  std::vector<uint32_t> last_child(1, 0);  // per node, its last child (appending siblings)
  const std::string* prev = nullptr;
  for (int32_t id : ids) {
    const std::string& s = pieces_[id];
    size_t common = 0;
    if (prev) {
      while (common < s.size() && common < prev->size() && s[common] == (*prev)[common]) ++common;
    }
    path.resize(common + 1);
    for (size_t i = common; i < s.size(); ++i) {
      const uint32_t parent = path.back(), child = (uint32_t)nodes_.size();
      Node n;
      n.byte = (uint8_t)s[i];
      nodes_.push_back(n);
      last_child.push_back(0);
      if (last_child[parent] == 0) {
        nodes_[parent].first_child = child;
      } else {
        nodes_[last_child[parent]].next_sibling = child;
      }
      last_child[parent] = child;
      path.push_back(child);
    }
    Node& end = nodes_[path.back()];
    if (end.n_tokens == 0) end.first_token = (uint32_t)tokens_.size();
    tokens_.push_back(id);  // a piece equal to the previous one ends at the same node, next to it
    ++end.n_tokens;
    prev = &s;
  }
}

template <class R>
int VocabTrie::allow(const R& r, std::vector<uint8_t>& allowed) const {
  int n = 0;
  // Depth first, each node's recognizer state on the stack; a refused byte prunes its subtree.
  struct Frame {
    uint32_t node;
    R state;
  };
  std::vector<Frame> stack;
  stack.reserve(256);
  for (uint32_t c = nodes_[0].first_child; c != 0; c = nodes_[c].next_sibling)
    stack.push_back({c, r});
  while (!stack.empty()) {
    Frame f = stack.back();
    stack.pop_back();
    const Node& node = nodes_[f.node];
    if (!f.state.feed(node.byte)) continue;
    for (uint32_t t = 0; t < node.n_tokens; ++t) {
      allowed[tokens_[node.first_token + t]] = 1;
      ++n;
    }
    for (uint32_t c = node.first_child; c != 0; c = nodes_[c].next_sibling)
      stack.push_back({c, f.state});
  }
  return n;
}

template <class Ev>
JsonConstraint<Ev>::JsonConstraint(std::shared_ptr<const VocabTrie> vocab,
                                   std::shared_ptr<const JsonSchema> schema)
    : vocab_(std::move(vocab)), schema_(std::move(schema)) {
  if constexpr (std::is_same_v<Ev, NoJsonEvents>) {
    CT_THROW_IF_NOT(!schema_, "JSON output: a schema needs JsonSchemaConstraint");
    r_ = Recognizer(true);
  } else {
    CT_THROW_IF_NOT(schema_ != nullptr, "JSON output: JsonSchemaConstraint without a schema");
    r_ = Recognizer(false, Ev(schema_.get()));
  }
}

template <class Ev>
int JsonConstraint<Ev>::allowed(std::vector<uint8_t>& allowed) {
  CT_THROW_IF_NOT(!ended_, "JSON output: the answer has ended");
  if (r_.done()) {  // the value is whole: the answer ends
    CT_THROW_IF_NOT(!vocab_->eog().empty(),
                    "JSON output: the value is complete but the vocabulary has no "
                    "end-of-generation token to end the answer with");
    allowed.assign(vocab_->n_vocab(), 0);
    for (int32_t id : vocab_->eog()) allowed[id] = 1;
    return (int)vocab_->eog().size();
  }
  for (size_t i = 0; i < masks_.size(); ++i) {
    if (masks_[i].state == r_) {
      allowed = masks_[i].allowed;
      std::rotate(masks_.begin(), masks_.begin() + i, masks_.begin() + i + 1);
      return masks_.front().n;
    }
  }
  allowed.assign(vocab_->n_vocab(), 0);
  int n = vocab_->allow(r_, allowed);
  if (r_.complete()) {  // a top-level number may end here or go on
    for (int32_t id : vocab_->eog()) {
      if (!allowed[id]) ++n;
      allowed[id] = 1;
    }
  }
  CT_THROW_IF_NOT(n > 0, "JSON output: no token of the vocabulary continues the JSON text");
  ++walks_;
  if (masks_.size() < kMasks) masks_.emplace_back();
  std::rotate(masks_.begin(), masks_.end() - 1, masks_.end());  // the oldest to the front
  masks_.front() = {r_, allowed, n};
  return n;
}

template <class Ev>
void JsonConstraint<Ev>::accept(int32_t id) {
  CT_THROW_IF_NOT(id >= 0 && id < vocab_->n_vocab(), "JSON output: token {} of a {}-token vocabulary",
                  id, vocab_->n_vocab());
  const auto& eog = vocab_->eog();
  if (std::find(eog.begin(), eog.end(), id) != eog.end()) {
    CT_THROW_IF_NOT(r_.complete(), "JSON output: end-of-generation token {} before the value is whole",
                    id);
    ended_ = true;
    return;
  }
  CT_THROW_IF_NOT(r_.feed(vocab_->piece(id)),
                  "JSON output: token {} ('{}') does not continue the JSON text", id,
                  vocab_->piece(id));
}

std::unique_ptr<TokenConstraint> make_json_constraint(std::shared_ptr<const VocabTrie> vocab,
                                                      bool object,
                                                      std::shared_ptr<const JsonSchema> schema) {
  if (schema) return std::make_unique<JsonSchemaConstraint>(std::move(vocab), std::move(schema));
  if (object) return std::make_unique<JsonObjectConstraint>(std::move(vocab));
  return nullptr;
}

template class BasicJsonRecognizer<NoJsonEvents>;
template class BasicJsonRecognizer<JsonSchemaEvents>;
template class JsonConstraint<NoJsonEvents>;
template class JsonConstraint<JsonSchemaEvents>;
template int VocabTrie::allow(const JsonRecognizer&, std::vector<uint8_t>&) const;
template int VocabTrie::allow(const JsonSchemaRecognizer&, std::vector<uint8_t>&) const;

}  // namespace ct
