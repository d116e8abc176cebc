// Selective recomputation: one layer loop for every policy and both backends (backend/backend.h).
// Per layer, the backend places each chunk's non-selected rows (unpacked, rotated to global
// positions) in the KV cache, then the decoder layer runs on the active rows only, attending over
// the full, causally masked sequence.
#include "reuse/selective.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

#include "backend/cpu_forward.h"
#include "core/error.h"
#include "core/timer.h"
#include "reuse/freq_rank.h"

namespace ct {

RequestLayout layout_request(const ComposedRequest& r) {
  CT_THROW_IF_NOT(!r.query.empty(), "a composed request needs a non-empty query");
  RequestLayout lay;
  auto append = [&](const std::vector<int32_t>& t, bool chunk) {
    lay.tokens.insert(lay.tokens.end(), t.begin(), t.end());
    lay.is_chunk.insert(lay.is_chunk.end(), t.size(), chunk ? 1 : 0);
  };
  append(r.prefix, false);
  for (const ChunkSource* c : r.chunks) {
    CT_THROW_IF_NOT(c != nullptr, "null chunk in request");
    lay.chunk_offset.push_back((int32_t)lay.tokens.size());
    append(c->meta().tokens, true);
  }
  lay.query_begin = (int)lay.tokens.size();
  append(r.query, false);
  lay.n_total = (int)lay.tokens.size();
  return lay;
}

std::pair<int, int> PrefixCache::longest_match(const std::vector<int32_t>& tokens) const {
  int best = 0, best_i = -1;
  for (int i = 0; i < (int)entries_.size(); ++i) {
    const auto& t = entries_[i].tokens;
    int n = 0;
    const int lim = (int)std::min(t.size(), tokens.size());
    while (n < lim && t[n] == tokens[n]) ++n;
    if (n > best) {
      best = n;
      best_i = i;
    }
  }
  return {best, best_i};
}

void PrefixCache::copy_rows(int entry, int n, KVCache& kv) const {
  kv.copy_rows(entries_[entry].kv, n);
}

void PrefixCache::remember(const std::vector<int32_t>& tokens, const KVCache& kv) {
  if (capacity_ <= 0) return;
  Entry e;
  e.tokens = tokens;
  const int n = (int)tokens.size();
  e.kv.reset(kv.n_layer(), n, kv.kv_dim(), kv.dtype());
  e.kv.copy_rows(kv, n);
  e.kv.n_pos = n;
  if ((int)entries_.size() >= capacity_) entries_.erase(entries_.begin());
  entries_.push_back(std::move(e));
}

namespace {

// What to do with one chunk occurrence: which tokens are recomputed, which rank rows to load.
struct ChunkPlan {
  const ChunkSource* c = nullptr;
  int offset = 0;
  std::vector<uint8_t> selected;  // [n_tok] by text index
  int load_begin = 0;             // rank rows [load_begin, n_tok) hold every non-selected token
};

void set_selection(ChunkPlan& p, const std::vector<int32_t>& sel) {
  const ChunkMeta& meta = p.c->meta();
  p.selected.assign(meta.n_tok, 0);
  for (int32_t t : sel) p.selected[t] = 1;
  // Every non-selected token sits in rank rows [load_begin, n_tok): only they are read. For
  // cachetune (the top of the stored ranking) this is exactly the complement, one contiguous
  // suffix; for other selections it starts at the best-ranked token left out, and for full
  // recompute nothing is read.
  int j = 0;
  while (j < meta.n_tok && p.selected[meta.order[j]]) ++j;
  p.load_begin = j;
}

// First rank row read per layer for a plan: load_begin with sparse loading, else 0.
int read_begin(const ChunkPlan& p, bool sparse) { return sparse ? p.load_begin : 0; }

// The global position of every rank row read per layer, chunk after chunk in read order, or -1
// for a recomputed token inside the read range. The same in every layer.
std::vector<int32_t> read_row_positions(const std::vector<ChunkPlan>& plans, bool sparse) {
  std::vector<int32_t> pos;
  for (const ChunkPlan& p : plans) {
    const ChunkMeta& meta = p.c->meta();
    for (int j = read_begin(p, sparse); j < meta.n_tok; ++j) {
      const int t = meta.order[j];
      pos.push_back(p.selected[t] ? -1 : p.offset + t);
    }
  }
  return pos;
}

// Active rows: every non-chunk position plus the selected chunk positions, ascending.
std::vector<int32_t> active_positions(const RequestLayout& lay,
                                      const std::vector<ChunkPlan>& plans) {
  std::vector<uint8_t> on(lay.n_total, 0);
  for (int i = 0; i < lay.n_total; ++i) on[i] = !lay.is_chunk[i];
  for (const ChunkPlan& p : plans) {
    for (int t = 0; t < p.c->meta().n_tok; ++t) {
      if (p.selected[t]) on[p.offset + t] = 1;
    }
  }
  std::vector<int32_t> pos;
  for (int i = 0; i < lay.n_total; ++i) {
    if (on[i]) pos.push_back(i);
  }
  return pos;
}

struct PassResult {
  std::vector<float> logits;
  std::vector<float> attn;  // accumulated query attention [n_total] (when tapped)
  int n_active = 0, n_loaded = 0;
};

// The reused rows of the plans as the backends read them: one segment per chunk occurrence, its
// rank rows [read_begin, n_tok) (read_row_positions gives where each goes).
ReusedRows reused_rows(const std::vector<ChunkPlan>& plans, bool sparse) {
  ReusedRows r;
  r.pos = read_row_positions(plans, sparse);
  for (const ChunkPlan& p : plans) {
    const ChunkMeta& meta = p.c->meta();
    r.segments.push_back(
        {meta.dtype, meta.n_tok - read_begin(p, sparse), "chunk " + meta.id.substr(0, 12)});
  }
  r.read = [&plans, sparse](int l, int s, void* k, void* v) {
    const ChunkPlan& p = plans[s];
    p.c->read_rows(l, read_begin(p, sparse), p.c->meta().n_tok, k, v);
  };
  return r;
}

// A layer-0 policy's selection of every chunk, once layer 0 has run on every row of the request:
// from the fresh pre-RoPE K and V of Policy::kCheckLayer at every position, F32
// [n_total][kv_dim] each (check_kv projects them). A model with no layer after layer 0 has
// nothing to recompute there: no selection (k and v are then not read).
bool has_check_layer(const Model& m) { return m.config().n_layer > Policy::kCheckLayer; }

void select_at_check_layer(const Model& m, std::vector<ChunkPlan>& plans, const float* k,
                           const float* v, const PolicyOptions& po) {
  const int KV = m.config().kv_dim();
  for (ChunkPlan& p : plans) {
    const size_t at = (size_t)p.offset * KV;
    set_selection(p, has_check_layer(m) ? po.kind->select_after_layer0(*p.c, Policy::kCheckLayer,
                                                                       k + at, v + at, po)
                                        : std::vector<int32_t>());
  }
}

// The check layer's K and V of the pass's active rows (after layer 0), into k and v from row
// `first` on; nothing without a check layer.
void check_kv(const Model& m, LayerBackend& be, std::vector<float>& k, std::vector<float>& v,
              size_t first) {
  if (!has_check_layer(m)) return;
  const size_t at = first * m.config().kv_dim();
  be.project_kv(Policy::kCheckLayer, k.data() + at, v.data() + at);
}

// The layer loop, on either backend. With a layer-0 policy (PolicyStage::kAfterLayer0), layer 0
// recomputes every row and the policy then chooses each chunk's selection from layer 1's fresh
// K/V (select_at_check_layer); the reused rows are placed from layer 1 on. Taps and the layer-0
// stage need a backend whose caps() has them.
PassResult run_pass(const Model& m, LayerBackend& be, const RequestLayout& lay,
                    std::vector<ChunkPlan>& plans, bool tap_query,
                    const PolicyOptions* after_layer0, bool sparse, PrefillBreakdown& bd) {
  const ModelConfig& c = m.config();
  const int KV = c.kv_dim();
  const bool blend = after_layer0 != nullptr;
  const BackendCaps caps = be.caps();
  CT_THROW_IF_NOT(caps.taps || !tap_query,
                  "the {} backend has no layer taps, which query attention needs", caps.name);
  CT_THROW_IF_NOT(caps.keep_rows || !blend, "the {} backend cannot run a layer-0 policy",
                  caps.name);
  PassResult res;
  std::vector<int32_t> act;
  if (blend) {
    act.resize(lay.n_total);
    for (int i = 0; i < lay.n_total; ++i) act[i] = i;
  } else {
    act = active_positions(lay, plans);
  }
  std::vector<int32_t> toks(act.size());
  for (size_t i = 0; i < act.size(); ++i) toks[i] = lay.tokens[act[i]];
  be.begin(toks.data(), act.data(), (int)act.size());
  if (tap_query) res.attn.assign(lay.n_total, 0.0f);
  // A layer-0 policy decides its selection after layer 0, so its rows are placed from layer 1.
  ReusedRows rows;
  if (!blend) {
    rows = reused_rows(plans, sparse);
    be.set_reused(rows, 0);
  }
  for (int l = 0; l < c.n_layer; ++l) {
    LayerTap tap;
    bool tapped = false;
    if (tap_query) {
      tap.probs_accum = res.attn.data();
      tap.probs_from_row =
          (int)(std::lower_bound(act.begin(), act.end(), lay.query_begin) - act.begin());
      tapped = true;
    }
    be.layer(l, tapped ? &tap : nullptr);
    if (blend && l == 0) {
      std::vector<float> k1((size_t)lay.n_total * KV), v1(k1.size());
      check_kv(m, be, k1, v1, 0);  // (the backend counts it as compute)
      Timer st;
      select_at_check_layer(m, plans, k1.data(), v1.data(), *after_layer0);
      act = active_positions(lay, plans);
      be.keep_rows(act);
      rows = reused_rows(plans, sparse);
      be.set_reused(rows, 1);
      bd.select_ms += st.ms();
    }
  }
  res.n_active = (int)act.size();
  res.n_loaded = rows.n_placed();
  res.logits = be.finish();
  const LayerTimes& t = be.times();
  bd.load_ms += t.load_ms;
  bd.load_wait_ms += t.load_wait_ms;
  bd.compute_ms += t.compute_ms;
  bd.logits_ms += t.logits_ms;
  bd.kv_to_host_ms += t.kv_to_host_ms;
  if (tap_query) {
    const double n_q = (double)(lay.n_total - lay.query_begin) * c.n_layer;
    for (float& a : res.attn) a = (float)(a / n_q);
  }
  return res;
}

// A token-stage policy's list on a device: the rows the policy placed in the host cache
// ([0, n_reused): already rotated, in the cache's type) go into the device's cache as they are,
// the rest of the list runs through every layer there, and the finished cache comes back to the
// host (to_host), where after_tokens reads it (the prefix cache remembers it). to_host may be null when the
// policy reuses no rows and reads nothing after.
std::vector<float> device_token_pass(const Model& m, DeviceSequence& dev, const TokenPlan& tp,
                                     KVCache* to_host, PrefillBreakdown& bd) {
  const int n = (int)tp.tokens.size() - tp.n_reused;
  CT_THROW_IF_NOT(n > 0, "a token-stage policy left no token to prefill");
  CT_ASSERT(tp.n_reused == 0 || to_host != nullptr,
            "{} reused rows of a host cache the policy did not declare (uses_host_cache)",
            tp.n_reused);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), tp.n_reused);
  const auto be = dev.layers(to_host);
  be->begin(tp.tokens.data() + tp.n_reused, pos.data(), n);
  if (tp.n_reused > 0) {
    ReusedRows rows;
    rows.segments.push_back({to_host->dtype(), tp.n_reused, "the reused prefix"});
    rows.pos.resize(tp.n_reused);
    std::iota(rows.pos.begin(), rows.pos.end(), 0);
    rows.rotated = true;
    const size_t bytes = (size_t)tp.n_reused * to_host->row_bytes();
    rows.read = [to_host, bytes](int l, int, void* k, void* v) {
      std::memcpy(k, to_host->k_data(l), bytes);
      std::memcpy(v, to_host->v_data(l), bytes);
    };
    be->set_reused(rows, 0);
  }
  for (int l = 0; l < m.config().n_layer; ++l) be->layer(l, nullptr);
  std::vector<float> logits = be->finish();
  const LayerTimes& t = be->times();
  bd.load_ms += t.load_ms;
  bd.load_wait_ms += t.load_wait_ms;
  bd.compute_ms += t.compute_ms;
  bd.logits_ms += t.logits_ms;
  bd.kv_to_host_ms += t.kv_to_host_ms;
  return logits;
}

}  // namespace

