// Sampling implementation: candidates sorted by logit, cut by top-k then top-p, then drawn.
#include "model/sampler.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/vec.h"
#include "core/error.h"
#include "model/json_constraint.h"

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
  for (int i = 0; i < n_vocab; ++i) {
    const float z = logits[i] / p.temperature;
    cand[i] = {std::isnan(z) ? -INFINITY : z, i};  // NaN counts as -inf, as in the fast path
  }
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
    if (prob[i] < p.min_p) continue;  // prob[i] = p_i / p_max
    out.ids.push_back(cand[i].second);
    out.w.push_back(prob[i]);
  }
  return out;
}

namespace {

// A thread's sampling scratch (the engine samples on one thread).
struct Scratch {
  std::vector<float> z, e;
  std::vector<int32_t> sorted;
  std::vector<uint16_t> bucket;
  SampleCandidates cand;
};

}  // namespace

const SampleCandidates& Sampler::candidates(const float* logits, int n_vocab) {
  SampleCandidates& c = top_candidates(logits, n_vocab);
  if (p_.min_p > 0.0f) {  // weights are p_i / p_max: the most likely has weight 1
    size_t kept = 0;
    for (size_t i = 0; i < c.ids.size(); ++i) {
      if (c.w[i] < p_.min_p) continue;
      c.ids[kept] = c.ids[i];
      c.w[kept++] = c.w[i];
    }
    c.ids.resize(kept);
    c.w.resize(kept);
  }
  return c;
}

SampleCandidates& Sampler::top_candidates(const float* logits, int n_vocab) {
  thread_local Scratch t;
  SampleCandidates& c = t.cand;
  std::vector<float>& z = t.z;
  c.ids.clear();
  c.w.clear();
  z.resize(n_vocab);
  for (int i = 0; i < n_vocab; ++i) {
    const float x = logits[i] / p_.temperature;
    z[i] = std::isnan(x) ? -INFINITY : x;
  }
  const float mx = cpu::vec_max(z.data(), n_vocab, z[0]);
  if (!std::isfinite(mx)) return c;  // +inf from a tiny temperature, or nothing finite
  const auto weight = [&](int32_t i) { return std::exp((double)z[i] - mx); };
  const auto before = [&](int32_t a, int32_t b) {
    return z[a] > z[b] || (z[a] == z[b] && a < b);
  };
  // Keeps the smallest prefix of c (from `from` on) whose share of `total` reaches top-p after
  // `cum` of mass ahead of it; false, c unchanged, when it does not get there.
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
  int k = (p_.top_k > 0 && p_.top_k < n_vocab) ? p_.top_k : n_vocab;
  if (k < n_vocab && constraint_) {
    // Most logits may be -inf (a constraint's mask): top-k of the allowed ones, found without
    // widening the margin below them pass after pass.
    k = std::max(1, std::min(k, n_allowed_));
  }
  if (k < n_vocab) {
    // Top-k: the tokens within a logit margin of the best are the top ones; widen it until they
    // are k or more, then sort those alone. Top-p then within the k, as the reference does.
    for (float margin = 8.0f;; margin *= 2.0f) {
      const float floor = mx - margin;
      t.sorted.clear();
      for (int32_t i = 0; i < n_vocab; ++i) {
        if (z[i] >= floor) t.sorted.push_back(i);
      }
      if ((int)t.sorted.size() >= k || !std::isfinite(floor)) break;
    }
    const int n = std::min<int>(k, (int)t.sorted.size());
    std::partial_sort(t.sorted.begin(), t.sorted.begin() + n, t.sorted.end(), before);
    c.ids.assign(t.sorted.begin(), t.sorted.begin() + n);
    double sum = 0;
    for (int32_t id : c.ids) {
      c.w.push_back(weight(id));
      sum += c.w.back();
    }
    if (p_.top_p < 1.0f) cut_top_p(0, 0.0, sum);
    return c;
  }
  t.e.assign(z.begin(), z.end());
  cpu::vec_exp_sub_sum(t.e.data(), n_vocab, mx);
  if (p_.top_p >= 1.0f) {  // every token, in id order
    c.ids.resize(n_vocab);
    c.w.resize(n_vocab);
    for (int i = 0; i < n_vocab; ++i) {
      c.ids[i] = i;
      c.w[i] = t.e[i];
    }
    return c;
  }
  // Top-p over the vocabulary: the mass by logit in buckets of 1/32 below the best (the last
  // bucket takes everything 32 or more below), in one pass. The buckets before the one where
  // the mass nears top-p are in the nucleus whole (in id order); from that bucket on, each
  // bucket's tokens are sorted and cut as the reference cuts, going on into the next bucket
  // when the exact (double) mass has not got there yet. "Nears": the float masses that pick the
  // bucket differ from the double weights by rounding, so the bucket is picked 1e-5 early.
  constexpr int kBuckets = 1024;
  constexpr float kRange = 32.0f;
  double total = 0;
  std::vector<double> mass(kBuckets + 1, 0.0);
  t.bucket.resize(n_vocab);
  for (int i = 0; i < n_vocab; ++i) {
    const float d = (mx - z[i]) * (kBuckets / kRange);  // monotone in z: ties share a bucket
    const int b = d < (float)kBuckets ? (int)d : kBuckets;
    t.bucket[i] = (uint16_t)b;
    mass[b] += t.e[i];
    total += t.e[i];
  }
  int first = kBuckets;
  double ahead = 0;
  for (int b = 0; b <= kBuckets; ++b) {
    if ((ahead + mass[b]) / total >= p_.top_p - 1e-5) {
      first = b;
      break;
    }
    ahead += mass[b];
  }
  // The tokens of buckets `first` on, grouped by bucket in one counting pass (each group in id
  // order), so that each bucket after the first costs its own tokens only.
  std::vector<int> start(kBuckets + 2, 0);
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (t.bucket[i] < first) {
      c.ids.push_back(i);
      c.w.push_back(weight(i));
    } else {
      ++start[t.bucket[i] + 1];
    }
  }
  for (int b = first; b <= kBuckets; ++b) start[b + 1] += start[b];
  t.sorted.resize(start[kBuckets + 1]);
  {
    std::vector<int> fill(start.begin(), start.end());
    for (int32_t i = 0; i < n_vocab; ++i) {
      if (t.bucket[i] >= first) t.sorted[fill[t.bucket[i]]++] = i;
    }
  }
  double cum = 0;
  for (double w : c.w) cum += w / total;
  for (int b = first; b <= kBuckets; ++b) {
    const auto lo = t.sorted.begin() + start[b], hi = t.sorted.begin() + start[b + 1];
    if (lo == hi) continue;
    std::sort(lo, hi, before);
    const size_t from = c.ids.size();
    for (auto it = lo; it != hi; ++it) {
      c.ids.push_back(*it);
      c.w.push_back(weight(*it));
    }
    if (cut_top_p(from, cum, total)) break;
    for (size_t i = from; i < c.ids.size(); ++i) cum += c.w[i] / total;
  }
  // Rounding can leave the mass a hair short with every token in: then they all stay.
  return c;
}

