// JSON Schema for constrained output: the compiler (JsonSchema::compile) and the events that
// check a text against the compiled schema as the recognizer reads it (json_constraint.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/json_constraint.h"

namespace ct {

using json = nlohmann::json;

namespace {

constexpr const char* kKindNames[JsonSchema::kKinds] = {"an object", "an array", "a string",
                                                        "a number",  "true",     "false",
                                                        "null"};

// Keywords that only describe: they constrain nothing, so any schema may carry them.
bool is_annotation(const std::string& k) {
  static const char* const kNames[] = {"title",        "description", "default",  "examples",
                                       "$schema",      "$id",         "$comment", "deprecated",
                                       "readOnly",     "writeOnly",   "$defs",    "definitions",
                                       "discriminator"};  // OpenAPI's hint beside oneOf
  return std::find_if(std::begin(kNames), std::end(kNames),
                      [&](const char* n) { return k == n; }) != std::end(kNames);
}

bool is_supported(const std::string& k) {
  static const char* const kNames[] = {"type",
                                       "properties",
                                       "required",
                                       "additionalProperties",
                                       "items",
                                       "prefixItems",
                                       "minItems",
                                       "maxItems",
                                       "minLength",
                                       "maxLength",
                                       "minimum",
                                       "maximum",
                                       "exclusiveMinimum",
                                       "exclusiveMaximum",
                                       "enum",
                                       "const",
                                       "anyOf",
                                       "oneOf",
                                       "allOf",
                                       "$ref",
                                       "pattern",
                                       "format"};
  return std::find_if(std::begin(kNames), std::end(kNames),
                      [&](const char* n) { return k == n; }) != std::end(kNames);
}

std::string pointer_token(const std::string& s) {  // RFC 6901
  std::string out;
  for (char c : s) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

// Error messages quote parts of the schema: a key or pointer from a request may be megabytes.
std::string shorten(const std::string& s, size_t max = 120) {
  if (s.size() <= max) return s;
  while (max > 0 && ((uint8_t)s[max] & 0xC0) == 0x80) --max;  // where a UTF-8 character begins
  return s.substr(0, max) + "...";
}

// A child's JSON pointer for messages, bounded (every node keeps its own).
std::string child_path(const std::string& parent, const std::string& tail) {
  if (parent.size() >= 200) return parent;  // already cut: "..." ends it
  return shorten(parent + tail, 200);
}

// A value's kind by its first byte (JsonSchema::kKinds: none).
uint8_t kind_of(uint8_t c) {
  switch (c) {
    case '{': return JsonSchema::kObject;
    case '[': return JsonSchema::kArray;
    case '"': return JsonSchema::kString;
    case 't': return JsonSchema::kTrue;
    case 'f': return JsonSchema::kFalse;
    case 'n': return JsonSchema::kNull;
    default: return c == '-' || (c >= '0' && c <= '9') ? JsonSchema::kNumber : JsonSchema::kKinds;
  }
}

// Decimal magnitudes as digit strings: one more (carrying), one less (borrowing; d > 0), and a
// decimal's form with its leading zeros dropped.
std::string plus_one(std::string d) {
  int i = (int)d.size() - 1;
  for (; i >= 0 && d[i] == '9'; --i) d[i] = '0';
  if (i < 0) return "1" + d;
  ++d[i];
  return d;
}
std::string minus_one(std::string d) {
  int i = (int)d.size() - 1;
  for (; d[i] == '0'; --i) d[i] = '9';
  --d[i];
  return d;
}
JsonDecimal normal(bool neg, std::string digits, int64_t exp) {
  const size_t nz = digits.find_first_not_of('0');
  digits.erase(0, nz == std::string::npos ? digits.size() : nz);
  return JsonDecimal{neg && !digits.empty(), std::move(digits), exp};
}
JsonDecimal negated(const JsonDecimal& d) { return normal(!d.neg, d.digits, d.exp); }

// The integers next to d: the largest not above it (floor) or the smallest not below (ceil).
JsonDecimal to_integer(const JsonDecimal& d, bool up) {
  std::string m = d.exp >= 0 ? d.digits + std::string(d.exp, '0') : d.digits;
  bool frac = false;  // a nonzero fraction was cut
  if (d.exp < 0) {
    const size_t cut = (size_t)std::min<int64_t>(-d.exp, (int64_t)m.size());
    frac = m.find_first_not_of('0', m.size() - cut) != std::string::npos;
    m.erase(m.size() - cut);
  }
  // Truncation moves toward zero: away from it when rounding up a positive, down a negative.
  if (frac && up != d.neg) m = plus_one(m);
  return normal(d.neg, m, 0);
}
// An integer plus or minus one.
JsonDecimal step(const JsonDecimal& d, int delta) {
  if (d.digits.empty()) return JsonDecimal{delta < 0, "1", 0};
  const bool away = (delta > 0) != d.neg;  // the magnitude grows
  return normal(d.neg, away ? plus_one(d.digits) : minus_one(d.digits), 0);
}

bool above(const JsonDecimal& v, const JsonSchema::Node::Bound& lo) {
  const int c = compare(v, lo.at);
  return !lo.on || c > 0 || (c == 0 && lo.closed);
}
bool below(const JsonDecimal& v, const JsonSchema::Node::Bound& hi) {
  const int c = compare(v, hi.at);
  return !hi.on || c < 0 || (c == 0 && hi.closed);
}

// Whether [a, b) (b null: unbounded) holds a value inside [lo, hi]: the larger lower end below
// the smaller upper one, or equal to it with both ends included. Neither end of a nonempty meet
// needs more digits than it has, so some text reaches it.
bool meets(const JsonDecimal& a, const JsonDecimal* b, const JsonSchema::Node::Bound& lo,
           const JsonSchema::Node::Bound& hi) {
  const JsonDecimal* l = &a;
  bool l_closed = true;
  if (lo.on) {
    const int c = compare(lo.at, a);
    if (c >= 0) {
      l = &lo.at;
      l_closed = lo.closed;
    }
  }
  const JsonDecimal* u = b;
  bool u_closed = false;
  if (hi.on && (u == nullptr || compare(hi.at, *u) < 0)) {
    u = &hi.at;
    u_closed = hi.closed;
  }
  if (u == nullptr) return true;
  const int c = compare(*l, *u);
  return c < 0 || (c == 0 && l_closed && u_closed);
}

// Where a number that begins with `text` (a prefix of a number without exponent) stands
// against n's bounds: kOut, no value it can still reach is in bounds; kIn, some is; kSettled,
// every one is (the rest of the number needs no check). Its magnitude's reachable values: after
// the point with fraction digits F, [I.F, I.F + 10^-|F|); "0", [0, 1); integer digits I,
// [I 10^m, (I + 1) 10^m) for every m >= 0; a sign alone, [0, inf). A negative number mirrors the
// bounds. (For an integer node the same ranges hold its integers, its bounds being integers.)
enum Reach { kOut, kIn, kSettled };
Reach reach(std::string_view text, const JsonSchema::Node& n) {
  JsonSchema::Node::Bound lo = n.min, hi = n.max;
  if (!text.empty() && text[0] == '-') {
    text.remove_prefix(1);
    lo = {n.max.on, n.max.closed, negated(n.max.at)};
    hi = {n.min.on, n.min.closed, negated(n.min.at)};
  }
  // One range [a, b) (b null: unbounded): whether it meets the bounds, or lies inside them.
  auto range = [&](const JsonDecimal& a, const JsonDecimal* b) {
    if (above(a, lo) && (b == nullptr ? !hi.on : !hi.on || compare(*b, hi.at) <= 0)) return kSettled;
    return meets(a, b, lo, hi) ? kIn : kOut;
  };
  const JsonDecimal zero;
  if (text.empty()) return range(zero, nullptr);
  const size_t dot = text.find('.');
  const std::string ip(text.substr(0, dot));
  if (dot != std::string_view::npos) {
    const std::string digits = ip + std::string(text.substr(dot + 1));
    const int64_t exp = -(int64_t)(text.size() - dot - 1);
    const JsonDecimal a = normal(false, digits, exp), b = normal(false, plus_one(digits), exp);
    return range(a, &b);
  }
  if (ip == "0") {
    const JsonDecimal one{false, "1", 0};
    return range(zero, &one);
  }
  JsonDecimal a = normal(false, ip, 0), b = normal(false, plus_one(ip), 0);
  if (!hi.on) return above(a, lo) ? kSettled : kIn;  // some m puts the range above any minimum
  // No range below the lower bound's place can reach it: start at the first that may (a few
  // steps then decide, however far apart the bounds are).
  if (lo.on && !lo.at.neg && !lo.at.digits.empty()) {
    const int64_t place = (int64_t)lo.at.digits.size() + lo.at.exp - (int64_t)b.digits.size();
    a.exp = b.exp = std::max<int64_t>(0, place);
  }
  for (;; ++a.exp, ++b.exp) {
    if (meets(a, &b, lo, hi)) return kIn;
    if (compare(a, hi.at) > 0) return kOut;  // every later range lies higher still
  }
}

bool in_bounds(const JsonDecimal& v, const JsonSchema::Node& n) {
  return above(v, n.min) && below(v, n.max);
}

}  // namespace

// Two passes: build() turns each schema object into a node (a leaf, a $ref or an anyOf), then
// resolve() gives every node its table of leaves by kind, refusing anyOf alternatives that admit
// the same kind and $ref / anyOf cycles that never reach a value.
class JsonSchemaCompiler {
 public:
  explicit JsonSchemaCompiler(const json& doc) : doc_(doc) {}

