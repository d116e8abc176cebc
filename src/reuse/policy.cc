// The Policy base class's defaults and the helpers policy implementations share: the kept
// rankings and the top-r selections.
#include "reuse/policy.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>

#include "core/error.h"
#include "reuse/freq_rank.h"
#include "reuse/selective.h"

namespace ct {

namespace {
std::mutex& memo_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, ChunkRanking>& memo_map() {
  static std::map<std::string, ChunkRanking> memo;
  return memo;
}
constexpr size_t kMemoMax = 1u << 15;

[[noreturn]] void wrong_stage(const Policy& p, const char* hook) {
  CT_THROW("policy '{}' has no {} (it is a {} policy)", p.name(), hook,
           p.stage() == PolicyStage::kChunk         ? "per-chunk"
           : p.stage() == PolicyStage::kRequest     ? "per-request"
           : p.stage() == PolicyStage::kAfterLayer0 ? "layer-0"
                                                    : "token-list");
}
}  // namespace

void remember_ranking(const std::string& chunk_id, const std::string& name, ChunkRanking r) {
  CT_ASSERT(r.scores.size() == r.order.size(), "ranking of {} scores and {} order entries",
            r.scores.size(), r.order.size());
  std::lock_guard<std::mutex> lock(memo_mutex());
  if (memo_map().size() > kMemoMax) memo_map().clear();
  memo_map()[chunk_id + "/" + name] = std::move(r);
}

std::optional<ChunkRanking> remembered_ranking(const std::string& chunk_id,
                                               const std::string& name) {
  std::lock_guard<std::mutex> lock(memo_mutex());
  auto it = memo_map().find(chunk_id + "/" + name);
  if (it == memo_map().end()) return std::nullopt;
  return it->second;
}

std::vector<int32_t> top_r_by_score(const std::vector<float>& scores, double r) {
  return top_k_by_score(scores, n_select(r, (int)scores.size()));
}

std::vector<int32_t> top_k_by_score(const std::vector<float>& scores, int k) {
  const int n = (int)scores.size();
  CT_ASSERT(k >= 0 && k <= n, "top {} of {} scores", k, n);
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<int32_t> top_of_order(const std::vector<int32_t>& order, int k) {
  CT_ASSERT(k >= 0 && k <= (int)order.size(), "top {} of a {}-token order", k, order.size());
  std::vector<int32_t> s(order.begin(), order.begin() + k);
  std::sort(s.begin(), s.end());
  return s;
}

std::vector<int> shared_budget(const std::vector<const std::vector<float>*>& scores, double r) {
  struct Cand {
    float s;
    int c, t;
  };
  std::vector<Cand> all;
  int total = 0;
  for (size_t c = 0; c < scores.size(); ++c) {
    const int n = (int)scores[c]->size();
    total += n_select(r, n);
    for (int t = 0; t < n; ++t) {
      const float s = (*scores[c])[t];
      CT_THROW_IF_NOT(std::isfinite(s), "shared budget: chunk {} token {} has score {}", c, t, s);
      all.push_back({s, (int)c, t});
    }
  }
  std::vector<int> count(scores.size(), 0);
  std::partial_sort(all.begin(), all.begin() + total, all.end(), [](const Cand& a, const Cand& b) {
    if (a.s != b.s) return a.s > b.s;
    return a.c != b.c ? a.c < b.c : a.t < b.t;
  });
  for (int i = 0; i < total; ++i) ++count[all[i].c];
  return count;
}

std::vector<int32_t> Policy::select_chunk(const ChunkSource&, const PolicyOptions&) const {
  wrong_stage(*this, "per-chunk selection: it selects inside the prefill");
}

void Policy::prepare(const ChunkSource&, const PolicyOptions&) const {}

std::vector<std::vector<int32_t>> Policy::select_request(const PolicyRequest& r) const {
  std::vector<std::vector<int32_t>> out;
  for (const ChunkSource* c : r.req.chunks) out.push_back(select_chunk(*c, r.opt.policy));
  return out;
}

std::vector<int32_t> Policy::select_after_layer0(const ChunkSource&, int, const float*,
                                                 const float*, const PolicyOptions&) const {
  wrong_stage(*this, "layer-0 selection");
}

TokenPlan Policy::plan_tokens(const PolicyRequest&, KVCache&) const {
  wrong_stage(*this, "token-list prefill");
}

void Policy::after_tokens(const PolicyRequest&, const std::vector<int32_t>&,
                          const KVCache&) const {}

}  // namespace ct