void Sampler::set_context(const std::vector<int32_t>& tokens) {
  seen_.clear();
  is_seen_.clear();
  for (int32_t id : tokens) seen_.push_back(id);
  std::sort(seen_.begin(), seen_.end());
  seen_.erase(std::unique(seen_.begin(), seen_.end()), seen_.end());
}

void Sampler::see(int32_t id) {
  if (is_seen_[id]) return;
  is_seen_[id] = 1;
  seen_.push_back(id);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

Sampler::~Sampler() = default;

void Sampler::set_constraint(std::unique_ptr<TokenConstraint> c) { constraint_ = std::move(c); }

const float* Sampler::adjust(const float* logits, int n_vocab) {
  const bool penalties = p_.frequency_penalty != 0.0f || p_.presence_penalty != 0.0f;
  const bool repetition = p_.repetition_penalty != 1.0f;
  if (repetition && is_seen_.empty()) {  // the context's tokens, checked once
    is_seen_.assign(n_vocab, 0);
    for (int32_t id : seen_) {
      CT_THROW_IF_NOT(id >= 0 && id < n_vocab, "context token {}: the vocabulary has {}", id,
                      n_vocab);
      is_seen_[id] = 1;
    }
  }
  if (constraint_) {
    n_allowed_ = constraint_->allowed(allowed_);
    CT_THROW_IF_NOT((int)allowed_.size() == n_vocab,
                    "the sampler's constraint has a {}-token vocabulary; the logits have {}",
                    allowed_.size(), n_vocab);
  }
  if (!constraint_ && p_.logit_bias.empty() && (!penalties || counts_.empty()) &&
      (!repetition || seen_.empty()))
    return logits;
  adjusted_.assign(logits, logits + n_vocab);
  if (repetition) {
    for (int32_t id : seen_) {
      float& x = adjusted_[id];
      x = x > 0 ? x / p_.repetition_penalty : x * p_.repetition_penalty;
    }
  }
  for (const auto& [id, bias] : p_.logit_bias) {
    CT_THROW_IF_NOT(id >= 0 && id < n_vocab, "logit_bias for token {}: the vocabulary has {}", id,
                    n_vocab);
    adjusted_[id] += bias;
  }
  for (const auto& [id, n] : counts_) {
    adjusted_[id] -= (float)n * p_.frequency_penalty + p_.presence_penalty;
  }
  if (constraint_) {
    constexpr float kNever = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n_vocab; ++i) {
      if (!allowed_[i]) adjusted_[i] = kNever;
    }
  }
  return adjusted_.data();
}

int32_t Sampler::sample(const float* raw, int n_vocab) {
  const float* logits = adjust(raw, n_vocab);
  int32_t id = -1;
  if (p_.temperature > 0.0f) {
    const SampleCandidates& c = candidates(logits, n_vocab);
    if (!c.ids.empty()) {
      double total = 0;
      for (double w : c.w) total += w;
      std::uniform_real_distribution<double> u(0.0, total);
      double r = u(rng_);
      for (size_t i = 0; i < c.ids.size() && id < 0; ++i) {
        r -= c.w[i];
        if (r <= 0) id = c.ids[i];
      }
      if (id < 0) id = c.ids.back();
    }
  }
  // Greedy, or no finite scaled logit (argmax's rule then: a NaN at index 0 wins, none elsewhere).
  if (id < 0) id = argmax(logits, n_vocab);
  if (constraint_) {
    // A draw's zero-weight candidate (its -inf) or a NaN argmax: the best allowed token instead.
    if (!allowed_[id]) {
      id = -1;
      for (int i = 0; i < n_vocab; ++i) {
        if (allowed_[i] && (id < 0 || logits[i] > logits[id])) id = i;
      }
    }
    constraint_->accept(id);
  }
  if (p_.repetition_penalty != 1.0f) see(id);
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

}  // namespace ct