  std::shared_ptr<const JsonSchema> run() {
    add(kLeaf, "#");  // node 0: any value
    raw_[0].kinds = (1u << JsonSchema::kKinds) - 1;
    const uint16_t root = build(doc_, "#");
    for (uint16_t i = 0; i < raw_.size(); ++i) resolve(i);
    frames_needed();
    if (out_[root].need > JsonSchemaEvents::kMaxFrames)
      fail("#", "no document fits: it would need objects and arrays nested more than " +
                    std::to_string(JsonSchemaEvents::kMaxFrames) +
                    " deep, or no finite document exists (a required property or array element "
                    "that must contain itself)");
    auto s = std::make_shared<JsonSchema>();
    s->nodes_ = std::move(out_);
    s->root_ = root;
    return s;
  }

 private:
  enum Type : uint8_t { kLeaf, kRef, kUnion };
  struct Raw {
    Type type = kLeaf;
    uint8_t kinds = 0;              // a leaf's kinds
    std::vector<uint16_t> alts;     // an anyOf's (oneOf's) alternatives
    bool one_of = false;
    uint16_t target = 0;            // a $ref's node
    std::string path;
    int state = 0;                  // resolve(): 0 not yet, 1 under way, 2 done
  };

  uint16_t add(Type t, const std::string& path) {
    CT_THROW_IF_NOT(raw_.size() < JsonSchema::kMaxNodes,
                    "json_schema at {}: more than {} schema nodes", path, JsonSchema::kMaxNodes);
    raw_.push_back(Raw{t, 0, {}, false, 0, path, 0});
    out_.emplace_back();
    std::fill(std::begin(out_.back().leaf), std::end(out_.back().leaf), JsonSchema::kNone);
    return (uint16_t)(raw_.size() - 1);
  }

  [[noreturn]] static void fail(const std::string& path, const std::string& what) {
    CT_THROW("json_schema at {}: {}", path, what);
  }

  uint16_t build(const json& s, const std::string& path) {
    // Bounded: a hostile schema nested a million deep must not exhaust the stack.
    if (++depth_ > JsonSchema::kMaxNesting)
      fail(path, "nested more than " + std::to_string(JsonSchema::kMaxNesting) + " deep");
    const uint16_t id = build_node(s, path);
    --depth_;
    return id;
  }

  uint16_t build_node(const json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(path, "the schema false admits no value");
      return JsonSchema::kAny;
    }
    if (!s.is_object()) fail(path, "a schema is an object or a boolean, not " + std::string(s.type_name()));
    if (&s != &doc_ && s.contains("$id"))  // the root's own (also when "#" refers to it) is fine
      fail(path, "$id inside a schema is not supported (a $ref would resolve against the root)");
    size_t constraints = 0;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (is_annotation(it.key())) continue;
      if (!is_supported(it.key()))
        fail(path,
             "keyword '" + shorten(it.key()) +
                 "' is not supported (supported: type, properties, required, "
                 "additionalProperties, items, prefixItems, minItems, maxItems, minLength, "
                 "maxLength, "
                 "pattern, format, minimum, maximum, exclusiveMinimum, exclusiveMaximum, "
                 "enum, const, anyOf, oneOf, allOf of one schema, $ref, and annotations such as "
                 "title and "
                 "description)");
      ++constraints;
    }
    if (s.contains("$ref")) {
      if (constraints > 1) fail(path, "$ref beside other constraining keywords is not supported");
      return ref(s["$ref"], path);
    }
    if (s.contains("allOf")) {
      // One schema (what generators write to give a $ref a description): that schema. Several
      // would need the intersection of their constraints.
      const json& a = s["allOf"];
      if (constraints > 1) fail(path, "allOf beside other constraining keywords is not supported");
      if (!a.is_array() || a.size() != 1)
        fail(path,
             "allOf is supported with exactly one schema (an intersection of several is not)");
      return build(a[0], child_path(path, "/allOf/0"));
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      const std::string key = k;
      if (constraints > 1) fail(path, key + " beside other constraining keywords is not supported");
      const json& a = s[k];
      if (!a.is_array() || a.empty()) fail(path, key + " must be a non-empty array");
      const uint16_t id = add(kUnion, path);
      raw_[id].one_of = key == "oneOf";
      for (size_t i = 0; i < a.size(); ++i) {
        const uint16_t alt = build(a[i], child_path(path, "/" + key + "/" + std::to_string(i)));
        raw_[id].alts.push_back(alt);
      }
      return id;
    }
    return leaf(s, path);
  }

