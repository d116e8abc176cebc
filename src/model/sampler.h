// Next-token sampling: greedy, or temperature with top-k and top-p (nucleus), seeded.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

namespace ct {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax, lowest id on ties)
  int top_k = 40;            // 0 = no limit
  float top_p = 0.95f;       // 1 = no limit
  uint64_t seed = 0;
  // OpenAI's adjustments of the logits before greedy choice or sampling: token j's logit minus
  // count_j * frequency_penalty minus presence_penalty if count_j > 0, count_j its occurrences in
  // the tokens this sampler has chosen so far; plus logit_bias's value for j.
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;
  // After top-k and top-p, the candidates whose probability is at least min_p times the most
  // likely one's (vLLM's and llama.cpp's min-p); 0 = off.
  float min_p = 0.0f;
  // vLLM's (and llama.cpp's) multiplicative penalty on every token that occurs in the context
  // (Sampler::set_context: the prompt) or among the chosen tokens: its logit divided by it when
  // positive, multiplied by it otherwise, once per token whatever its count; applied to the raw
  // logits, before logit_bias and the two penalties above. 1 = off; must be > 0.
  float repetition_penalty = 1.0f;
};

// The tokens a draw chooses among (top-k, then top-p, of softmax(logits / temperature)) and
// their weights (unnormalised probabilities), in the order the draw scans them.
struct SampleCandidates {
  std::vector<int32_t> ids;
  std::vector<double> w;
};

class TokenConstraint;  // model/json_constraint.h

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  ~Sampler();
  // Only the tokens the constraint allows may be chosen (the others' logits count as -inf after
  // the adjustments; greedy and every draw choose among the allowed ones), and each chosen
  // token is passed to its accept(). E.g. JSON output (JsonObjectConstraint).
  void set_constraint(std::unique_ptr<TokenConstraint> c);
  // The tokens before the first one sampled (the prompt), for repetition_penalty; ids outside
  // [0, n_vocab) are refused when sampling.
  void set_context(const std::vector<int32_t>& tokens);
  // The next token from `logits` (adjusted as SamplingParams says); counts it for the penalties.
  int32_t sample(const float* logits, int n_vocab);
  // The candidates of a draw at temperature > 0: the reference's set and weights (a weight may
  // differ in its last bits), without sorting the vocabulary (which cost 23 ms a token on a 152k
  // vocabulary). Without top-k and top-p every token, in id order; with top-k the k best,
  // sorted, found among the tokens within a logit margin of the best; with top-p alone the
  // nucleus from one pass of the mass in logit buckets, the buckets wholly inside it in id order,
  // then the sorted cut where it ends. NaN logits count as -inf here. Empty when no logit is finite
  // after scaling (a temperature so small that the best overflows: sample() then takes the
  // argmax). The result lives in this thread's scratch until its next call (sampling runs on one
  // thread per engine, so a request holds no vocabulary-sized buffers of its own).
  const SampleCandidates& candidates(const float* logits, int n_vocab);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<float> adjusted_;                   // the logits after penalties and bias
  std::vector<std::pair<int32_t, int>> counts_;  // chosen tokens and their counts
  std::vector<int32_t> seen_;  // repetition_penalty: the context's and chosen tokens, each once
  std::vector<char> is_seen_;  // [n_vocab], once sampling has begun: whether a token is in seen_
  std::unique_ptr<TokenConstraint> constraint_;
  std::vector<uint8_t> allowed_;  // the constraint's mask of this step
  int n_allowed_ = 0;             // and how many tokens it allows
  void see(int32_t id);
  // logits, or adjusted_ holding them with the penalties and bias applied.
  const float* adjust(const float* logits, int n_vocab);
  // candidates() before its min-p filter.
  SampleCandidates& top_candidates(const float* logits, int n_vocab);
};

// The reference the fast candidates are held to: sort the whole vocabulary by logit (ties to
// the lower id; NaN as -inf), cut to top-k, then to the smallest prefix with top-p of the mass,
// weights exp(z - max) in double. Needs a finite largest scaled logit.
SampleCandidates sample_candidates_ref(const float* logits, int n_vocab, const SamplingParams& p);

// A generated token's log-probability under the model (the log-softmax of its raw logits, before
// logit bias, penalties, temperature and top-k/top-p, as vLLM's logprobs report it) and the k most
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
