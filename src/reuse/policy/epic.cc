// `epic` (EPIC, Hu et al. 2024): recompute the first k tokens of each chunk, k = epic_k,
// independent of r.
#include <algorithm>
#include <numeric>

#include "reuse/policy.h"

namespace ct::policies {
namespace {
class Epic final : public Policy {
 public:
  Epic()
      : Policy("epic", "the first epic_k (16) tokens of each chunk, whatever r",
               PolicyStage::kChunk) {}
  std::vector<int32_t> select_chunk(const ChunkSource& c, const PolicyOptions& p) const override {
    std::vector<int32_t> first(std::min(p.epic_k, c.meta().n_tok));
    std::iota(first.begin(), first.end(), 0);
    return first;
  }
};
}  // namespace
const Policy& epic() { return instance<Epic>(); }
}  // namespace ct::policies
