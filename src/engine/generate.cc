// Decode loop: sample, stop on end-of-generation or the token budget, feed the token back.
#include "engine/generate.h"

#include "backend/cpu_forward.h"
#include "core/error.h"
#include "core/timer.h"
#include "model/json_constraint.h"
#include "model/stop_matcher.h"

namespace ct {

DecodeResult decode_steps(const Tokenizer& tok, int n_vocab, int start_pos,
                          std::vector<float> logits, const GenerateOptions& opt,
                          const DecodeStep& step,
                          const std::function<void(const std::string&)>& on_piece) {
  DecodeResult r;
  Sampler sampler(opt.sampling);
  if (opt.json_object || opt.json_schema)
    sampler.set_constraint(
        make_json_constraint(std::make_shared<VocabTrie>(tok), opt.json_object, opt.json_schema));
  StopMatcher stops(opt.stop);
  Timer t;
  for (int i = 0; i < opt.max_tokens; ++i) {
    const int32_t id = sampler.sample(logits.data(), n_vocab);
    if (opt.stop_at_eog && tok.is_eog(id)) {
      r.stopped_at_eog = true;
      break;
    }
    r.tokens.push_back(id);
    if (opt.stop.empty()) {
      if (on_piece) on_piece(tok.token_to_piece(id));
    } else {
      const StopMatcher::Step s = stops.feed(tok.token_to_piece(id));
      if (on_piece) on_piece(s.text);
      if (s.stopped) {
        r.stopped_at_sequence = true;
        break;
      }
    }
    if (i + 1 == opt.max_tokens) break;
    logits = step(id, start_pos + i);
  }
  if (!opt.stop.empty() && !r.stopped_at_sequence) {
    const std::string rest = stops.flush();  // a partial match that never completed
    if (on_piece && !rest.empty()) on_piece(rest);
  }
  r.decode_s = t.seconds();
  // Cut at a stop sequence the text is what the pieces spelled up to it; otherwise the
  // tokenizer's decoding of the tokens, as without stop sequences.
  r.text = r.stopped_at_sequence ? stops.emitted() : tok.decode(r.tokens);
  return r;
}

DecodeResult decode(const Model& m, KVCache& kv, Workspace& ws, std::vector<float> logits,
                    const GenerateOptions& opt,
                    const std::function<void(const std::string&)>& on_piece) {
  return decode_steps(
      m.tokenizer(), m.config().n_vocab, kv.n_pos, std::move(logits), opt,
      [&](int32_t id, int pos) {
        CT_THROW_IF_NOT(pos < kv.n_ctx(), "KV cache full at {} positions while decoding",
                        kv.n_ctx());
        return cpu::prefill(m, &id, 1, pos, kv, ws);
      },
      on_piece);
}

std::vector<float> forced_decode_logits(const Model& m, KVCache& kv, Workspace& ws,
                                        const std::vector<float>& first_logits,
                                        const std::vector<int32_t>& forced) {
  const size_t V = m.config().n_vocab;
  std::vector<float> out(forced.size() * V);
  if (forced.empty()) return out;
  std::copy(first_logits.begin(), first_logits.end(), out.begin());
  for (size_t i = 0; i + 1 < forced.size(); ++i) {
    CT_THROW_IF_NOT(kv.n_pos < kv.n_ctx(), "KV cache full at {} positions", kv.n_ctx());
    const auto l = cpu::prefill(m, &forced[i], 1, kv.n_pos, kv, ws);
    std::copy(l.begin(), l.end(), out.begin() + (i + 1) * V);
  }
  return out;
}

}  // namespace ct