  uint16_t leaf(const json& s, const std::string& path) {
    const uint16_t id = add(kLeaf, path);
    uint8_t kinds = (1u << JsonSchema::kKinds) - 1;
    bool integer = false;
    if (s.contains("type")) {
      const json& t = s["type"];
      std::vector<std::string> types;
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty() &&
                 std::all_of(t.begin(), t.end(), [](const json& x) { return x.is_string(); })) {
        for (const auto& x : t) types.push_back(x.get<std::string>());
      } else {
        fail(child_path(path, "/type"), "type must be a type name or a non-empty array of them");
      }
      kinds = 0;
      bool number = false;
      for (const auto& n : types) {
        if (n == "object") {
          kinds |= 1u << JsonSchema::kObject;
        } else if (n == "array") {
          kinds |= 1u << JsonSchema::kArray;
        } else if (n == "string") {
          kinds |= 1u << JsonSchema::kString;
        } else if (n == "number" || n == "integer") {
          kinds |= 1u << JsonSchema::kNumber;
          (n == "number" ? number : integer) = true;
        } else if (n == "boolean") {
          kinds |= (1u << JsonSchema::kTrue) | (1u << JsonSchema::kFalse);
        } else if (n == "null") {
          kinds |= 1u << JsonSchema::kNull;
        } else {
          fail(child_path(path, "/type"), "unknown type '" + shorten(n) +
                                   "' (object, array, string, number, integer, boolean, null)");
        }
      }
      integer = integer && !number;
    }
    // The node's fields are set through its index: build() below may grow out_.
    out_[id].integer = integer;
    if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      out_[id].additional = a.is_boolean() && !a.get<bool>()
                                ? JsonSchema::kNone
                                : build(a, child_path(path, "/additionalProperties"));
    }
    std::map<std::string, uint16_t> props;  // by the key as written in compact JSON
    if (s.contains("properties")) {
      const json& p = s["properties"];
      if (!p.is_object()) fail(child_path(path, "/properties"), "properties must be an object");
      if (p.size() > 64) fail(child_path(path, "/properties"), "more than 64 properties");
      for (auto it = p.begin(); it != p.end(); ++it) {
        const std::string written = json(it.key()).dump();
        if (written.size() - 2 > JsonSchema::kMaxText)
          fail(child_path(path, "/properties"),
               "a property name longer than " + std::to_string(JsonSchema::kMaxText) + " bytes");
        props[written.substr(1, written.size() - 2)] =
            build(it.value(), child_path(path, "/properties/" + pointer_token(it.key())));
      }
    }
    std::vector<std::string> required;
    if (s.contains("required")) {
      const json& r = s["required"];
      if (!r.is_array() ||
          !std::all_of(r.begin(), r.end(), [](const json& x) { return x.is_string(); }))
        fail(child_path(path, "/required"), "required must be an array of property names");
      for (const auto& x : r) {
        const std::string written = json(x.get<std::string>()).dump();
        if (written.size() - 2 > JsonSchema::kMaxText)
          fail(child_path(path, "/required"),
               "a property name longer than " + std::to_string(JsonSchema::kMaxText) + " bytes");
        required.push_back(written.substr(1, written.size() - 2));
        if (!props.count(required.back())) {
          if (out_[id].additional == JsonSchema::kNone)
            fail(child_path(path, "/required"), "'" + shorten(x.get<std::string>()) +
                                         "' is required but is not among the properties, and "
                                         "additionalProperties is false");
          props[required.back()] = out_[id].additional;
        }
      }
    }
    if (props.size() > 64) fail(child_path(path, "/properties"), "more than 64 properties");
    for (const auto& [name, node] : props) {  // sorted bytewise (std::string's order)
      if (std::find(required.begin(), required.end(), name) != required.end())
        out_[id].required |= uint64_t(1) << out_[id].names.size();
      out_[id].names.push_back(name);
      out_[id].props.push_back(node);
    }
    {
      JsonSchema::Node& n = out_[id];  // (build() below may grow out_)
      for (auto [k, field] : {std::pair{"minItems", &n.min_items}, {"maxItems", &n.max_items},
                              {"minLength", &n.min_length}, {"maxLength", &n.max_length}}) {
        if (!s.contains(k)) continue;
        const json& v = s[k];
        // An integer, or a number with an integer's value (JSON Schema: 2.0 is an integer).
        const double d = v.is_number() ? v.get<double>() : -1.0;
        if (!(d >= 0 && d <= UINT32_MAX && d == (double)(uint64_t)d))
          fail(child_path(path, std::string("/") + k),
               std::string(k) + " must be an integer from 0 to 4294967295");
        *field = (uint32_t)d;
      }
      // Bounds no string (number) meets leave that kind out; a schema left with no kind fails.
      const uint8_t strings = 1u << JsonSchema::kString, numbers = 1u << JsonSchema::kNumber;
      if (n.min_length > n.max_length) {
        if ((kinds & ~strings) == 0)
          fail(path, "minLength " + std::to_string(n.min_length) + " is above maxLength " +
                         std::to_string(n.max_length));
        kinds &= ~strings;
      }
      if (!string_pattern(s, path, n, (kinds & strings) != 0)) {
        if ((kinds & ~strings) == 0)
          fail(path, n.min_length > 0 || n.max_length < UINT32_MAX
                         ? "the pattern matches no string of a length from minLength to maxLength"
                         : "the pattern matches no string");
        kinds &= ~strings;
      }
      if (!number_bounds(s, path, n, integer)) {
        if ((kinds & ~numbers) == 0)
          fail(path, std::string("no ") + (integer ? "integer" : "number") +
                         " lies between the minimum and the maximum");
        kinds &= ~numbers;
      }
    }
    // prefixItems (a tuple: element i follows prefixItems[i]) and items (every element after
    // them; false: none).
    size_t n_prefix = 0;
    if (s.contains("prefixItems")) {
      const json& pi = s["prefixItems"];
      if (!pi.is_array() || pi.empty())
        fail(child_path(path, "/prefixItems"), "prefixItems must be a non-empty array of schemas");
      if (pi.size() > 64) fail(child_path(path, "/prefixItems"), "more than 64 prefixItems");
      n_prefix = pi.size();
      for (size_t i = 0; i < pi.size(); ++i) {
        const uint16_t e = build(pi[i], child_path(path, "/prefixItems/" + std::to_string(i)));
        out_[id].prefix.push_back(e);  // (build() may grow out_)
      }
    }
    if (s.contains("items")) {
      const json& it = s["items"];
      if (it.is_boolean() && !it.get<bool>()) {
        // No element after the prefix, whatever maxItems says.
        out_[id].max_items = std::min<uint32_t>(out_[id].max_items, (uint32_t)n_prefix);
      } else {
        if (it.is_array())
          fail(child_path(path, "/items"),
               "items as an array (draft 4's tuple form) is not "
               "supported; write prefixItems");
        out_[id].items = build(it, child_path(path, "/items"));
      }
    }
    if (out_[id].min_items > out_[id].max_items)
      fail(path, "minItems " + std::to_string(out_[id].min_items) + " is above maxItems " +
                     std::to_string(out_[id].max_items));
    if (s.contains("enum") || s.contains("const")) {
      if (s.contains("enum") && s.contains("const")) fail(path, "enum beside const is not supported");
      // Read in place: copying a value nested a million deep would recurse that deep.
      std::vector<const json*> values;
      if (s.contains("const")) {
        values.push_back(&s["const"]);
      } else {
        const json& e = s["enum"];
        if (!e.is_array() || e.empty())
          fail(child_path(path, "/enum"), "enum must be a non-empty array");
        for (const json& v : e) values.push_back(&v);
      }
      uint8_t lit_kinds = 0;
      for (const json* vp : values) {
        const json& v = *vp;
        if (v.is_object() || v.is_array())
          fail(path, "enum or const values that are objects or arrays are not supported");
        const std::string text = v.dump();
        if (text.size() > JsonSchema::kMaxText)
          fail(path, "an enum or const value longer than " + std::to_string(JsonSchema::kMaxText) +
                         " bytes");
        const uint8_t k = kind_of((uint8_t)text[0]);
        // A value the type or the length bounds refuse can never be valid: left out.
        if (!((kinds >> k) & 1) || (integer && !v.is_number_integer())) continue;
        if (v.is_string()) {
          uint64_t chars = 0;  // code points: the bytes that begin a UTF-8 character
          for (unsigned char c : v.get_ref<const std::string&>()) chars += (c & 0xC0) != 0x80;
          if (chars < out_[id].min_length || chars > out_[id].max_length) continue;
          if (out_[id].pattern && !out_[id].pattern->matches(v.get_ref<const std::string&>()))
            continue;
        }
        if (v.is_number() && !in_bounds(JsonDecimal::parse(text), out_[id])) continue;
        lit_kinds |= 1u << k;
        out_[id].literals.push_back(text);
      }
      if (out_[id].literals.empty())
        fail(path, "no enum or const value has the schema's type (and bounds, and pattern)");
      CT_THROW_IF_NOT(out_[id].literals.size() < JsonSchema::kNone,
                      "json_schema at {}: more than {} enum values", path, JsonSchema::kNone - 1);
      std::sort(out_[id].literals.begin(), out_[id].literals.end());
      out_[id].literals.erase(std::unique(out_[id].literals.begin(), out_[id].literals.end()),
                              out_[id].literals.end());
      kinds = lit_kinds;
    }
    raw_[id].kinds = kinds;
    return id;
  }

  // pattern, or format as the pattern JsonPattern::format_pattern gives it; both constrain
  // strings only, so on a node whose type has no string they are not read (as JSON Schema says;
  // OpenAPI's {"type": "integer", "format": "int64"} passes). Beside the length bounds the
  // node keeps the lengths in which each position can complete a match (Node::lengths), so
  // that a character is taken only where a match within the bounds can still follow (else a
  // pattern could need a length they forbid and strand the sampler). Returns false when the
  // pattern matches no string (of a length within the bounds).
  bool string_pattern(const json& s, const std::string& path, JsonSchema::Node& n, bool strings) {
    if (!s.contains("pattern") && !s.contains("format")) return true;
    if (s.contains("pattern") && s.contains("format"))
      fail(path, "pattern beside format is not supported");
    const std::string k = s.contains("pattern") ? "pattern" : "format";
    const std::string at = child_path(path, "/" + k);
    if (!s[k].is_string()) fail(at, k + " must be a string");
    if (!strings) return true;
    std::string re = s[k].get<std::string>();
    if (k == "format") {
      // OpenAPI's binary and password (pydantic's bytes and SecretStr) admit every string.
      if (re == "binary" || re == "password") return true;
      re = JsonPattern::format_pattern(re);
      if (re.empty())
        fail(at, "format '" + shorten(s[k].get<std::string>()) +
                     "' is not supported (supported: date, time, date-time, duration, uuid, "
                     "ipv4, ipv6, hostname, email, and binary and password, which admit any "
                     "string)");
    }
    // Each pattern's tables are a few dozen times its length: bounded per schema.
    pattern_bytes_ += re.size();
    if (pattern_bytes_ > kMaxPatternBytes)
      fail(at, "patterns and formats longer than " + std::to_string(kMaxPatternBytes) +
                   " bytes in all");
    try {
      n.pattern = JsonPattern::compile(re, /*allow_empty=*/true);
    } catch (const Error& e) {
      fail(at, e.what());
    }
    if (!n.pattern->matches_nothing() && (n.min_length > 0 || n.max_length < UINT32_MAX)) {
      // Beside length bounds: the lengths each position can still complete a match in.
      if (n.min_length > kMaxPatternMinLength)
        fail(path, "minLength " + std::to_string(n.min_length) + " beside " + k + " is above " +
                       std::to_string(kMaxPatternMinLength));
      const uint64_t K =
          std::min<uint64_t>(n.max_length, (uint64_t)n.min_length + n.pattern->positions());
      length_states_ += K + 1;
      if (length_states_ > kMaxLengthStates)
        fail(path, "minLength and maxLength beside patterns and formats: more than " +
                       std::to_string(kMaxLengthStates) + " lengths in all (the sum of " +
                       "min(maxLength, minLength + the pattern's positions) + 1)");
      n.lengths = n.pattern->completions((int)K);
      if (n.length_fits(n.pattern->start(), 0)) return true;
    } else if (!n.pattern->matches_nothing()) {
      return true;
    }
    n.pattern.reset();
    n.lengths.clear();
    return false;
  }
  static constexpr size_t kMaxPatternBytes = 65536;
  static constexpr uint32_t kMaxPatternMinLength = 4096;
  static constexpr uint64_t kMaxLengthStates = 65536;
  size_t pattern_bytes_ = 0;
  uint64_t length_states_ = 0;

  // minimum, exclusiveMinimum, maximum, exclusiveMaximum: the tighter of each pair, exact from
  // there on; an integer node's rounded inward to integers. A bound is what the JSON parser
  // read: an integer up to 64 bits exactly, else a double, taken as its shortest decimal text
  // (as Python's json reads a fraction); a double of 2^53 or more could be a longer integer
  // rounded, which a client comparing integers exactly would not agree with, so it is refused.
  // Returns whether some number lies between the bounds.
  bool number_bounds(const json& s, const std::string& path, JsonSchema::Node& n, bool integer) {
    using Bound = JsonSchema::Node::Bound;
    const std::tuple<const char*, bool, bool> keys[] = {{"minimum", false, false},
                                                        {"exclusiveMinimum", false, true},
                                                        {"maximum", true, false},
                                                        {"exclusiveMaximum", true, true}};
    for (const auto& [k, upper, exclusive] : keys) {
      if (!s.contains(k)) continue;
      const json& v = s[k];
      if (!v.is_number())
        fail(child_path(path, std::string("/") + k),
             std::string(k) + " must be a number (the boolean form of draft 4 is not supported)");
      if (v.is_number_float() && std::fabs(v.get<double>()) >= 9007199254740992.0)
        fail(child_path(path, std::string("/") + k),
             std::string(k) + " " + v.dump() +
                 " is not exact as a double (2^53 or more); write an integer within 64 bits");
      const Bound b{true, !exclusive, JsonDecimal::parse(v.dump())};
      Bound& cur = upper ? n.max : n.min;
      const int c = cur.on ? compare(b.at, cur.at) : 0;
      if (!cur.on || (upper ? c < 0 : c > 0)) {
        cur = b;
      } else if (c == 0 && !b.closed) {
        cur.closed = false;
      }
    }
    if (integer) {  // the least integer above the minimum, the greatest below the maximum
      if (n.min.on)
        n.min = {true, true,
                 n.min.closed ? to_integer(n.min.at, true) : step(to_integer(n.min.at, false), 1)};
      if (n.max.on)
        n.max = {true, true,
                 n.max.closed ? to_integer(n.max.at, false) : step(to_integer(n.max.at, true), -1)};
    }
    if (!n.min.on || !n.max.on) return true;
    const int c = compare(n.min.at, n.max.at);
    return c < 0 || (c == 0 && n.min.closed && n.max.closed);
  }

  uint16_t ref(const json& r, const std::string& path) {
    if (!r.is_string()) fail(child_path(path, "/$ref"), "$ref must be a string");
    const std::string target = r.get<std::string>();
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#')
      fail(child_path(path, "/$ref"), "'" + shorten(target) + "': only references inside the schema (#...) are supported");
    const json* t = nullptr;
    try {
      t = &doc_.at(json::json_pointer(target.substr(1)));
    } catch (const json::exception&) {
      fail(child_path(path, "/$ref"), "'" + shorten(target) + "' does not name a place in the schema");
    }
    const uint16_t id = add(kRef, path);
    refs_[target] = id;  // before the target is built: it may refer to itself
    const uint16_t to = build(*t, shorten(target, 200));
    raw_[id].target = to;
    return id;
  }

  // Node::need and the leaves' need_obj / need_arr, by relaxation from "unreachable": an object
  // needs one frame more than its deepest required property, an array one more than its items
  // when it must have one, a scalar none. Values above kMaxFrames count as unreachable, so the
  // rounds are few.
  void frames_needed() {
    constexpr int kCap = JsonSchemaEvents::kMaxFrames + 1;
    for (auto& n : out_) n.need = n.need_obj = n.need_arr = JsonSchema::kUnreachable;
    auto plus1 = [&](int v) { return (uint8_t)std::min(v + 1, kCap); };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < out_.size(); ++i) {
        JsonSchema::Node& n = out_[i];
        if (raw_[i].type == kLeaf && i != JsonSchema::kAny) {
          int deepest = 0;
          for (size_t j = 0; j < n.props.size(); ++j)
            if ((n.required >> j) & 1) deepest = std::max<int>(deepest, out_[n.props[j]].need);
          uint8_t o = plus1(deepest);
          // An array needs room for the elements it must have: the first min_items.
          int elem = 0;
          const size_t must = std::min<size_t>(n.min_items, n.prefix.size() + 1);
          for (size_t e = 0; e < must; ++e) elem = std::max<int>(elem, out_[n.element(e)].need);
          const uint8_t a = n.min_items == 0 ? 1 : plus1(elem);
          // A tagged union is opened only where every alternative fits: its value picks one.
          for (const uint16_t b : n.branch) o = std::max(o, out_[b].need_obj);
          if (o < n.need_obj || a < n.need_arr) changed = true;
          n.need_obj = std::min(n.need_obj, o);
          n.need_arr = std::min(n.need_arr, a);
        }
        uint8_t need = JsonSchema::kUnreachable;
        for (int k = 0; k < JsonSchema::kKinds; ++k) {
          const uint16_t l = n.leaf[k];
          if (l == JsonSchema::kNone) continue;
          if (l == JsonSchema::kAny || (k != JsonSchema::kObject && k != JsonSchema::kArray)) {
            need = 0;
          } else {
            need = std::min(need, k == JsonSchema::kObject ? out_[l].need_obj : out_[l].need_arr);
          }
        }
        if (need < n.need) {
          n.need = need;
          changed = true;
        }
      }
    }
  }

  // Sets node i's leaf table. Resolving an alternative may add nodes (a tagged union's), so
  // raw_ and out_ are indexed afresh after each call, never held by reference across one.
  void resolve(uint16_t i) {
    if (raw_[i].state == 2) return;
    if (raw_[i].state == 1)
      fail(raw_[i].path, "$ref or anyOf refers back to itself before any object or array");
    raw_[i].state = 1;
    const Raw r = raw_[i];  // a copy
    if (i == JsonSchema::kAny) {
      std::fill_n(out_[i].leaf, JsonSchema::kKinds, JsonSchema::kAny);
    } else if (r.type == kLeaf) {
      for (int k = 0; k < JsonSchema::kKinds; ++k)
        out_[i].leaf[k] = (r.kinds >> k) & 1 ? i : JsonSchema::kNone;
    } else if (r.type == kRef) {
      resolve(r.target);
      std::copy_n(out_[r.target].leaf, JsonSchema::kKinds, out_[i].leaf);
    } else {
      const std::string what = r.one_of ? "oneOf" : "anyOf";
      const std::vector<uint16_t>& alts = r.alts;
      std::vector<int> from(JsonSchema::kKinds, -1);
      std::vector<uint16_t> objects;  // the alternatives' object leaves (oneOf: repeats kept)
      uint16_t found[JsonSchema::kKinds];
      std::fill(std::begin(found), std::end(found), JsonSchema::kNone);
      auto clash = [&](int k, size_t a) {
        fail(raw_[i].path, what + " alternatives " + std::to_string(from[k]) + " and " +
                               std::to_string(a) + " both admit " + kKindNames[k] +
                               "; the alternative a value follows is chosen by its first byte, "
                               "so they must differ in type (objects may also differ in a tag: "
                               "a required property with a const or enum)");
      };
      for (size_t a = 0; a < alts.size(); ++a) {
        resolve(alts[a]);
        for (int k = 0; k < JsonSchema::kKinds; ++k) {
          const uint16_t l = out_[alts[a]].leaf[k];
          if (l == JsonSchema::kNone) continue;
          if (k == JsonSchema::kObject) {
            // Objects may be told apart later, by a tag; any object (kAny) by nothing.
            const bool any = !objects.empty() && objects[0] == JsonSchema::kAny;
            if ((l == JsonSchema::kAny && !objects.empty()) || any) clash(k, a);
            // An alternative that is itself a tagged union counts as its alternatives. oneOf:
            // the same object twice would match a value twice, which tagged() refuses.
            std::vector<uint16_t> objs{l};
            if (l != JsonSchema::kAny && !out_[l].branch.empty()) {
              objs.clear();
              for (const uint16_t b : out_[l].branch)
                if (std::find(objs.begin(), objs.end(), b) == objs.end()) objs.push_back(b);
            }
            for (const uint16_t o : objs)
              if (r.one_of || std::find(objects.begin(), objects.end(), o) == objects.end())
                objects.push_back(o);
          } else if (from[k] >= 0 && (found[k] != l || r.one_of)) {
            clash(k, a);  // (oneOf: a value two alternatives admit would match both)
          }
          if (from[k] < 0) from[k] = (int)a;
          found[k] = l;
        }
      }
      if (objects.size() > 1) found[JsonSchema::kObject] = tagged(r.path, what, objects);
      std::copy_n(found, JsonSchema::kKinds, out_[i].leaf);
    }
    raw_[i].state = 2;
  }

  // The leaf a property's node is, following $refs (not resolving them: this runs inside
  // resolve(), and a property may refer back to the union), when it is an enum or const.
  const JsonSchema::Node* literal_leaf(uint16_t id) const {
    for (int hops = 0; hops < 64 && id != JsonSchema::kAny && raw_[id].type == kRef; ++hops)
      id = raw_[id].target;
    if (id == JsonSchema::kAny || raw_[id].type != kLeaf || out_[id].literals.empty())
      return nullptr;
    return &out_[id];
  }

  // A literal's identity as JSON Schema compares values: a number by its value (1, 1.0 and
  // 1e0 are one value; -0 is 0), anything else by its compact text.
  static std::string value_key(const std::string& text) {
    if (text[0] != '-' && (text[0] < '0' || text[0] > '9')) return text;
    JsonDecimal d = JsonDecimal::parse(text);
    while (!d.digits.empty() && d.digits.back() == '0') {  // trailing zeros into the exponent
      d.digits.pop_back();
      ++d.exp;
    }
    if (d.digits.empty()) return "n0";
    return std::string("n") + (d.neg ? "-" : "") + d.digits + "e" + std::to_string(d.exp);
  }

  // A tagged union of the object leaves objs (two or more): the first property name, in the
  // first alternative's (bytewise) order, that every alternative requires, with a const or enum
  // there and no value (compared as JSON Schema compares them) in two alternatives. Its node (a
  // leaf whose one property is the tag, holding every value) is returned; refused by name when
  // no property tells them apart. Made once per list of alternatives (sites that refer to the
  // same objects share it), and the values it reads are bounded per schema.
  uint16_t tagged(const std::string path, const std::string& what,
                  const std::vector<uint16_t>& objs) {
    if (auto it = tagged_.find(objs); it != tagged_.end()) return it->second;
    for (size_t j = 0; j < out_[objs[0]].names.size(); ++j) {
      const std::string name = out_[objs[0]].names[j];
      std::vector<std::pair<std::string, size_t>> values;  // (literal, alternative)
      std::vector<uint64_t> seen;
      bool ok = true;
      for (size_t a = 0; a < objs.size() && ok; ++a) {
        const JsonSchema::Node& o = out_[objs[a]];
        const auto at = std::find(o.names.begin(), o.names.end(), name);
        const size_t idx = (size_t)(at - o.names.begin());
        const JsonSchema::Node* lit = at == o.names.end() ? nullptr : literal_leaf(o.props[idx]);
        ok = lit != nullptr && ((o.required >> idx) & 1);
        if (!ok) break;
        tag_values_ += lit->literals.size();
        if (tag_values_ > kMaxTagValues)
          fail(path, what + " of objects: more than " + std::to_string(kMaxTagValues) +
                         " tag values read in all");
        for (const std::string& v : lit->literals) values.push_back({v, a});
        seen.push_back(uint64_t(1) << idx);
      }
      if (!ok) continue;
      std::vector<std::pair<std::string, size_t>> keys;
      for (const auto& [v, a] : values) keys.push_back({value_key(v), a});
      std::sort(keys.begin(), keys.end());
      bool disjoint = true;
      for (size_t v = 1; v < keys.size(); ++v)
        if (keys[v].first == keys[v - 1].first && keys[v].second != keys[v - 1].second)
          disjoint = false;
      if (!disjoint) continue;
      if (values.size() >= JsonSchema::kNone)
        fail(path, what + " of objects: more than " + std::to_string(JsonSchema::kNone - 1) +
                       " tag values");
      std::sort(values.begin(), values.end());
      // The tag's node: every value; the union's node: the tag alone, then the branch.
      const uint16_t tag = add(kLeaf, path + " (tag '" + shorten(name) + "')");
      uint8_t kinds = 0;
      for (const auto& [v, a] : values) {
        out_[tag].literals.push_back(v);
        kinds |= 1u << kind_of((uint8_t)v[0]);
      }
      raw_[tag].kinds = kinds;
      const uint16_t u = add(kLeaf, path);
      raw_[u].kinds = 1u << JsonSchema::kObject;
      JsonSchema::Node& n = out_[u];
      n.names = {name};
      n.props = {tag};
      n.required = 1;
      n.additional = JsonSchema::kNone;
      for (const auto& [v, a] : values) {
        n.branch.push_back(objs[a]);
        n.branch_seen.push_back(seen[a]);
      }
      resolve(tag);
      resolve(u);
      tagged_[objs] = u;
      return u;
    }
    fail(path, what +
                   " alternatives that are objects must differ in a tag: a property every one "
                   "requires, with a const or enum whose values no two of them share (as "
                   "pydantic's Literal fields of a discriminated union)");
  }
  static constexpr uint64_t kMaxTagValues = 1 << 20;
  uint64_t tag_values_ = 0;
  std::map<std::vector<uint16_t>, uint16_t> tagged_;

  const json& doc_;
  int depth_ = 0;  // build()'s nesting
  std::vector<Raw> raw_;
  std::vector<JsonSchema::Node> out_;
  std::map<std::string, uint16_t> refs_;
};

