// The Policy base class's defaults and the helpers policy implementations share: the kept
// rankings and the top-r selections.
#include "reuse/policy.h"

#include <algorithm>
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
std::map<std::string, std::vector<int32_t>>& memo_map() {
  static std::map<std::string, std::vector<int32_t>> memo;
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

void remember_ranking(const std::string& chunk_id, const std::string& name,
                      std::vector<int32_t> order) {
  std::lock_guard<std::mutex> lock(memo_mutex());
  if (memo_map().size() > kMemoMax) memo_map().clear();
  memo_map()[chunk_id + "/" + name] = std::move(order);
}

std::optional<std::vector<int32_t>> remembered_ranking(const std::string& chunk_id,
                                                       const std::string& name) {
  std::lock_guard<std::mutex> lock(memo_mutex());
  auto it = memo_map().find(chunk_id + "/" + name);
  if (it == memo_map().end()) return std::nullopt;
  return it->second;
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

std::vector<int32_t> top_of_order(const std::vector<int32_t>& order, int k) {
  CT_ASSERT(k >= 0 && k <= (int)order.size(), "top {} of a {}-token order", k, order.size());
  std::vector<int32_t> s(order.begin(), order.begin() + k);
  std::sort(s.begin(), s.end());
  return s;
}

std::vector<int32_t> select_offline(const ChunkSource& c, const PolicyOptions& p) {
  return p.kind->select_chunk(c, p);
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

std::vector<int32_t> Policy::select_after_layer0(const ChunkSource&, const float*, const float*,
                                                 const PolicyOptions&) const {
  wrong_stage(*this, "layer-0 selection");
}

TokenPlan Policy::plan_tokens(const PolicyRequest&, KVCache&) const {
  wrong_stage(*this, "token-list prefill");
}

void Policy::after_tokens(const PolicyRequest&, const std::vector<int32_t>&,
                          const KVCache&) const {}

}  // namespace ct
