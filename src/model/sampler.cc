// Sampling implementation: candidates sorted by logit, cut by top-k then top-p, then drawn.
#include "model/sampler.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/vec.h"
#include "core/error.h"

namespace ct {

int32_t argmax(const float* logits, int n) {
  // The plain loop's answer (argmax_ref): the first index of the largest value; a NaN never
  // wins, except at index 0, where nothing compares greater and 0 stays. One vector pass finds
  // the largest value (max_ps returns its second operand, the running maximum, against a NaN),
  // a second its first index; a batched decode step runs this once per sequence.
  if (n <= 1 || std::isnan(logits[0])) return 0;
  __m256 m = _mm256_set1_ps(logits[0]);
  int i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(logits + i), m);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  float mx = _mm_cvtss_f32(h);
  for (; i < n; ++i) mx = logits[i] > mx ? logits[i] : mx;
  const __m256 target = _mm256_set1_ps(mx);
  for (i = 0; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(logits + i), target, _CMP_EQ_OQ));
    if (hit != 0) return i + __builtin_ctz((unsigned)hit);
  }
  for (; i < n; ++i) {
    if (logits[i] == mx) return i;
  }
  return 0;  // not reached: mx is one of the values
}

TokenLogprob token_logprob(const float* logits, int n_vocab, int32_t id, int k) {
  CT_ASSERT(id >= 0 && id < n_vocab && k >= 0 && k <= kMaxTopLogprobs,
            "token_logprob: id {} of {}, k {}", id, n_vocab, k);
  // log sum exp around the largest logit, by vector passes over a copy (a 152k vocabulary in
  // about 0.1 ms; a scalar double loop took 1.6); the float sum's rounding is far below what
  // the logprobs are read to.
  thread_local std::vector<float> e;
  e.assign(logits, logits + n_vocab);
  const float mx = cpu::vec_max(logits, n_vocab, logits[0]);
  const double lse = mx + std::log((double)cpu::vec_exp_sub_sum(e.data(), n_vocab, mx));
  TokenLogprob out;
  out.id = id;
  out.logprob = (float)(logits[id] - lse);
  // The k best in one pass: a sorted list of at most k (k <= 20, so insertion is cheap).
  const auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int32_t> best;
  best.reserve(k + 1);
  for (int32_t i = 0; i < n_vocab && k > 0; ++i) {
    if ((int)best.size() == k && !better(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
    if ((int)best.size() > k) best.pop_back();
  }
  for (int32_t t : best) out.top.push_back({t, (float)(logits[t] - lse)});
  return out;
}

int32_t argmax_ref(const float* logits, int n) {
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
