// Selective recomputation: one layer loop for every policy. Per layer, the loader writes each
// chunk's non-selected rows (unpacked, rotated to global positions) into the KV cache, then the
// decoder layer runs on the active rows only, attending over the full, causally masked sequence.
#include "reuse/selective.h"

#include <algorithm>
#include <cstring>

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
  for (const ChunkKV* c : r.chunks) {
    CT_THROW_IF_NOT(c != nullptr, "null chunk in request");
    lay.chunk_offset.push_back((int32_t)lay.tokens.size());
    append(c->meta.tokens, true);
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
  const KVCache& src = entries_[entry].kv;
  const size_t bytes = (size_t)n * kv.kv_dim() * sizeof(float);
  for (int l = 0; l < kv.n_layer(); ++l) {
    std::memcpy(kv.k(l), src.k(l), bytes);
    std::memcpy(kv.v(l), src.v(l), bytes);
  }
}

void PrefixCache::remember(const std::vector<int32_t>& tokens, const KVCache& kv) {
  if (capacity_ <= 0) return;
  Entry e;
  e.tokens = tokens;
  const int n = (int)tokens.size();
  e.kv.reset(kv.n_layer(), n, kv.kv_dim());
  const size_t bytes = (size_t)n * kv.kv_dim() * sizeof(float);
  for (int l = 0; l < kv.n_layer(); ++l) {
    std::memcpy(e.kv.k(l), kv.k(l), bytes);
    std::memcpy(e.kv.v(l), kv.v(l), bytes);
  }
  e.kv.n_pos = n;
  if ((int)entries_.size() >= capacity_) entries_.erase(entries_.begin());
  entries_.push_back(std::move(e));
}

