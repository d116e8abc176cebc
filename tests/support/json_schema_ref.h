// A reference for response_format json_schema: the supported subset's meaning on a parsed value,
// written from JSON Schema's definitions, independent of the byte-level recognizer it checks
// (model/json_constraint.h). Keys are compared decoded; enum and const values as compact JSON
// text, as the recognizer reads them. Used by tests/unit/json_schema_test.cc and
// fuzz/json_schema_fuzz.cc.
#pragma once

#include <nlohmann/json.hpp>
#include <cmath>
#include <cstdint>
#include <string>

namespace ct::test {

// Whether a recognizer's state can go on to a complete value: it is complete, or some byte other
// than whitespace may follow, or a whitespace byte may follow and leads to such a state. Inside a
// string a space is content (a const " a" needs its space); outside strings whitespace alone
// never completes a value and the recognizer allows only a bounded run of it. One accepted
// whitespace byte is followed: outside strings every whitespace byte leads to the same state, and
// inside strings only the space is accepted. A state for which this is false strands a sampler.
template <typename Recognizer>
bool json_can_go_on(Recognizer r) {
  for (int step = 0; step < (1 << 17); ++step) {
    if (r.complete()) return true;
    int space = -1;
    for (int b = 0; b < 256; ++b) {
      Recognizer c = r;
      if (!c.feed(static_cast<uint8_t>(b))) continue;
      if (b != ' ' && b != '\t' && b != '\n' && b != '\r') return true;
      if (space < 0) space = b;
    }
    if (space < 0 || !r.feed(static_cast<uint8_t>(space))) return false;
  }
  return false;
}

// Whether v is valid for schema s (a part of root, which $ref pointers index). integral_floats:
// a float with an integer's value counts as an integer, as JSON Schema says (a parser reads a
// 30-digit integer as a float); false: only values parsed as integers do.
inline bool json_schema_valid(const nlohmann::json& v, const nlohmann::json& s,
                              const nlohmann::json& root, bool integral_floats = false) {
  using json = nlohmann::json;
  auto valid = [&](const json& x, const json& sub) {
    return json_schema_valid(x, sub, root, integral_floats);
  };
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string r = s["$ref"];
    return valid(v, root.at(json::json_pointer(r.substr(1))));
  }
  if (s.contains("anyOf")) {
    for (const json& a : s["anyOf"])
      if (valid(v, a)) return true;
    return false;
  }
  if (s.contains("type")) {
    const json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    const bool integer = v.is_number_integer() ||
                         (integral_floats && v.is_number_float() &&
                          v.get<double>() == std::trunc(v.get<double>()));
    bool any = false;
    for (const json& t : types) {
      const std::string n = t;
      any = any || (n == "object" && v.is_object()) || (n == "array" && v.is_array()) ||
            (n == "string" && v.is_string()) || (n == "number" && v.is_number()) ||
            (n == "integer" && integer) || (n == "boolean" && v.is_boolean()) ||
            (n == "null" && v.is_null());
    }
    if (!any) return false;
  }
  if (s.contains("enum") || s.contains("const")) {
    bool any = false;
    if (s.contains("const")) {
      any = s["const"].dump() == v.dump();
    } else {
      for (const json& x : s["enum"]) any = any || x.dump() == v.dump();
    }
    if (!any) return false;
  }
  if (v.is_object()) {
    const json props = s.value("properties", json::object());
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        if (!valid(it.value(), props[it.key()])) return false;
      } else if (s.contains("additionalProperties") && !valid(it.value(), s["additionalProperties"])) {
        return false;
      }
    }
    for (const json& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return false;
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    auto bound = [&](const char* k) { return s[k].get<double>(); };
    if ((s.contains("minimum") && !(x >= bound("minimum"))) ||
        (s.contains("maximum") && !(x <= bound("maximum"))) ||
        (s.contains("exclusiveMinimum") && !(x > bound("exclusiveMinimum"))) ||
        (s.contains("exclusiveMaximum") && !(x < bound("exclusiveMaximum"))))
      return false;
  }
  if (v.is_string()) {  // length in Unicode code points: the bytes that begin a UTF-8 character
    double chars = 0;
    for (unsigned char c : v.get_ref<const std::string&>()) chars += (c & 0xC0) != 0x80;
    if (chars < s.value("minLength", 0.0) || chars > s.value("maxLength", 4294967295.0))
      return false;
  }
  if (v.is_array()) {
    if (s.contains("items") && s["items"].is_boolean() && !s["items"].get<bool>() && !v.empty())
      return false;
    if (v.size() < s.value("minItems", 0.0) || v.size() > s.value("maxItems", 4294967295.0))
      return false;
    if (s.contains("items"))
      for (const json& x : v)
        if (!valid(x, s["items"])) return false;
  }
  return true;
}

}  // namespace ct::test
