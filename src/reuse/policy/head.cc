#include "reuse/policy/head.h"

#include <numeric>

#include "core/error.h"
#include "reuse/policy.h"

namespace ct {

ChunkRanking head_ranking(int n_tok) {
  CT_THROW_IF_NOT(n_tok >= 0, "head ranking of {} tokens", n_tok);
  ChunkRanking r;
  r.order.resize(n_tok);
  std::iota(r.order.begin(), r.order.end(), 0);
  r.scores.resize(n_tok);
  for (int t = 0; t < n_tok; ++t) r.scores[t] = (float)(n_tok - t);
  return r;
}

std::vector<int32_t> head_selection(int n_tok, double r) {
  std::vector<int32_t> s(n_select(r, n_tok));
  std::iota(s.begin(), s.end(), 0);
  return s;
}

namespace policies {
namespace {
class Head final : public Policy {
 public:
  Head() : Policy("head", "the first ceil(r*N) tokens of each chunk", PolicyStage::kChunk) {}
  std::vector<int32_t> select_chunk(const ChunkSource& c, const PolicyOptions& p) const override {
    return head_selection(c.meta().n_tok, p.ratio);
  }
};
}  // namespace
const Policy& head() { return instance<Head>(); }
}  // namespace policies

}  // namespace ct
