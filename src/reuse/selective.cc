// Selective recomputation: one layer loop for every policy. Per layer, the loader writes each
// chunk's non-selected rows (unpacked, rotated to global positions) into the KV cache, then the
// decoder layer runs on the active rows only, attending over the full, causally masked sequence.
#include "reuse/selective.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/timer.h"
#include "reuse/freq_rank.h"
#include "backend/cuda/decoder.h"  // without CUDA its constructor throws (backend/registry.h)

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

// Fills each layer's reused chunk rows of the KV cache: reads the rank rows from the chunk's
// source into a staging buffer, unpacks the non-selected ones to F32 at their global positions
// and applies deferred RoPE there. With overlap, a loader thread works ahead of the layer loop
// and hands layers over through per-layer ready flags (the CPU counterpart of the paper's
// transfer stream and per-layer events); without, wait(l) loads layer l on the calling thread.
class LayerLoader {
 public:
  LayerLoader(const Model& m, const std::vector<ChunkPlan>& plans, KVCache& kv,
              const PipelineOptions& opt, int first_layer)
      : m_(m),
        plans_(plans),
        kv_(kv),
        opt_(opt),
        n_layer_(m.config().n_layer),
        ready_(n_layer_, 0) {
    for (int l = 0; l < first_layer; ++l) ready_[l] = 1;
    // The loaded positions: the non-selected tokens, in the order their rank rows are read.
    for (int32_t g : read_row_positions(plans_, opt_.sparse)) {
      if (g >= 0) pos_.push_back(g);
    }
    n_rows = (int)pos_.size();
    if (opt_.overlap) {
      thread_ = std::thread([this, first_layer] {
        omp_set_num_threads(1);  // the compute thread's OpenMP team owns the cores
        for (int l = first_layer; l < n_layer_ && !stop_; ++l) {
          try {
            load(l, opt_.rope_in_loader);
          } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            error_ = std::current_exception();
            cv_.notify_all();
            return;
          }
          std::lock_guard<std::mutex> lock(mu_);
          ready_[l] = 1;
          cv_.notify_all();
        }
      });
    }
  }
  ~LayerLoader() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  // Blocks until layer l's rows are in the cache (rotated), loading it here when not overlapped.
  void wait(int l) {
    if (!opt_.overlap) {
      if (!ready_[l]) load(l, true);
      ready_[l] = 1;
      return;
    }
    Timer t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return ready_[l] || error_; });
      if (error_) std::rethrow_exception(error_);
    }
    if (!opt_.rope_in_loader) {
      // RoPE on the compute thread is load work that the layer loop pays for in full.
      Timer rt;
      rope(l);
      rope_on_caller_ms_ += rt.ms();
    }
    wait_ms += t.ms();
  }

  // All load work (read, unpack, RoPE) on whichever thread did it; valid after the last wait().
  double load_ms() const { return loader_ms_ + rope_on_caller_ms_; }
  double wait_ms = 0;  // compute-side time spent waiting for, or doing, load work
  int n_rows = 0;      // rows loaded per layer

 private:
  void load(int l, bool do_rope) {
    Timer t;
    const int KV = kv_.kv_dim();
    float* kc = kv_.k(l);
    float* vc = kv_.v(l);
    size_t n = 0;
    for (const ChunkPlan& p : plans_) {
      const ChunkMeta& meta = p.c->meta();
      const size_t row_bytes = (size_t)KV * kv_dtype_size(meta.dtype);
      const int begin = read_begin(p, opt_.sparse);
      const size_t bytes = row_bytes * (meta.n_tok - begin);
      if (bytes == 0) continue;
      if (stage_k_.size() < bytes) {
        stage_k_.resize(bytes);
        stage_v_.resize(bytes);
      }
      p.c->read_rows(l, begin, meta.n_tok, stage_k_.data(), stage_v_.data());
      for (int j = begin; j < meta.n_tok; ++j) {
        const int t = meta.order[j];
        if (p.selected[t]) continue;
        const int g = p.offset + t;
        const size_t src = row_bytes * (j - begin);
        kv_unpack(meta.dtype, stage_k_.data() + src, kc + (size_t)g * KV, KV);
        kv_unpack(meta.dtype, stage_v_.data() + src, vc + (size_t)g * KV, KV);
        CT_ASSERT(pos_[n] == g, "load order changed");
        ++n;
      }
    }
    if (do_rope) rope(l);
    loader_ms_ += t.ms();
  }
  // Only one thread ever calls rope() in a given loader (the loader thread with rope_in_loader
  // and overlap, else the caller), so the tables filled on the first call need no lock.
  void rope(int l) {
    if (rope_cos_.empty() && !pos_.empty()) {
      m_.rope().angle_table(pos_.data(), (int)pos_.size(), rope_cos_, rope_sin_);
    }
    m_.rope().apply_at_positions(kv_.k(l), kv_.kv_dim(), m_.config().n_head_kv, pos_.data(),
                                 (int)pos_.size(), rope_cos_.data(), rope_sin_.data());
  }

  const Model& m_;
  const std::vector<ChunkPlan>& plans_;
  KVCache& kv_;
  PipelineOptions opt_;
  int n_layer_;
  std::vector<char> ready_;
  // loader_ms_ is written by whichever thread runs load() (the loader thread, published to the
  // caller with ready_ under mu_); rope_on_caller_ms_ only by the caller.
  double loader_ms_ = 0;
  double rope_on_caller_ms_ = 0;
  std::vector<uint8_t> stage_k_, stage_v_;  // reusable staging buffers (loader thread only)
  std::vector<int32_t> pos_;  // global positions of the loaded rows (same in every layer)
  std::vector<float> rope_cos_, rope_sin_;  // F32 [n_rows][n_rot/2]: their RoPE angles, once
  std::mutex mu_;
  std::condition_variable cv_;
  std::exception_ptr error_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

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

