// `full`: recompute every token (plain prefill through the selective layer loop); the reference.
#include <numeric>

#include "reuse/policy.h"

namespace ct::policies {
namespace {
class Full final : public Policy {
 public:
  const char* name() const override { return "full"; }
  const char* summary() const override { return "recompute every chunk token (the reference)"; }
  PolicyStage stage() const override { return PolicyStage::kChunk; }
  bool scored() const override { return false; }
  std::vector<int32_t> select_chunk(const ChunkSource& c, const PolicyOptions&) const override {
    std::vector<int32_t> all(c.meta().n_tok);
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
};
}  // namespace
const Policy& full() {
  static const Full* p = new Full();
  return *p;
}
}  // namespace ct::policies
