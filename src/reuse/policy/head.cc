#include "reuse/policy/head.h"

#include <numeric>

#include "core/error.h"

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

}  // namespace ct
