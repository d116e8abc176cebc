// A random generator defined here, so a seeded draw is the same on every platform and standard
// library: SplitMix64 with an exact bounded draw, FNV-1a for string seeds, and a Fisher-Yates
// shuffle on top. (std::mt19937 is portable, but std::uniform_int_distribution, std::shuffle and
// std::hash are not.) Used by the random policy and the evaluation's bootstrap.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ct {

// SplitMix64 (Steele, Lea, Flood 2014): next() = the well-known mix of state += 0x9e3779b97f4a7c15.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : s_(seed) {}
  uint64_t next();
  // Uniform in [0, n) without modulo bias (Lemire's multiply-shift with rejection); n >= 1.
  uint64_t below(uint64_t n);

 private:
  uint64_t s_;
};

// FNV-1a (64-bit) of s.
uint64_t fnv1a64(const std::string& s);

// FNV-1a of `label` mixed into `seed`: one independent stream per label.
uint64_t stream_seed(uint64_t seed, const std::string& label);

// Fisher-Yates: a uniformly random permutation of v, the same for the same generator state.
template <typename T>
void portable_shuffle(std::vector<T>& v, SplitMix64& g) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[g.below(i)]);
}

}  // namespace ct
