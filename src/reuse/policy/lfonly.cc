// `lfonly` (ablation): prefill only each chunk's selected tokens (the top of its stored ranking,
// as cachetune selects) and drop the rest of the chunk from the prompt: what the selection alone
// carries, without the reused K/V of the other tokens.
#include "reuse/freq_rank.h"
#include "reuse/policy.h"
#include "reuse/selective.h"

namespace ct::policies {
namespace {
class LfOnly final : public Policy {
 public:
  LfOnly()
      : Policy("lfonly", "prefill only the selected tokens of each chunk, drop the rest (ablation)",
               PolicyStage::kTokens) {}
  bool scored() const override { return false; }
  TokenPlan plan_tokens(const PolicyRequest& r, KVCache&) const override {
    TokenPlan plan;
    plan.tokens = r.req.prefix;
    plan.selected.emplace();
    for (const ChunkSource* ch : r.req.chunks) {
      const ChunkMeta& meta = ch->meta();
      const auto sel = top_of_order(meta.order, n_select(r.opt.policy.ratio, meta.n_tok));
      for (int32_t t : sel) plan.tokens.push_back(meta.tokens[t]);
      plan.selected->push_back(sel);
    }
    plan.tokens.insert(plan.tokens.end(), r.req.query.begin(), r.req.query.end());
    return plan;
  }
};
}  // namespace
const Policy& lfonly() { return instance<LfOnly>(); }
}  // namespace ct::policies
