#include "reuse/policy/probe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>

#include "backend/backend.h"
#include "backend/cpu_forward.h"
#include "core/error.h"
#include "core/sha256.h"
#include "reuse/encoder.h"
#include "reuse/policy.h"
#include "reuse/selective.h"

namespace ct {

const char* const kDefaultProbeText =
    "Notes from the community garden meeting: volunteers agreed to water the tomato beds on "
    "weekday mornings, to repair the tool shed door before the rain, and to plant sunflowers "
    "along the south fence in May.";

int probe_layers(const ProbeOptions& o, int n_layer) {
  const int want = o.layers > 0 ? o.layers : (n_layer + 4) / 5;
  return std::clamp(want, std::min(2, n_layer), n_layer);
}

std::string probe_params(const ProbeOptions& o) {
  Sha256 h;
  h.update(o.text);
  return fmt::format("probe2:layers={}:text={}",
                     o.layers > 0 ? std::to_string(o.layers) : std::string("auto"),
                     h.hex_digest().substr(0, 16));
}

namespace {

// K (after RoPE, as the cache holds it) and V of the probe context in the first `layers` layers.
struct ProbePrefix {
  int n = 0;
  std::vector<std::vector<float>> k, v;  // [layers] F32 [n][kv_dim]
};

std::shared_ptr<const ProbePrefix> probe_prefix(const Model& m, const ProbeOptions& o, bool sink,
                                                int layers) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const ProbePrefix>> memo;
  const std::string key = m.fingerprint() + "|" + probe_params(o) + "|" + std::to_string(layers) +
                          "|" + (sink ? "sink" : "nosink") + "|" + o.text;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  std::vector<int32_t> toks;
  if (sink) toks.push_back(m.tokenizer().bos() >= 0 ? m.tokenizer().bos() : 0);
  const auto body = m.tokenizer().encode(o.text, /*parse_special=*/false);
  toks.insert(toks.end(), body.begin(), body.end());
  CT_THROW_IF_NOT(!toks.empty(), "the probe context is empty; give a non-empty probe text");
  const ModelConfig& c = m.config();
  const int n = (int)toks.size(), KV = c.kv_dim();
  KVCache kv(layers, n, KV);
  Workspace ws;
  std::vector<float> x((size_t)n * c.n_embd);
  m.embed(toks.data(), n, x.data());
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  auto p = std::make_shared<ProbePrefix>();
  p->n = n;
  for (int l = 0; l < layers; ++l) {
    cpu::forward_layer(m, l, x.data(), pos.data(), n, kv, ws);
    p->k.emplace_back(kv.k(l), kv.k(l) + (size_t)n * KV);
    p->v.emplace_back(kv.v(l), kv.v(l) + (size_t)n * KV);
  }
  if (memo.size() > 64) memo.clear();
  memo[key] = p;
  return p;
}

// Token indices by descending score, ties to the lower index.
ChunkRanking ranking_by_scores(std::vector<float> scores) {
  ChunkRanking r;
  r.scores = std::move(scores);
  r.order.resize(r.scores.size());
  std::iota(r.order.begin(), r.order.end(), 0);
  std::stable_sort(r.order.begin(), r.order.end(),
                   [&](int32_t a, int32_t b) { return r.scores[a] > r.scores[b]; });
  return r;
}
// Per token L2 norm of a - b over kv_dim channels, into out[n].
void drift_norms(const float* a, const float* b, int n, int kv_dim, double* out) {
  for (int t = 0; t < n; ++t) {
    double s = 0;
    const float* pa = a + (size_t)t * kv_dim;
    const float* pb = b + (size_t)t * kv_dim;
    for (int i = 0; i < kv_dim; ++i) {
      const double d = (double)pa[i] - pb[i];
      s += d * d;
    }
    out[t] = std::sqrt(s);
  }
}

}  // namespace

int probe_context_length(const Model& m, const ProbeOptions& o, bool sink) {
  return probe_prefix(m, o, sink, probe_layers(o, m.config().n_layer))->n;
}

