// `cachetune`, the product policy: the top ceil(r*N) of the ranking stored with the record,
// whichever rank mode the chunk was ingested with (EncodeOptions::rank; docs/RESULTS.md says which
// is the default and why). The complement is then one contiguous suffix of rank rows.
#include "reuse/freq_rank.h"
#include "reuse/policy.h"

namespace ct::policies {
namespace {
class CacheTune final : public Policy {
 public:
  CacheTune()
      : Policy("cachetune",
               "the top ceil(r*N) of the ranking stored with each chunk (the product default)",
               PolicyStage::kChunk) {}
  std::vector<int32_t> select_chunk(const ChunkSource& c, const PolicyOptions& p) const override {
    return top_of_order(c.meta().order, n_select(p.ratio, c.meta().n_tok));
  }
};
}  // namespace
const Policy& cachetune() { return instance<CacheTune>(); }
}  // namespace ct::policies
