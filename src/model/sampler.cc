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

SampleCandidates sample_candidates_ref(const float* logits, int n_vocab,
                                       const SamplingParams& p) {
  std::vector<std::pair<float, int32_t>> cand(n_vocab);
  for (int i = 0; i < n_vocab; ++i) cand[i] = {logits[i] / p.temperature, i};
  const int k = (p.top_k > 0 && p.top_k < n_vocab) ? p.top_k : n_vocab;
  std::partial_sort(cand.begin(), cand.begin() + k, cand.end(),
                    [](const auto& a, const auto& b) {
                      return a.first > b.first || (a.first == b.first && a.second < b.second);
                    });
  cand.resize(k);
  const float mx = cand[0].first;
  double sum = 0;
  std::vector<double> prob(k);
  for (int i = 0; i < k; ++i) sum += (prob[i] = std::exp((double)cand[i].first - mx));
  int keep = k;
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (int i = 0; i < k; ++i) {
      cum += prob[i] / sum;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  SampleCandidates out;
  for (int i = 0; i < keep; ++i) {
    out.ids.push_back(cand[i].second);
    out.w.push_back(prob[i]);
  }
  return out;
}

const SampleCandidates& Sampler::candidates(const float* logits, int n_vocab) {
  SampleCandidates& c = cand_;
  c.ids.clear();
  c.w.clear();
  z_.resize(n_vocab);
  for (int i = 0; i < n_vocab; ++i) z_[i] = logits[i] / p_.temperature;
  const float mx = cpu::vec_max(z_.data(), n_vocab, z_[0]);
  const auto weight = [&](int32_t i) { return std::exp((double)z_[i] - mx); };
  const auto before = [&](int32_t a, int32_t b) {
    return z_[a] > z_[b] || (z_[a] == z_[b] && a < b);
  };
  // The smallest prefix of c (sorted, weights set) whose share of `total` reaches top-p, after
  // `cum` of mass ahead of it; false when it does not get there.
  const auto cut_top_p = [&](size_t from, double cum, double total) {
    for (size_t i = from; i < c.ids.size(); ++i) {
      cum += c.w[i] / total;
      if (cum >= p_.top_p) {
        c.ids.resize(i + 1);
        c.w.resize(i + 1);
        return true;
      }
    }
    return false;
  };
  const int k = (p_.top_k > 0 && p_.top_k < n_vocab) ? p_.top_k : n_vocab;
  if (k < n_vocab) {
    // Top-k: the tokens within a logit margin of the best are the top ones; widen it until they
    // are k or more, then sort those alone. Top-p then within the k, as the reference does.
    for (float margin = 8.0f;; margin *= 2.0f) {
      const float floor = mx - margin;
      sorted_.clear();
      for (int32_t i = 0; i < n_vocab; ++i) {
        if (z_[i] >= floor) sorted_.push_back(i);
      }
      if ((int)sorted_.size() >= k || !std::isfinite(floor)) break;
    }
    const int n = std::min<int>(k, (int)sorted_.size());
    std::partial_sort(sorted_.begin(), sorted_.begin() + n, sorted_.end(), before);
    c.ids.assign(sorted_.begin(), sorted_.begin() + n);
    double sum = 0;
    for (int32_t id : c.ids) {
      c.w.push_back(weight(id));
      sum += c.w.back();
    }
    if (p_.top_p < 1.0f) cut_top_p(0, 0.0, sum);
    return c;
  }
  e_.assign(z_.begin(), z_.end());
  cpu::vec_exp_sub_sum(e_.data(), n_vocab, mx);
  if (p_.top_p >= 1.0f) {  // every token, in id order
    c.ids.resize(n_vocab);
    c.w.resize(n_vocab);
    for (int i = 0; i < n_vocab; ++i) {
      c.ids[i] = i;
      c.w[i] = e_[i];
    }
    return c;
  }
  // Top-p over the vocabulary: the mass by logit in buckets of 1/32 below the best (the last
  // bucket takes everything 32 or more below), in one pass. The buckets before the one where
  // the mass reaches top-p are in the nucleus whole (in id order); that bucket's tokens are
  // sorted and cut as the reference cuts.
  constexpr int kBuckets = 1024;
  constexpr float kRange = 32.0f;
  double total = 0;
  std::vector<double> mass(kBuckets + 1, 0.0);
  bucket_.resize(n_vocab);
  for (int i = 0; i < n_vocab; ++i) {
    const float d = (mx - z_[i]) * (kBuckets / kRange);  // monotone in z: ties share a bucket
    const int b = d < (float)kBuckets ? (int)d : kBuckets;
    bucket_[i] = (uint16_t)b;
    mass[b] += e_[i];
    total += e_[i];
  }
  int cut = kBuckets;
  double before_cut = 0;
  for (int b = 0; b <= kBuckets; ++b) {
    if ((before_cut + mass[b]) / total >= p_.top_p) {
      cut = b;
      break;
    }
    before_cut += mass[b];
  }
  sorted_.clear();
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (bucket_[i] < cut) {
      c.ids.push_back(i);
      c.w.push_back(weight(i));
    } else if (bucket_[i] == cut) {
      sorted_.push_back(i);
    }
  }
  double cum = 0;
  for (double w : c.w) cum += w / total;
  std::sort(sorted_.begin(), sorted_.end(), before);
  const size_t from = c.ids.size();
  for (int32_t id : sorted_) {
    c.ids.push_back(id);
    c.w.push_back(weight(id));
  }
  // Rounding can leave the mass a hair short with every token in: then keep them all.
  cut_top_p(from, cum, total);
  return c;
}

const float* Sampler::adjust(const float* logits, int n_vocab) {
  const bool penalties = p_.frequency_penalty != 0.0f || p_.presence_penalty != 0.0f;
  if (p_.logit_bias.empty() && (!penalties || counts_.empty())) return logits;
  adjusted_.assign(logits, logits + n_vocab);
  for (const auto& [id, bias] : p_.logit_bias) {
    CT_THROW_IF_NOT(id >= 0 && id < n_vocab, "logit_bias for token {}: the vocabulary has {}", id,
                    n_vocab);
    adjusted_[id] += bias;
  }
  for (const auto& [id, n] : counts_) {
    adjusted_[id] -= (float)n * p_.frequency_penalty + p_.presence_penalty;
  }
  return adjusted_.data();
}

int32_t Sampler::sample(const float* raw, int n_vocab) {
  const float* logits = adjust(raw, n_vocab);
  const int32_t id = p_.temperature <= 0.0f ? argmax(logits, n_vocab) : draw(logits, n_vocab);
  if (p_.frequency_penalty != 0.0f || p_.presence_penalty != 0.0f) {
    auto it = std::find_if(counts_.begin(), counts_.end(), [&](const auto& c) { return c.first == id; });
    if (it == counts_.end()) {
      counts_.push_back({id, 1});
    } else {
      ++it->second;
    }
  }
  return id;
}

int32_t Sampler::draw(const float* logits, int n_vocab) {
  const SampleCandidates& c = candidates(logits, n_vocab);
  double total = 0;
  for (double w : c.w) total += w;
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_);
  for (size_t i = 0; i < c.ids.size(); ++i) {
    r -= c.w[i];
    if (r <= 0) return c.ids[i];
  }
  return c.ids.back();
}

}  // namespace ct