ProbePass::ProbePass(const Model& m, const std::vector<int32_t>& tokens, bool sink,
                     const std::vector<const float*>& k_iso,
                     const std::vector<const float*>& v_iso, const ProbeOptions& o,
                     DeviceSequence* device)
    : tokens_(tokens), k_iso_(k_iso), v_iso_(v_iso) {
  const ModelConfig& c = m.config();
  const int n = (int)tokens.size();
  kv_dim_ = c.kv_dim();
  layers_ = probe_layers(o, c.n_layer);
  CT_THROW_IF_NOT(n > 0, "probe ranking of an empty chunk");
  CT_THROW_IF_NOT((int)k_iso.size() >= layers_ && (int)v_iso.size() >= layers_,
                  "probe ranking needs the isolated K/V of {} layers, got {}", layers_,
                  std::min(k_iso.size(), v_iso.size()));
  std::shared_ptr<const ProbePrefix> pre = probe_prefix(m, o, sink, layers_);
  const int P = pre->n;
  CT_THROW_IF_NOT(P + n <= c.n_ctx_train,
                  "probe context ({} tokens) + chunk ({} tokens) exceed the model context of {}", P,
                  n, c.n_ctx_train);
  // The chunk after the probe context, through the layer contract: the context's rows are
  // placed as they are (already rotated) with the first slice, the chunk's rows computed over
  // them, layer by layer. On the CPU the cache holds only the probed layers; a device
  // overwrites its own sequence (when it holds the context and the chunk; else the CPU runs the
  // pass) and runs it whole.
  ctx_.segments.push_back({KvDtype::F32, P, "probe context"});
  ctx_.pos.resize(P);
  std::iota(ctx_.pos.begin(), ctx_.pos.end(), 0);
  ctx_.rotated = true;
  const size_t ctx_bytes = (size_t)P * kv_dim_ * sizeof(float);
  ctx_.read = [pre, ctx_bytes](int l, int, void* k, void* v) {
    std::memcpy(k, pre->k[l].data(), ctx_bytes);
    std::memcpy(v, pre->v[l].data(), ctx_bytes);
  };
  PipelineOptions po;
  po.overlap = false;  // a few layers of short passes: no loader thread
  if (device && device->n_ctx() >= P + n) {
    whole_ = true;
    be_ = device->layers(nullptr);
  } else {
    kv_ = KVCache(layers_, P + n, kv_dim_);
    be_ = make_cpu_layers(m, kv_, ws_, po);
  }
  pos_.resize(n);
  std::iota(pos_.begin(), pos_.end(), P);
  dk_.assign(layers_, std::vector<double>(n, 0.0));
  dv_.assign(layers_, std::vector<double>(n, 0.0));
}

ProbePass::~ProbePass() = default;

void ProbePass::step(int rows) {
  const int n = (int)tokens_.size(), a = done_, KV = kv_dim_;
  CT_THROW_IF_NOT(rows > 0 && rows <= rows_left(), "a probe slice of {} rows with {} left", rows,
                  rows_left());
  CT_THROW_IF_NOT(!whole_ || rows == n, "the probe pass on a device runs whole: {} rows of {}",
                  rows, n);
  be_->begin(tokens_.data() + a, pos_.data() + a, rows);
  if (a == 0) be_->set_reused(ctx_, 0);  // later slices attend over the placed rows
  std::vector<float> kp((size_t)rows * KV), vp((size_t)rows * KV);
  for (int l = 0; l < layers_; ++l) {
    LayerTap tap;
    tap.k_pre_rope = kp.data();
    tap.v = vp.data();
    be_->layer(l, &tap);
    if (l == 0) continue;  // layer 0's K and V depend on the token alone
    drift_norms(kp.data(), k_iso_[l] + (size_t)a * KV, rows, KV, dk_[l].data() + a);
    drift_norms(vp.data(), v_iso_[l] + (size_t)a * KV, rows, KV, dv_[l].data() + a);
  }
  done_ += rows;
}

