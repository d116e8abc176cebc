// libFuzzer target: the HTTP API's request parsing (server/api.h) on arbitrary body text, the way
// the server runs it: parse_json_body, then parse_chat_request (/v1/chat/completions) and
// parse_chunks on the "chunks" member (/v1/chunks). A bad request must be a RequestError (a 400
// naming the field); any other exception, crash or sanitizer report is a finding.
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "server/api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ct::server::ApiLimits limits;
  limits.max_chunks = 8;
  limits.max_chunk_bytes = 64;  // small, so the fuzzer reaches the size checks
  nlohmann::json body;
  try {
    body = ct::server::parse_json_body(text);
  } catch (const ct::server::RequestError& e) {
    if (e.status() != 400) ct::fuzz::finding("malformed JSON is not a 400:", e.what());
    return 0;
  }
  try {
    const ct::server::ChatRequest r = ct::server::parse_chat_request(body, limits);
    if (r.chunks.size() > (size_t)limits.max_chunks) ct::fuzz::finding("chunk limit not enforced");
    if (r.gen.max_tokens < 1 || r.gen.max_tokens > limits.max_tokens_limit) {
      ct::fuzz::finding("max_tokens outside its limits");
    }
  } catch (const ct::server::RequestError&) {
  }
  try {
    if (body.is_object() && body.contains("chunks")) {
      for (const std::string& c : ct::server::parse_chunks(body["chunks"], limits)) {
        if (c.empty() || c.size() > limits.max_chunk_bytes) ct::fuzz::finding("chunk size");
      }
    }
  } catch (const ct::server::RequestError&) {
  }
  return 0;
}
