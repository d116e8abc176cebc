// A reference for response_format json_schema: the supported subset's meaning on a parsed value,
// written from JSON Schema's definitions, independent of the byte-level recognizer it checks
// (model/json_constraint.h); patterns through std::regex, formats through their RFCs' grammars. Keys are compared decoded; enum and const values as compact JSON
// text, as the recognizer reads them. Used by tests/unit/json_schema_test.cc and
// fuzz/json_schema_fuzz.cc.
#pragma once

#include <arpa/inet.h>
#include <nlohmann/json.hpp>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <regex>
#include <string>
#include <vector>

namespace ct::test {

// Thrown where the reference cannot judge a value: a pattern std::regex does not take, or a
// string with a character whose class std::regex's "C" locale decides otherwise than ECMA-262
// (the non-ASCII white space of \s, the line separators '.' refuses).
struct CannotJudge {};

// A string's code points (the caller's strings are UTF-8, as nlohmann::json keeps them).
inline std::u32string code_points(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = (unsigned char)s[i];
    const int n = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
    char32_t cp = n == 0 ? c : c & (0x7F >> (n + 1));
    for (int k = 1; k <= n && i + k < s.size(); ++k) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
    out.push_back(cp);
    i += n + 1;
  }
  return out;
}

// JSON Schema's pattern: ECMA-262 regular expression search (not anchored), on code points.
inline bool pattern_matches(const std::string& pattern, const std::string& value) {
  std::wstring w;
  for (char32_t c : code_points(value)) {
    const bool odd_space = c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
                           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
                           c == 0x3000 || c == 0xFEFF;
    if (odd_space) throw CannotJudge{};
    w.push_back((wchar_t)c);
  }
  std::wstring p;
  for (char32_t c : code_points(pattern)) p.push_back((wchar_t)c);
  // std::regex backtracks: a long string against nested quantifiers may take exponential time.
  if (w.size() > 64 || p.size() > 256) throw CannotJudge{};
  try {
    return std::regex_search(w, std::wregex(p, std::regex::ECMAScript));
  } catch (const std::regex_error&) {
    throw CannotJudge{};
  }
}

