// Selection policies behind one interface: which tokens of each reused chunk are recomputed in
// the new context. Offline policies decide from the stored chunk alone; online ones (cacheblend,
// prophetkv) decide inside the forward pass (src/reuse/selective.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reuse/chunk_source.h"
#include "store/chunk.h"

namespace ct {

enum class PolicyKind {
  kFull,       // recompute everything (plain prefill)
  kReuse,      // recompute nothing of the chunks
  kCacheTune,  // top ceil(r*N) of the stored low-frequency ranking
  kPrefix,     // reuse only the longest exactly matching prefix of an earlier request
  kCacheBlend, // recompute layer 0 fully, then the tokens with the largest K/V deviation there
  kEpic,       // the first k tokens of each chunk (k = epic_k, independent of r)
  kRandom,     // ceil(r*N) tokens uniformly at random (seeded)
  kL2,         // top ceil(r*N) by joint K/V norm (no FFT)
  kHighFreq,   // top ceil(r*N) by the high-frequency reconstruction
  kLfOnly,     // prefill only the selected (cachetune) tokens; the rest of each chunk is dropped
  kProphetKV,  // full-reuse pass, query attention to chunk tokens picks the top ceil(r*N)
};

struct PolicyOptions {
  PolicyKind kind = PolicyKind::kCacheTune;
  double ratio = 0.15;
  double alpha = 0.5;  // cutoff for the l2/highfreq rankings computed on demand
  int epic_k = 16;
  uint64_t seed = 0;
};

const char* policy_name(PolicyKind k);
// Throws ct::Error listing the valid names.
PolicyKind parse_policy(const std::string& name);
std::vector<PolicyKind> all_policies();
bool policy_is_online(PolicyKind k);  // cacheblend, prophetkv

// Tokens of chunk `c` (indices in text order, ascending) an offline policy recomputes.
// For kFull all, kReuse none; kCacheBlend/kProphetKV/kPrefix are not offline (throws).
// The l2/highfreq rankings are computed from the stored K/V on first use and memoised per
// (chunk id, mode, alpha).
std::vector<int32_t> select_offline(const ChunkSource& c, const PolicyOptions& p);

// Top ceil(r*N) indices of `scores` (ties to the lower index), ascending.
std::vector<int32_t> top_r_by_score(const std::vector<float>& scores, double r);

}  // namespace ct
