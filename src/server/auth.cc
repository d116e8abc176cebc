// API-key checks of the server (see auth.h).
#include "server/auth.h"

#include <array>
#include <cctype>
#include <cstdint>

#include "core/sha256.h"

namespace ct::server {
namespace {

std::array<uint8_t, 32> digest_of(const std::string& s) {
  Sha256 h;
  h.update(s);
  return h.digest();
}

bool same_key(const std::string& given, const std::string& key) {
  const std::array<uint8_t, 32> a = digest_of(given), b = digest_of(key);
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

}  // namespace

bool route_is_public(const std::string& path) { return path == "/health"; }

std::string api_key_refusal(const std::optional<std::string>& authorization,
                            const std::string& key) {
  if (!authorization || authorization->empty()) {
    return "no API key given; send the header 'Authorization: Bearer <key>' with the key this "
           "server was started with (--api-key or CACHETUNE_API_KEY)";
  }
  const std::string& h = *authorization;
  // The scheme is case-insensitive (RFC 9110); one or more spaces before the token.
  static const std::string kScheme = "bearer ";
  bool bearer = h.size() > kScheme.size();
  for (size_t i = 0; bearer && i < kScheme.size(); ++i)
    bearer = std::tolower(static_cast<unsigned char>(h[i])) == kScheme[i];
  if (!bearer) return "the Authorization header is not of the form 'Bearer <key>'";
  size_t start = kScheme.size();
  while (start < h.size() && h[start] == ' ') ++start;
  if (!same_key(h.substr(start), key)) return "incorrect API key provided";
  return "";
}

nlohmann::json api_key_error_body(const std::string& message) {
  return {{"error",
           {{"message", message},
            {"type", "invalid_request_error"},
            {"param", nullptr},
            {"code", "invalid_api_key"}}}};
}

}  // namespace ct::server
