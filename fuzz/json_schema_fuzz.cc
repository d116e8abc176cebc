// libFuzzer target: response_format json_schema (model/json_constraint.h). The input is a schema's
// JSON text, a NUL byte, then a document. The compiler either compiles the schema or refuses it
// with ct::Error (no other exception, no crash, whatever the nesting or size); a compiled schema's
// recognizer must refuse the same byte whether the document is fed whole or byte by byte, leave
// its state unchanged when it refuses one, never reach a state from which no text leads to a
// complete value (that would strand the sampler; ct::test::json_can_go_on), and accept only
// documents that nlohmann::json parses and that the reference validator of the subset
// (tests/support/json_schema_ref.h) finds valid for the schema (where it can judge them: numbers
// of at most 15 significant digits, as the bounds are compared exactly and the reference's as
// doubles; patterns std::regex takes, on strings of at most 64 characters without the non-ASCII
// white space its "C" locale classifies otherwise than ECMA-262).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "fuzz_common.h"
#include "model/json_constraint.h"
#include "support/json_schema_ref.h"

namespace {

// Whether the text holds a number with more than 15 significant digits outside strings: the
// recognizer compares numbers with their bounds exactly, the reference validator as doubles,
// which tell apart only 15 digits, so the reference cannot judge such a document.
bool beyond_a_double(const std::string& doc) {
  bool leading = true, beyond = false;
  int digits = 0;
  ct::fuzz::for_each_outside_strings(doc.data(), doc.size(), [&](unsigned char c) {
    if (c >= '0' && c <= '9') {
      if (c != '0') leading = false;
      if (!leading && ++digits > 15) beyond = true;
    } else if (c != '.') {
      digits = 0;
      leading = true;
    }
  });
  return beyond;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  if (nul == std::string::npos) return 0;
  nlohmann::json schema;
  try {
    schema = nlohmann::json::parse(in.substr(0, nul));
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  std::shared_ptr<const ct::JsonSchema> compiled;
  try {
    compiled = ct::JsonSchema::compile(schema);
  } catch (const ct::Error&) {
    return 0;  // refused, with its reason
  } catch (const std::exception& e) {
    ct::fuzz::finding("the compiler threw something other than ct::Error", e.what());
  }
  const std::string doc = in.substr(nul + 1);
  const ct::JsonSchemaRecognizer start(false, ct::JsonSchemaEvents(compiled.get()));
  ct::JsonSchemaRecognizer whole = start;
  const bool fed = whole.feed(doc);
  ct::JsonSchemaRecognizer r = start;
  size_t taken = 0;
  for (; taken < doc.size(); ++taken) {
    const ct::JsonSchemaRecognizer before = r;
    if (!r.feed(static_cast<uint8_t>(doc[taken]))) {
      if (!(r == before)) ct::fuzz::finding("a refusal changed the state");
      break;
    }
  }
  if ((taken == doc.size()) != fed) ct::fuzz::finding("whole and byte-by-byte feeding differ");
  if (!ct::test::json_can_go_on(r))
    ct::fuzz::finding("a state that cannot go on to a whole value", doc.c_str());
  if (!fed || !whole.complete()) return 0;
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(doc);
  } catch (const nlohmann::json::out_of_range&) {
    return 0;  // a number beyond a double: the reference's limit
  } catch (const nlohmann::json::exception&) {
    ct::fuzz::finding("the schema's recognizer accepted text that is not JSON", doc.c_str());
  }
  if (beyond_a_double(doc)) return 0;
  try {
    if (!ct::test::json_schema_valid(parsed, schema, schema, /*integral_floats=*/true))
      ct::fuzz::finding("the recognizer accepted a document the schema refuses", doc.c_str());
  } catch (const ct::test::CannotJudge&) {
    return 0;  // a pattern or string the reference's std::regex cannot judge
  }
  return 0;
}