namespace {

// What to do with one chunk occurrence: which tokens are recomputed, which rank rows to load.
struct ChunkPlan {
  const ChunkKV* c = nullptr;
  int offset = 0;
  std::vector<uint8_t> selected;  // [n_tok] by text index
  int load_begin = 0;  // rank rows [load_begin, n_tok) hold every non-selected token
};

void set_selection(ChunkPlan& p, const std::vector<int32_t>& sel, bool ranking_prefix) {
  const int n = p.c->meta.n_tok;
  p.selected.assign(n, 0);
  for (int32_t t : sel) p.selected[t] = 1;
  // When the selection is the top of the stored ranking, the complement is one contiguous
  // suffix of rank rows: only it is read (sparse loading). Otherwise scan all rows.
  p.load_begin = ranking_prefix ? (int)sel.size() : 0;
}

// Writes layer l's non-selected chunk rows into kv and applies deferred RoPE at their global
// positions. Returns the number of rows loaded.
int load_layer(const Model& m, int l, const std::vector<ChunkPlan>& plans, KVCache& kv,
               std::vector<int32_t>& pos) {
  const int KV = kv.kv_dim();
  pos.clear();
  float* kc = kv.k(l);
  float* vc = kv.v(l);
  for (const ChunkPlan& p : plans) {
    const ChunkMeta& meta = p.c->meta;
    const size_t row_bytes = (size_t)KV * kv_dtype_size(meta.dtype);
    const uint8_t* kb = p.c->k[l].data();
    const uint8_t* vb = p.c->v[l].data();
    for (int j = p.load_begin; j < meta.n_tok; ++j) {
      const int t = meta.order[j];
      if (p.selected[t]) continue;
      const int g = p.offset + t;
      kv_unpack(meta.dtype, kb + j * row_bytes, kc + (size_t)g * KV, KV);
      kv_unpack(meta.dtype, vb + j * row_bytes, vc + (size_t)g * KV, KV);
      pos.push_back(g);
    }
  }
  m.rope().apply_at_positions(kc, KV, m.config().n_head_kv, pos.data(), (int)pos.size());
  return (int)pos.size();
}

// Active rows: every non-chunk position plus the selected chunk positions, ascending.
std::vector<int32_t> active_positions(const RequestLayout& lay,
                                      const std::vector<ChunkPlan>& plans) {
  std::vector<uint8_t> on(lay.n_total, 0);
  for (int i = 0; i < lay.n_total; ++i) on[i] = !lay.is_chunk[i];
  for (const ChunkPlan& p : plans) {
    for (int t = 0; t < p.c->meta.n_tok; ++t) {
      if (p.selected[t]) on[p.offset + t] = 1;
    }
  }
  std::vector<int32_t> pos;
  for (int i = 0; i < lay.n_total; ++i) {
    if (on[i]) pos.push_back(i);
  }
  return pos;
}

// Keeps the hidden rows of `x` (rows listed by `from`) whose positions appear in `to`.
void compact_rows(std::vector<float>& x, const std::vector<int32_t>& from,
                  const std::vector<int32_t>& to, int E) {
  size_t j = 0, w = 0;
  for (size_t i = 0; i < from.size() && w < to.size(); ++i) {
    if (from[i] != to[w]) continue;
    if (i != w) std::memmove(x.data() + w * E, x.data() + i * E, E * sizeof(float));
    ++w;
    ++j;
  }
  CT_ASSERT(w == to.size(), "active set is not a subset ({} of {})", w, to.size());
  x.resize(w * E);
}

struct PassResult {
  std::vector<float> logits;
  std::vector<float> attn;  // accumulated query attention [n_total] (when tapped)
  int n_active = 0, n_loaded = 0;
};

// The layer loop. With blend_ratio >= 0 (CacheBlend), layer 0 recomputes every row and the
// chunk tokens whose K/V deviate most from the stored ones become the selection afterwards.
PassResult run_pass(const Model& m, const RequestLayout& lay, std::vector<ChunkPlan>& plans,
                    KVCache& kv, Workspace& ws, bool tap_query, double blend_ratio,
                    PrefillBreakdown& bd) {
  const ModelConfig& c = m.config();
  const int E = c.n_embd, KV = c.kv_dim();
  PassResult res;
  std::vector<int32_t> act;
  if (blend_ratio >= 0) {
    act.resize(lay.n_total);
    for (int i = 0; i < lay.n_total; ++i) act[i] = i;
  } else {
    act = active_positions(lay, plans);
  }
  std::vector<int32_t> toks(act.size());
  for (size_t i = 0; i < act.size(); ++i) toks[i] = lay.tokens[act[i]];
  std::vector<float> x(act.size() * E);
  m.embed(toks.data(), (int)act.size(), x.data());
  std::vector<int32_t> pos_scratch;
  if (tap_query) res.attn.assign(lay.n_total, 0.0f);
  std::vector<float> k0, v0;  // CacheBlend layer-0 taps, F32 [n_total][KV]
  for (int l = 0; l < c.n_layer; ++l) {
    if (!(blend_ratio >= 0 && l == 0)) {
      Timer lt;
      res.n_loaded = load_layer(m, l, plans, kv, pos_scratch);
      bd.load_ms += lt.ms();
    }
    LayerTap tap;
    if (tap_query) {
      tap.probs_accum = res.attn.data();
      tap.probs_from_row = (int)(std::lower_bound(act.begin(), act.end(), lay.query_begin) -
                                 act.begin());
    }
    if (blend_ratio >= 0 && l == 0) {
      k0.resize((size_t)lay.n_total * KV);
      v0.resize((size_t)lay.n_total * KV);
      tap.k_pre_rope = k0.data();
      tap.v = v0.data();
    }
    Timer ct;
    m.forward_layer(l, x.data(), act.data(), (int)act.size(), kv, ws, &tap);
    bd.compute_ms += ct.ms();
    if (blend_ratio >= 0 && l == 0) {
      Timer st;
      std::vector<float> stored(KV);
      for (ChunkPlan& p : plans) {
        const ChunkMeta& meta = p.c->meta;
        const size_t row_bytes = (size_t)KV * kv_dtype_size(meta.dtype);
        std::vector<float> dev(meta.n_tok);
        for (int j = 0; j < meta.n_tok; ++j) {
          const int t = meta.order[j], g = p.offset + t;
          double d = 0;
          kv_unpack(meta.dtype, p.c->k[0].data() + j * row_bytes, stored.data(), KV);
          for (int i = 0; i < KV; ++i) {
            const double e = k0[(size_t)g * KV + i] - stored[i];
            d += e * e;
          }
          kv_unpack(meta.dtype, p.c->v[0].data() + j * row_bytes, stored.data(), KV);
          for (int i = 0; i < KV; ++i) {
            const double e = v0[(size_t)g * KV + i] - stored[i];
            d += e * e;
          }
          dev[t] = (float)d;
        }
        set_selection(p, top_r_by_score(dev, blend_ratio), false);
      }
      std::vector<int32_t> next = active_positions(lay, plans);
      compact_rows(x, act, next, E);
      act = std::move(next);
      bd.select_ms += st.ms();
    }
  }
  res.n_active = (int)act.size();
  Timer gt;
  res.logits.resize(c.n_vocab);
  m.logits(x.data() + (act.size() - 1) * E, 1, res.logits.data(), ws);
  bd.logits_ms += gt.ms();
  if (tap_query) {
    const double n_q = (double)(lay.n_total - lay.query_begin) * c.n_layer;
    for (float& a : res.attn) a = (float)(a / n_q);
  }
  return res;
}

}  // namespace

std::vector<float> selective_prefill(const Model& m, const ComposedRequest& req,
                                     const SelectiveOptions& opt, KVCache& kv, Workspace& ws,
                                     PrefillBreakdown* breakdown) {
  return selective_prefill(m, req, opt, kv, ws, breakdown, nullptr);
}