ChunkRanking ProbePass::ranking() const {
  CT_THROW_IF_NOT(rows_left() == 0, "the probe ranking with {} of {} rows left", rows_left(),
                  tokens_.size());
  const int n = (int)tokens_.size();
  const auto mean = [n](const std::vector<double>& x) {
    double sum = 0;
    for (double v : x) sum += v;
    return sum / n;
  };
  std::vector<double> score(n, 0.0);
  int n_scored = 0;
  double scale = 0;  // the chunk's mean drift, averaged over the scored layers
  for (int l = 1; l < layers_; ++l) {
    const double mk = mean(dk_[l]), mv = mean(dv_[l]);
    for (int t = 0; t < n; ++t) {
      score[t] += 0.5 * (mk > 0 ? dk_[l][t] / mk : 0.0) + 0.5 * (mv > 0 ? dv_[l][t] / mv : 0.0);
    }
    scale += 0.5 * (mk + mv);
    ++n_scored;
  }
  std::vector<float> scores(n);
  for (int t = 0; t < n; ++t) {
    const double s = n_scored > 0 ? score[t] / n_scored * (scale / n_scored) : 0.0;
    CT_THROW_IF_NOT(std::isfinite(s), "probe ranking: non-finite drift at token {}", t);
    scores[t] = (float)s;
  }
  return ranking_by_scores(std::move(scores));
}

ChunkRanking probe_rank(const Model& m, const std::vector<int32_t>& tokens, bool sink,
                        const std::vector<const float*>& k_iso,
                        const std::vector<const float*>& v_iso, const ProbeOptions& o,
                        DeviceSequence* device) {
  ProbePass pass(m, tokens, sink, k_iso, v_iso, o, device);
  pass.step(pass.rows_left());
  return pass.ranking();
}

std::string attention_params() {
  return fmt::format("attn2:last={}:prior={}", kAttentionRows, kAttentionPrior);
}

int attention_first_row(int n) { return std::max(0, n - kAttentionRows); }

std::vector<float> attention_received(const float* sums, int n, int n_layer) {
  CT_THROW_IF_NOT(n > 0 && n_layer > 0, "attention weights of {} tokens over {} layers", n,
                  n_layer);
  constexpr double kPrior = kAttentionPrior;
  const int first = attention_first_row(n);
  const auto seen_by = [&](int j) { return (double)(n - std::max(j, first)); };
  double total = 0, seen = 0;
  for (int j = 0; j < n; ++j) {
    CT_THROW_IF_NOT(std::isfinite(sums[j]) && sums[j] >= 0,
                    "attention weights: token {} received {}, expected a finite sum >= 0", j,
                    sums[j]);
    total += (double)sums[j] / n_layer;
    seen += seen_by(j);
  }
  const double mean = total / seen;
  std::vector<float> w(n, 1.0f);
  if (!(mean > 0)) return w;
  for (int j = 0; j < n; ++j) {
    const double a = ((double)sums[j] / n_layer + kPrior * mean) / (seen_by(j) + kPrior);
    w[j] = (float)(a / mean);
  }
  return w;
}

ChunkRanking attention_rank(const std::vector<float>& weight) { return ranking_by_scores(weight); }

ChunkRanking probe_attention_rank(const ChunkRanking& probe, const std::vector<float>& weight) {
  CT_THROW_IF_NOT(probe.scores.size() == weight.size(),
                  "probe-attn ranking: {} probe scores for {} attention weights",
                  probe.scores.size(), weight.size());
  std::vector<float> s(weight.size());
  for (size_t j = 0; j < s.size(); ++j) s[j] = probe.scores[j] * weight[j];
  return ranking_by_scores(std::move(s));
}

ChunkRanking stored_ranking(const ChunkSource& c, RankMode mode) {
  CT_ASSERT(mode != RankMode::kLowFreq && mode != RankMode::kHighFreq && mode != RankMode::kL2,
            "stored_ranking of a spectral mode (its name needs the alpha; policy/spectral.cc)");
  const ChunkMeta& meta = c.meta();
  const char* name = rank_mode_name(mode);
  if (meta.rank_mode == name) return {meta.scores, meta.order};
  auto kept = remembered_ranking(meta.id, name);
  CT_THROW_IF_NOT(
      kept && (int)kept->order.size() == meta.n_tok,
      "chunk {} was ingested with rank mode '{}', and this policy needs the '{}' "
      "ranking, which is computed at ingest: re-ingest with --rank {} (and give `generate` or "
      "`serve` the same --rank)",
      meta.id.substr(0, 12), meta.rank_mode, name, name);
  return std::move(*kept);
}

