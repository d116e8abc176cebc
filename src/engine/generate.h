// Autoregressive decoding on top of a prefilled KV cache, shared by plain generation and by
// every reuse policy (which only differ in how the prompt's cache was filled).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu_forward.h"
#include "model/model.h"
#include "model/sampler.h"

namespace ct {

class JsonSchema;  // model/json_constraint.h

struct GenerateOptions {
  SamplingParams sampling;
  int max_tokens = 128;
  bool stop_at_eog = true;
  // The answer is one JSON object (OpenAI's response_format json_object): only tokens that
  // continue valid JSON text may be chosen, and an end-of-generation token only once the object
  // is whole (JsonObjectConstraint). max_tokens may still cut it short.
  bool json_object = false;
  // The answer is one JSON value that this schema accepts (response_format json_schema;
  // JsonSchemaConstraint); when set, json_object is not.
  std::shared_ptr<const JsonSchema> json_schema;
  // Stop sequences (StopMatcher, at most 4): generation ends before the first occurrence, which
  // is left out of the text and of what on_piece receives.
  std::vector<std::string> stop;
  // >= 0 (at most kMaxTopLogprobs): the engine records each generated token's log-probability
  // and its `logprobs` most likely alternatives in Answer::logprobs; -1: none.
  int logprobs = -1;
  // >= 0 (at most kMaxTopLogprobs): the engine also scores the prompt, recording the
  // log-probability of each of its tokens after the ones before it (and that many alternatives)
  // in Answer::prompt_logprobs; the prompt is then computed whole by the plain forward pass
  // (every row's logits: a prompt of reused chunks cannot be scored, Engine::begin refuses it),
  // on the CPU. -1: none.
  int prompt_logprobs = -1;
};

struct DecodeResult {
  std::vector<int32_t> tokens;  // generated ids (without the stop token)
  std::string text;
  double decode_s = 0;  // time after the first token
  bool stopped_at_eog = false;
  bool stopped_at_sequence = false;  // a GenerateOptions::stop sequence ended it
};

// One decode step of some backend: the next-token logits after feeding token `id` at position
// `pos` (F32 [n_vocab]).
using DecodeStep = std::function<std::vector<float>(int32_t id, int pos)>;

// The decode loop over any backend's step: sample from `first_logits` (the prompt's last
// position, which is start_pos - 1), stop at an end-of-generation token (opt.stop_at_eog) or
// after opt.max_tokens or at a stop sequence (opt.stop; the text is cut before it, and text
// that may begin one reaches on_piece only once the following tokens rule it out), else feed
// the token at start_pos, start_pos + 1, ...
DecodeResult decode_steps(const Tokenizer& tok, int n_vocab, int start_pos,
                          std::vector<float> first_logits, const GenerateOptions& opt,
                          const DecodeStep& step,
                          const std::function<void(const std::string&)>& on_piece = nullptr);

// decode_steps on the CPU model: kv holds the prompt at [0, kv.n_pos); first_logits are the
// logits of its last position. Calls on_piece with each new token's text as it is produced (may
// be empty).
DecodeResult decode(const Model& m, KVCache& kv, Workspace& ws, std::vector<float> first_logits,
                    const GenerateOptions& opt,
                    const std::function<void(const std::string&)>& on_piece = nullptr);

// Teacher forcing: feeds `forced` one token at a time after the prompt and returns the logits
// before each forced token (F32 [forced.size()][n_vocab]; row 0 is first_logits).
std::vector<float> forced_decode_logits(const Model& m, KVCache& kv, Workspace& ws,
                                        const std::vector<float>& first_logits,
                                        const std::vector<int32_t>& forced);

}  // namespace ct
