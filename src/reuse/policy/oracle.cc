// The oracles (eval only, not realisable): the true drift of every chunk token against the full
// prefill, which the eval harness computes and passes in PolicyOptions::drift, decides. `oracle`
// recomputes each chunk's true top ceil(r*N) (the upper bound of per-chunk offline rankings);
// `oracle-shared` gives the same total to the true top drift of the whole request (the upper
// bound of rankings with a shared budget, such as probe-shared).
#include "core/error.h"
#include "reuse/policy.h"
#include "reuse/selective.h"

namespace ct::policies {
namespace {
class Oracle final : public Policy {
 public:
  Oracle(const char* name, const char* summary, bool shared)
      : Policy(name, summary, PolicyStage::kRequest), shared_(shared) {}
  bool eval_only() const override { return true; }
  std::vector<std::vector<int32_t>> select_request(const PolicyRequest& r) const override {
    const auto* drift = r.opt.policy.drift;
    const size_t n = r.req.chunks.size();
    CT_THROW_IF_NOT(drift != nullptr && drift->size() == n,
                    "the {} policy needs the true drift of each of the {} chunks (eval only)",
                    name(), n);
    std::vector<const std::vector<float>*> scores;
    for (size_t b = 0; b < n; ++b) {
      const int n_tok = r.req.chunks[b]->meta().n_tok;
      CT_THROW_IF_NOT((int)(*drift)[b].size() == n_tok,
                      "{}: the drift of chunk {} has {} entries, the chunk {} tokens", name(), b,
                      (*drift)[b].size(), n_tok);
      scores.push_back(&(*drift)[b]);
    }
    const double ratio = r.opt.policy.ratio;
    std::vector<int> count(n);
    if (shared_) {
      count = shared_budget(scores, ratio);
    } else {
      for (size_t b = 0; b < n; ++b) count[b] = n_select(ratio, (int)scores[b]->size());
    }
    std::vector<std::vector<int32_t>> out;
    for (size_t b = 0; b < n; ++b) out.push_back(top_k_by_score(*scores[b], count[b]));
    return out;
  }

 private:
  bool shared_;
};
}  // namespace
const Policy& oracle() {
  static const Oracle* p = new Oracle(
      "oracle", "the true top drift tokens of each chunk, from the full prefill (eval only)",
      false);
  return *p;
}
const Policy& oracle_shared() {
  static const Oracle* p = new Oracle(
      "oracle-shared",
      "the true top drift tokens of the whole request, one shared budget (eval only)", true);
  return *p;
}
}  // namespace ct::policies