std::vector<float> selective_prefill(const Model& m, const ComposedRequest& req,
                                     const SelectiveOptions& opt, KVCache& kv, Workspace& ws,
                                     PrefillBreakdown* breakdown) {
  return selective_prefill(m, req, opt, kv, ws, breakdown, nullptr);
}

namespace {

// Checks the request against the model and the cache, lays it out and gives each chunk its plan.
RequestLayout checked_layout(const Model& m, const ComposedRequest& req, const SelectiveOptions& opt,
                             const KVCache& kv, std::vector<ChunkPlan>& plans) {
  RequestLayout lay = layout_request(req);
  const ModelConfig& c = m.config();
  // A device prefill that keeps its cache on the device does not touch the host kv, unless the
  // policy works on the host cache itself.
  const bool host_kv_unused =
      opt.device && !opt.device_kv_to_host && !opt.policy.kind->uses_host_cache();
  CT_THROW_IF_NOT(host_kv_unused || lay.n_total <= kv.n_ctx(),
                  "composed prompt of {} tokens does not fit the {}-position KV cache", lay.n_total,
                  kv.n_ctx());
  for (const ChunkSource* ch : req.chunks) {
    const ChunkMeta& cm = ch->meta();
    CT_THROW_IF_NOT(cm.model_fingerprint == m.fingerprint() && cm.n_layer == c.n_layer &&
                        cm.kv_dim == c.kv_dim(),
                    "chunk {} was encoded by model {} ({} layers, kv_dim {}), not by the loaded "
                    "model {} ({} layers, kv_dim {})",
                    cm.id.substr(0, 12), cm.model_fingerprint, cm.n_layer, cm.kv_dim,
                    m.fingerprint(), c.n_layer, c.kv_dim());
  }
  plans.assign(req.chunks.size(), ChunkPlan{});
  for (size_t b = 0; b < req.chunks.size(); ++b) {
    plans[b].c = req.chunks[b];
    plans[b].offset = lay.chunk_offset[b];
  }
  return lay;
}

// The backend of one pass: the device when given, else the CPU. A device copies its cache to the
// host kv only for the pass whose cache is kept (not a two-pass policy's first pass).
using LayersFn = std::function<std::unique_ptr<LayerBackend>(bool kept)>;

// What request-stage and token-stage policies see; its reuse pass (pass 1 of a two-pass policy:
// full reuse, query attention tapped) runs on layers(false). Holds references to its arguments.
PolicyRequest policy_request(const Model& m, const ComposedRequest& req, const RequestLayout& lay,
                             const SelectiveOptions& opt, std::vector<ChunkPlan>& plans,
                             const LayersFn& layers) {
  return PolicyRequest{m, req, lay, opt, [&m, &lay, &opt, &plans, &layers] {
                         for (ChunkPlan& p : plans) set_selection(p, {});
                         PrefillBreakdown bd1;
                         const auto be = layers(false);
                         return run_pass(m, *be, lay, plans, true, nullptr, opt.pipeline.sparse,
                                         bd1)
                             .attn;
                       }};
}

// A chunk- or request-stage policy's selection, into the plans.
void select_before_layers(const PolicyRequest& preq, std::vector<ChunkPlan>& plans) {
  const Policy& pol = *preq.opt.policy.kind;
  const std::vector<std::vector<int32_t>> sel = pol.select_request(preq);
  CT_ASSERT(sel.size() == plans.size(), "policy '{}' selected for {} of {} chunks", pol.name(),
            sel.size(), plans.size());
  for (size_t b = 0; b < plans.size(); ++b) set_selection(plans[b], sel[b]);
}

}  // namespace

