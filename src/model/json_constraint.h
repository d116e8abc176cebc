// JSON-constrained decoding (OpenAI's `response_format`): a byte-level recognizer of JSON text
// (RFC 8259, UTF-8), optionally checked against a JSON Schema as it goes, and a token constraint
// that lets the sampler choose only tokens whose bytes continue a valid text, and an
// end-of-generation token only once the value is complete.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/json_pattern.h"

namespace ct {

class Tokenizer;

// What a recognizer tells a checker of the text's meaning as it goes (each call may refuse the
// byte by returning false): a value begins with byte c; the bytes of a scalar value (string,
// number, true/false/null) after its first, and its end; each byte of a string value that
// begins a character (string_char, after scalar_byte: not a UTF-8 continuation, not inside an
// escape, not the closing quote; a surrogate pair's two escapes begin one); an object key's opening quote, its raw
// bytes (escapes as written) and its closing quote; a comma or closing bracket of an object or
// array. This one checks nothing.
struct NoJsonEvents {
  bool value(uint8_t) { return true; }
  bool scalar_byte(uint8_t) { return true; }
  bool scalar_end() { return true; }
  bool string_char() { return true; }
  bool key_open() { return true; }
  bool key_byte(uint8_t) { return true; }
  bool key_close() { return true; }
  bool comma(bool) { return true; }
  bool close(bool) { return true; }
  bool can_end() const { return true; }
  bool operator==(const NoJsonEvents&) const = default;
};

// A pushdown recognizer of one JSON value: feed() takes the text byte by byte and refuses the
// first byte after which no continuation could be valid JSON; complete() says whether the text so
// far is a whole value. A value type copied freely to try continuations: 24 bytes with
// NoJsonEvents; with JsonSchemaEvents a few hundred, plus the text of a bounded number not yet
// settled (at most 1,024 bytes).
// A \u escape of a UTF-16 surrogate must be a high one followed by a low one's escape.
// Limits beyond RFC 8259 (a generator's, not a parser's): nesting depth at most kMaxDepth, and at
// most kMaxSpaces whitespace bytes in a row outside strings, so a constrained model cannot pad
// forever. Only an object at the top level with object_only. Ev (NoJsonEvents, JsonSchemaEvents)
// is told the text's structure and may refuse a byte; it is part of the state.
template <class Ev>
class BasicJsonRecognizer {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxSpaces = 32;
  explicit BasicJsonRecognizer(bool object_only = true, Ev ev = Ev());
  // Whether byte c may come next; if so, the state moves past it (else it is unchanged).
  bool feed(uint8_t c);
  bool feed(std::string_view s);  // every byte, stopping at the first refused one
  bool complete() const;
  // Whether the text is a whole value after which nothing but whitespace could follow.
  bool done() const { return mode_ == kDone; }
  // Equal states take the same bytes from here on (the constraint reuses a mask by it).
  bool operator==(const BasicJsonRecognizer&) const = default;
  const Ev& events() const { return ev_; }

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
  bool number_step(uint8_t c);
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
  [[no_unique_address]] Ev ev_;
};
using JsonRecognizer = BasicJsonRecognizer<NoJsonEvents>;

// An exact decimal, digits x 10^exp (digits without leading zeros; none: zero), in which a
// schema's numeric bounds (as the JSON parser read them: integers within 64 bits exactly, other
// numbers as doubles) and the number being read are compared: no rounding of the number,
// whatever its number of digits.
struct JsonDecimal {
  bool neg = false;
  std::string digits;
  int64_t exp = 0;
  bool operator==(const JsonDecimal&) const = default;
  // From JSON number text (sign, integer, fraction, exponent; the caller has checked its form).
  static JsonDecimal parse(std::string_view text);
};
int compare(const JsonDecimal& a, const JsonDecimal& b);  // < 0, 0 or > 0

// A JSON Schema compiled for the recognizer (OpenAI's response_format json_schema). The subset
// (docs/SERVER.md): type (one or a list), properties, required, additionalProperties (a bool or a
// schema; absent: any other key allowed, as JSON Schema says), items, prefixItems (tuples),
// minItems, maxItems, minLength, maxLength (in characters: Unicode code points), pattern (an
// ECMA-262 regular expression, a subset: json_pattern.h), format (date, time, date-time, duration,
// uuid, ipv4, ipv6, hostname, email, as patterns; binary and password: any string), minimum,
// maximum, exclusiveMinimum, exclusiveMaximum (compared exactly, in decimal; a number so bounded is
// written without exponent), enum, const, anyOf, oneOf, allOf of one schema, $ref to "#" or into
// "#/$defs" / "#/definitions" (recursion allowed), and the annotations (title, description,
// default, examples, OpenAPI's discriminator, ...). Any other keyword is refused by name: a schema
// the text would not be checked against must not pass silently. The recognizer decides which anyOf
// alternative a value follows by the value's first byte, so alternatives must differ in type (e.g.
// a string or null), except objects told apart by a tag (a required property with a const or enum
// whose values differ between them), which must then come first; oneOf is taken where its
// alternatives are so disjoint (then exactly one is at least one). Keys and enum/const values are
// matched as written in compact JSON (a key spelled with an escape it does not need is refused);
// integers are written without fraction or exponent. At most 64 properties per object, 4096 schema
// nodes, 128 levels of nesting (a $ref's target counts as nested where it is referred to).
class JsonSchema {
 public:
  // Throws ct::Error naming the keyword and its place (a JSON pointer) for what is not supported.
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::json& schema);

