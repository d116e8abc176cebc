// JSON Schema output (response_format json_schema): the compiled schema's recognizer against an
// independent validator of the same subset on random documents, its refusals at the exact byte,
// the compiler's refusals by name, and the constrained sampler and engine on a tiny random model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "model/json_constraint.h"
#include "model/model.h"
#include "model/sampler.h"
#include "support/errors.h"
#include "support/json_schema_ref.h"
#include "support/json_test_support.h"

namespace ct {
namespace {

using json = nlohmann::json;

bool ref_valid(const json& v, const json& s, const json& root) {
  return test::json_schema_valid(v, s, root);
}

using Recognizer = JsonSchemaRecognizer;

Recognizer recognizer(const std::shared_ptr<const JsonSchema>& s) {
  return Recognizer(false, JsonSchemaEvents(s.get()));
}

bool accepts(const std::shared_ptr<const JsonSchema>& s, const std::string& text) {
  Recognizer r = recognizer(s);
  return r.feed(text) && r.complete();
}

int first_refused(const std::shared_ptr<const JsonSchema>& s, const std::string& text) {
  Recognizer r = recognizer(s);
  for (size_t i = 0; i < text.size(); ++i)
    if (!r.feed((uint8_t)text[i])) return (int)i;
  return -1;
}

// Schemas of the kinds people send: an OpenAI strict object, pydantic's nested models with
// $defs and Optional (anyOf with null), a recursive tree, enums, bounded arrays, free values.
const char* const kSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
        "color": {"enum": ["black", "white", "tabby"]}, "tags": {"type": "array",
        "items": {"type": "string"}, "maxItems": 3}}, "required": ["name", "age", "color"],
        "additionalProperties": false})",
    R"({"$defs": {"Address": {"title": "Address", "type": "object", "properties": {
          "street": {"type": "string"}, "zip": {"anyOf": [{"type": "string"}, {"type": "null"}],
          "default": null}}, "required": ["street"], "additionalProperties": false}},
        "type": "object", "properties": {"home": {"$ref": "#/$defs/Address"},
          "work": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]},
          "score": {"type": "number"}}, "required": ["home", "score"],
        "additionalProperties": false})",
    R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
          "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"],
          "additionalProperties": false}}, "$ref": "#/$defs/node"})",
    R"({"type": "array", "items": {"enum": [1, 12, -3, "x", "xy", true, null]}, "minItems": 1,
        "maxItems": 4})",
    R"({"type": "object", "properties": {"a": {"const": "fixed"}, "b": {"type": ["integer", "null"]},
        "c": true, "d": {"type": "boolean"}}, "additionalProperties": {"type": "integer"}})",
    R"({"anyOf": [{"type": "object", "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"], "additionalProperties": false}, {"type": "array", "maxItems": 2},
        {"type": "string"}]})",
    R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 4},
        "e": {"enum": ["a", "abc", "abcdef", 3], "maxLength": 3}, "n": {"type": ["string",
        "integer"], "minLength": 1}, "z": {"type": "string", "maxLength": 3}},
        "additionalProperties": false})",
    R"({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120},
        "p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "t": {"type": "number",
        "minimum": -2.5, "exclusiveMaximum": 40}, "i": {"type": "integer",
        "exclusiveMinimum": -3.5, "exclusiveMaximum": 3}},
        "additionalProperties": false})",
    R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$",
        "examples": ["AB-123", "ZZ-000"]}, "when": {"type": "string", "format": "date",
        "examples": ["2024-02-29", "1999-12-31"]}, "at": {"type": "string", "format": "date-time",
        "examples": ["2024-02-29T23:59:59Z"]}, "e": {"enum": ["ab", "AB-1", "QQ-999"],
        "pattern": "-"}}, "additionalProperties": false})",
    R"({"type": "array", "items": {"type": ["string", "null"], "pattern": "(ab|\u00e9)+\\d?$",
        "examples": ["ab", "x\u00e91", "abab", "\u00e9\n\u00e9"]}, "maxItems": 3})",
    // Tuples (pydantic's tuple[int, str]): prefixItems, with and without items after them;
    // formats that are patterns (duration) and that admit any string (binary).
    R"({"type": "object", "properties": {"t": {"type": "array", "prefixItems": [{"type":
        "integer", "minimum": 0, "maximum": 9}, {"type": "string", "format": "duration",
        "examples": ["P1Y2M3DT4H5M6S", "PT5S", "P3W", "P1M", "PT1H30M", "P2D"]},
        {"enum": ["a", null]}], "items": false, "minItems": 2}, "u": {"type": "array",
        "prefixItems": [{"type": "boolean"}], "items": {"type": "integer"}, "maxItems": 3},
        "b": {"type": "string", "format": "binary"}}, "additionalProperties": false})",
    // Unions of objects told apart by a tag, as pydantic writes them: a plain Union of models
    // with Literal fields (anyOf, here with null), and a discriminated union (oneOf with
    // OpenAPI's discriminator). The tags sort first among each object's keys, so a document
    // dumped with sorted keys writes its tag first, as the recognizer wants it.
    R"({"$defs": {"Cat": {"type": "object", "properties": {"kind": {"const": "cat", "type":
        "string"}, "lives": {"type": "integer", "minimum": 0, "maximum": 9}}, "required":
        ["kind", "lives"], "additionalProperties": false}, "Dog": {"type": "object", "properties":
        {"kind": {"enum": ["dog", "pup"]}, "name": {"type": "string", "pattern": "^[A-Z][a-z]*$",
        "minLength": 2, "maxLength": 4, "examples": ["Rex", "Bo", "Fido", "Maxi", "Ab"]}},
        "required": ["kind"],
        "additionalProperties": false}}, "type": "object", "properties": {"pet": {"anyOf":
        [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"type": "null"}]}, "pets": {"type":
        "array", "items": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
        "discriminator": {"propertyName": "kind", "mapping": {"cat": "#/$defs/Cat", "dog":
        "#/$defs/Dog", "pup": "#/$defs/Dog"}}}, "maxItems": 3}}, "required": ["pet"],
        "additionalProperties": false})",
};

// A random value shaped by the schema most of the time (so that both valid and invalid
// documents are common), else any value.
json random_value(std::mt19937& rng, const json& s, const json& root, int depth);