std::vector<float> selective_prefill(const Model& m, const ComposedRequest& req,
                                     const SelectiveOptions& opt, KVCache& kv, Workspace& ws,
                                     PrefillBreakdown* breakdown, SelectionReport* report) {
  Timer total;
  PrefillBreakdown bd;
  const RequestLayout lay = layout_request(req);
  const ModelConfig& c = m.config();
  CT_THROW_IF_NOT(lay.n_total <= kv.n_ctx(),
                  "composed prompt of {} tokens does not fit the {}-position KV cache",
                  lay.n_total, kv.n_ctx());
  for (const ChunkKV* ch : req.chunks) {
    CT_THROW_IF_NOT(ch->meta.model_fingerprint == m.fingerprint() && ch->meta.n_layer == c.n_layer &&
                        ch->meta.kv_dim == c.kv_dim(),
                    "chunk {} was encoded by model {} ({} layers, kv_dim {}), not by the loaded "
                    "model {} ({} layers, kv_dim {})",
                    ch->meta.id.substr(0, 12), ch->meta.model_fingerprint, ch->meta.n_layer,
                    ch->meta.kv_dim, m.fingerprint(), c.n_layer, c.kv_dim());
  }
  const PolicyKind kind = opt.policy.kind;
  std::vector<float> logits;

  if (kind == PolicyKind::kPrefix || kind == PolicyKind::kLfOnly) {
    // Both are plain prefills of a token list: the whole prompt after the reused prefix, or the
    // prompt with each chunk reduced to its selected tokens.
    std::vector<int32_t> toks = lay.tokens;
    int n_reused = 0;
    Timer st;
    if (kind == PolicyKind::kLfOnly) {
      toks = req.prefix;
      if (report) report->selected.clear();
      for (const ChunkKV* ch : req.chunks) {
        const auto sel = select_offline(*ch, opt.policy);
        for (int32_t t : sel) toks.push_back(ch->meta.tokens[t]);
        if (report) report->selected.push_back(sel);
      }
      toks.insert(toks.end(), req.query.begin(), req.query.end());
    } else {
      CT_THROW_IF_NOT(opt.prefix_cache != nullptr, "the prefix policy needs a PrefixCache");
      auto [n, entry] = opt.prefix_cache->longest_match(toks);
      n_reused = std::min(n, (int)toks.size() - 1);  // the last token always runs for logits
      if (n_reused > 0) {
        Timer lt;
        opt.prefix_cache->copy_rows(entry, n_reused, kv);
        bd.load_ms += lt.ms();
      }
    }
    bd.select_ms += st.ms();
    Timer ct;
    logits = m.prefill(toks.data() + n_reused, (int)toks.size() - n_reused, n_reused, kv, ws);
    bd.compute_ms += ct.ms();
    kv.n_pos = (int)toks.size();
    if (kind == PolicyKind::kPrefix) opt.prefix_cache->remember(toks, kv);
    bd.n_active = (int)toks.size() - n_reused;
    bd.n_loaded = n_reused;
    if (opt.query_attention) opt.query_attention->assign(lay.n_total, 0.0f);
  } else {
    std::vector<ChunkPlan> plans(req.chunks.size());
    Timer st;
    for (size_t b = 0; b < req.chunks.size(); ++b) {
      plans[b].c = req.chunks[b];
      plans[b].offset = lay.chunk_offset[b];
    }
    double blend_ratio = -1;
    if (kind == PolicyKind::kCacheBlend) {
      blend_ratio = opt.policy.ratio;
      for (ChunkPlan& p : plans) set_selection(p, {}, false);
    } else if (kind == PolicyKind::kProphetKV) {
      // Pass 1: full reuse, recording the query rows' attention; pass 2 recomputes the chunk
      // tokens that attention favoured.
      for (ChunkPlan& p : plans) set_selection(p, {}, true);
      PrefillBreakdown bd1;
      PassResult first = run_pass(m, lay, plans, kv, ws, true, -1, bd1);
      for (ChunkPlan& p : plans) {
        std::vector<float> score(p.c->meta.n_tok);
        for (int t = 0; t < p.c->meta.n_tok; ++t) score[t] = first.attn[p.offset + t];
        set_selection(p, top_r_by_score(score, opt.policy.ratio), false);
      }
    } else {
      for (ChunkPlan& p : plans) {
        const bool prefix_of_ranking = kind == PolicyKind::kCacheTune;
        set_selection(p, select_offline(*p.c, opt.policy), prefix_of_ranking);
      }
    }
    bd.select_ms += st.ms();
    PassResult r = run_pass(m, lay, plans, kv, ws, opt.query_attention != nullptr, blend_ratio, bd);
    logits = std::move(r.logits);
    kv.n_pos = lay.n_total;
    bd.n_active = r.n_active;
    bd.n_loaded = r.n_loaded;
    if (opt.query_attention) *opt.query_attention = std::move(r.attn);
    if (report) {
      report->selected.clear();
      for (const ChunkPlan& p : plans) {
        std::vector<int32_t> sel;
        for (int t = 0; t < p.c->meta.n_tok; ++t) {
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

}  // namespace ct
