// `prophetkv` (online, sees the query): a first pass reuses every chunk token and records the
// query rows' attention; the chunk tokens that attention favoured most, ceil(r*N) per chunk, are
// recomputed in the second pass.
#include "reuse/policy.h"
#include "reuse/selective.h"

namespace ct::policies {
namespace {
class ProphetKV final : public Policy {
 public:
  ProphetKV()
      : Policy("prophetkv",
               "a full-reuse pass's query attention picks ceil(r*N) per chunk (sees the query)",
               PolicyStage::kRequest) {}
  bool reads_reuse_pass() const override { return true; }
  std::vector<std::vector<int32_t>> select_request(const PolicyRequest& r) const override {
    const std::vector<float> attn = r.reuse_pass_attention();
    std::vector<std::vector<int32_t>> out;
    for (size_t b = 0; b < r.req.chunks.size(); ++b) {
      const int n_tok = r.req.chunks[b]->meta().n_tok, off = r.lay.chunk_offset[b];
      std::vector<float> score(attn.begin() + off, attn.begin() + off + n_tok);
      out.push_back(top_r_by_score(score, r.opt.policy.ratio));
    }
    return out;
  }
};
}  // namespace
const Policy& prophetkv() { return instance<ProphetKV>(); }
}  // namespace ct::policies