std::vector<float> selective_prefill(const Model& m, const ComposedRequest& req,
                                     const SelectiveOptions& opt, KVCache& kv, Workspace& ws,
                                     PrefillBreakdown* breakdown, SelectionReport* report) {
  Timer total;
  PrefillBreakdown bd;
  std::vector<ChunkPlan> plans;
  const RequestLayout lay = checked_layout(m, req, opt, kv, plans);
  const Policy& pol = *opt.policy.kind;
  std::vector<float> logits;
  const LayersFn layers = [&](bool kept) -> std::unique_ptr<LayerBackend> {
    if (opt.device) return opt.device->layers(kept && opt.device_kv_to_host ? &kv : nullptr);
    return make_cpu_layers(m, kv, ws, opt.pipeline);
  };
  const PolicyRequest preq = policy_request(m, req, lay, opt, plans, layers);

  if (pol.stage() == PolicyStage::kTokens) {
    // A plain prefill of a token list on top of the rows the policy placed.
    Timer st;
    const TokenPlan tp = pol.plan_tokens(preq, kv);
    bd.select_ms += st.ms();
    bd.load_ms += tp.load_ms;
    if (report) {
      report->selected.clear();
      if (tp.selected) report->selected = *tp.selected;
    }
    if (opt.device) {
      const bool to_host = opt.device_kv_to_host || pol.uses_host_cache();
      logits = device_token_pass(m, *opt.device, tp, to_host ? &kv : nullptr, bd);
    } else {
      Timer ct;
      logits = cpu::prefill(m, tp.tokens.data() + tp.n_reused,
                            (int)tp.tokens.size() - tp.n_reused, tp.n_reused, kv, ws);
      bd.compute_ms += ct.ms();
    }
    kv.n_pos = (int)tp.tokens.size();
    pol.after_tokens(preq, tp.tokens, kv);
    bd.n_active = (int)tp.tokens.size() - tp.n_reused;
    bd.n_loaded = tp.n_reused;
    if (opt.query_attention) opt.query_attention->assign(lay.n_total, 0.0f);
  } else {
    Timer st;
    const bool layer0 = pol.stage() == PolicyStage::kAfterLayer0;
    if (layer0) {
      for (ChunkPlan& p : plans) set_selection(p, {});
    } else {
      select_before_layers(preq, plans);
    }
    bd.select_ms += st.ms();
    const auto be = layers(true);
    PassResult r = run_pass(m, *be, lay, plans, opt.query_attention != nullptr,
                            layer0 ? &opt.policy : nullptr, opt.pipeline.sparse, bd);
    logits = std::move(r.logits);
    kv.n_pos = lay.n_total;
    bd.n_active = r.n_active;
    bd.n_loaded = r.n_loaded;
    if (opt.query_attention) *opt.query_attention = std::move(r.attn);
    if (report) {
      report->selected.clear();
      for (const ChunkPlan& p : plans) {
        std::vector<int32_t> sel;
        for (int t = 0; t < p.c->meta().n_tok; ++t) {
          if (p.selected[t]) sel.push_back(t);
        }
        report->selected.push_back(std::move(sel));
      }
    }
  }
  bd.n_total = lay.n_total;
  bd.total_ms = total.ms();
  if (breakdown) *breakdown = bd;
  return logits;
}

