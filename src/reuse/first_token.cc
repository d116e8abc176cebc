#include "reuse/first_token.h"

#include "core/timer.h"
#include "model/sampler.h"

namespace ct {

FirstToken run_to_first_token(const Model& m, const ComposedRequest& req,
                              const SelectiveOptions& opt, KVCache& kv, Workspace& ws,
                              SelectionReport* report) {
  for (const ChunkSource* c : req.chunks) opt.policy.kind->prepare(*c, opt.policy);
  FirstToken out;
  Timer t;
  out.logits = selective_prefill(m, req, opt, kv, ws, &out.bd, report);
  out.token = argmax(out.logits.data(), (int)out.logits.size());
  out.piece = m.tokenizer().token_to_piece(out.token);
  out.ttft_ms = t.ms();
  return out;
}

}  // namespace ct
