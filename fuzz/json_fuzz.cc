// libFuzzer target: JSON output's recognizer (model/json_constraint.h) on arbitrary bytes, against
// nlohmann::json as the independent parser. The recognizer must take the whole input as a complete
// object exactly when nlohmann parses it as an object (inputs beyond the recognizer's generator
// bounds, deeper than 64 or with more than 32 whitespace bytes in a row, numbers beyond a
// double's range, which nlohmann refuses, and inputs nlohmann reads its own way, with a byte
// order mark or a NUL byte, are left out); it must refuse the same byte whichever
// way the input is fed (whole, or byte by byte on copies); and a refused byte must leave its
// state unchanged.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_common.h"
#include "model/json_constraint.h"

namespace {

// Whether the input stays within the recognizer's bounds (so that the reference's verdict
// applies): nesting depth, and whitespace runs outside strings, by a plain scan.
bool within_bounds(const std::string& s) {
  int depth = 0, max_depth = 0, spaces = 0, max_spaces = 0;
  ct::fuzz::for_each_outside_strings(s.data(), s.size(), [&](unsigned char c) {
    const bool ws = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    spaces = ws ? spaces + 1 : 0;
    if (spaces > max_spaces) max_spaces = spaces;
    if (c == '{' || c == '[') max_depth = ++depth > max_depth ? depth : max_depth;
    if (c == '}' || c == ']') --depth;
  });
  return max_depth <= ct::JsonRecognizer::kMaxDepth &&
         max_spaces <= ct::JsonRecognizer::kMaxSpaces;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string s(reinterpret_cast<const char*>(data), size);
  ct::JsonRecognizer whole;
  const bool fed = whole.feed(s);
  const bool ours = fed && whole.complete();
  // Byte by byte: the first refused byte leaves the state as it was (a copy compares equal in
  // what it accepts next), and no byte after it is taken.
  ct::JsonRecognizer r;
  size_t taken = 0;
  for (; taken < s.size(); ++taken) {
    const ct::JsonRecognizer before = r;
    if (!r.feed(static_cast<uint8_t>(s[taken]))) {
      ct::JsonRecognizer again = before;
      if (again.feed(static_cast<uint8_t>(s[taken]))) ct::fuzz::finding("refused byte taken on a copy");
      // The state is unchanged: it takes what the copy of the state before takes.
      for (int b = 0; b < 256; ++b) {
        ct::JsonRecognizer x = r, y = before;
        if (x.feed((uint8_t)b) != y.feed((uint8_t)b)) ct::fuzz::finding("a refusal changed the state");
      }
      break;
    }
  }
  if ((taken == s.size()) != fed) ct::fuzz::finding("whole and byte-by-byte feeding differ");
  // The reference's own reading: it skips a UTF-8 byte order mark before the text (which RFC
  // 8259 forbids generating) and ends the input at a NUL byte.
  if (!within_bounds(s) || s.rfind("\xEF\xBB\xBF", 0) == 0 || s.find('\0') != std::string::npos)
    return 0;
  bool ref = false;
  try {
    ref = nlohmann::json::parse(s).is_object();
  } catch (const nlohmann::json::out_of_range&) {
    return 0;  // a number beyond a double: the reference's limit, no verdict on the syntax
  } catch (const nlohmann::json::exception&) {
    ref = false;
  }
  if (ours != ref) ct::fuzz::finding(ref ? "a JSON object refused" : "non-JSON accepted", s.c_str());
  return 0;
}
