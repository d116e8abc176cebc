// Sampling implementation: candidates sorted by logit, cut by top-k then top-p, then drawn.
#include "model/sampler.h"

#include <algorithm>
#include <cmath>

namespace ct {

int32_t argmax(const float* logits, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

int32_t Sampler::sample(const float* logits, int n_vocab) {
  if (p_.temperature <= 0.0f) return argmax(logits, n_vocab);
  cand_.resize(n_vocab);
  for (int i = 0; i < n_vocab; ++i) cand_[i] = {logits[i] / p_.temperature, i};
  const int k = (p_.top_k > 0 && p_.top_k < n_vocab) ? p_.top_k : n_vocab;
  std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(),
                    [](const auto& a, const auto& b) {
                      return a.first > b.first || (a.first == b.first && a.second < b.second);
                    });
  cand_.resize(k);
  const float mx = cand_[0].first;
  double sum = 0;
  std::vector<double> prob(k);
  for (int i = 0; i < k; ++i) sum += (prob[i] = std::exp((double)cand_[i].first - mx));
  int keep = k;
  if (p_.top_p < 1.0f) {
    double cum = 0;
    for (int i = 0; i < k; ++i) {
      cum += prob[i] / sum;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = 0;
  for (int i = 0; i < keep; ++i) total += prob[i];
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_);
  for (int i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r <= 0) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

}  // namespace ct
