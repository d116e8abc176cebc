// Decode loop: sample, stop on end-of-generation or the token budget, feed the token back.
#include "model/generate.h"

#include "core/error.h"
#include "core/timer.h"

namespace ct {

DecodeResult decode(const Model& m, KVCache& kv, Workspace& ws, std::vector<float> logits,
                    const GenerateOptions& opt,
                    const std::function<void(const std::string&)>& on_piece) {
  DecodeResult r;
  Sampler sampler(opt.sampling);
  const Tokenizer& tok = m.tokenizer();
  const int n_vocab = m.config().n_vocab;
  Timer t;
  for (int i = 0; i < opt.max_tokens; ++i) {
    const int32_t id = sampler.sample(logits.data(), n_vocab);
    if (opt.stop_at_eog && tok.is_eog(id)) {
      r.stopped_at_eog = true;
      break;
    }
    r.tokens.push_back(id);
    if (on_piece) on_piece(tok.token_to_piece(id));
    if (i + 1 == opt.max_tokens) break;
    CT_THROW_IF_NOT(kv.n_pos < kv.n_ctx(), "KV cache full at {} positions while decoding",
                    kv.n_ctx());
    logits = m.prefill(&id, 1, kv.n_pos, kv, ws);
  }
  r.decode_s = t.seconds();
  r.text = tok.decode(r.tokens);
  return r;
}

}  // namespace ct
