// `reuse`: recompute no chunk token; every chunk row comes from its record (the lower bound).
#include "reuse/policy.h"

namespace ct::policies {
namespace {
class Reuse final : public Policy {
 public:
  Reuse() : Policy("reuse", "recompute no chunk token (full reuse)", PolicyStage::kChunk) {}
  bool scored() const override { return false; }
  std::vector<int32_t> select_chunk(const ChunkSource&, const PolicyOptions&) const override {
    return {};
  }
};
}  // namespace
const Policy& reuse() { return instance<Reuse>(); }
}  // namespace ct::policies