struct SlicedPrefill::State {
  State(const Model& model, KVCache& c) : m(model), kv(c) {}
  const Model& m;
  KVCache& kv;
  int n_vocab = 0;
  RequestLayout lay;
  std::vector<ChunkPlan> plans;  // reused_rows() reads through them: they stay put
  // The token at every position of the finished cache: lay.tokens, or a token-stage policy's
  // list (TokenPlan::tokens).
  std::vector<int32_t> tokens;
  std::vector<int32_t> act;  // active positions, ascending
  ReusedRows rows;
  int rows_from_layer = 0;  // the first layer the reused rows are placed in
  size_t next = 0;          // first active row not yet computed
  std::vector<float> logits;
  PrefillBreakdown bd;
  Timer total;
  // A token-stage policy (its after_tokens runs at the end), with what that reads.
  const Policy* token_policy = nullptr;
  ComposedRequest req;
  SelectiveOptions opt;
  // The selection pass (select_step) before the first slice, in blocks of its rows (sel_pos,
  // ascending; sel_next the first not run): a layer-0 policy's (layer 0 over every position,
  // the check layer's K/V projected into sel_k and sel_v, F32 [n_total][KV] each) or a two-pass
  // policy's reuse pass (every layer over the non-chunk positions with every chunk row reused,
  // placed by the first block; the query rows' attention added into sel_attn, F32 [n_total]).
  enum class Pass { kNone, kLayer0, kReuse } pass = Pass::kNone;
  std::vector<int32_t> sel_pos;
  size_t sel_next = 0;
  std::vector<float> sel_k, sel_v, sel_attn;
  ReusedRows sel_reused;
  // Once the selection is made (at construction, or after the selection pass's last row): the
  // active rows, the reused rows and the breakdown's counts.
  void plan_rows() {
    act = active_positions(lay, plans);
    rows = reused_rows(plans, opt.pipeline.sparse);
    bd.n_total = lay.n_total;
    bd.n_active = (int)act.size();
    bd.n_loaded = rows.n_placed();
  }
};

