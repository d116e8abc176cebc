// libFuzzer target: the cache tier specs of --tier (parse_tier_spec, parse_bytes in
// engine/engine.h) on arbitrary text. Bad text must be a ct::Error naming it; a spec that parses
// has a known kind and a port in range.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "engine/engine.h"
#include "store/disk_tier.h"
#include "store/redis_tier.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ct::TierSpec t = ct::parse_tier_spec(text);
    if (t.kind != "device" && t.kind != "host" && t.kind != "disk" && t.kind != "redis") {
      ct::fuzz::finding("unknown tier kind accepted:", t.kind.c_str());
    }
    if (t.kind == "redis") {
      const int port = ct::store::redis_tier_options(t).port;
      if (port <= 0 || port > 65535) ct::fuzz::finding("port range");
    }
    if (t.kind == "disk" && ct::store::disk_tier_options(t).read_bytes_per_sec < 0)
      ct::fuzz::finding("negative disk bandwidth");
  } catch (const ct::Error&) {
  }
  try {
    (void)ct::parse_bytes(text);
  } catch (const ct::Error&) {
  }
  return 0;
}
