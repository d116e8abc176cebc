// Tier construction in one place: a tier spec ("device:2G", "disk:/path:bw=100M",
// "redis:host:port") is parsed and checked by the kind it names, built into a Tier, and mapped to
// the key its recompute-ratio calibration is stored under. Each kind lives in its tier's own file
// (memory_tier.cc, disk_tier.cc, redis_tier.cc); tier_registry.cc lists them, one line each.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "store/tier.h"

namespace ct::store {

struct TierSpec {
  std::string kind;                 // a registered kind: "device", "host", "disk", "redis"
  std::string text;                 // the spec as written, for messages
  std::vector<std::string> fields;  // the ':'-separated fields after the kind
};

// One kind of tier. `check` throws ct::Error naming spec.text and the expected form (usage);
// `make` builds the tier from a spec `check` accepted; `calibration_key` is the part of the spec a
// calibration depends on (the kind, plus whatever changes per-token load costs).
struct TierKind {
  const char* name;
  const char* usage;  // e.g. "disk[:DIR][:CAPACITY][:bw=RATE][:direct][:nosync]"
  void (*check)(const TierSpec& spec);
  std::unique_ptr<Tier> (*make)(const TierSpec& spec);
  std::string (*calibration_key)(const TierSpec& spec);
};

// Parses and checks a spec; throws ct::Error naming the text, and for an unknown kind the known
// ones.
TierSpec parse_tier_spec(const std::string& text);
std::unique_ptr<Tier> make_tier(const TierSpec& spec);
// The part of a tier spec a recompute-ratio calibration depends on: the kind, plus the read
// throttle of a disk ("disk:bw=104857600", bytes/s) because an emulated slow medium is a different
// medium. The directory and capacity do not change per-token costs, so they are left out.
std::string calibration_tier_key(const TierSpec& spec);
std::vector<std::string> tier_kinds();  // registry order

// "512M", "2G", "1.5MiB", "100000" -> bytes; throws ct::Error naming the text.
size_t parse_bytes(const std::string& text);

}  // namespace ct::store