json any_value(std::mt19937& rng, int depth) {
  switch (rng() % (depth > 3 ? 5 : 7)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return (int64_t)(rng() % 40) - 20;
    case 3: return (double)(rng() % 100) / 8.0;
    case 4: {
      static const char* const w[] = {"x", "tabby", "a\"b", "\xc3\xa9", "", "12", "null"};
      return w[rng() % 7];
    }
    case 5: {
      json a = json::array();
      for (int i = rng() % 4; i > 0; --i) a.push_back(any_value(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      static const char* const k[] = {"name", "age", "v", "kids", "a", "b", "zz", "ok"};
      for (int i = rng() % 3; i > 0; --i) o[k[rng() % 8]] = any_value(rng, depth + 1);
      return o;
    }
  }
}

json random_value(std::mt19937& rng, const json& s, const json& root, int depth) {
  if (depth > 5 || s.is_boolean() || rng() % 10 == 0) return any_value(rng, depth);
  if (s.contains("$ref"))
    return random_value(rng, root.at(json::json_pointer(s["$ref"].get<std::string>().substr(1))),
                        root, depth);
  for (const char* k : {"anyOf", "oneOf"})
    if (s.contains(k)) return random_value(rng, s[k][rng() % s[k].size()], root, depth);
  if (s.contains("const")) return s["const"];
  if (s.contains("enum")) return s["enum"][rng() % s["enum"].size()];
  std::string type = "object";
  if (s.contains("type"))
    type = s["type"].is_array() ? s["type"][rng() % s["type"].size()].get<std::string>()
                                : s["type"].get<std::string>();
  if (type == "object") {
    json o = json::object();
    const json props = s.value("properties", json::object());
    for (auto it = props.begin(); it != props.end(); ++it)
      if (rng() % 8 != 0) o[it.key()] = random_value(rng, it.value(), root, depth + 1);
    if (rng() % 6 == 0) o["extra"] = any_value(rng, depth + 1);
    return o;
  }
  if (type == "array") {
    json a = json::array();
    const json prefix = s.value("prefixItems", json::array());
    for (int i = rng() % 5, at = 0; i > 0; --i, ++at)
      a.push_back(random_value(rng,
                               at < (int)prefix.size() ? prefix[at] : s.value("items", json(true)),
                               root, depth + 1));
    return a;
  }
  if (type == "string" && s.contains("examples") && rng() % 10 != 0) {  // near a valid one
    std::string v = s["examples"][rng() % s["examples"].size()];
    const size_t at = v.empty() ? 0 : rng() % v.size();
    if (rng() % 4 == 0 && at < v.size() && (uint8_t)v[at] < 0x80) {  // an ASCII byte replaced
      static const char* const c[] = {"a", "1", "-", "\xc3\xa9", "T", "9", ""};
      v.replace(at, 1, c[rng() % 7]);
    }
    return v;
  }
  if (type == "string") {  // 0-6 characters of 1-4 bytes each, some written as escapes
    static const char* const c[] = {"a", "\"", "\n", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
    std::string out;
    for (int i = rng() % 6; i > 0; --i) out += c[rng() % 6];
    return out;
  }
  if ((type == "integer" || type == "number") && rng() % 4 != 0 &&
      (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
       s.contains("exclusiveMaximum"))) {  // bounded: mostly near and between the bounds
    double lo = s.value("minimum", s.value("exclusiveMinimum", -50.0));
    double hi = s.value("maximum", s.value("exclusiveMaximum", 50.0));
    const double margin = std::max(0.5, (hi - lo) / 10);
    lo -= margin;
    hi += margin;
    const double x = lo + (hi - lo) * (double)(rng() % 1001) / 1000.0;
    if (type == "integer") return (int64_t)std::llround(x);
    return std::round(x * 100) / 100;
  }
  if (type == "integer") return rng() % 2 ? (int64_t)(rng() % 2000) - 1000 : (int64_t)(rng() % 200) - 50;
  if (type == "number") {  // halves to sixteenths and hundredths near 0, 1 and 40 (no exponent)
    switch (rng() % 4) {
      case 0: return (double)(rng() % 1000) / 16.0;
      case 1: return (double)((int)(rng() % 300) - 100) / 100.0;
      case 2: return (double)((int)(rng() % 200) - 20) / 4.0;
      default: return rng() % 9;
    }
  }
  if (type == "boolean") return rng() % 2 == 0;
  return nullptr;
}

TEST(JsonSchema, TheRecognizerAgreesWithAnIndependentValidatorOnRandomDocuments) {
  std::mt19937 rng(11);
  for (const char* text : kSchemas) {
    const json schema = json::parse(text);
    SCOPED_TRACE(schema.dump());
    const auto compiled = JsonSchema::compile(schema);
    int valid = 0, invalid = 0;
    for (int it = 0; it < 1500; ++it) {
      const json v = random_value(rng, schema, schema, 0);
      const std::string doc = v.dump(rng() % 3 == 0 ? 2 : -1);
      const bool want = ref_valid(v, schema, schema);
      ASSERT_EQ(accepts(compiled, doc), want) << doc;
      (want ? valid : invalid) += 1;
    }
    EXPECT_GT(valid, 150);  // both occurred often
    EXPECT_GT(invalid, 150);
  }
}

TEST(JsonSchema, RefusesTheFirstByteNoValidDocumentCouldContinue) {
  const auto cat = JsonSchema::compile(json::parse(kSchemas[0]));
  const std::string ok = R"({"name": "Tom", "age": 3, "color": "tabby", "tags": ["a", "b", "c"]})";
  EXPECT_TRUE(accepts(cat, ok));
  struct Case {
    std::string text;
    int at;
  };
  const Case cases[] = {
      {R"({"name": "Tom", "age": 3})", 24},                   // '}' before the required color
      {R"({"name": "Tom", "name")", 17},  // a key twice: no unseen property begins with 'n'
      {R"({"nick")", 3},                  // no property begins with "ni"
      {R"({"age": 1.5)", 9},                                  // an integer's '.'
      {R"({"age": 1e3)", 9},                                  // an integer's exponent
      {R"({"color": "tab")", 14},                             // not a whole enum value
      {R"({"color": "blue")", 13},                            // no enum value begins "blu"
      {R"({"tags": ["a", "b", "c", "d"]})", 23},              // a fourth element's comma
      {R"({"name": 3)", 9},                                   // a number for a string
      {R"({"name": "T", "age": 1, "color": "black", "tags": [], )", 52},  // no property left
  };
  for (const Case& c : cases) EXPECT_EQ(first_refused(cat, c.text), c.at) << c.text;

  const auto nums = JsonSchema::compile(json::parse(kSchemas[3]));
  EXPECT_FALSE(accepts(nums, "[1, 12, -3, \"xy\", null]"));  // five: above maxItems
  EXPECT_TRUE(accepts(nums, "[1, 12, -3, \"xy\"]"));
  EXPECT_EQ(first_refused(nums, "[]"), 1);       // minItems 1
  EXPECT_EQ(first_refused(nums, "[13]"), 2);     // 1, 12: no value begins "13"
  EXPECT_EQ(first_refused(nums, "[1 ,2]"), 4);   // '2'
  EXPECT_EQ(first_refused(nums, "[false]"), 1);  // true is an enum value, false not

  const auto none = JsonSchema::compile(json::parse(R"({"type": "array", "items": false})"));
  EXPECT_TRUE(accepts(none, "[ ]"));
  EXPECT_EQ(first_refused(none, "[1]"), 1);  // no element at all

  // A top-level number ends where the text does: complete once it is a whole allowed value.
  const auto top = JsonSchema::compile(json::parse(R"({"enum": [1, 12]})"));
  Recognizer r = recognizer(top);
  ASSERT_TRUE(r.feed("1"));
  EXPECT_TRUE(r.complete());
  const auto twelve = JsonSchema::compile(json::parse(R"({"enum": [12]})"));
  Recognizer r2 = recognizer(twelve);
  ASSERT_TRUE(r2.feed("1"));
  EXPECT_FALSE(r2.complete());
  EXPECT_FALSE(r2.feed("3"));

  // A free value (true, or additionalProperties absent) is only counted: any JSON inside.
  const auto mixed = JsonSchema::compile(json::parse(kSchemas[4]));
  EXPECT_TRUE(accepts(mixed, R"({"c": {"x": [1, {"y": null}]}, "a": "fixed", "z": 4})"));
  EXPECT_EQ(first_refused(mixed, R"({"z": "s")"), 6);  // another key's value: an integer
  EXPECT_EQ(first_refused(mixed, R"({"a": "fixee")"), 11);
}

// Holes a review found: each schema's prefix once stranded the sampler, or a document the
// schema refuses was accepted.
// minLength / maxLength count characters (Unicode code points) however they are written: a
// multi-byte UTF-8 character, an escape, a surrogate pair's two escapes are one each.
TEST(JsonSchema, StringLengthsCountCharacters) {
  const auto two_three = JsonSchema::compile(
      json::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"));
  for (const char* ok : {R"("ab")", R"("abc")", "\"\xf0\x9f\x98\x80\xc3\xa9\"", R"("\ud83d\ude00\n")",
                         R"("\u00e9\"x")"}) {
    EXPECT_TRUE(accepts(two_three, ok)) << ok;
  }
  EXPECT_EQ(first_refused(two_three, R"("a")"), 2);                 // the quote after one
  EXPECT_EQ(first_refused(two_three, R"("\ud83d\ude00")"), 13);     // one character
  EXPECT_EQ(first_refused(two_three, R"("abcd")"), 4);              // the fourth character
  EXPECT_EQ(first_refused(two_three, "\"ab\xc3\xa9\xc3\xa9\""), 5);  // its lead byte
  EXPECT_EQ(first_refused(two_three, R"("ab\n\t")"), 5);            // the fourth's backslash
  EXPECT_EQ(first_refused(two_three, R"("ab\ud83d\ude00\n")"), 15);  // the 4th after a pair
  const auto empty = JsonSchema::compile(json::parse(R"({"type": "string", "maxLength": 0})"));
  EXPECT_TRUE(accepts(empty, R"("")"));
  EXPECT_EQ(first_refused(empty, R"(" ")"), 1);
  // Beside other kinds the bounds hold for strings alone; beside enum, the values outside them
  // are left out at compile time.
  const auto mixed = JsonSchema::compile(
      json::parse(R"({"type": ["integer", "string"], "minLength": 2})"));
  EXPECT_TRUE(accepts(mixed, "7"));
  EXPECT_EQ(first_refused(mixed, R"("x")"), 2);
  const auto e = JsonSchema::compile(json::parse(R"({"enum": ["a", "ab", "abc"], "minLength": 2})"));
  EXPECT_EQ(e->node(e->root()).literals.size(), 2u);
  EXPECT_EQ(first_refused(e, R"("a")"), 2);
  EXPECT_TRUE(accepts(e, R"("ab")"));
  // Every state on the way can go on (a minimum length is reachable with any character).
  const auto longer = JsonSchema::compile(json::parse(R"({"type": "string", "minLength": 40})"));
  Recognizer r = recognizer(longer);
  ASSERT_TRUE(r.feed("\""));
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(ct::test::json_can_go_on(r)) << i;
    EXPECT_FALSE(Recognizer(r).feed("\"")) << i;
    ASSERT_TRUE(r.feed(i % 2 ? "\\u00e9" : "\xe2\x82\xac"));
  }
  EXPECT_TRUE(r.feed("\""));
}

// minimum / maximum / exclusive*: compared exactly in decimal; a byte is refused as soon as no
// number it could begin lies in bounds; integers' bounds are rounded inward.
TEST(JsonSchema, NumberBoundsRefuseTheFirstByteOutOfReach) {
  const auto age = JsonSchema::compile(json::parse(R"({"type": "integer", "minimum": 0, "maximum": 120})"));
  for (const char* ok : {"0", "7", "120", "-0", "99"}) EXPECT_TRUE(accepts(age, ok)) << ok;
  EXPECT_EQ(first_refused(age, "121"), 2);   // 12 may still become 120, 121 nothing
  EXPECT_EQ(first_refused(age, "130"), 2);   // 13 itself is fine
  EXPECT_EQ(first_refused(age, "1200"), 3);
  EXPECT_EQ(first_refused(age, "-1"), 1);    // "-" may still be -0
  EXPECT_EQ(first_refused(age, "5.0"), 1);   // an integer
  Recognizer r = recognizer(age);
  ASSERT_TRUE(r.feed("12"));
  EXPECT_TRUE(r.complete());
  const auto p = JsonSchema::compile(
      json::parse(R"({"type": "number", "exclusiveMinimum": 0, "maximum": 1})"));
  for (const char* ok : {"0.5", "1", "1.000", "0.0001"}) EXPECT_TRUE(accepts(p, ok)) << ok;
  EXPECT_EQ(first_refused(p, "2"), 0);
  EXPECT_EQ(first_refused(p, "1.01"), 3);
  EXPECT_EQ(first_refused(p, "1.5"), 2);
  EXPECT_EQ(first_refused(p, "0.5e1"), 3);   // a bounded number is written without exponent
  EXPECT_EQ(first_refused(p, "-1"), 0);     // a minus sign could only begin -0 or below
  EXPECT_FALSE(accepts(p, "0"));             // 0 is excluded: "0." may go on, "0" not end
  EXPECT_EQ(first_refused(p, "0.0"), -1);    // (0.0 may still become 0.01)
  const auto obj = JsonSchema::compile(json::parse(
      R"({"type": "object", "properties": {"p": {"type": "number", "exclusiveMinimum": 0}}})"));
  EXPECT_EQ(first_refused(obj, R"({"p": 0})"), 7);  // the '}' that would end 0
  EXPECT_TRUE(accepts(obj, R"({"p": 0.000000000000000000000000001})"));  // exact, any length
  // Integers' bounds rounded inward: (-3.5, 3) holds -3 .. 2.
  const auto i = JsonSchema::compile(
      json::parse(R"({"type": "integer", "exclusiveMinimum": -3.5, "exclusiveMaximum": 3})"));
  for (int v = -5; v <= 5; ++v)
    EXPECT_EQ(accepts(i, std::to_string(v)), v >= -3 && v <= 2) << v;
  const auto far = JsonSchema::compile(json::parse(
      R"({"type": "integer", "minimum": 1000000000000000, "maximum": 18446744073709551615})"));
  EXPECT_TRUE(accepts(far, "1" + std::string(15, '0')));
  EXPECT_TRUE(accepts(far, "18446744073709551615"));
  EXPECT_EQ(first_refused(far, "18446744073709551616"), 19);
  EXPECT_EQ(first_refused(far, "2" + std::string(19, '0')), 19);
  EXPECT_FALSE(accepts(far, "9" + std::string(14, '0')));
  // A number whose every continuation is in bounds is no longer checked (nor kept): a model
  // writing 0.333... forever costs nothing per byte. One that stays unsettled (an exact bound
  // followed by zeros) is cut after 1,024 bytes, where it may still end or settle.
  const auto unit = JsonSchema::compile(json::parse(R"({"type": "number", "minimum": 0, "maximum": 1})"));
  EXPECT_TRUE(accepts(unit, "0." + std::string(200000, '3')));
  const auto one = JsonSchema::compile(json::parse(R"({"type": "number", "maximum": 1})"));
  Recognizer z = recognizer(one);
  ASSERT_TRUE(z.feed("1." + std::string(1022, '0')));  // 1,024 bytes
  EXPECT_FALSE(Recognizer(z).feed("0"));
  EXPECT_TRUE(z.complete());
  const auto above0 = JsonSchema::compile(json::parse(R"({"type": "number", "exclusiveMinimum": 0})"));
  Recognizer y = recognizer(above0);
  ASSERT_TRUE(y.feed("0." + std::string(1022, '0')));
  EXPECT_FALSE(Recognizer(y).feed("0"));
  EXPECT_TRUE(ct::test::json_can_go_on(y));
  EXPECT_TRUE(y.feed("7" + std::string(5000, '7')));  // settled
  EXPECT_TRUE(y.complete());
  // Bounds no number meets leave numbers out of a type list; a double of 2^53 or more might be a
  // rounded longer integer, so it is refused.
  const auto either = JsonSchema::compile(
      json::parse(R"({"type": ["integer", "string"], "minimum": 0.5, "maximum": 0.9})"));
  EXPECT_TRUE(accepts(either, R"("x")"));
  EXPECT_EQ(first_refused(either, "0"), 0);
  // Enum values outside the bounds are left out.
  const auto e = JsonSchema::compile(json::parse(R"({"enum": [1, 5, 50, "x"], "maximum": 10})"));
  EXPECT_EQ(e->node(e->root()).literals.size(), 3u);
  EXPECT_EQ(first_refused(e, "50"), 1);
  // The tighter of minimum and exclusiveMinimum; the decimals compare exactly.
  const auto both = JsonSchema::compile(
      json::parse(R"({"type": "number", "minimum": 0.1, "exclusiveMinimum": 0.1, "maximum": 0.3})"));
  EXPECT_FALSE(accepts(both, "0.1"));
  EXPECT_TRUE(accepts(both, "0.10000000000000000001"));
  EXPECT_TRUE(accepts(both, "0.3"));
  EXPECT_FALSE(accepts(both, "0.30000000000000001"));
  // Every prefix of the numbers between two bounds can go on.
  const auto band = JsonSchema::compile(
      json::parse(R"({"type": "number", "minimum": -12.75, "exclusiveMaximum": 7.5})"));
  for (const char* text : {"-12.75", "-12.7", "-0.001", "7.4999", "-9"}) {
    Recognizer b = recognizer(band);
    for (const char* c = text; *c; ++c) {
      ASSERT_TRUE(b.feed((uint8_t)*c)) << text;
      ASSERT_TRUE(ct::test::json_can_go_on(b)) << text;
    }
    EXPECT_TRUE(b.complete()) << text;
  }
}

// Patterns and formats: a string is read character by character (escapes and UTF-8 decoded),
// each byte refused as soon as no character it can still become leads on to a match.
TEST(JsonSchema, PatternsRefuseTheFirstByteNoMatchCanFollow) {
  const auto s = JsonSchema::compile(json::parse(R"({"type": "object", "properties": {
      "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
      "when": {"type": "string", "format": "date"},
      "word": {"type": "string", "pattern": "^[\u00e0-\u00ff]x$"},
      "any": {"type": "string", "pattern": "b"}}, "additionalProperties": false})"));
  // ok: a prefix the recognizer takes; bad: the byte it must refuse next.
  auto refused_at = [&](const std::string& ok, const std::string& bad) {
    Recognizer r = recognizer(s);
    ASSERT_TRUE(r.feed(ok)) << ok;
    EXPECT_TRUE(ct::test::json_can_go_on(r)) << ok;
    EXPECT_EQ(first_refused(s, ok + bad), (int)ok.size()) << ok << " + " << bad;
  };
  EXPECT_TRUE(accepts(s, R"({"code": "AB-123", "when": "2024-02-29", "any": "abc"})"));
  refused_at(R"({"code": "A)", "b");
  refused_at(R"({"code": "AB-12)", "\"");                 // too short
  refused_at(R"({"code": "AB-123)", "4");                  // too long
  EXPECT_TRUE(accepts(s, R"({"code": "\u0041\u0042-123"})"));  // escapes are their characters
  refused_at(R"({"code": "\u00)", "6");  // \u006_ is U+0060..U+006F: no capital letter
  refused_at(R"({"code": "AB-123)", "\\");  // nothing may follow, not even an escape
  EXPECT_TRUE(accepts(s, R"({"code": "AB\u002d12\u0033"})"));  // an escape may write any of them
  refused_at(R"({"when": "2023-02-2)", "9");               // not a leap year
  refused_at(R"({"when": "2024-04-3)", "1");
  EXPECT_TRUE(accepts(s, R"({"when": "2000-02-29"})"));
  // UTF-8: a lead byte is taken if some character it begins is in the class.
  EXPECT_TRUE(accepts(s, "{\"word\": \"\xc3\xa9x\"}"));
  EXPECT_TRUE(accepts(s, R"({"word": "\u00e9x"})"));
  refused_at("{\"word\": \"", "\xe2");          // U+2000..U+2FFF
  refused_at("{\"word\": \"", "\xc2");          // U+0080..U+00BF
  refused_at("{\"word\": \"\xc3", "\x9f");      // U+00DF
  refused_at(R"({"word": "\u00)", "d");             // U+00D0..U+00DF
  refused_at(R"({"word": "\u)", "D");              // U+D000..U+DFFF
  refused_at(R"({"any": "\uD)", "8");               // a surrogate pair is not taken
  // Unanchored: anything around one 'b', and the string may end only once it holds one.
  EXPECT_TRUE(accepts(s, "{\"any\": \"\xf0\x9f\x98\x80" "b\\n\"}"));
  refused_at(R"({"any": "xyz)", "\"");
  // A whole character leaves no trace of how it was written: the states are equal (the mask
  // cache of the constraint keys on them).
  Recognizer x = recognizer(s), y = recognizer(s);
  ASSERT_TRUE(x.feed(R"({"any": "\u00e9a)"));
  ASSERT_TRUE(y.feed("{\"any\": \"\xc3\xa9" "a"));
  EXPECT_TRUE(x == y);
  ASSERT_TRUE(y.feed(R"(\u000a)"));  // the same character as x's \n, another way
  ASSERT_TRUE(x.feed(R"(\n)"));
  EXPECT_TRUE(x == y);
}

// Every text of up to 6 bytes over an alphabet of quotes, escapes, hex digits and the bytes of
// 2-4-byte characters: no state the recognizer reaches is stranded, and it completes exactly the
// documents std::regex (the reference) finds matching.
// A pattern beside minLength / maxLength: a character is refused as soon as no match within the
// bounds can follow it, counted in characters however they are written.
TEST(JsonSchema, PatternsBesideLengthBoundsEndWithinThem) {
  auto schema = [](const char* pattern, int lo, int hi) {
    json s = {{"type", "string"}, {"pattern", pattern}};
    if (lo > 0) s["minLength"] = lo;
    if (hi >= 0) s["maxLength"] = hi;
    return JsonSchema::compile(s);
  };
  const auto word = schema("^[a-z]+$", 3, 5);
  EXPECT_TRUE(accepts(word, R"("abc")"));
  EXPECT_TRUE(accepts(word, R"("ab\u0063de")"));           // an escape is one character
  EXPECT_EQ(first_refused(word, R"("ab")"), 3);            // two: the quote
  EXPECT_EQ(first_refused(word, R"("abcdef")"), 6);        // the sixth letter
  EXPECT_EQ(first_refused(word, R"("abcd\u0065f")"), 11);  // the sixth, after an escaped fifth
  // Pairs of "ab" within 5: after "abab" an 'a' could end only at 6 characters.
  const auto pairs = schema("^(ab)+$", 0, 5);
  EXPECT_TRUE(accepts(pairs, R"("abab")"));
  EXPECT_EQ(first_refused(pairs, R"("ababa")"), 5);
  // Alternatives of other lengths: with at most 3, only the a's are left.
  const auto alt = schema("^aa$|^bbbbb$", 0, 3);
  EXPECT_TRUE(accepts(alt, R"("aa")"));
  EXPECT_EQ(first_refused(alt, R"("b")"), 1);
  EXPECT_EQ(first_refused(alt, "\"\\u0062"), 6);  // the escape's last digit: it would be a 'b'
  // At least 4 of a pattern whose strings are long: any count above works, counted to 4 + 255.
  const auto some = schema("x(yz)*", 9, -1);
  EXPECT_TRUE(accepts(some, R"("xyzyzyzyz")"));
  EXPECT_TRUE(accepts(some, R"("abxyzyzyz")"));        // search: the match anywhere
  EXPECT_EQ(first_refused(some, R"("xyzyzyzy")"), 9);  // 8: the quote
  // Multi-byte characters: 2 to 3 euros; a fourth is refused at its lead byte.
  const auto euros = schema("^\u20ac+$", 2, 3);
  EXPECT_TRUE(accepts(euros, "\"\xe2\x82\xac\xe2\x82\xac\""));
  EXPECT_EQ(first_refused(euros, "\"\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2"), 10);
  // A type list keeps its other kinds where no string of the lengths matches.
  const auto none = JsonSchema::compile(
      json::parse(R"({"type": ["string", "null"], "pattern": "^ab$", "minLength": 3})"));
  EXPECT_TRUE(accepts(none, "null"));
  EXPECT_EQ(first_refused(none, R"("")"), 0);
  // A format, too (pydantic's HttpUrl-style bounds beside one).
  const auto date =
      JsonSchema::compile(json::parse(R"({"type": "string", "format": "date", "maxLength": 10})"));
  EXPECT_TRUE(accepts(date, R"("2024-02-29")"));
}

TEST(JsonSchema, PatternStringsNeverStrandAndMatchTheReference) {
  const std::string alphabet = "\"\\uD80aAbx1-n\xc3\xa9\xe2\x82\xac\xf0\x9f\x98";
  std::vector<json> schemas;
  for (const char* pattern : {"^(a|\u00e9)+1?$", "[^a]b", "^\\S-\\w?$", "^(\u20ac|\\u0041)\\d*$"})
    schemas.push_back({{"type", "string"}, {"pattern", pattern}});
  // Beside length bounds: a character is taken only where the pattern can still end within them.
  schemas.push_back(
      {{"type", "string"}, {"pattern", "^(a|\u00e9)+1?$"}, {"minLength", 2}, {"maxLength", 3}});
  schemas.push_back({{"type", "string"}, {"pattern", "[^a]b"}, {"maxLength", 3}});
  schemas.push_back({{"type", "string"}, {"pattern", "^\\S-\\w*$"}, {"minLength", 4}});
  schemas.push_back(
      {{"type", "string"}, {"pattern", "^(ab|\u20ac1|x)+$"}, {"minLength", 3}, {"maxLength", 5}});
  for (const json& schema : schemas) {
    SCOPED_TRACE(schema.dump());
    const auto compiled = JsonSchema::compile(schema);
    std::vector<std::pair<std::string, Recognizer>> level = {{"", recognizer(compiled)}};
    int complete = 0, states = 0;
    for (int depth = 0; depth < 6; ++depth) {
      std::vector<std::pair<std::string, Recognizer>> next;
      for (const auto& [text, r] : level) {
        for (char c : alphabet) {
          Recognizer q = r;
          if (!q.feed((uint8_t)c)) continue;
          ++states;
          const std::string t = text + c;
          ASSERT_TRUE(ct::test::json_can_go_on(q)) << t;
          if (q.complete()) {
            ++complete;
            ASSERT_TRUE(ref_valid(json::parse(t), schema, schema)) << t;
          }
          next.emplace_back(t, q);
        }
      }
      level = std::move(next);
    }
    EXPECT_GT(complete, 0);  // (the other direction: the random documents' test above)
    EXPECT_GT(states, 50);
  }
}

// prefixItems: element i follows prefixItems[i], the rest items (absent: any value; false:
// none), refused at the exact byte; an element whose schema would not fit in the frames left
// is not offered, whatever the element before it needed.
TEST(JsonSchema, TuplesFollowPrefixItemsElementByElement) {
  const auto pair = JsonSchema::compile(json::parse(
      R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
          "items": false, "minItems": 2})"));
  EXPECT_TRUE(accepts(pair, R"([1, "a"])"));
  EXPECT_EQ(first_refused(pair, R"(["a")"), 1);       // a string first
  EXPECT_EQ(first_refused(pair, R"([1, 2)"), 4);      // a number second
  EXPECT_EQ(first_refused(pair, R"([1, "a", )"), 7);  // no third element
  EXPECT_EQ(first_refused(pair, R"([1])"), 2);        // minItems 2
  const auto rest = JsonSchema::compile(json::parse(
      R"({"type": "array", "prefixItems": [{"type": "boolean"}], "items": {"type": "null"}})"));
  EXPECT_TRUE(accepts(rest, "[]"));
  EXPECT_TRUE(accepts(rest, "[true, null, null]"));
  EXPECT_EQ(first_refused(rest, "[true, 1"), 7);
  const auto open = JsonSchema::compile(json::parse(R"({"prefixItems": [{"const": 1}]})"));
  EXPECT_TRUE(accepts(open, R"([1, "x", {"y": [2]}])"));  // after the prefix: any value
  EXPECT_EQ(first_refused(open, "[2"), 1);
  // Nested 19 deep, an element needing two frames more does not fit after one needing none.
  json s = {{"type", "array"},
            {"prefixItems",
             {{{"type", "integer"}},
              {{"type", "array"}, {"minItems", 1}, {"items", {{"type", "array"}}}}}}};
  for (int i = 0; i < 18; ++i) s = {{"type", "array"}, {"items", std::move(s)}};
  const auto deep = JsonSchema::compile(s);
  Recognizer r = recognizer(deep);
  ASSERT_TRUE(r.feed(std::string(19, '[') + "1"));  // 19 frames open
  Recognizer c = r;
  EXPECT_FALSE(c.feed(","));  // [[]] would need the 20th and 21st
  EXPECT_TRUE(ct::test::json_can_go_on(r));
  EXPECT_TRUE(r.feed("]"));
  const auto shallow = JsonSchema::compile(s["items"]);
  Recognizer t = recognizer(shallow);
  ASSERT_TRUE(t.feed(std::string(18, '[') + "1"));
  EXPECT_TRUE(t.feed(", [[]]"));  // one level less: it fits
}

// Objects of an anyOf / oneOf told apart by a tag: the tag comes first and its value picks the
// alternative the rest of the object follows; refused at the exact byte otherwise. Unions the
// recognizer cannot tell apart so are refused by name.
TEST(JsonSchema, TaggedUnionsPickTheirAlternativeByTheTagWrittenFirst) {
  const json defs = json::parse(R"({
      "A": {"type": "object", "properties": {"t": {"const": "a"}, "x": {"type": "integer"}},
            "required": ["t", "x"], "additionalProperties": false},
      "B": {"type": "object", "properties": {"t": {"enum": ["b", 2]}, "y": {"type": "null"}},
            "required": ["t"]}})");
  json schema = {
      {"$defs", defs},
      {"anyOf", {{{"$ref", "#/$defs/A"}}, {{"$ref", "#/$defs/B"}}, {{"type", "string"}}}}};
  const auto u = JsonSchema::compile(schema);
  EXPECT_TRUE(accepts(u, R"({"t": "a", "x": 1})"));
  EXPECT_TRUE(accepts(u, R"({"t": 2, "y": null, "z": [1]})"));  // B allows other keys
  EXPECT_TRUE(accepts(u, R"("s")"));
  EXPECT_EQ(first_refused(u, R"({"x": 1, "t": "a"})"), 2);  // the tag first
  EXPECT_EQ(first_refused(u, R"({"t": "c")"), 7);           // no alternative's value
  EXPECT_EQ(first_refused(u, R"({"t": "a", "y")"), 12);     // A has no y
  EXPECT_EQ(first_refused(u, R"({"t": "a"})"), 9);          // A requires x
  EXPECT_TRUE(accepts(u, R"({"t": 2, "x": "any"})"));       // B's x: another key, any value
  EXPECT_EQ(first_refused(u, R"({"t": "a", "t")"), 12);     // the tag once
  // Nested: a union inside an array of unions, both switching at their own depth.
  schema = {{"$defs", defs},
            {"type", "array"},
            {"items",
             {{"oneOf", {{{"$ref", "#/$defs/A"}}, {{"$ref", "#/$defs/B"}}}},
              {"discriminator", {{"propertyName", "t"}}}}}};
  const auto arr = JsonSchema::compile(schema);
  EXPECT_TRUE(accepts(arr, R"([{"t": "b", "y": null}, {"t": "a", "x": 3}, {"t": 2}])"));
  EXPECT_EQ(first_refused(arr, R"([{"t": "b", "y": null}, {"t": "a", "y")"), 36);
  // A union of unions is the union of their objects, told apart by a tag they all have (here
  // B and C by "u" alone would pass the inner union, but the outer needs one for A, B and C).
  const auto nested = JsonSchema::compile(json::parse(R"({"anyOf": [
      {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"],
       "additionalProperties": false},
      {"anyOf": [{"type": "object", "properties": {"k": {"const": 2}, "b": {"type": "null"}},
                  "required": ["k", "b"], "additionalProperties": false},
                 {"type": "object", "properties": {"k": {"const": 3}, "c": {"type": "null"}},
                  "required": ["k", "c"], "additionalProperties": false}]}]})"));
  EXPECT_TRUE(accepts(nested, R"({"k": 2, "b": null})"));
  EXPECT_TRUE(accepts(nested, R"({"k": 1})"));
  EXPECT_EQ(first_refused(nested, R"({"k": 3})"), 7);  // C requires c
  EXPECT_EQ(first_refused(nested, R"({"k": 3, "b")"), 10);
  // What cannot be told apart so is refused by name.
  const std::pair<const char*, const char*> cases[] = {
      {R"({"anyOf": [{"type": "object", "properties": {"t": {"const": 1}}},
                     {"type": "object", "properties": {"t": {"const": 2}}, "required": ["t"]}]})",
       "must differ in a tag"},  // the first does not require t
      {R"({"anyOf": [{"type": "object", "properties": {"t": {"enum": [1, 2]}}, "required": ["t"]},
                     {"type": "object", "properties": {"t": {"const": 2}}, "required": ["t"]}]})",
       "must differ in a tag"},  // 2 in both
      {R"({"anyOf": [{"type": "object", "properties": {"t": {"type": "string"}}, "required": ["t"]},
                     {"type": "object", "properties": {"t": {"const": "b"}}, "required": ["t"]}]})",
       "must differ in a tag"},  // no enum in the first
      {R"({"anyOf": [{"type": "object"}, {"type": "object", "properties": {"t": {"const": 1}},
                     "required": ["t"]}]})",
       "must differ in a tag"},
      {R"({"anyOf": [true, {"type": "object", "properties": {"t": {"const": 1}}, "required": ["t"]}]})",
       "anyOf alternatives 0 and 1 both admit an object"},
      {R"({"$defs": {"s": {"type": "string"}}, "oneOf": [{"$ref": "#/$defs/s"}, {"$ref": "#/$defs/s"}]})",
       "oneOf alternatives 0 and 1 both admit a string"},
      {R"({"$defs": {"o": {"type": "object", "properties": {"t": {"const": 1}}, "required": ["t"]}},
          "oneOf": [{"$ref": "#/$defs/o"}, {"$ref": "#/$defs/o"}]})",
       "must differ in a tag"},  // oneOf: the same object twice matches twice
      // Tag values compared as JSON Schema compares them: 1 is 1.0, -0 is 0 (a review found
      // {"t": 1} accepted by a oneOf that both alternatives match).
      {R"({"oneOf": [{"type": "object", "properties": {"t": {"const": 1}}, "required": ["t"]},
                     {"type": "object", "properties": {"t": {"const": 1.0}}, "required": ["t"]}]})",
       "must differ in a tag"},
      {R"({"anyOf": [{"type": "object", "properties": {"t": {"enum": [0, "x"]}}, "required": ["t"]},
                     {"type": "object", "properties": {"t": {"const": -0.0}}, "required": ["t"]}]})",
       "must differ in a tag"},
      {R"({"anyOf": [{"type": "object", "properties": {"t": {"const": 10}}, "required": ["t"]},
                     {"type": "object", "properties": {"t": {"const": 1e1}}, "required": ["t"]}]})",
       "must differ in a tag"},
  };
  for (const auto& c : cases) {
    const std::string err = test::error_of([&] { JsonSchema::compile(json::parse(c.first)); });
    EXPECT_NE(err.find(c.second), std::string::npos) << c.first << ": " << err;
  }
  // allOf of one schema (a $ref given a description, as older pydantic wrote it) is that schema.
  const auto all = JsonSchema::compile(json::parse(
      R"({"$defs": {"s": {"type": "string", "maxLength": 2}},
          "properties": {"a": {"allOf": [{"$ref": "#/$defs/s"}], "description": "d"}}})"));
  EXPECT_TRUE(accepts(all, R"({"a": "xy"})"));
  EXPECT_EQ(first_refused(all, R"({"a": "xyz")"), 9);
  // Numbers that differ in value are told apart whatever their text (1 and 10, 0.1 and 1).
  EXPECT_NO_THROW(JsonSchema::compile(json::parse(
      R"({"anyOf": [{"type": "object", "properties": {"t": {"enum": [1, 0.1]}}, "required": ["t"]},
                    {"type": "object", "properties": {"t": {"enum": [10, 100.5]}}, "required": ["t"]}]})")));
  // Hostile schemas (a review's): a union site is made once per list of objects, however many
  // sites refer to them, and the tag values read are bounded; more than 65,534 tag values in
  // one union are refused (the recognizer counts a value's index in 16 bits).
  {
    json big = json::array();
    for (int i = 0; i < 40000; ++i) big.push_back("v" + std::to_string(i));
    json s = {
        {"$defs",
         {{"A",
           {{"type", "object"}, {"properties", {{"t", {{"enum", big}}}}}, {"required", {"t"}}}},
          {"B",
           {{"type", "object"}, {"properties", {{"t", {{"const", "b"}}}}}, {"required", {"t"}}}}}}};
    json sites = json::array();
    for (int i = 0; i < 60; ++i)  // (wrapped in anyOfs of one: the same objects)
      sites.push_back(
          {{"anyOf", {{{"anyOf", {{{"$ref", "#/$defs/A"}}, {{"$ref", "#/$defs/B"}}}}}}}});
    s["type"] = "array";
    s["prefixItems"] = sites;
    const auto shared = JsonSchema::compile(s);  // one union node for the 60 sites
    EXPECT_LT(shared->size(), 200u);
    EXPECT_TRUE(accepts(shared, R"([{"t": "v39999"}, {"t": "b"}])"));
    json wide = s["$defs"];
    json more = json::array();
    for (int i = 0; i < 30000; ++i) more.push_back("w" + std::to_string(i));
    wide["B"]["properties"]["t"] = {{"enum", more}};  // 70,000 in all
    const std::string err = test::error_of([&] {
      JsonSchema::compile(
          json{{"$defs", wide}, {"anyOf", {{{"$ref", "#/$defs/A"}}, {{"$ref", "#/$defs/B"}}}}});
    });
    EXPECT_NE(err.find("more than 65534 tag values"), std::string::npos) << err;
  }
  // The union's path in messages outlives the nodes the union adds (a review found it read
  // after add() had moved the node table, under ASan).
  EXPECT_NO_THROW(JsonSchema::compile(json::parse(R"({"type": "object", "properties": {
      "f0": {"type": "null"}, "u": {"anyOf": [
        {"type": "object", "properties": {"t": {"const": "a"}}, "required": ["t"]},
        {"type": "object", "properties": {"t": {"const": "b"}}, "required": ["t"]}]}}})")));
  // anyOf keeps an object that two alternatives share (the same $ref twice): no tag needed.
  EXPECT_NO_THROW(JsonSchema::compile(json::parse(
      R"({"$defs": {"o": {"type": "object"}}, "anyOf": [{"$ref": "#/$defs/o"}, {"$ref": "#/$defs/o"}]})")));
}

TEST(JsonSchema, NeitherStrandsTheSamplerNorWidensTheSchema) {
  // An integer listed with other types: '.', 'e' and 'E' are refused in numbers only.
  const auto ib = JsonSchema::compile(json::parse(R"({"type": ["integer", "boolean"]})"));
  EXPECT_TRUE(accepts(ib, "true"));
  EXPECT_TRUE(accepts(ib, "false"));
  EXPECT_EQ(first_refused(ib, "1.5"), 1);
  const auto is = JsonSchema::compile(json::parse(R"({"type": ["integer", "string"]})"));
  EXPECT_TRUE(accepts(is, "\"hello E.\""));
  // items false holds whatever maxItems says.
  const auto none = JsonSchema::compile(
      json::parse(R"({"type": "array", "items": false, "maxItems": 3, "minItems": 0})"));
  EXPECT_EQ(first_refused(none, "[1]"), 1);
  EXPECT_TRUE(accepts(none, "[]"));
  // Another key may hold no escape: "\u0061" is "a", which is not another key.
  const auto esc = JsonSchema::compile(json::parse(
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "q\"": {"type": "null"}},
          "required": ["a"]})"));
  EXPECT_EQ(first_refused(esc, R"({"a": 1, "\u0061": "x"})"), 10);
  EXPECT_TRUE(accepts(esc, R"({"a": 1, "q\"": null, "other key": [1]})"));  // a name's own escape
  const auto nl = JsonSchema::compile(json::parse(R"({"properties": {"a\nb": {"type": "null"}}})"));
  EXPECT_TRUE(accepts(nl, R"({"a\nb": null, "c": 1})"));
  EXPECT_EQ(first_refused(nl, R"({"a\u000ab": 1})"), 4);  // the name spelled another way
  EXPECT_EQ(first_refused(nl, R"({"a\n": 1})"), 5);        // another key with an escape
  // A seen name that needs an escape: its escape can begin no other key, so it is refused at
  // once (else the text would be stranded inside the key).
  EXPECT_EQ(first_refused(esc, R"({"q\"": null, "a": 1, "q\)"), 24);
  // Nesting: a schema needing more than 20 frames, or no finite document, is refused whole; one
  // needing 20 fits, and a property whose value would not fit in what is left is not offered.
  auto nested = [](int n, bool required) {
    json s = {{"type", "integer"}};
    for (int i = 0; i < n; ++i) {
      json o = {{"type", "object"}, {"properties", {{"a", std::move(s)}}}};
      if (required) o["required"] = {"a"};
      s = std::move(o);
    }
    return s;
  };
  for (const char* text :
       {R"({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]})",
        R"({"type": "array", "items": {"$ref": "#"}, "minItems": 1})"}) {
    try {
      JsonSchema::compile(json::parse(text));
      ADD_FAILURE() << "accepted " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no document fits"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(JsonSchema::compile(nested(21, true)), Error);
  const auto twenty = JsonSchema::compile(nested(20, true));
  std::string doc;
  for (int i = 0; i < 20; ++i) doc += "{\"a\": ";
  EXPECT_TRUE(accepts(twenty, doc + "1" + std::string(20, '}')));
  const auto optional = JsonSchema::compile(nested(30, false));
  std::string deep;
  for (int i = 0; i < 19; ++i) deep += "{\"a\": ";
  Recognizer r = recognizer(optional);
  ASSERT_TRUE(r.feed(deep + "{"));  // the 20th object
  Recognizer k = r;
  EXPECT_TRUE(k.feed("\"a"));  // "a..." may still become another key,
  EXPECT_FALSE(k.feed("\""));  // but "a" itself would need a 21st object
  EXPECT_TRUE(r.feed("}"));
  // A space inside a string is content, not padding: where only a space may come next (a const,
  // an enum value or a property name with one) the text can still go on. (The fuzz harness once
  // took such a state for a stranded one.)
  const auto spaced = JsonSchema::compile(json::parse(
      R"({"type": "object", "properties": {"a": {"const": " x "}, "t ags": {"enum": ["b c"]}},
                         "additionalProperties": false})"));
  for (const char* prefix : {R"({"a": ")", R"({"a": " x)", R"({"t)", R"({"t ags": "b)"}) {
    Recognizer s = recognizer(spaced);
    ASSERT_TRUE(s.feed(prefix)) << prefix;
    EXPECT_TRUE(ct::test::json_can_go_on(s)) << prefix;
    Recognizer other = s;
    EXPECT_FALSE(other.feed("q")) << prefix;  // only the space may follow
  }
  EXPECT_TRUE(accepts(spaced, R"({"a": " x ", "t ags": "b c"})"));
  // The check itself tells a stranded state apart: a stand-in that takes `spaces` spaces (-1:
  // any number) and then, if `x`, one 'x' that completes it.
  struct Script {
    int spaces;
    bool x;
    bool done = false;
    bool complete() const { return done; }
    bool feed(uint8_t c) {
      if (done) return false;
      if (c == ' ' && spaces != 0) return spaces > 0 ? (--spaces, true) : true;
      if (c == 'x' && x && spaces <= 0) return done = true;
      return false;
    }
  };
  EXPECT_TRUE(ct::test::json_can_go_on(Script{3, true}));
  EXPECT_FALSE(ct::test::json_can_go_on(Script{3, false}));   // spaces, then nothing
  EXPECT_FALSE(ct::test::json_can_go_on(Script{0, false}));   // nothing at all
  EXPECT_FALSE(ct::test::json_can_go_on(Script{-1, false}));  // spaces forever
  // Every prefix of every random document of every schema can go on (or is complete).
  std::mt19937 rng(2);
  for (const char* text : kSchemas) {
    const json schema = json::parse(text);
    const auto compiled = JsonSchema::compile(schema);
    for (int it = 0; it < 200; ++it) {
      const std::string d = random_value(rng, schema, schema, 0).dump(rng() % 2 ? 1 : -1);
      Recognizer p = recognizer(compiled);
      for (char c : d) {
        if (!p.feed((uint8_t)c)) break;
        ASSERT_TRUE(ct::test::json_can_go_on(p)) << d;
      }
    }
  }
  // Long texts: an enum value or a property name longer than 65,000 bytes is refused (the
  // recognizer counts a key's or value's bytes in 16 bits); another key of any length is fine.
  EXPECT_THROW(JsonSchema::compile(json{{"enum", {std::string(70000, 'x')}}}), Error);
  const auto open = JsonSchema::compile(json::parse(R"({"type": "object"})"));
  EXPECT_TRUE(accepts(open, "{\"" + std::string(70000, 'k') + "\": 1}"));
  // An enum value nested 300,000 deep is refused, not copied (a copy recursed that deep).
  const std::string deep_enum =
      "{\"enum\": [" + std::string(300000, '[') + std::string(300000, ']') + "]}";
  EXPECT_THROW(JsonSchema::compile(json::parse(deep_enum)), Error);
}

TEST(JsonSchema, TheCompilerRefusesWhatItWouldNotCheckByName) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "string", "pattern": "^x?y?z?$", "minLength": 4})",
       "the pattern matches no string of a length from minLength to maxLength"},
      {R"({"type": "string", "pattern": "a", "minLength": 5000})", "minLength 5000 beside pattern"},
      {R"({"type": "object", "properties": {"d": {"type": "string", "format": "uri"}}})",
       "json_schema at #/properties/d/format: format 'uri' is not supported"},
      {R"j({"type": "string", "pattern": "(?=x)"})j",
       "json_schema at #/pattern: pattern '(?=x)': groups (? other than (?:"},
      {R"({"type": "string", "pattern": 3})", "pattern must be a string"},
      {R"({"type": "string", "pattern": "^a", "format": "date"})", "pattern beside format"},
      {R"({"type": "string", "pattern": "[]"})", "the pattern matches no string"},
      {R"({"type": "string", "pattern": "^a{,3}$"})", "does not form a quantifier"},
      {R"({"enum": ["ab", "b"], "pattern": "^a$"})",
       "no enum or const value has the schema's type"},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})",
       "allOf is supported with exactly one"},
      {R"({"allOf": [{"type": "string"}], "maxLength": 3})", "allOf beside other constraining"},
      {R"({"type": "integer", "uniqueItems": true})", "keyword 'uniqueItems'"},
      {R"({"type": "integer", "multipleOf": 2})", "keyword 'multipleOf'"},
      {R"({"anyOf": [{"type": "integer"}, {"type": "number"}]})",
       "anyOf alternatives 0 and 1 both admit a number"},
      {R"({"anyOf": [{"type": "object"}, {"type": "object", "required": ["a"]}]})",
       "anyOf alternatives that are objects must differ in a tag"},
      {R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
          "$ref": "#/$defs/a"})",
       "refers back to itself"},
      {R"({"$ref": "#/$defs/missing"})", "does not name a place in the schema"},
      {R"({"$ref": "https://example.com/s.json"})", "only references inside the schema"},
      {R"({"type": "object", "required": ["a"], "additionalProperties": false})",
       "'a' is required but is not among the properties"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "minItems 3 is above maxItems 2"},
      {R"({"type": "string", "enum": [1, 2]})", "no enum or const value has the schema's type"},
      {R"({"enum": [{"a": 1}]})", "objects or arrays are not supported"},
      {R"({"type": "thing"})", "unknown type 'thing'"},
      {R"(false)", "the schema false admits no value"},
      {R"({"items": [{"type": "string"}]})", "tuple form) is not supported; write prefixItems"},
      {R"({"prefixItems": []})", "prefixItems must be a non-empty array"},
      {R"({"prefixItems": {"type": "string"}})", "prefixItems must be a non-empty array"},
      {R"({"type": "array", "prefixItems": [true], "items": false, "minItems": 2})",
       "minItems 2 is above maxItems 1"},

      {R"({"type": "object", "properties": {"a": {"$id": "x", "type": "string"}}})",
       "$id inside a schema is not supported"},
      {R"({"type": "array", "minItems": 1.5})", "minItems must be an integer"},
      {R"({"type": "string", "minLength": 3, "maxLength": 2})", "minLength 3 is above maxLength 2"},
      {R"({"type": "string", "maxLength": -1})", "maxLength must be an integer"},
      {R"({"enum": ["abc"], "maxLength": 2})", "no enum or const value has the schema's type"},
      {R"({"type": "number", "minimum": 5, "maximum": 3})", "no number lies between"},
      {R"({"type": "number", "exclusiveMinimum": 1, "maximum": 1})", "no number lies between"},
      {R"({"type": "integer", "minimum": 0.2, "maximum": 0.8})", "no integer lies between"},
      {R"({"type": "number", "exclusiveMinimum": true})", "must be a number"},
      {R"({"type": "integer", "maximum": 123456789012345678901234567890})",
       "is not exact as a double"},
      {R"({"type": "integer", "minimum": 1e20})", "is not exact as a double"},
      {R"(3)", "a schema is an object or a boolean, not number"},
  };
  for (const auto& [schema, want] : cases) {
    try {
      JsonSchema::compile(json::parse(schema));
      ADD_FAILURE() << "accepted " << schema;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << schema << ": " << e.what();
    }
  }
  // pattern and format constrain strings only: where strings are not among the kinds they are
  // not read, and a pattern that matches nothing leaves strings out of the kinds.
  EXPECT_NO_THROW(JsonSchema::compile(json::parse(R"({"type": "integer", "format": "int64"})")));
  const auto nothing = JsonSchema::compile(json::parse(R"({"type": ["string", "null"], "pattern": "[]"})"));
  EXPECT_TRUE(accepts(nothing, "null"));
  EXPECT_EQ(first_refused(nothing, "\"\""), 0);
  // Patterns' tables grow with their length: 64 KiB of patterns per schema at most.
  json long_patterns = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 17; ++i)
    long_patterns["properties"]["p" + std::to_string(i)] = {
        {"type", "string"}, {"pattern", "[" + std::string(3998, 'a') + "]"}};
  const std::string err = test::error_of([&] { JsonSchema::compile(long_patterns); });
  EXPECT_NE(err.find("longer than 65536 bytes in all"), std::string::npos) << err;
  long_patterns["properties"].erase("p16");
  EXPECT_NO_THROW(JsonSchema::compile(long_patterns));
  std::string many = R"({"type": "object", "properties": {)";
  for (int i = 0; i < 65; ++i) many += (i ? ", \"p" : "\"p") + std::to_string(i) + "\": {}";
  EXPECT_THROW(JsonSchema::compile(json::parse(many + "}}")), Error);
  // The root's own $id, also where "#" refers back to the root, is an annotation.
  EXPECT_NO_THROW(JsonSchema::compile(json::parse(
      R"({"$id": "https://x/t", "type": "object", "properties": {"c": {"$ref": "#"}}})")));
  // A hostile schema's size is bounded, not its stack: nesting, and nodes (a chain of $defs).
  json deep = json::object();
  for (int i = 0; i < 100000; ++i) deep = json{{"items", std::move(deep)}};
  try {
    JsonSchema::compile(deep);
    ADD_FAILURE() << "a schema nested 100000 deep was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nested more than 128 deep"), std::string::npos) << e.what();
  }
  json chain = {{"$ref", "#/$defs/d0"}, {"$defs", json::object()}};
  for (int i = 0; i < 5000; ++i)
    chain["$defs"]["d" + std::to_string(i)] = {{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
  chain["$defs"]["d5000"] = {{"type", "integer"}};
  EXPECT_THROW(JsonSchema::compile(chain), Error);  // too deep
  json wide = {{"type", "object"}, {"properties", json::object()}};
  for (int p = 0; p < 64; ++p) {
    json alts = json::array();
    for (int a = 0; a < 64; ++a) alts.push_back({{"const", a}});
    wide["properties"]["p" + std::to_string(p)] = {{"anyOf", alts}};
  }
  try {
    JsonSchema::compile(wide);
    ADD_FAILURE() << "a schema of 4161 nodes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 4096 schema nodes"), std::string::npos)
        << e.what();
  }
}

