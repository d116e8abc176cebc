// Selection policies as objects: which tokens of each reused chunk are recomputed in the new
// context. Each policy is one class in its own file under src/reuse/policy/, registered by one
// line in src/reuse/policy/registry.cc; selective_prefill (src/reuse/selective.cc) asks the
// policy's stage how it plugs into the prefill and calls the matching hook. Nothing outside the
// policy files switches on a policy's name: callers ask the traits below.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "reuse/chunk_source.h"
#include "reuse/freq_rank.h"
#include "store/chunk.h"

namespace ct {

class KVCache;
class Model;
class Policy;
struct ComposedRequest;
struct RequestLayout;
struct SelectiveOptions;

// `--policy cachetune`: the product policy (the top of the ranking stored with the record).
const Policy& default_policy();

struct PolicyOptions {
  const Policy* kind = &default_policy();
  double ratio = 0.15;
  double alpha = 0.5;  // cutoff for the l2/highfreq/freq rankings computed on demand
  int epic_k = 16;
  uint64_t seed = 0;
  // oracle policies: per chunk of the request, in prompt order, each token's true drift against
  // the full prefill (F32 [n_tok], text order), which only the eval harness knows.
  const std::vector<std::vector<float>>* drift = nullptr;
};

// Where a policy's decision is made, and so which hook selective_prefill calls.
enum class PolicyStage {
  kChunk,        // select_chunk(): from each stored chunk alone (offline, query-independent)
  kRequest,      // select_request(): from the whole request, before the layer loop
  kAfterLayer0,  // select_after_layer0(): layer 0 recomputes every row, layer 1's fresh K/V decide
  kTokens,       // plan_tokens(): no layer loop; a plain prefill of a token list
};

// What a request-stage or token-stage policy sees of the request being prefilled.
struct PolicyRequest {
  const Model& model;
  const ComposedRequest& req;
  const RequestLayout& lay;
  const SelectiveOptions& opt;
  // Runs the layer loop recomputing no chunk token and returns the query rows' attention over
  // every position, F32 [n_total], averaged over query rows, heads and layers (into the same kv,
  // which the real pass then overwrites).
  std::function<std::vector<float>()> reuse_pass_attention;
};

// A token-stage policy's prefill: `tokens` (global positions 0..) on top of kv rows
// [0, n_reused), which plan_tokens has filled.
struct TokenPlan {
  std::vector<int32_t> tokens;
  int n_reused = 0;
  // Per chunk, the tokens kept (the selection report); nullopt: no per-chunk selection.
  std::optional<std::vector<std::vector<int32_t>>> selected;
  double load_ms = 0;  // time plan_tokens spent placing the reused rows
};

class Policy {
 public:
  // summary: one line, for --help and error messages.
  Policy(const char* name, const char* summary, PolicyStage stage)
      : name_(name), summary_(summary), stage_(stage) {}
  virtual ~Policy() = default;
  Policy(const Policy&) = delete;
  Policy& operator=(const Policy&) = delete;
  const char* name() const { return name_; }
  const char* summary() const { return summary_; }
  PolicyStage stage() const { return stage_; }

  // Traits callers ask instead of testing names.
  // A token-stage policy whose plan_tokens places rows in, or whose after_tokens reads, the host
  // K/V cache (prefix caching): a device prefill (SelectiveOptions::device) then needs a host
  // cache of the whole prompt and hands its finished cache back there. Every policy runs on a
  // device; a token-stage policy without this trait reuses no rows (lfonly).
  virtual bool uses_host_cache() const { return false; }
  // Has a per-chunk recompute set of about ceil(r*N) tokens whose Recall@r against the true drift
  // is reported (eval).
  virtual bool scored() const { return true; }
  // Needs SelectiveOptions::prefix_cache.
  virtual bool uses_prefix_cache() const { return false; }
  // Needs PolicyOptions::drift, the true drift that only the eval harness knows.
  virtual bool eval_only() const { return false; }
  // A request-stage policy whose select_request reads PolicyRequest::reuse_pass_attention (a
  // two-pass policy, ProphetKV): a sliced prefill runs that pass in blocks of rows first.
  virtual bool reads_reuse_pass() const { return false; }
  // The rankings this policy reads from the chunk (stored_ranking, policy/probe.h), which a
  // deployment computes at ingest. The eval harness has the encoder compute them beside the
  // stored one (EncodeOptions::also); `generate` and `serve` store one ranking (`--rank`), and a
  // policy whose ranking a record lacks says which `--rank` to ingest with.
  virtual std::vector<RankMode> ingest_rankings() const { return {}; }

