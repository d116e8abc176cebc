// `random`: ceil(r*N) tokens of each chunk uniformly at random, seeded by the policy seed and the
// chunk id, so a chunk gets the same draw everywhere, on every platform and standard library
// (core/random.h).
#include "core/random.h"

#include <algorithm>
#include <numeric>

#include "reuse/freq_rank.h"
#include "reuse/policy.h"

namespace ct::policies {
namespace {
class Random final : public Policy {
 public:
  Random() : Policy("random", "ceil(r*N) tokens at random (seeded)", PolicyStage::kChunk) {}
  std::vector<int32_t> select_chunk(const ChunkSource& c, const PolicyOptions& p) const override {
    const ChunkMeta& meta = c.meta();
    SplitMix64 rng(stream_seed((uint64_t)p.seed, meta.id));
    std::vector<int32_t> all(meta.n_tok);
    std::iota(all.begin(), all.end(), 0);
    portable_shuffle(all, rng);
    all.resize(n_select(p.ratio, meta.n_tok));
    std::sort(all.begin(), all.end());
    return all;
  }
};
}  // namespace
const Policy& random() { return instance<Random>(); }
}  // namespace ct::policies