class JsonSchemaConstraintTest : public test::TinyJsonModelTest {};

TEST_F(JsonSchemaConstraintTest, TheTrieAllowsExactlyTheTokensWhoseBytesContinueTheText) {
  const auto cat = JsonSchema::compile(json::parse(kSchemas[0]));
  test::expect_trie_allows_exactly_the_continuations(
      model_->tokenizer(), recognizer(cat),
      {"", "{", "{\"", "{\"na", "{\"age\": 1", "{\"color\": \"t",
       "{\"tags\": [\"a\", \"b\", \"c\"", "{\"name\": \"x\", "});
}

// Random logits through the constrained sampler: the recognizer never strands the sampler (a
// token always continues the text), and every answer that ends is a document the independent
// validator accepts.
TEST_F(JsonSchemaConstraintTest, SampledAnswersAreValidDocumentsForEverySchema) {
  const Tokenizer& tok = model_->tokenizer();
  const auto trie = std::make_shared<const VocabTrie>(tok);
  const int V = tok.n_vocab();
  std::mt19937 rng(5);
  std::normal_distribution<float> z(0.0f, 3.0f);
  std::vector<std::string> pieces(V);
  for (int32_t id = 0; id < V; ++id) pieces[id] = tok.token_to_piece(id);
  for (const char* text : kSchemas) {
    const json schema = json::parse(text);
    SCOPED_TRACE(schema.dump());
    const auto compiled = JsonSchema::compile(schema);
    int ended = 0;
    std::string last;
    for (int run = 0; run < 16; ++run) {
      SamplingParams p;
      p.temperature = run % 3 == 0 ? 0.0f : 1.0f;
      p.top_k = run % 2 == 0 ? 0 : 40;
      p.seed = run;
      Sampler s(p);
      s.set_constraint(std::make_unique<JsonSchemaConstraint>(trie, compiled));
      std::string out;
      bool eog = false;
      std::vector<float> logits(V);
      for (int t = 0; t < 400 && !eog; ++t) {
        for (float& x : logits) x = z(rng);
        // Favour closing brackets and quotes, later on, and hold back runs of whitespace (many
        // of the tiny vocabulary's tokens), so that documents end within the budget.
        for (int32_t id = 0; id < V; ++id) {
          const std::string& piece = pieces[id];
          if (piece == "}" || piece == "]" || piece == "\"") logits[id] += (float)(t / 20);
          if (!piece.empty() && piece.find_first_not_of(" \t\n\r") == std::string::npos)
            logits[id] -= 4.0f;
        }
        const int32_t id = s.sample(logits.data(), V);
        if (tok.is_eog(id)) {
          eog = true;
        } else {
          out += tok.token_to_piece(id);
        }
      }
      Recognizer r = recognizer(compiled);
      ASSERT_TRUE(r.feed(out)) << out;
      last = out;
      if (eog) {
        ++ended;
        json doc;
        try {
          doc = json::parse(out);
        } catch (const json::out_of_range&) {
          continue;  // a number beyond a double (9e6654117971): the reference cannot read it
        }
        EXPECT_TRUE(ref_valid(doc, schema, schema)) << out;
      }
    }
    EXPECT_GT(ended, 4) << last;
  }
}