bool SlicedPrefill::supports(const SelectiveOptions& opt) {
  return !opt.device && !opt.query_attention;
}

SlicedPrefill::SlicedPrefill(const Model& m, const ComposedRequest& req,
                             const SelectiveOptions& opt, KVCache& kv)
    : s_(std::make_unique<State>(m, kv)) {
  CT_THROW_IF_NOT(supports(opt),
                  "policy '{}' cannot prefill in slices with a device or query attention; run it "
                  "whole",
                  opt.policy.kind->name());
  State& s = *s_;
  const Policy& pol = *opt.policy.kind;
  s.n_vocab = m.config().n_vocab;
  s.lay = checked_layout(m, req, opt, kv, s.plans);
  s.tokens = s.lay.tokens;
  s.opt = opt;
  s.req = req;
  Timer st;
  // The reuse pass runs in select_step's blocks, for the policies that declare they read it.
  const PolicyRequest preq{m, req, s.lay, opt, [&pol]() -> std::vector<float> {
                             CT_THROW_IF_NOT(false,
                                             "policy '{}' reads the reuse pass without declaring "
                                             "it (reads_reuse_pass)",
                                             pol.name());
                             return {};
                           }};
  if (pol.stage() == PolicyStage::kTokens) {
    // The policy places its reused rows now; the slices prefill the rest of its token list.
    TokenPlan tp = pol.plan_tokens(preq, kv);
    s.bd.select_ms = st.ms();
    s.bd.load_ms = tp.load_ms;
    s.tokens = std::move(tp.tokens);
    for (int i = tp.n_reused; i < (int)s.tokens.size(); ++i) s.act.push_back(i);
    s.bd.n_total = s.lay.n_total;  // the prompt's length, as the whole prefill reports it
    s.bd.n_active = (int)s.act.size();
    s.bd.n_loaded = tp.n_reused;
    s.token_policy = &pol;
    return;
  }
  if (pol.stage() == PolicyStage::kAfterLayer0) {
    // The selection pass runs in blocks (select_step) before the first slice: layer 0 of every
    // row into kv (where the rows left out keep it), with the check layer's K/V projected for
    // the selection. The slices then recompute the selected rows through every layer and place
    // the others from layer 1, as the whole prefill does.
    for (ChunkPlan& p : s.plans) set_selection(p, {});
    s.pass = State::Pass::kLayer0;
    s.sel_pos.resize(s.lay.n_total);
    std::iota(s.sel_pos.begin(), s.sel_pos.end(), 0);
    const size_t cells = has_check_layer(m) ? (size_t)s.lay.n_total * m.config().kv_dim() : 0;
    s.sel_k.resize(cells);
    s.sel_v.resize(cells);
    s.rows_from_layer = 1;
  } else if (pol.reads_reuse_pass()) {
    // The reuse pass in blocks (select_step) over the rows it recomputes, every chunk row
    // reused, as PolicyRequest::reuse_pass_attention runs it whole; it writes into kv, which
    // the slices then overwrite (every row a slice attends over is placed or recomputed first).
    for (ChunkPlan& p : s.plans) set_selection(p, {});
    s.pass = State::Pass::kReuse;
    s.sel_pos = active_positions(s.lay, s.plans);
    s.sel_reused = reused_rows(s.plans, opt.pipeline.sparse);
    s.sel_attn.assign(s.lay.n_total, 0.0f);
  } else {
    select_before_layers(preq, s.plans);
    s.bd.select_ms = st.ms();
    s.plan_rows();
    return;
  }
  s.bd.select_ms = st.ms();
  s.bd.n_total = s.lay.n_total;
}