  // A value's kind, by its first byte.
  enum Kind : uint8_t { kObject, kArray, kString, kNumber, kTrue, kFalse, kNull, kKinds };
  static constexpr uint16_t kAny = 0;        // node 0: any value
  static constexpr uint16_t kNone = 0xFFFF;  // no node: the value is refused
  // Bounds on what compile() takes (a schema comes from a request): nodes (each schema object,
  // $ref and anyOf) and nesting of schema objects.
  static constexpr size_t kMaxNodes = 4096;
  static constexpr int kMaxNesting = 128;
  static constexpr size_t kMaxText = 65000;  // bytes of a property name or enum value
  static constexpr uint8_t kUnreachable = 255;
  struct Node {
    // The node a value of each kind follows (after anyOf and $ref): a leaf, kAny or kNone.
    uint16_t leaf[kKinds];
    bool integer = false;            // a number without fraction or exponent
    std::vector<std::string> names;  // properties: the keys as written, sorted (bytewise)
    std::vector<uint16_t> props;     // each name's node
    uint64_t required = 0;           // bit i: names[i] is required
    uint16_t additional = kAny;      // other keys' values; kNone: no other key
    uint16_t items = kAny;           // the elements after the prefix
    std::vector<uint16_t> prefix;    // prefixItems: element i's node, for i < prefix.size()
    uint32_t min_items = 0, max_items = UINT32_MAX;
    uint16_t element(uint32_t i) const { return i < prefix.size() ? prefix[i] : items; }
    // A string's length in characters (Unicode code points; an escape is one, a surrogate
    // pair's two escapes one). With enum or const, the values outside are left out instead.
    uint32_t min_length = 0, max_length = UINT32_MAX;
    // A string's pattern (or format), matched against its characters. With enum or const, the
    // values it refuses are left out instead.
    std::shared_ptr<const JsonPattern> pattern;
    // With a pattern and length bounds: pattern->completions(K), K = min(max_length,
    // min_length + positions), so that a character is taken only where the pattern can still
    // be completed within the bounds. Empty: no bounds beside the pattern.
    std::vector<JsonPattern::State> lengths;
    // Whether a pattern state s, after n characters, can still end in a match of a length
    // within the bounds.
    bool length_fits(const JsonPattern::State& s, uint32_t n) const;
    // A number's bounds (minimum / exclusiveMinimum, maximum / exclusiveMaximum, the tighter of
    // each pair); an integer node's rounded inward to integers, both then closed. With enum or
    // const, the values outside are left out instead.
    struct Bound {
      bool on = false;
      bool closed = true;  // the bound itself is allowed
      JsonDecimal at;
    };
    Bound min, max;
    bool bounded() const { return min.on || max.on; }
    std::vector<std::string> literals;  // enum / const as compact JSON, sorted; empty: none
    // A tagged union of objects (anyOf / oneOf alternatives that are all objects, told apart by
    // a required property whose enum / const values differ): the node's one property is the
    // tag, written first, whose node lists every alternative's values; branch[i] is the object
    // the value literals[i] of that node selects, branch_seen[i] the tag's bit there. Empty:
    // not a union.
    std::vector<uint16_t> branch;
    std::vector<uint64_t> branch_seen;
    // The fewest open objects and arrays (JsonSchemaEvents' frames) a value of this node needs
    // to be whole: of any of its kinds (need), of a leaf's object and array kinds; above
    // JsonSchemaEvents::kMaxFrames (kUnreachable at most): none fits, or no finite value exists
    // (a required property that contains itself).
    uint8_t need = 0, need_obj = 0, need_arr = 0;
  };
  const Node& node(uint16_t i) const { return nodes_[i]; }
  uint16_t root() const { return root_; }
  size_t size() const { return nodes_.size(); }

 private:
  friend class JsonSchemaCompiler;
  std::vector<Node> nodes_;
  uint16_t root_ = kAny;
};

// The events that check a text against a JsonSchema as the recognizer reads it: a stack of the
// open objects and arrays (the properties seen, the elements counted), and the key or scalar
// being read (the range of property names or enum values it may still be). A value the schema
// leaves free is followed by counting its brackets alone.
class JsonSchemaEvents {
 public:
  static constexpr int kMaxFrames = 20;  // open objects and arrays the schema constrains
  JsonSchemaEvents() = default;
  explicit JsonSchemaEvents(const JsonSchema* s) : s_(s) {}
  bool value(uint8_t c);
  bool scalar_byte(uint8_t c);
  bool scalar_end();
  bool string_char();
  bool key_open();
  bool key_byte(uint8_t c);
  bool key_close();
  bool comma(bool object);
  bool close(bool object);
  bool can_end() const;
  bool operator==(const JsonSchemaEvents&) const = default;

