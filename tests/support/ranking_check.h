// Shared helpers for the ranking tests (tests/unit/freq_rank_test.cc, tests/cuda): random chunk
// K/V with widely different layer scales, and a tolerance-aware comparison of two rankings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reuse/freq_rank.h"

namespace ct::test {

// One chunk's KV: F32 [n_layer][n_tok][kv_dim] for K and for V.
struct Kv {
  int n_layer, n_tok, kv_dim;
  std::vector<std::vector<float>> k, v;
  Kv(int l, int n, int d)
      : n_layer(l),
        n_tok(n),
        kv_dim(d),
        k(l, std::vector<float>(static_cast<size_t>(n) * d)),
        v(l, std::vector<float>(static_cast<size_t>(n) * d)) {}
  std::vector<const float*> kp() const {
    std::vector<const float*> p;
    for (const auto& x : k) p.push_back(x.data());
    return p;
  }
  std::vector<const float*> vp() const {
    std::vector<const float*> p;
    for (const auto& x : v) p.push_back(x.data());
    return p;
  }
};

// Random KV with per-layer scales that differ by orders of magnitude, so the per-layer
// normalisation matters, and a per-channel offset so DC is not negligible.
Kv random_kv(int n_layer, int n_tok, int kv_dim, uint32_t seed);

// Scores within `rel` of each other relative to the mean score (the scores average 1 by
// construction, so this is also close to an absolute tolerance). Orders may differ only where
// tokens are tied to within that tolerance: position by position, the reference scores of the
// tokens each ranking puts there must agree.
void expect_rankings_match(const ChunkRanking& got, const ChunkRanking& want, double rel,
                           const std::string& what);

}  // namespace ct::test
