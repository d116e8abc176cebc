// Offline selection rules and policy names.
#include "reuse/policy.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>
#include <random>

#include "core/error.h"
#include "core/random.h"
#include "reuse/encoder.h"
#include "reuse/freq_rank.h"
#include "reuse/policy/head.h"

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
    {"prophetkv", PolicyKind::kProphetKV}, {"freq", PolicyKind::kFreq},
    {"head", PolicyKind::kHead},           {"probe", PolicyKind::kProbe},
    {"oracle", PolicyKind::kOracle},
};

std::mutex& memo_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, std::vector<int32_t>>& memo_map() {
  static std::map<std::string, std::vector<int32_t>> memo;
  return memo;
}
constexpr size_t kMemoMax = 1u << 15;

std::string spectral_name(const RankOptions& ro) {
  return std::string(rank_mode_name(ro.mode)) + "/" + std::to_string(ro.alpha);
}

const std::vector<int32_t>* find_memo(const std::string& key) {
  auto& memo = memo_map();
  auto it = memo.find(key);
  return it == memo.end() ? nullptr : &it->second;
}

// Rankings of stored chunks under other options, computed once per (id, mode, alpha).
std::vector<int32_t> memo_ranking(const ChunkSource& c, const RankOptions& ro) {
  const std::string key = c.meta().id + "/" + spectral_name(ro);
  {
    std::lock_guard<std::mutex> lock(memo_mutex());
    if (const auto* o = find_memo(key)) return *o;
  }
  std::vector<int32_t> order = rank_stored_chunk(read_whole_chunk(c), ro).order;
  std::lock_guard<std::mutex> lock(memo_mutex());
  if (memo_map().size() > kMemoMax) memo_map().clear();
  memo_map()[key] = order;
  return order;
}

std::vector<int32_t> sorted_prefix(const std::vector<int32_t>& order, int n) {
  std::vector<int32_t> s(order.begin(), order.begin() + n);
  std::sort(s.begin(), s.end());
  return s;
}
}  // namespace

void remember_ranking(const std::string& chunk_id, const std::string& name,
                      std::vector<int32_t> order) {
  std::lock_guard<std::mutex> lock(memo_mutex());
  if (memo_map().size() > kMemoMax) memo_map().clear();
  memo_map()[chunk_id + "/" + name] = std::move(order);
}

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
      // Seeded by the policy seed and the chunk id, so a chunk gets the same draw everywhere, on
      // every platform and standard library (core/random.h).
      SplitMix64 rng(stream_seed((uint64_t)p.seed, meta.id));
      std::vector<int32_t> all(n);
      std::iota(all.begin(), all.end(), 0);
      portable_shuffle(all, rng);
      all.resize(k);
      std::sort(all.begin(), all.end());
      return all;
    }
    case PolicyKind::kFreq:
    case PolicyKind::kL2:
    case PolicyKind::kHighFreq: {
      RankOptions ro;
      ro.mode = p.kind == PolicyKind::kL2       ? RankMode::kL2
                : p.kind == PolicyKind::kFreq ? RankMode::kLowFreq
                                              : RankMode::kHighFreq;
      ro.alpha = p.alpha;
      if (meta.rank_mode == rank_mode_name(ro.mode) &&
          (ro.mode == RankMode::kL2 || meta.alpha == ro.alpha)) {
        return sorted_prefix(meta.order, k);
      }
      return sorted_prefix(memo_ranking(src, ro), k);
    }
    case PolicyKind::kHead:
      return head_selection(n, p.ratio);
    case PolicyKind::kProbe: {
      if (meta.rank_mode == rank_mode_name(RankMode::kProbe)) return sorted_prefix(meta.order, k);
      std::lock_guard<std::mutex> lock(memo_mutex());
      const auto* o = find_memo(meta.id + "/probe");
      CT_THROW_IF_NOT(o != nullptr && (int)o->size() == n,
                      "chunk {} was ingested with rank mode '{}', and the probe policy needs the "
                      "probe ranking, which is computed at ingest: re-ingest with --rank probe",
                      meta.id.substr(0, 12), meta.rank_mode);
      return sorted_prefix(*o, k);
    }
    default:
      CT_THROW("policy '{}' selects online, not from the stored chunk", policy_name(p.kind));
  }
}

}  // namespace ct
