// API keys for `cachetune serve --api-key` (or $CACHETUNE_API_KEY): every route but /health
// requires `Authorization: Bearer <key>`; a missing or wrong key is a 401 in OpenAI's error
// shape. The comparison takes the same time whatever the key sent.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace ct::server {

// Routes served without a key (load balancers' health checks).
bool route_is_public(const std::string& path);

// Why the request's Authorization header value (nullopt: no header) does not carry `key`, or ""
// when it does. Compares SHA-256 digests of the sent and expected keys byte by byte without an
// early exit, so timing reveals neither the key's length nor a matching prefix.
std::string api_key_refusal(const std::optional<std::string>& authorization,
                            const std::string& key);

// The 401 body: {"error": {"message", "type": "invalid_request_error", "param": null,
// "code": "invalid_api_key"}}, as OpenAI answers a bad key.
nlohmann::json api_key_error_body(const std::string& message);

}  // namespace ct::server
