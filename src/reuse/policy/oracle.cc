// `oracle` (eval only, not realisable): the true top ceil(r*N) drift tokens of each chunk against
// the full prefill, which the eval harness computes and passes in PolicyOptions::oracle. The
// upper bound offline rankings are measured against.
#include "core/error.h"
#include "reuse/policy.h"
#include "reuse/selective.h"

namespace ct::policies {
namespace {
class Oracle final : public Policy {
 public:
  const char* name() const override { return "oracle"; }
  const char* summary() const override {
    return "the true top drift tokens from the full prefill (eval only)";
  }
  PolicyStage stage() const override { return PolicyStage::kRequest; }
  bool on_gpu() const override { return true; }
  bool eval_only() const override { return true; }
  std::vector<std::vector<int32_t>> select_request(const PolicyRequest& r) const override {
    const auto* given = r.opt.policy.oracle;
    const size_t n = r.req.chunks.size();
    CT_THROW_IF_NOT(given != nullptr && given->size() == n,
                    "the oracle policy needs a selection for each of the {} chunks (eval only)", n);
    for (size_t b = 0; b < n; ++b) {
      const int n_tok = r.req.chunks[b]->meta().n_tok;
      for (int32_t t : (*given)[b]) {
        CT_THROW_IF_NOT(t >= 0 && t < n_tok,
                        "oracle selection: token {} outside chunk {} of {} tokens", t, b, n_tok);
      }
    }
    return *given;
  }
};
}  // namespace
const Policy& oracle() {
  static const Oracle* p = new Oracle();
  return *p;
}
}  // namespace ct::policies