int SlicedPrefill::select_rows_left() const {
  return (int)(s_->sel_pos.size() - s_->sel_next);
}

double SlicedPrefill::select_share() const {
  // A layer-0 pass row is one layer of n_layer; a reuse pass row goes through all of them.
  return s_->pass == State::Pass::kLayer0 ? 1.0 / s_->m.config().n_layer : 1.0;
}

int SlicedPrefill::select_rows_within(const RowWork& w, double work) const {
  const int left = select_rows_left();
  const int32_t* pos = s_->sel_pos.data() + s_->sel_next;
  return std::min(left, std::max(1, w.fit_at(pos, left, work, select_share())));
}

double SlicedPrefill::select_work_of(const RowWork& w, int rows) const {
  return w.rows_at(s_->sel_pos.data() + s_->sel_next, std::min(rows, select_rows_left()),
                   select_share());
}

void SlicedPrefill::select_step(int n, Workspace& ws) {
  State& s = *s_;
  n = std::min(n, select_rows_left());
  CT_THROW_IF_NOT(n > 0, "a selection block of {} rows ({} left)", n, select_rows_left());
  const size_t a = s.sel_next;
  const int32_t* pos = s.sel_pos.data() + a;
  std::vector<int32_t> toks(n);
  for (int i = 0; i < n; ++i) toks[i] = s.lay.tokens[pos[i]];
  {
    const auto be = make_cpu_layers(s.m, s.kv, ws, s.opt.pipeline);
    be->begin(toks.data(), pos, n);  // over the rows before the block, in kv
    if (s.pass == State::Pass::kLayer0) {
      be->layer(0, nullptr);
      check_kv(s.m, *be, s.sel_k, s.sel_v, a);
    } else {
      if (a == 0) be->set_reused(s.sel_reused, 0);
      // The query rows' attention: from the block's first query row, if it has one.
      const int q = (int)(std::lower_bound(pos, pos + n, s.lay.query_begin) - pos);
      for (int l = 0; l < s.m.config().n_layer; ++l) {
        LayerTap tap;
        tap.probs_accum = s.sel_attn.data();
        tap.probs_from_row = q;
        be->layer(l, q < n ? &tap : nullptr);
      }
    }
    // As in the whole prefill: layer 0 over every row is the layer loop's, the reuse pass is
    // the selection's.
    (s.pass == State::Pass::kLayer0 ? s.bd.compute_ms : s.bd.select_ms) +=
        be->times().compute_ms;
  }
  if (a + n < s.sel_pos.size()) {
    s.sel_next = a + n;
    return;
  }
  // The last block: the selection (a layer-0 policy reads each chunk's stored check-layer rows
  // here; a read that fails leaves the pass to be run again, as a slice's does).
  Timer sel;
  if (s.pass == State::Pass::kLayer0) {
    select_at_check_layer(s.m, s.plans, s.sel_k.data(), s.sel_v.data(), s.opt.policy);
  } else {
    const double n_q = (double)(s.lay.n_total - s.lay.query_begin) * s.m.config().n_layer;
    for (float& x : s.sel_attn) x = (float)(x / n_q);
    const PolicyRequest preq{s.m, s.req, s.lay, s.opt, [&s] { return s.sel_attn; }};
    select_before_layers(preq, s.plans);
  }
  s.bd.select_ms += sel.ms();
  s.sel_next = s.sel_pos.size();
  s.sel_k = std::vector<float>();
  s.sel_v = std::vector<float>();
  s.sel_attn = std::vector<float>();
  s.sel_reused = ReusedRows();
  s.plan_rows();
}

