// Next-token sampling: greedy, or temperature with top-k and top-p (nucleus), seeded.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace ct {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax, lowest id on ties)
  int top_k = 40;            // 0 = no limit
  float top_p = 0.95f;       // 1 = no limit
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
  int32_t sample(const float* logits, int n_vocab);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

// A generated token's log-probability under the model (the log-softmax of its raw logits, before
// temperature and top-k/top-p, as OpenAI's and vLLM's logprobs report it) and the k most
// likely tokens with theirs, most likely first (ties: the lower id first).
struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};
inline constexpr int kMaxTopLogprobs = 20;
// k in [0, kMaxTopLogprobs]; logits must be finite.
TokenLogprob token_logprob(const float* logits, int n_vocab, int32_t id, int k);

// The first index of the largest logit (a NaN is never the largest, unless at index 0), by
// vector passes; argmax_ref is the plain loop the tests hold it to.
int32_t argmax(const float* logits, int n);
int32_t argmax_ref(const float* logits, int n);

}  // namespace ct