  // kChunk: tokens of chunk c (text-order indices, ascending) to recompute.
  virtual std::vector<int32_t> select_chunk(const ChunkSource& c, const PolicyOptions& p) const;
  // Work a deployment would do at ingest (a ranking it would store), done before a timed
  // request so that TTFT compares selections. Default: nothing.
  virtual void prepare(const ChunkSource& c, const PolicyOptions& p) const;
  // kChunk and kRequest: per chunk of the request in prompt order, the tokens to recompute.
  // Default: select_chunk of each chunk.
  virtual std::vector<std::vector<int32_t>> select_request(const PolicyRequest& r) const;
  // kAfterLayer0: the selection of chunk c from its tokens' fresh pre-RoPE K and V of `layer`
  // in the request, F32 [n_tok][kv_dim] in text order. Layer 0 has run on every row, so these
  // are what a full prefill computes there; the selected rows then run from that layer on, the
  // others keep the stored K/V from it. The layer is kCheckLayer (CacheBlend's, as LMCache's
  // check_layers = [1]): layer 0's own K/V are a function of the token alone, equal to the
  // stored ones up to their rounding, so they could not tell which tokens the context changed.
  static constexpr int kCheckLayer = 1;
  virtual std::vector<int32_t> select_after_layer0(const ChunkSource& c, int layer,
                                                   const float* k, const float* v,
                                                   const PolicyOptions& p) const;
  // kTokens: what to prefill instead of the layer loop; after_tokens sees the finished kv.
  virtual TokenPlan plan_tokens(const PolicyRequest& r, KVCache& kv) const;
  virtual void after_tokens(const PolicyRequest& r, const std::vector<int32_t>& tokens,
                            const KVCache& kv) const;

 private:
  const char* name_;
  const char* summary_;
  PolicyStage stage_;
};

// The one instance of policy class P (default-constructible), never destroyed, so that a thread
// still running at exit can use it: a policy file's factory is `return instance<P>();`.
template <class P>
const Policy& instance() {
  static const P* p = new P();
  return *p;
}

// The policy of that name; ct::Error listing the known names otherwise.
const Policy& find_policy(std::string_view name);
// Every registered policy, in registry order.
const std::vector<const Policy*>& all_policies();
// "full, reuse, cachetune, ..." for help texts.
std::string policy_names();

// --- for policy implementations -----------------------------------------------------------

// Rankings kept next to the stored one, by chunk id and name ("probe", "lowfreq/<alpha>", ...):
// policies look here for a ranking the record was not laid out in before computing it.
// Encoders that produce several rankings at once (the eval harness) leave the others here.
void remember_ranking(const std::string& chunk_id, const std::string& name, ChunkRanking r);
std::optional<ChunkRanking> remembered_ranking(const std::string& chunk_id,
                                               const std::string& name);

// Top ceil(r*N) indices of `scores` (ties to the lower index), ascending.
std::vector<int32_t> top_r_by_score(const std::vector<float>& scores, double r);
// Top k indices of `scores` (ties to the lower index), ascending.
std::vector<int32_t> top_k_by_score(const std::vector<float>& scores, int k);
// The first k entries of a ranking order, ascending.
std::vector<int32_t> top_of_order(const std::vector<int32_t>& order, int k);

// One budget for a whole request instead of ceil(r*N) per chunk: the same total, the sum over
// chunks of n_select(r, N_c), goes to the highest scores of all chunks together (ties: the
// earlier chunk, then the lower index). scores[c] is chunk c's F32 [N_c] in text order, on a
// scale comparable across chunks. Returns each chunk's count; chunk c then recomputes its own
// top count[c] by score, which for a ranking sorted by score is a prefix of its order.
std::vector<int> shared_budget(const std::vector<const std::vector<float>*>& scores, double r);

}  // namespace ct
