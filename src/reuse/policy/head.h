// The `head` policy: recompute the first ceil(r*N) tokens of each chunk. Query-independent and
// free to compute; measured in docs/RESULTS.md ("Offline policies"), where the tokens whose K/V
// drift most between the isolated and the in-context encoding sit at each chunk's start.
#pragma once

#include <cstdint>
#include <vector>

#include "reuse/freq_rank.h"

namespace ct {

// The head ranking of an n_tok-token chunk: order = 0, 1, ..., n_tok-1, score(t) = n_tok - t, so
// a record stored in this order loads the complement of any r as one contiguous suffix.
ChunkRanking head_ranking(int n_tok);

// The first n_select(r, n_tok) token indices.
std::vector<int32_t> head_selection(int n_tok, double r);

}  // namespace ct
