// SplitMix64, its bounded draw and the FNV-1a string seeds (core/random.h).
#include "core/random.h"

#include "core/error.h"

namespace ct {

uint64_t SplitMix64::next() {
  uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::below(uint64_t n) {
  CT_ASSERT(n >= 1, "below({})", n);
  unsigned __int128 m = (unsigned __int128)next() * n;
  uint64_t low = (uint64_t)m;
  if (low < n) {
    const uint64_t t = (0 - n) % n;  // 2^64 mod n
    while (low < t) {
      m = (unsigned __int128)next() * n;
      low = (uint64_t)m;
    }
  }
  return (uint64_t)(m >> 64);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint64_t stream_seed(uint64_t seed, const std::string& label) {
  SplitMix64 g(seed ^ fnv1a64(label));
  return g.next();
}

}  // namespace ct
