// The tier registry: spec splitting, the size parser every kind shares, and the list of kinds.
#include "store/tier_registry.h"

#include <cctype>
#include <charconv>

#include "core/error.h"

namespace ct::store {

// Each kind is defined in its tier's own file. Adding a tier: its files plus one line here.
extern const TierKind kDeviceTierKind, kHostTierKind;  // memory_tier.cc
extern const TierKind kDiskTierKind;                   // disk_tier.cc
extern const TierKind kRedisTierKind;                  // redis_tier.cc

namespace {

const TierKind* const kTierKinds[] = {&kDeviceTierKind, &kHostTierKind, &kDiskTierKind,
                                      &kRedisTierKind};

const TierKind& kind_of(const TierSpec& spec) {
  for (const TierKind* k : kTierKinds)
    if (spec.kind == k->name) return *k;
  std::string names;
  for (const TierKind* k : kTierKinds) names += (names.empty() ? "" : ", ") + std::string(k->name);
  CT_THROW("tier '{}': unknown kind '{}', expected {}", spec.text, spec.kind, names);
}

}  // namespace

size_t parse_bytes(const std::string& text) {
  CT_THROW_IF_NOT(!text.empty(), "empty size, expected a number with optional K/M/G suffix");
  // Digits with at most one '.', parsed whole by from_chars: std::stod threw std::invalid_argument
  // for "." and std::out_of_range for 400 digits, and ignored the rest of "1.2.3".
  size_t i = 0;
  int n_dots = 0;
  while (i < text.size() && (std::isdigit((unsigned char)text[i]) || text[i] == '.')) {
    n_dots += text[i] == '.';
    ++i;
  }
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + i, v);
  CT_THROW_IF_NOT(
      i > 0 && n_dots <= 1 && ec == std::errc() && end == text.data() + i,
      "size '{}' is not a number with an optional K, M or G suffix (expected e.g. 512M, 2G)", text);
  const std::string suf = text.substr(i);
  double mul = 1;
  if (suf == "K" || suf == "KiB") {
    mul = 1024.0;
  } else if (suf == "M" || suf == "MiB") {
    mul = 1024.0 * 1024;
  } else if (suf == "G" || suf == "GiB") {
    mul = 1024.0 * 1024 * 1024;
  } else if (!suf.empty()) {
    CT_THROW("size '{}' has unknown suffix '{}', expected K, M or G", text, suf);
  }
  // Converting a double at or above 2^64 to size_t is undefined; 2^63 bytes is far beyond any
  // capacity or bandwidth.
  const double bytes = v * mul;
  CT_THROW_IF_NOT(bytes < 0x1p63, "size '{}' is {} bytes, expected less than 2^63", text, bytes);
  return (size_t)bytes;
}

TierSpec parse_tier_spec(const std::string& text) {
  TierSpec spec;
  spec.text = text;
  size_t start = 0;
  bool first = true;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ':') {
      (first ? spec.kind : spec.fields.emplace_back()) = text.substr(start, i - start);
      first = false;
      start = i + 1;
    }
  }
  kind_of(spec).check(spec);
  return spec;
}

std::unique_ptr<Tier> make_tier(const TierSpec& spec) { return kind_of(spec).make(spec); }

std::string calibration_tier_key(const TierSpec& spec) {
  return kind_of(spec).calibration_key(spec);
}

std::vector<std::string> tier_kinds() {
  std::vector<std::string> names;
  for (const TierKind* k : kTierKinds) names.push_back(k->name);
  return names;
}

}  // namespace ct::store