SlicedPrefill::~SlicedPrefill() = default;

int SlicedPrefill::rows_left() const { return (int)(s_->act.size() - s_->next); }

bool SlicedPrefill::done() const { return select_rows_left() == 0 && rows_left() == 0; }

int SlicedPrefill::rows_within(const RowWork& w, double work) const {
  const int left = rows_left();
  return std::min(left, std::max(1, w.fit_at(s_->act.data() + s_->next, left, work)));
}

double SlicedPrefill::work_of(const RowWork& w, int rows) const {
  return w.rows_at(s_->act.data() + s_->next, std::min(rows, rows_left()));
}

const ReusedRows* SlicedPrefill::add_slice(int n, std::vector<int32_t>& tokens,
                                           std::vector<int32_t>& pos,
                                           std::vector<BatchSeq>& seqs) const {
  const State& s = *s_;
  n = std::min(n, rows_left());
  CT_THROW_IF_NOT(select_rows_left() == 0, "a slice before the selection pass's {} rows",
                  select_rows_left());
  CT_THROW_IF_NOT(n > 0, "a slice of {} rows ({} left)", n, rows_left());
  for (size_t i = s.next; i < s.next + n; ++i) {
    pos.push_back(s.act[i]);
    tokens.push_back(s.tokens[s.act[i]]);
  }
  seqs.push_back(BatchSeq{&s.kv, n, false});
  return s.next == 0 && !s.rows.segments.empty() ? &s.rows : nullptr;
}

int SlicedPrefill::reused_from_layer() const { return s_->rows_from_layer; }

void SlicedPrefill::slice_done(int n, const float* last_logits, const LayerTimes& t) {
  State& s = *s_;
  n = std::min(n, rows_left());
  s.next += n;
  s.bd.load_ms += t.load_ms;
  s.bd.load_wait_ms += t.load_wait_ms;
  s.bd.compute_ms += t.compute_ms;
  s.bd.logits_ms += t.logits_ms;
  if (!done()) return;
  s.logits.assign(last_logits, last_logits + s.n_vocab);
  s.kv.n_pos = (int)s.tokens.size();
  if (s.token_policy) {
    const PolicyRequest preq{s.m, s.req, s.lay, s.opt, [] { return std::vector<float>(); }};
    s.token_policy->after_tokens(preq, s.tokens, s.kv);
  }
  s.bd.total_ms = s.total.ms();
}

std::vector<float> SlicedPrefill::take_logits() {
  CT_THROW_IF_NOT(done(), "the sliced prefill has {} rows left", rows_left());
  return std::move(s_->logits);
}

const PrefillBreakdown& SlicedPrefill::breakdown() const { return s_->bd; }

}  // namespace ct