std::shared_ptr<const JsonSchema> JsonSchema::compile(const json& schema) {
  return JsonSchemaCompiler(schema).run();
}

// ---- the events ----

bool JsonSchemaEvents::narrow(const std::vector<std::string>& v, uint8_t c) {
  if (pos_ == 0xFFFF) return false;
  const auto b = v.begin() + lo_, e = v.begin() + hi_;
  // In [lo_, hi_) every string begins with the pos_ bytes read, in bytewise order: the one that
  // ends there first, then the others by their next byte.
  const auto l = std::partition_point(b, e, [&](const std::string& s) {
    return s.size() <= pos_ || (uint8_t)s[pos_] < c;
  });
  const auto h = std::partition_point(l, e, [&](const std::string& s) { return (uint8_t)s[pos_] == c; });
  lo_ = (uint16_t)(l - v.begin());
  hi_ = (uint16_t)(h - v.begin());
  ++pos_;
  return lo_ < hi_;
}

namespace {
uint64_t first_bits(size_t n) { return n >= 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1; }
}  // namespace

uint64_t JsonSchemaEvents::open_props(const Frame& f, const JsonSchema::Node& n) const {
  uint64_t open = ~f.seen & first_bits(n.names.size());
  for (size_t j = 0; j < n.props.size(); ++j)
    if (depth_ + s_->node(n.props[j]).need > kMaxFrames) open &= ~(uint64_t(1) << j);
  return open;
}

