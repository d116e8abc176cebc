// `prefix` (prefix caching, the serving systems' baseline): reuse the K/V of the longest prompt
// prefix that exactly matches an earlier request's (SelectiveOptions::prefix_cache), prefill the
// rest. No per-chunk selection: a chunk is reused only when everything before it matches too.
#include <algorithm>

#include "core/error.h"
#include "core/timer.h"
#include "reuse/policy.h"
#include "reuse/selective.h"

namespace ct::policies {
namespace {
class Prefix final : public Policy {
 public:
  Prefix()
      : Policy("prefix", "reuse the longest prefix matching an earlier request (prefix caching)",
               PolicyStage::kTokens) {}
  bool scored() const override { return false; }
  bool uses_prefix_cache() const override { return true; }
  bool uses_host_cache() const override { return true; }
  TokenPlan plan_tokens(const PolicyRequest& r, KVCache& kv) const override {
    CT_THROW_IF_NOT(r.opt.prefix_cache != nullptr, "the prefix policy needs a PrefixCache");
    TokenPlan plan;
    plan.tokens = r.lay.tokens;
    auto [n, entry] = r.opt.prefix_cache->longest_match(plan.tokens);
    // The last token always runs, for the logits.
    plan.n_reused = std::min(n, (int)plan.tokens.size() - 1);
    if (plan.n_reused > 0) {
      Timer t;
      r.opt.prefix_cache->copy_rows(entry, plan.n_reused, kv);
      plan.load_ms = t.ms();
    }
    return plan;
  }
  void after_tokens(const PolicyRequest& r, const std::vector<int32_t>& tokens,
                    const KVCache& kv) const override {
    r.opt.prefix_cache->remember(tokens, kv);
  }
};
}  // namespace
const Policy& prefix() { return instance<Prefix>(); }
}  // namespace ct::policies