 private:
  struct Frame {
    uint16_t node = 0;   // an object or array leaf; kAny: a free value (count: its open brackets)
    uint16_t child = 0;  // an object's: the node of the value after the current key
    uint32_t count = 0;  // an array's elements so far
    uint64_t seen = 0;   // an object's properties so far
    bool operator==(const Frame&) const = default;
  };
  bool narrow(const std::vector<std::string>& v, uint8_t c);
  bool pattern_byte(const JsonSchema::Node& n, uint8_t c);
  // In the innermost object: the properties that may still come (unseen, and whose value fits
  // in the frames left), and whether another key may.
  uint64_t open_props(const Frame& f, const JsonSchema::Node& n) const;
  bool other_keys(const JsonSchema::Node& n) const;
  const JsonSchema* s_ = nullptr;
  Frame frames_[kMaxFrames];
  uint8_t depth_ = 0;
  uint32_t objects_ = 0;  // bit i: frame i is an object
  // The key or scalar being read: its leaf (kNone: none, or nothing to check), the bytes read
  // so far and the range [lo_, hi_) of names / literals that begin with them.
  uint16_t slot_ = JsonSchema::kNone;
  uint16_t pos_ = 0, lo_ = 0, hi_ = 0;
  bool key_escaped_ = false;  // the key being read has held a '\\' (it can only be a property's)
  bool length_ = false;       // the scalar being read is a string whose length slot_ bounds
  uint32_t chars_ = 0;        // its characters so far
  // A number whose value slot_ bounds: kOpenNumber, its text so far in num_ (at most
  // kMaxNumberText bytes); kSettledNumber, every value it can still reach is in bounds.
  static constexpr uint8_t kNoNumber = 0, kOpenNumber = 1, kSettledNumber = 2;
  static constexpr size_t kMaxNumberText = 1024;
  uint8_t number_ = kNoNumber;
  std::string num_;
  // A string whose pattern slot_ holds: the automaton's state after its last whole character,
  // and the character being read (an escape or a UTF-8 sequence): its bits so far, the hex
  // digits or continuation bytes still due, and esc_ (1 after a backslash, 2 in a \u escape).
  bool pattern_ = false;
  uint8_t esc_ = 0, cp_due_ = 0;
  uint32_t cp_ = 0;
  JsonPattern::State pat_;
};
using JsonSchemaRecognizer = BasicJsonRecognizer<JsonSchemaEvents>;

// The vocabulary as a trie of its tokens' bytes (Tokenizer::token_to_piece), built once per model
// and shared by every constrained request; special and control tokens (empty or unrendered
// pieces) are left out, end-of-generation tokens listed apart.
class VocabTrie {
 public:
  explicit VocabTrie(const Tokenizer& tok);
  int32_t n_vocab() const { return n_vocab_; }
  // Marks allowed[id] = 1 for every token whose bytes r accepts in full (allowed: n_vocab
  // entries, zeroed by the caller); returns how many.
  template <class R>
  int allow(const R& r, std::vector<uint8_t>& allowed) const;
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

// The JSON constraints: the answer is one JSON value (json_object: an object; json_schema: a
// value the schema accepts), then an end-of-generation token.
template <class Ev>
class JsonConstraint final : public TokenConstraint {
 public:
  using Recognizer = BasicJsonRecognizer<Ev>;
  // json_object: no schema; json_schema: its compiled schema.
  explicit JsonConstraint(std::shared_ptr<const VocabTrie> vocab,
                          std::shared_ptr<const JsonSchema> schema = nullptr);
  int allowed(std::vector<uint8_t>& allowed) override;
  void accept(int32_t id) override;
  const Recognizer& state() const { return r_; }
  int mask_walks() const { return walks_; }  // masks computed by a walk of the trie

 private:
  std::shared_ptr<const VocabTrie> vocab_;
  std::shared_ptr<const JsonSchema> schema_;  // what r_'s events point into
  Recognizer r_;
  bool ended_ = false;  // an end-of-generation token was accepted
  // The masks of the last few states, most recent first: inside a string, or between an
  // object's members, the state repeats from token to token, and so does its mask.
  static constexpr size_t kMasks = 8;
  struct Mask {
    Recognizer state;
    std::vector<uint8_t> allowed;
    int n = 0;
  };
  std::vector<Mask> masks_;
  int walks_ = 0;
};
using JsonObjectConstraint = JsonConstraint<NoJsonEvents>;
using JsonSchemaConstraint = JsonConstraint<JsonSchemaEvents>;

// The constraint a request's JSON output asks for: the schema's when there is one, else an
// object's (object: json_object); none when neither.
std::unique_ptr<TokenConstraint> make_json_constraint(std::shared_ptr<const VocabTrie> vocab,
                                                      bool object,
                                                      std::shared_ptr<const JsonSchema> schema);

}  // namespace ct