bool JsonSchemaEvents::other_keys(const JsonSchema::Node& n) const {
  return n.additional != JsonSchema::kNone && depth_ + s_->node(n.additional).need <= kMaxFrames;
}

bool JsonSchemaEvents::value(uint8_t c) {
  const uint8_t kind = kind_of(c);
  const bool container = kind == JsonSchema::kObject || kind == JsonSchema::kArray;
  uint16_t node = s_->root();
  if (depth_ > 0) {
    Frame& f = frames_[depth_ - 1];
    if (f.node == JsonSchema::kAny) {  // inside a free value: count its brackets
      if (container) ++f.count;
      return true;
    }
    if ((objects_ >> (depth_ - 1)) & 1) {
      node = f.child;
    } else {
      const JsonSchema::Node& a = s_->node(f.node);
      if (f.count >= a.max_items) return false;
      node = a.element(f.count++);
    }
  }
  const uint16_t leaf = s_->node(node).leaf[kind];
  if (leaf == JsonSchema::kNone) return false;
  if (leaf != JsonSchema::kAny) {
    const JsonSchema::Node& n = s_->node(leaf);
    if (!n.literals.empty()) {  // an enum: the bytes must spell one of its values
      slot_ = leaf;
      pos_ = lo_ = 0;
      hi_ = (uint16_t)n.literals.size();
      return narrow(n.literals, c);
    }
    if (!container) {
      if (n.integer && kind == JsonSchema::kNumber) slot_ = leaf;
      if (kind == JsonSchema::kNumber && n.bounded()) {
        slot_ = leaf;  // a bounded number: its text is kept, its reach checked at every byte
        num_.assign(1, (char)c);
        const Reach r = reach(num_, n);
        if (r == kSettled) {
          number_ = kSettledNumber;
          num_.clear();
        } else {
          number_ = kOpenNumber;
        }
        return r != kOut;
      }
      if (kind == JsonSchema::kString && n.pattern) {
        slot_ = leaf;  // a string with a pattern: its characters go through the automaton
        pattern_ = true;
        pat_ = n.pattern->start();
        length_ = !n.lengths.empty();  // and are counted, when its length is bounded too
        chars_ = 0;
        return true;
      }
      if (kind == JsonSchema::kString && (n.min_length > 0 || n.max_length < UINT32_MAX)) {
        slot_ = leaf;  // a string whose length is bounded: its characters are counted
        length_ = true;
        chars_ = 0;
      }
      return true;
    }
    // Room for the frames it needs to be whole (its required members' objects and arrays).
    if (depth_ + (kind == JsonSchema::kObject ? n.need_obj : n.need_arr) > kMaxFrames)
      return false;
  } else if (!container) {
    return true;
  }
  if (depth_ >= kMaxFrames) return false;
  frames_[depth_] = Frame{leaf, JsonSchema::kAny, leaf == JsonSchema::kAny ? 1u : 0u, 0};
  if (kind == JsonSchema::kObject) objects_ |= 1u << depth_;
  ++depth_;
  return true;
}

