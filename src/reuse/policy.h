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
  // The product policy: the top ceil(r*N) of the ranking stored with the record, whichever rank
  // mode the chunk was ingested with (EncodeOptions::rank; docs/RESULTS.md says which is the
  // default and why).
  kCacheTune,
  kPrefix,     // reuse only the longest exactly matching prefix of an earlier request
  kCacheBlend, // recompute layer 0 fully, then the tokens with the largest K/V deviation there
  kEpic,       // the first k tokens of each chunk (k = epic_k, independent of r)
  kRandom,     // ceil(r*N) tokens uniformly at random (seeded)
  kL2,         // top ceil(r*N) by joint K/V norm (no FFT)
  kHighFreq,   // top ceil(r*N) by the high-frequency reconstruction
  kLfOnly,     // prefill only the selected (cachetune) tokens; the rest of each chunk is dropped
  kProphetKV,  // full-reuse pass, query attention to chunk tokens picks the top ceil(r*N)
  kFreq,       // the paper's low-frequency ranking (alpha): stored, or computed from the stored K/V
  kHead,       // the first ceil(r*N) tokens of each chunk (policy/head.h)
  kProbe,      // top ceil(r*N) of the probe-drift ranking (policy/probe.h), computed at ingest
  // Eval only, not realisable: the true top ceil(r*N) drift tokens against the full prefill,
  // given per chunk in PolicyOptions::oracle.
  kOracle,
};

struct PolicyOptions {
  PolicyKind kind = PolicyKind::kCacheTune;
  double ratio = 0.15;
  double alpha = 0.5;  // cutoff for the l2/highfreq rankings computed on demand
  int epic_k = 16;
  uint64_t seed = 0;
  // kOracle: per chunk of the request, in prompt order, the token indices to recompute.
  const std::vector<std::vector<int32_t>>* oracle = nullptr;
};

const char* policy_name(PolicyKind k);
// Throws ct::Error listing the valid names.
PolicyKind parse_policy(const std::string& name);
std::vector<PolicyKind> all_policies();
bool policy_is_online(PolicyKind k);  // cacheblend, prophetkv

// Tokens of chunk `c` (indices in text order, ascending) an offline policy recomputes.
// For kFull all, kReuse none; kCacheBlend/kProphetKV/kPrefix/kOracle are not offline (throws).
// The freq/l2/highfreq rankings are the stored one when the record was laid out in it, else
// computed from the stored K/V on first use and memoised per (chunk id, mode, alpha). kProbe
// needs the model: the stored ranking of a record ingested with rank mode "probe", or one left by
// remember_ranking(id, "probe", ...); otherwise ct::Error asking to re-ingest.
std::vector<int32_t> select_offline(const ChunkSource& c, const PolicyOptions& p);

// Rankings kept next to the stored one, by chunk id and name ("probe", "lowfreq/<alpha>", ...):
// select_offline looks here for a ranking the record was not laid out in before computing it.
// Encoders that produce several rankings at once (the eval harness) leave the others here.
void remember_ranking(const std::string& chunk_id, const std::string& name,
                      std::vector<int32_t> order);

// Top ceil(r*N) indices of `scores` (ties to the lower index), ascending.
std::vector<int32_t> top_r_by_score(const std::vector<float>& scores, double r);

}  // namespace ct
