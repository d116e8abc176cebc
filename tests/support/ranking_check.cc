// Shared helpers for the ranking tests; see ranking_check.h.
#include "support/ranking_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace ct::test {

Kv random_kv(int n_layer, int n_tok, int kv_dim, uint32_t seed) {
  Kv kv(n_layer, n_tok, kv_dim);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int l = 0; l < n_layer; ++l) {
    const float scale = std::pow(10.0f, static_cast<float>(l % 3) - 1.0f);
    for (auto* m : {&kv.k[l], &kv.v[l]}) {
      for (int t = 0; t < n_tok; ++t) {
        for (int c = 0; c < kv_dim; ++c) {
          (*m)[static_cast<size_t>(t) * kv_dim + c] = scale * (0.3f * (c % 5) + nd(rng));
        }
      }
    }
  }
  return kv;
}

void expect_rankings_match(const ChunkRanking& got, const ChunkRanking& want, double rel,
                           const std::string& what) {
  ASSERT_EQ(got.scores.size(), want.scores.size()) << what;
  ASSERT_EQ(got.order.size(), want.order.size()) << what;
  double mean = 0.0;
  for (float s : want.scores) mean += std::fabs(s);
  mean = std::max(mean / std::max<size_t>(want.scores.size(), 1), 1e-30);
  int bad = 0;
  for (size_t t = 0; t < want.scores.size() && bad < 5; ++t) {
    const double tol = rel * std::max<double>(std::fabs(want.scores[t]), mean);
    if (std::fabs(got.scores[t] - want.scores[t]) > tol) {
      ADD_FAILURE() << what << ": score[" << t << "] = " << got.scores[t] << ", reference "
                    << want.scores[t];
      ++bad;
    }
  }
  for (size_t i = 0; i < want.order.size() && bad < 5; ++i) {
    const double a = want.scores[got.order[i]], b = want.scores[want.order[i]];
    if (std::fabs(a - b) > rel * std::max(std::fabs(b), mean)) {
      ADD_FAILURE() << what << ": rank " << i << " holds token " << got.order[i]
                    << ", reference token " << want.order[i] << " (reference scores " << a << " vs "
                    << b << ")";
      ++bad;
    }
  }
}

}  // namespace ct::test