bool JsonSchemaEvents::scalar_byte(uint8_t c) {
  if (slot_ == JsonSchema::kNone) return true;
  const JsonSchema::Node& n = s_->node(slot_);
  if (!n.literals.empty()) return narrow(n.literals, c);
  if (number_ != kNoNumber) {  // written without exponent; some value within reach in bounds
    if (c == 'e' || c == 'E' || (n.integer && c == '.')) return false;
    if (number_ == kSettledNumber) return true;
    num_ += (char)c;
    // Unsettled past kMaxNumberText bytes: only an exact bound followed by zeros stays so (its
    // other digits settle it, or it may end), so refusing the next byte strands nothing.
    const Reach r = reach(num_, n);
    if (r == kSettled) {  // whatever follows is in bounds: the text is no longer needed
      number_ = kSettledNumber;
      num_.clear();
      return true;
    }
    return r == kIn && num_.size() <= kMaxNumberText;
  }
  if (pattern_) return pattern_byte(n, c);
  if (length_) return true;
  return c != '.' && c != 'e' && c != 'E';  // an integer
}

// A string's bytes (after its opening quote, the recognizer having checked them) decoded into
// characters for the pattern's automaton. Within an escape or a UTF-8 sequence, each byte is
// taken only if some character it can still become leads on: the code points a \u escape's
// digits so far can reach, or a sequence's bytes so far (surrogates excluded: a character
// beyond U+FFFF is written in UTF-8, not as an escaped surrogate pair).
bool JsonSchemaEvents::pattern_byte(const JsonSchema::Node& n, uint8_t c) {
  const JsonPattern& p = *n.pattern;
  // With length bounds, the characters the string will have once the one this byte belongs to
  // is whole (a byte that begins a character comes before string_char() counts it), and
  // whether a state can still end in a match within the bounds from there.
  const uint32_t after = chars_ + (esc_ == 0 && cp_due_ == 0 ? 1 : 0);
  auto goes_on = [&](const JsonPattern::State& s) {
    return !s.empty() && (!length_ || n.length_fits(s, after));
  };
  auto take = [&](uint32_t cp) {  // a whole character (cp_ cleared: equal states stay equal)
    const JsonPattern::State next = p.step(pat_, cp);
    if (!goes_on(next)) return false;
    pat_ = next;
    cp_ = 0;
    return true;
  };
  // Whether some character in [lo, hi] leads on (the union of their states can end within the
  // bounds iff one of them can).
  auto some = [&](uint32_t lo, uint32_t hi) {
    return length_ ? goes_on(p.step_range(pat_, lo, hi)) : p.can_step(pat_, lo, hi);
  };
  auto within = [&](int bits_due) {  // cp_'s bits so far, bits_due more to come
    const uint32_t lo = cp_ << bits_due;
    return some(lo, lo + ((1u << bits_due) - 1));
  };
  if (esc_ == 1) {
    esc_ = 0;
    switch (c) {
      case 'b': return take(8);
      case 'f': return take(12);
      case 'n': return take(10);
      case 'r': return take(13);
      case 't': return take(9);
      case 'u':
        esc_ = 2;
        cp_ = 0;
        cp_due_ = 4;
        return within(16);
      default: return take(c);  // '"', '\\' or '/'
    }
  }
  if (esc_ == 2) {
    cp_ = cp_ * 16 + (c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    if (--cp_due_ > 0) return within(4 * cp_due_);
    esc_ = 0;
    return take(cp_);
  }
  if (cp_due_ > 0) {  // a UTF-8 continuation byte
    cp_ = (cp_ << 6) | (c & 0x3F);
    if (--cp_due_ > 0) return within(6 * cp_due_);
    return take(cp_);
  }
  if (c == '"') return true;  // the closing quote: scalar_end() asks whether it matched
  if (c == '\\') {
    esc_ = 1;
    return some(0, 0xFFFF);
  }
  if (c < 0x80) return take(c);
  // A lead byte: 2, 3 or 4 bytes, the smallest code point of each length (shorter forms are
  // overlong) and the largest (U+10FFFF) bounding what it can still be.
  cp_due_ = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
  cp_ = c & (0x7F >> (cp_due_ + 1));
  const uint32_t lo = cp_ << (6 * cp_due_), hi = lo + ((1u << (6 * cp_due_)) - 1);
  const uint32_t least = cp_due_ == 1 ? 0x80 : cp_due_ == 2 ? 0x800 : 0x10000;
  return some(std::max(lo, least), std::min<uint32_t>(hi, 0x10FFFF));
}

bool JsonSchema::Node::length_fits(const JsonPattern::State& s, uint32_t n) const {
  if (n > max_length || s.empty()) return false;
  const uint64_t lo = min_length > n ? min_length - n : 0, hi = (uint64_t)max_length - n;
  const uint64_t reach = lo + pattern->positions();  // a longer completion can be cut to one
  if (lo == 0 && hi >= reach) return true;           // (a live state completes within positions())
  const uint64_t top = std::min<uint64_t>({hi, reach, lengths.size() - 1});
  for (uint64_t k = lo; k <= top; ++k)
    for (int w = 0; w < JsonPattern::kMaxPositions / 64; ++w)
      if (s.w[w] & lengths[k].w[w]) return true;
  return false;
}

bool JsonSchemaEvents::string_char() {
  if (!length_) return true;
  if (chars_ >= s_->node(slot_).max_length) return false;
  ++chars_;
  return true;
}

bool JsonSchemaEvents::can_end() const {
  if (slot_ == JsonSchema::kNone) return true;
  const JsonSchema::Node& n = s_->node(slot_);
  if (number_ != kNoNumber) return number_ == kSettledNumber || in_bounds(JsonDecimal::parse(num_), n);
  return n.literals.empty() || (lo_ < hi_ && n.literals[lo_].size() == pos_);
}

bool JsonSchemaEvents::scalar_end() {
  const bool ok = can_end() && (!length_ || chars_ >= s_->node(slot_).min_length) &&
                  (!pattern_ || s_->node(slot_).pattern->accepts(pat_));
  if (ok && depth_ > 0 && ((objects_ >> (depth_ - 1)) & 1)) {
    // A tagged union's tag (its only property) ended: the object goes on as the alternative
    // its value selects, with the tag seen.
    Frame& f = frames_[depth_ - 1];
    const JsonSchema::Node& u = s_->node(f.node);
    if (f.node != JsonSchema::kAny && !u.branch.empty()) {
      f.seen = u.branch_seen[lo_];
      f.node = u.branch[lo_];
    }
  }
  pattern_ = false;
  esc_ = cp_due_ = 0;
  cp_ = 0;
  pat_ = {};
  slot_ = JsonSchema::kNone;
  pos_ = lo_ = hi_ = 0;
  length_ = false;
  chars_ = 0;
  num_.clear();
  number_ = kNoNumber;
  return ok;
}

bool JsonSchemaEvents::key_open() {
  const Frame& f = frames_[depth_ - 1];
  if (f.node == JsonSchema::kAny) return true;
  const JsonSchema::Node& n = s_->node(f.node);
  slot_ = f.node;
  pos_ = lo_ = 0;
  hi_ = (uint16_t)n.names.size();
  key_escaped_ = false;
  // Some key must still be possible: a property that may still come, or any other key.
  return other_keys(n) || open_props(f, n) != 0;
}

bool JsonSchemaEvents::key_byte(uint8_t c) {
  const Frame& f = frames_[depth_ - 1];
  if (f.node == JsonSchema::kAny) return true;
  const JsonSchema::Node& n = s_->node(f.node);
  // Once no name matches, the key is another one: its bytes are not counted (any length, and
  // the state stays the same from byte to byte), and it may hold no escape, so that its bytes
  // are its name (an escaped spelling of a property's name, "\u0061" for "a", or "a\u000a" for
  // a name written "a\n", must not pass as another key).
  if (lo_ < hi_) narrow(n.names, c);
  key_escaped_ = key_escaped_ || c == '\\';
  // A property that may still come begins with these bytes, or (unescaped) another key may.
  return (open_props(f, n) & first_bits(hi_) & ~first_bits(lo_)) != 0 ||
         (!key_escaped_ && other_keys(n));
}

bool JsonSchemaEvents::key_close() {
  Frame& f = frames_[depth_ - 1];
  if (f.node == JsonSchema::kAny) return true;
  const JsonSchema::Node& n = s_->node(f.node);
  const int exact = lo_ < hi_ && n.names[lo_].size() == pos_ ? lo_ : -1;
  const bool escaped = key_escaped_;
  key_escaped_ = false;
  slot_ = JsonSchema::kNone;
  pos_ = lo_ = hi_ = 0;
  if (exact >= 0) {
    // A key twice, or one whose value would not fit in the frames left.
    if (!((open_props(f, n) >> exact) & 1)) return false;
    f.seen |= uint64_t(1) << exact;
    f.child = n.props[exact];
    return true;
  }
  if (escaped || !other_keys(n)) return false;
  f.child = n.additional;
  return true;
}

bool JsonSchemaEvents::comma(bool object) {
  const Frame& f = frames_[depth_ - 1];
  if (f.node == JsonSchema::kAny) return true;
  const JsonSchema::Node& n = s_->node(f.node);
  if (object) return other_keys(n) || open_props(f, n) != 0;
  // Another element, if one of the next element's schema fits in the frames left (a tuple's
  // elements differ: the one before it fitting says nothing).
  return f.count < n.max_items && depth_ + s_->node(n.element(f.count)).need <= kMaxFrames;
}

bool JsonSchemaEvents::close(bool object) {
  Frame& f = frames_[depth_ - 1];
  if (f.node == JsonSchema::kAny) {
    if (--f.count > 0) return true;
  } else {
    const JsonSchema::Node& n = s_->node(f.node);
    if (object ? (n.required & ~f.seen) != 0 : f.count < n.min_items) return false;
  }
  --depth_;
  frames_[depth_] = Frame{};
  objects_ &= ~(1u << depth_);
  return true;
}

JsonDecimal JsonDecimal::parse(std::string_view t) {
  const bool neg = !t.empty() && t[0] == '-';
  if (neg) t.remove_prefix(1);
  const size_t e = t.find_first_of("eE");
  int64_t exp = 0;
  if (e != std::string_view::npos) {
    std::string_view x = t.substr(e + 1);
    const bool eneg = !x.empty() && x[0] == '-';
    if (!x.empty() && (x[0] == '-' || x[0] == '+')) x.remove_prefix(1);
    for (char c : x) exp = std::min<int64_t>(exp * 10 + (c - '0'), int64_t(1) << 40);
    if (eneg) exp = -exp;
    t = t.substr(0, e);
  }
  const size_t dot = t.find('.');
  std::string digits(t.substr(0, dot));
  if (dot != std::string_view::npos) {
    digits += t.substr(dot + 1);
    exp -= (int64_t)(t.size() - dot - 1);
  }
  return normal(neg, std::move(digits), exp);
}

int compare(const JsonDecimal& a, const JsonDecimal& b) {
  const int sa = a.digits.empty() ? 0 : a.neg ? -1 : 1, sb = b.digits.empty() ? 0 : b.neg ? -1 : 1;
  if (sa != sb) return sa < sb ? -1 : 1;
  if (sa == 0) return 0;
  // Magnitudes: the place of the leading digit first, then the digits (the shorter padded).
  const int64_t ta = (int64_t)a.digits.size() + a.exp, tb = (int64_t)b.digits.size() + b.exp;
  int mag = ta < tb ? -1 : ta > tb ? 1 : 0;
  for (size_t i = 0; mag == 0 && i < std::max(a.digits.size(), b.digits.size()); ++i) {
    const char x = i < a.digits.size() ? a.digits[i] : '0', y = i < b.digits.size() ? b.digits[i] : '0';
    mag = x < y ? -1 : x > y ? 1 : 0;
  }
  return sa * mag;
}

}  // namespace ct
