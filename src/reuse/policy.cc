// Offline selection rules and policy names.
#include "reuse/policy.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>
#include <random>

#include "core/error.h"
#include "reuse/encoder.h"
#include "reuse/freq_rank.h"

namespace ct {

namespace {
struct NameKind {
  const char* name;
  PolicyKind kind;
};
constexpr NameKind kNames[] = {
    {"full", PolicyKind::kFull},           {"reuse", PolicyKind::kReuse},
    {"cachetune", PolicyKind::kCacheTune}, {"prefix", PolicyKind::kPrefix},
    {"cacheblend", PolicyKind::kCacheBlend}, {"epic", PolicyKind::kEpic},
    {"random", PolicyKind::kRandom},       {"l2", PolicyKind::kL2},
    {"highfreq", PolicyKind::kHighFreq},   {"lfonly", PolicyKind::kLfOnly},
    {"prophetkv", PolicyKind::kProphetKV},
};

// Rankings of stored chunks under other options, computed once per (id, mode, alpha).
std::vector<int32_t> memo_ranking(const ChunkSource& c, const RankOptions& ro) {
  static std::mutex mu;
  static std::map<std::string, std::vector<int32_t>> memo;
  const std::string key = c.meta().id + "/" + rank_mode_name(ro.mode) + "/" + std::to_string(ro.alpha);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = memo.find(key); it != memo.end()) return it->second;
  }
  std::vector<int32_t> order = rank_stored_chunk(read_whole_chunk(c), ro).order;
  std::lock_guard<std::mutex> lock(mu);
  if (memo.size() > 4096) memo.clear();
  memo[key] = order;
  return order;
}

std::vector<int32_t> sorted_prefix(const std::vector<int32_t>& order, int n) {
  std::vector<int32_t> s(order.begin(), order.begin() + n);
  std::sort(s.begin(), s.end());
  return s;
}
}  // namespace

const char* policy_name(PolicyKind k) {
  for (const auto& nk : kNames) {
    if (nk.kind == k) return nk.name;
  }
  return "unknown";
}

PolicyKind parse_policy(const std::string& name) {
  for (const auto& nk : kNames) {
    if (name == nk.name) return nk.kind;
  }
  std::string valid;
  for (const auto& nk : kNames) valid += std::string(valid.empty() ? "" : ", ") + nk.name;
  CT_THROW("unknown policy '{}', expected one of: {}", name, valid);
}

std::vector<PolicyKind> all_policies() {
  std::vector<PolicyKind> v;
  for (const auto& nk : kNames) v.push_back(nk.kind);
  return v;
}

bool policy_is_online(PolicyKind k) {
  return k == PolicyKind::kCacheBlend || k == PolicyKind::kProphetKV;
}

std::vector<int32_t> top_r_by_score(const std::vector<float>& scores, double r) {
  const int n = (int)scores.size();
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  const int k = n_select(r, n);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<int32_t> select_offline(const ChunkSource& src, const PolicyOptions& p) {
  const ChunkMeta& meta = src.meta();
  const int n = meta.n_tok;
  const int k = n_select(p.ratio, n);
  switch (p.kind) {
    case PolicyKind::kFull: {
      std::vector<int32_t> all(n);
      std::iota(all.begin(), all.end(), 0);
      return all;
    }
    case PolicyKind::kReuse:
      return {};
    case PolicyKind::kCacheTune:
    case PolicyKind::kLfOnly:
      return sorted_prefix(meta.order, k);
    case PolicyKind::kEpic: {
      std::vector<int32_t> first(std::min(p.epic_k, n));
      std::iota(first.begin(), first.end(), 0);
      return first;
    }
    case PolicyKind::kRandom: {
      // Seeded by the policy seed and the chunk id, so a chunk gets the same draw everywhere.
      std::seed_seq seq{(uint32_t)p.seed, (uint32_t)(p.seed >> 32),
                        (uint32_t)std::hash<std::string>()(meta.id)};
      std::mt19937 rng(seq);
      std::vector<int32_t> all(n);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(k);
      std::sort(all.begin(), all.end());
      return all;
    }
    case PolicyKind::kL2:
    case PolicyKind::kHighFreq: {
      RankOptions ro;
      ro.mode = p.kind == PolicyKind::kL2 ? RankMode::kL2 : RankMode::kHighFreq;
      ro.alpha = p.alpha;
      return sorted_prefix(memo_ranking(src, ro), k);
    }
    default:
      CT_THROW("policy '{}' selects online, not from the stored chunk", policy_name(p.kind));
  }
}

}  // namespace ct
