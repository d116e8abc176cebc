// `full`: recompute every token (plain prefill through the selective layer loop); the reference.
#include <numeric>

#include "reuse/policy.h"

namespace ct::policies {
namespace {
class Full final : public Policy {
 public:
  Full() : Policy("full", "recompute every chunk token (the reference)", PolicyStage::kChunk) {}
  bool scored() const override { return false; }
  std::vector<int32_t> select_chunk(const ChunkSource& c, const PolicyOptions&) const override {
    std::vector<int32_t> all(c.meta().n_tok);
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
};
}  // namespace
const Policy& full() { return instance<Full>(); }
}  // namespace ct::policies