TEST_F(JsonSchemaConstraintTest, TheEngineAnswersADocumentOfTheSchema) {
  EngineOptions eo;
  eo.model_path = *path_;
  Engine eng(eo);
  SelectiveOptions sel;
  // Every key forced, every value a short choice: a random model's answer ends within the budget.
  const json schema = json::parse(R"({"type": "object", "properties": {"ok": {"type": "boolean"},
      "n": {"enum": [1, 2, 3]}, "tag": {"anyOf": [{"const": "a"}, {"type": "null"}]}},
      "required": ["ok", "n", "tag"], "additionalProperties": false})");
  int whole = 0;
  for (int run = 0; run < 6; ++run) {
    GenerateOptions gen;
    gen.max_tokens = 300;
    gen.json_schema = JsonSchema::compile(schema);
    gen.sampling.temperature = 1.0f;
    gen.sampling.seed = run;
    const Answer a = eng.answer({}, "Describe a cat.", sel, gen);
    Recognizer r = recognizer(gen.json_schema);
    ASSERT_TRUE(r.feed(a.text)) << a.text;
    if ((int)a.tokens.size() < gen.max_tokens) {
      ++whole;
      EXPECT_TRUE(ref_valid(json::parse(a.text), schema, schema)) << a.text;
    }
  }
  EXPECT_GT(whole, 0);
}

}  // namespace
}  // namespace ct