namespace policies {
namespace {
// The top ceil(r*N) of each chunk's ranking `mode` (stored_ranking): probe, attn, probe-attn.
class Ranked final : public Policy {
 public:
  Ranked(const char* name, const char* summary, RankMode mode)
      : Policy(name, summary, PolicyStage::kChunk), mode_(mode) {}
  std::vector<int32_t> select_chunk(const ChunkSource& c, const PolicyOptions& p) const override {
    return top_of_order(stored_ranking(c, mode_).order, n_select(p.ratio, c.meta().n_tok));
  }
  std::vector<RankMode> ingest_rankings() const override { return {mode_}; }

 private:
  RankMode mode_;
};

// The same probe scores with one budget for the request (shared_budget): a chunk whose tokens
// drift more in the probe pass gets more of the request's sum of ceil(r*N_c), and each chunk
// still recomputes a prefix of its stored order, so the reused rows stay one contiguous read.
// With the position prior (`probe-pos`), chunk c's scores are first weighted by ln(1 + m_c), m_c
// the global position of its middle token: the probe pass puts one short context before every
// chunk, while in a request a chunk's drift grows with the context before it (the first chunk,
// after only the prefix, drifts least; docs/RESULTS.md). One factor per chunk, so the order
// within a chunk, and with it the contiguous read, is unchanged. `probe-attn-shared`: the same
// shared budget over the probe-attn scores (probe drift times attention received).
class ProbeShared final : public Policy {
 public:
  ProbeShared(const char* name, const char* summary, bool position_prior,
              RankMode mode = RankMode::kProbe)
      : Policy(name, summary, PolicyStage::kRequest),
        position_prior_(position_prior),
        mode_(mode) {}
  std::vector<RankMode> ingest_rankings() const override { return {mode_}; }
  std::vector<std::vector<int32_t>> select_request(const PolicyRequest& r) const override {
    std::vector<ChunkRanking> ranks;
    for (const ChunkSource* c : r.req.chunks) ranks.push_back(stored_ranking(*c, mode_));
    if (position_prior_) {
      for (size_t b = 0; b < ranks.size(); ++b) {
        const double mid = r.lay.chunk_offset[b] + 0.5 * (double)ranks[b].scores.size();
        const float w = (float)std::log1p(mid);
        for (float& v : ranks[b].scores) v *= w;
      }
    }
    std::vector<const std::vector<float>*> scores;
    for (const ChunkRanking& k : ranks) scores.push_back(&k.scores);
    const std::vector<int> count = shared_budget(scores, r.opt.policy.ratio);
    std::vector<std::vector<int32_t>> out;
    for (size_t b = 0; b < ranks.size(); ++b) out.push_back(top_of_order(ranks[b].order, count[b]));
    return out;
  }

 private:
  bool position_prior_;
  RankMode mode_;
};
}  // namespace
const Policy& probe() {
  static const Ranked* p = new Ranked(
      "probe", "the top ceil(r*N) of the probe-drift ranking computed at ingest", RankMode::kProbe);
  return *p;
}
const Policy& attn() {
  static const Ranked* p =
      new Ranked("attn",
                 "the top ceil(r*N) by the attention each token receives in its isolated "
                 "encoding (computed at ingest)",
                 RankMode::kAttn);
  return *p;
}
const Policy& probe_attn() {
  static const Ranked* p = new Ranked(
      "probe-attn",
      "the top ceil(r*N) by probe drift times the attention received in the isolated encoding",
      RankMode::kProbeAttn);
  return *p;
}
const Policy& probe_shared() {
  static const ProbeShared* p = new ProbeShared(
      "probe-shared", "the probe-drift ranking with one budget shared across the request's chunks",
      false);
  return *p;
}
const Policy& probe_pos() {
  static const ProbeShared* p = new ProbeShared(
      "probe-pos",
      "probe-shared with each chunk's scores weighted by ln(1 + its middle token's position)",
      true);
  return *p;
}
const Policy& probe_attn_shared() {
  static const ProbeShared* p =
      new ProbeShared("probe-attn-shared",
                      "the probe-attn ranking with one budget shared across the request's chunks",
                      false, RankMode::kProbeAttn);
  return *p;
}
}  // namespace policies

}  // namespace ct