// The formats the recognizer supports, checked by their RFCs' grammars (not by a pattern):
// RFC 3339 full-date, full-time, date-time; RFC 4122 uuid; dotted-quad ipv4 without leading
// zeros; an RFC 5321 mailbox with a dot-atom local part and a domain of LDH labels; an RFC 1123
// host name (LDH labels of 1-63 characters, at most 253 in all); an RFC 4291 ipv6 address as
// the C library's inet_pton reads it.
inline bool format_valid(const std::string& f, const std::string& v) {
  auto digits = [&](size_t at, size_t n, int& out) {
    if (at + n > v.size()) return false;
    out = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (v[i] < '0' || v[i] > '9') return false;
      out = out * 10 + (v[i] - '0');
    }
    return true;
  };
  auto date = [&](size_t at) {
    int y, m, d;
    if (!digits(at, 4, y) || v.size() < at + 10 || v[at + 4] != '-' || !digits(at + 5, 2, m) ||
        v[at + 7] != '-' || !digits(at + 8, 2, d))
      return false;
    const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return m >= 1 && m <= 12 && d >= 1 && d <= days[m - 1];
  };
  auto time = [&](size_t at) {  // to the end of v
    int h, m, s;
    if (!digits(at, 2, h) || v.size() < at + 8 || v[at + 2] != ':' || !digits(at + 3, 2, m) ||
        v[at + 5] != ':' || !digits(at + 6, 2, s) || h > 23 || m > 59 || s > 60)
      return false;
    size_t i = at + 8;
    if (i < v.size() && v[i] == '.') {
      const size_t f = ++i;
      while (i < v.size() && v[i] >= '0' && v[i] <= '9') ++i;
      if (i == f) return false;
    }
    if (i + 1 == v.size() && (v[i] == 'Z' || v[i] == 'z')) return true;
    int oh, om;
    return i + 6 == v.size() && (v[i] == '+' || v[i] == '-') && digits(i + 1, 2, oh) &&
           v[i + 3] == ':' && digits(i + 4, 2, om) && oh <= 23 && om <= 59;
  };
  auto hex = [](char c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); };
  auto split = [](const std::string& s, char sep) {
    std::vector<std::string> parts(1);
    for (char c : s) {
      if (c == sep) {
        parts.emplace_back();
      } else {
        parts.back().push_back(c);
      }
    }
    return parts;
  };
  if (f == "date") return v.size() == 10 && date(0);
  if (f == "time") return time(0);
  if (f == "date-time") return v.size() > 11 && date(0) && (v[10] == 'T' || v[10] == 't') && time(11);
  if (f == "uuid") {
    if (v.size() != 36) return false;
    for (size_t i = 0; i < 36; ++i)
      if (i == 8 || i == 13 || i == 18 || i == 23 ? v[i] != '-' : !hex(v[i])) return false;
    return true;
  }
  if (f == "binary" || f == "password") return true;  // OpenAPI's: any string
  if (f == "duration") {  // RFC 3339 Appendix A, by its ABNF, one production at a time
    size_t i = 1;
    auto unit = [&](char u) {  // 1*DIGIT u
      size_t j = i;
      while (j < v.size() && v[j] >= '0' && v[j] <= '9') ++j;
      if (j == i || j >= v.size() || v[j] != u) return false;
      i = j + 1;
      return true;
    };
    // A chain of optional-tail units: the first must come, each later one only after the one
    // before it (dur-year [dur-month [dur-day]], dur-hour [dur-minute [dur-second]]).
    auto chain = [&](const char* units) {
      for (const char* u = units; *u; ++u) {
        const size_t at = i;
        if (!unit(*u)) {
          i = at;
          return u != units;
        }
      }
      return true;
    };
    auto time = [&] {
      if (i >= v.size() || v[i] != 'T') return false;
      ++i;
      return chain("HMS") || chain("MS") || chain("S");
    };
    if (v.size() < 3 || v[0] != 'P') return false;
    if (v[1] == 'T') return time() && i == v.size();
    const size_t start = i;
    if (unit('W')) return i == v.size();
    i = start;
    if (!(chain("YMD") || chain("MD") || chain("D"))) return false;
    return i == v.size() || (time() && i == v.size());
  }
  if (f == "ipv4") {
    const auto parts = split(v, '.');
    if (parts.size() != 4) return false;
    for (const std::string& p : parts) {
      if (p.empty() || p.size() > 3 || (p.size() > 1 && p[0] == '0')) return false;
      for (char c : p)
        if (c < '0' || c > '9') return false;
      if (std::stoi(p) > 255) return false;
    }
    return true;
  }
  auto ldh_label = [](const std::string& l) {
    if (l.empty() || l.size() > 63 || l.front() == '-' || l.back() == '-') return false;
    for (char c : l)
      if (!std::isalnum((unsigned char)c) && c != '-') return false;
    return true;
  };
  if (f == "hostname") {
    if (v.empty() || v.size() > 253) return false;
    for (const std::string& l : split(v, '.'))
      if (!ldh_label(l)) return false;
    return true;
  }
  if (f == "ipv6") {
    unsigned char addr[16];
    return v.find('\0') == std::string::npos && inet_pton(AF_INET6, v.c_str(), addr) == 1;
  }
  if (f == "email") {
    const size_t at = v.rfind('@');
    if (at == std::string::npos) return false;
    const std::string atext = "!#$%&'*+-/=?^_`{|}~";
    for (const std::string& a : split(v.substr(0, at), '.')) {
      if (a.empty()) return false;
      for (char c : a)
        if (!std::isalnum((unsigned char)c) && atext.find(c) == std::string::npos) return false;
    }
    for (const std::string& l : split(v.substr(at + 1), '.'))
      if (!ldh_label(l)) return false;
    return true;
  }
  throw CannotJudge{};
}

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
// by_value: enum and const compare numbers by value, as JSON Schema does (1 is 1.0); false: by
// their compact text, as the recognizer matches them (it writes each value as listed). oneOf
// counts its matches by value, so that two alternatives a value matches both of are seen.
inline bool json_schema_valid(const nlohmann::json& v, const nlohmann::json& s,
                              const nlohmann::json& root, bool integral_floats = false,
                              bool by_value = false) {
  using json = nlohmann::json;
  auto valid = [&](const json& x, const json& sub) {
    return json_schema_valid(x, sub, root, integral_floats, by_value);
  };
  auto same = [&](const json& a, const json& b) {
    return by_value ? a == b : a.dump() == b.dump();
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
  if (s.contains("allOf")) {
    for (const json& a : s["allOf"])
      if (!valid(v, a)) return false;
  }
  if (s.contains("oneOf")) {
    int matched = 0, by_val = 0;
    for (const json& a : s["oneOf"]) {
      matched += valid(v, a);
      by_val += json_schema_valid(v, a, root, integral_floats, true);
    }
    return matched >= 1 && by_val == 1;
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
      any = same(s["const"], v);
    } else {
      for (const json& x : s["enum"]) any = any || same(x, v);
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
    if (s.contains("pattern") && s["pattern"].is_string() &&
        !pattern_matches(s["pattern"].get<std::string>(), v.get<std::string>()))
      return false;
    if (s.contains("format") && s["format"].is_string() &&
        !format_valid(s["format"].get<std::string>(), v.get<std::string>()))
      return false;
  }
  if (v.is_array()) {
    if (s.contains("items") && s["items"].is_boolean() && !s["items"].get<bool>() &&
        v.size() > (s.contains("prefixItems") ? s["prefixItems"].size() : 0))
      return false;
    if (v.size() < s.value("minItems", 0.0) || v.size() > s.value("maxItems", 4294967295.0))
      return false;
    const size_t n_prefix = s.contains("prefixItems") ? s["prefixItems"].size() : 0;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i < n_prefix) {
        if (!valid(v[i], s["prefixItems"][i])) return false;
      } else if (s.contains("items")) {
        if (!valid(v[i], s["items"])) return false;
      }
    }
  }
  return true;
}

}  // namespace ct::test