// The layer loop. With a layer-0 policy (PolicyStage::kAfterLayer0), layer 0 recomputes every
// row and the policy then chooses each chunk's selection from the fresh layer-0 K/V.
PassResult run_pass(const Model& m, const RequestLayout& lay, std::vector<ChunkPlan>& plans,
                    KVCache& kv, Workspace& ws, bool tap_query, const PolicyOptions* after_layer0,
                    const PipelineOptions& popt, PrefillBreakdown& bd) {
  const ModelConfig& c = m.config();
  const int E = c.n_embd, KV = c.kv_dim();
  const bool blend = after_layer0 != nullptr;
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
  std::vector<float> x(act.size() * E);
  m.embed(toks.data(), (int)act.size(), x.data());
  if (tap_query) res.attn.assign(lay.n_total, 0.0f);
  std::vector<float> k0, v0;  // layer-0 taps of a layer-0 policy, F32 [n_total][KV]
  // A layer-0 policy decides its selection after layer 0, so its loader starts at layer 1.
  std::unique_ptr<LayerLoader> loader;
  if (!blend) loader = std::make_unique<LayerLoader>(m, plans, kv, popt, 0);
  for (int l = 0; l < c.n_layer; ++l) {
    if (loader) loader->wait(l);
    LayerTap tap;
    if (tap_query) {
      tap.probs_accum = res.attn.data();
      tap.probs_from_row =
          (int)(std::lower_bound(act.begin(), act.end(), lay.query_begin) - act.begin());
    }
    if (blend && l == 0) {
      k0.resize((size_t)lay.n_total * KV);
      v0.resize((size_t)lay.n_total * KV);
      tap.k_pre_rope = k0.data();
      tap.v = v0.data();
    }
    Timer ct;
    m.forward_layer(l, x.data(), act.data(), (int)act.size(), kv, ws, &tap);
    bd.compute_ms += ct.ms();
    if (blend && l == 0) {
      Timer st;
      for (ChunkPlan& p : plans) {
        const size_t at = (size_t)p.offset * KV;
        set_selection(p, after_layer0->kind->select_after_layer0(*p.c, k0.data() + at,
                                                                 v0.data() + at, *after_layer0));
      }
      std::vector<int32_t> next = active_positions(lay, plans);
      compact_rows(x, act, next, E);
      act = std::move(next);
      bd.select_ms += st.ms();
      loader = std::make_unique<LayerLoader>(m, plans, kv, popt, 1);
    }
  }
  res.n_active = (int)act.size();
  if (loader) {
    res.n_loaded = loader->n_rows;
    bd.load_ms += loader->load_ms();
    bd.load_wait_ms += loader->wait_ms;
    if (!popt.overlap) bd.load_wait_ms += loader->load_ms();
  }
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

// The layer loop with the layers computed on the GPU decoder (SelectiveOptions::gpu). Each
// layer's reused rows are read from the chunk sources as stored (the complement's rank rows, or
// all rows without sparse loading) into pinned staging, copied to the device, and unpacked,
// rotated to their global positions (deferred RoPE) and placed in that layer's cache there,
// just before the layer is queued. The decoder's calls return before the GPU is done, so the
// reading of layer l+1 overlaps the GPU computing layer l.
PassResult run_pass_gpu(const Model& m, cuda::Decoder& dec, const RequestLayout& lay,
                        std::vector<ChunkPlan>& plans, KVCache& kv, const PipelineOptions& popt,
                        bool kv_to_host, PrefillBreakdown& bd) {
  const ModelConfig& c = m.config();
  const int KV = c.kv_dim();
  CT_THROW_IF_NOT(
      dec.n_ctx() >= lay.n_total && dec.dims().n_layer == c.n_layer && dec.dims().kv_dim() == KV,
      "GPU decoder ({} positions, {} layers, kv_dim {}) does not fit this request "
      "({} positions, {} layers, kv_dim {})",
      dec.n_ctx(), dec.dims().n_layer, dec.dims().kv_dim(), lay.n_total, c.n_layer, KV);
  PassResult res;
  const std::vector<int32_t> act = active_positions(lay, plans);
  std::vector<int32_t> toks(act.size());
  for (size_t i = 0; i < act.size(); ++i) toks[i] = lay.tokens[act[i]];
  std::vector<float> cos, sin;
  m.rope().angle_table(act.data(), (int)act.size(), cos, sin);

  // The raw rows read per layer, chunk after chunk, and where each goes (-1: recomputed).
  const KvDtype dtype = plans.empty() ? KvDtype::F16 : plans[0].c->meta().dtype;
  for (const ChunkPlan& p : plans) {
    const ChunkMeta& meta = p.c->meta();
    CT_THROW_IF_NOT(meta.dtype == dtype,
                    "GPU prefill needs one K/V type per request; chunk {} is {}, chunk {} is {}",
                    meta.id.substr(0, 12), kv_dtype_name(meta.dtype),
                    plans[0].c->meta().id.substr(0, 12), kv_dtype_name(dtype));
  }
  const std::vector<int32_t> raw_pos = read_row_positions(plans, popt.sparse);
  int n_loaded = 0;
  for (int32_t g : raw_pos) n_loaded += g >= 0;
  std::vector<float> rcos, rsin;
  {
    std::vector<int32_t> angle_pos(raw_pos);
    for (int32_t& g : angle_pos) g = std::max(g, 0);
    m.rope().angle_table(angle_pos.data(), (int)angle_pos.size(), rcos, rsin);
  }
  const cuda::RowType type = dtype == KvDtype::F32    ? cuda::RowType::kF32
                             : dtype == KvDtype::BF16 ? cuda::RowType::kBF16
                                                      : cuda::RowType::kF16;
  const size_t row_bytes = (size_t)KV * kv_dtype_size(dtype);

  Timer ct;
  dec.begin(toks.data(), act.data(), (int)act.size(), cos.data(), sin.data());
  dec.set_reused_rows(type, raw_pos.data(), (int)raw_pos.size(), rcos.data(), rsin.data());
  double load_ms = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    if (!raw_pos.empty()) {
      Timer lt;
      auto [k_dst, v_dst] = dec.reused_staging(l);
      size_t off = 0;
      for (const ChunkPlan& p : plans) {
        const int begin = read_begin(p, popt.sparse), n_tok = p.c->meta().n_tok;
        if (begin == n_tok) continue;
        p.c->read_rows(l, begin, n_tok, static_cast<uint8_t*>(k_dst) + off,
                       static_cast<uint8_t*>(v_dst) + off);
        off += row_bytes * (n_tok - begin);
      }
      dec.write_reused(l);
      load_ms += lt.ms();
    }
    dec.layer(l);
  }
  res.logits = dec.finish();
  bd.compute_ms += ct.ms() - load_ms;
  bd.load_ms += load_ms;
  bd.load_wait_ms += load_ms;
  res.n_active = (int)act.size();
  res.n_loaded = n_loaded;
  if (kv_to_host) {
    Timer kt;
    for (int l = 0; l < c.n_layer; ++l) dec.read_kv(l, lay.n_total, kv.k(l), kv.v(l));
    bd.kv_to_host_ms += kt.ms();
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
  // A GPU prefill that keeps its cache on the device does not touch the host kv.
  const bool host_kv_unused = opt.gpu && !opt.gpu_kv_to_host;
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
  const Policy& pol = *opt.policy.kind;
  std::vector<float> logits;
  CT_THROW_IF_NOT(!opt.gpu || (pol.on_gpu() && !opt.query_attention),
                  "policy '{}'{} is not available with GPU compute yet; use the CPU path",
                  pol.name(), opt.query_attention ? " with query attention" : "");
  std::vector<ChunkPlan> plans(req.chunks.size());
  for (size_t b = 0; b < req.chunks.size(); ++b) {
    plans[b].c = req.chunks[b];
    plans[b].offset = lay.chunk_offset[b];
  }
  const PolicyRequest preq{m, req, lay, opt, [&] {
                             // Pass 1 of a two-pass policy: full reuse, query attention tapped.
                             for (ChunkPlan& p : plans) set_selection(p, {});
                             PrefillBreakdown bd1;
                             return run_pass(m, lay, plans, kv, ws, true, nullptr, opt.pipeline,
                                             bd1)
                                 .attn;
                           }};

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
    Timer ct;
    logits = m.prefill(tp.tokens.data() + tp.n_reused, (int)tp.tokens.size() - tp.n_reused,
                       tp.n_reused, kv, ws);
    bd.compute_ms += ct.ms();
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
      const std::vector<std::vector<int32_t>> sel = pol.select_request(preq);
      CT_ASSERT(sel.size() == plans.size(), "policy '{}' selected for {} of {} chunks", pol.name(),
                sel.size(), plans.size());
      for (size_t b = 0; b < plans.size(); ++b) set_selection(plans[b], sel[b]);
    }
    bd.select_ms += st.ms();
    PassResult r =
        opt.gpu ? run_pass_gpu(m, *opt.gpu, lay, plans, kv, opt.pipeline, opt.gpu_kv_to_host, bd)
                : run_pass(m, lay, plans, kv, ws, opt.query_attention != nullptr,
                           layer0 ? &opt.policy : nullptr, opt.pipeline, bd);
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

}  // namespace ct
