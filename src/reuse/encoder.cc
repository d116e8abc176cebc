// Isolated chunk prefill with K/V taps, ranking, and rank-order packing.
#include "reuse/encoder.h"

#include <cstring>
#include <optional>

#include "backend/backend.h"
#include "core/error.h"
#include "core/sha256.h"
#include "core/timer.h"
#include "reuse/policy/head.h"

namespace ct {

const char* rank_mode_name(RankMode m) {
  switch (m) {
    case RankMode::kLowFreq:
      return "lowfreq";
    case RankMode::kHighFreq:
      return "highfreq";
    case RankMode::kL2:
      return "l2";
    case RankMode::kHead:
      return "head";
    case RankMode::kProbe:
      return "probe";
    case RankMode::kAttn:
      return "attn";
    case RankMode::kProbeAttn:
      return "probe-attn";
  }
  return "unknown";
}

RankMode parse_rank_mode(const std::string& s) {
  for (RankMode m : {RankMode::kLowFreq, RankMode::kHighFreq, RankMode::kL2, RankMode::kHead,
                     RankMode::kProbe, RankMode::kAttn, RankMode::kProbeAttn}) {
    if (s == rank_mode_name(m)) return m;
  }
  CT_THROW(
      "unknown rank mode '{}', expected one of: lowfreq, highfreq, l2, head, probe, attn, "
      "probe-attn",
      s);
}

std::string rank_params(const RankOptions& r, const ProbeOptions& p) {
  switch (r.mode) {
    case RankMode::kProbe:
      return probe_params(p);
    case RankMode::kAttn:
      return attention_params();
    case RankMode::kProbeAttn:
      return probe_params(p) + ":" + attention_params();
    default:
      return std::string();
  }
}

std::string chunk_id(const std::string& model_fingerprint, const std::vector<int32_t>& tokens,
                     const EncodeOptions& opt) {
  Sha256 h;
  h.update("cachetune-chunk-v1");
  h.update(model_fingerprint);
  h.update_pod((uint64_t)tokens.size());
  h.update(tokens.data(), tokens.size() * sizeof(int32_t));
  h.update(kv_dtype_name(opt.dtype));
  h.update_pod((uint8_t)opt.sink);
  h.update(rank_mode_name(opt.rank.mode));
  h.update_pod(opt.rank.alpha);
  const std::string params = rank_params(opt.rank, opt.probe);
  if (!params.empty()) h.update(params);
  return h.hex_digest();
}

bool encode_taps_attention(const EncodeOptions& opt) {
  const auto uses = [](RankMode m) { return m == RankMode::kAttn || m == RankMode::kProbeAttn; };
  bool any = uses(opt.rank.mode);
  for (const RankOptions& ro : opt.also) any = any || uses(ro.mode);
  return any;
}

namespace {

// The rankings of one isolated encoding. The probe pass runs once however many rankings use it.
class Ranker {
 public:
  // probe: the probe ranking when it was computed already (ProbePass, in probe_ms), else made on
  // first use.
  Ranker(const Model& m, const std::vector<int32_t>& tokens, bool sink,
         const std::vector<const float*>& kl, const std::vector<const float*>& vl, int KV,
         const std::vector<float>& attn, const ProbeOptions& po, DeviceSequence* device,
         std::optional<ChunkRanking> probe, double probe_ms)
      : m_(m),
        tokens_(tokens),
        sink_(sink),
        kl_(kl),
        vl_(vl),
        kv_(KV),
        attn_(attn),
        po_(po),
        device_(device),
        probe_(std::move(probe)),
        probe_ms_(probe_ ? probe_ms : 0.0) {}
  ChunkRanking operator()(const RankOptions& ro) {
    const int n = (int)tokens_.size();
    switch (ro.mode) {
      case RankMode::kHead:
        return head_ranking(n);
      case RankMode::kProbe:
        return probe();
      case RankMode::kAttn:
        return attention_rank(attn_);
      case RankMode::kProbeAttn:
        return probe_attention_rank(probe(), attn_);
      default:
        return rank_chunk_tokens(kl_, vl_, n, kv_, ro);
    }
  }
  // The precomputed probe pass's time, once, after the first ranking that used it (the cost
  // belongs to that ranking's time, as when the pass runs inside it); else 0.
  double take_probe_ms() {
    if (!probe_used_) return 0.0;
    const double ms = probe_ms_;
    probe_ms_ = 0;
    return ms;
  }

 private:
  const ChunkRanking& probe() {
    if (!probe_) probe_ = probe_rank(m_, tokens_, sink_, kl_, vl_, po_, device_);
    probe_used_ = true;
    return *probe_;
  }
  const Model& m_;
  const std::vector<int32_t>& tokens_;
  bool sink_;
  const std::vector<const float*>& kl_;
  const std::vector<const float*>& vl_;
  int kv_;
  const std::vector<float>& attn_;
  const ProbeOptions& po_;
  DeviceSequence* device_;
  std::optional<ChunkRanking> probe_;
  double probe_ms_ = 0;
  bool probe_used_ = false;
};
}  // namespace

ChunkEncoding::ChunkEncoding(const Model& m, std::vector<int32_t> tokens,
                             const EncodeOptions& opt, RowWork work)
    : m_(m), tokens_(std::move(tokens)), opt_(opt), work_(work), off_(opt.sink ? 1 : 0) {
  Timer setup;
  const ModelConfig& c = m.config();
  const int n = (int)tokens_.size();
  CT_THROW_IF_NOT(n > 0, "cannot encode an empty chunk");
  CT_THROW_IF_NOT(kv_record_type(opt.dtype), "chunk record type '{}': expected f16, bf16 or f32",
                  kv_dtype_name(opt.dtype));
  CT_THROW_IF_NOT(n + off_ <= c.n_ctx_train, "chunk of {} tokens exceeds the model context of {}",
                  n, c.n_ctx_train);
  probes_ = opt.rank.mode == RankMode::kProbe || opt.rank.mode == RankMode::kProbeAttn;
  if (probes_) {  // refused now rather than after the isolated pass
    probe_first_ = probe_context_length(m, opt.probe, opt.sink);
    CT_THROW_IF_NOT(probe_first_ + n <= c.n_ctx_train,
                    "probe context ({} tokens) + chunk ({} tokens) exceed the model context of {}",
                    probe_first_, n, c.n_ctx_train);
  }
  if (opt.sink) toks_.push_back(m.tokenizer().bos() >= 0 ? m.tokenizer().bos() : 0);
  toks_.insert(toks_.end(), tokens_.begin(), tokens_.end());
  const int nt = (int)toks_.size();
  const size_t cells = (size_t)c.n_layer * nt * c.kv_dim();
  k_all_.resize(cells);
  v_all_.resize(cells);
  // The attention the chunk's last rows give each row (summed over rows and layers), for the
  // rankings that weigh by it (attention_received).
  const bool want_attn = encode_taps_attention(opt);
  probs_.assign(want_attn ? nt : 0, 0.0f);
  pass_ = std::make_unique<TappedPass>(m, toks_.data(), nt, opt.device, k_all_.data(),
                                       v_all_.data(), want_attn ? probs_.data() : nullptr,
                                       want_attn ? off_ + attention_first_row(n) : -1);
  forward_ms_ += setup.ms();
}

ChunkEncoding::~ChunkEncoding() = default;

std::vector<const float*> ChunkEncoding::layer_rows(const std::vector<float>& all) const {
  const ModelConfig& c = m_.config();
  std::vector<const float*> out(c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) out[l] = all.data() + ((size_t)l * rows() + off_) * c.kv_dim();
  return out;
}

double ChunkEncoding::probe_share() const {
  const int L = m_.config().n_layer;
  return (double)probe_layers(opt_.probe, L) / L;
}

double ChunkEncoding::work_left() const {
  if (finished_) return 0;
  const int n = (int)tokens_.size();
  const int probe_left = !probes_ ? 0 : probe_ ? probe_->rows_left() : n;
  return (pass_ ? work_.rows(rows() - pass_->rows_left(), pass_->rows_left()) : 0) +
         work_.rows(probe_first_ + n - probe_left, probe_left, probe_share());
}

ChunkEncoding::Block ChunkEncoding::plan(double work) const {
  CT_THROW_IF_NOT(!finished_, "a step of a finished chunk encoding");
  const double before = work_left();
  CT_THROW_IF_NOT(work > 0 && before > 0, "a step of {} rows of work of a chunk encoding with {} "
                  "left", work, before);
  const bool all = opt_.device || work >= before;  // (each pass whole on a device)
  Block b;
  if (pass_) {
    const int left = pass_->rows_left(), first = rows() - left;
    b.pass_rows = all ? left : std::max(1, work_.fit(first, left, work));
    b.work = work_.rows(first, b.pass_rows);
    if (b.pass_rows < left) return b;
  }
  if (!probes_) return b;
  const int n = (int)tokens_.size();
  const double share = probe_share();
  const int left = probe_ ? probe_->rows_left() : n, first = probe_first_ + n - left;
  // Rows of the probe that fit in what the step has left (at least one when the step ran none).
  b.probe_rows = all ? left : work_.fit(first, left, work - b.work, share);
  if (b.pass_rows == 0) b.probe_rows = std::max(b.probe_rows, 1);
  b.work += work_.rows(first, b.probe_rows, share);
  return b;
}

double ChunkEncoding::step(double work) {
  const Block b = plan(work);
  if (b.pass_rows > 0) {
    Timer t;
    pass_->run(b.pass_rows);
    forward_ms_ += t.ms();
    rows_done_ += b.pass_rows;
    if (pass_->rows_left() == 0) {
      pass_.reset();  // its cache (or device backend) goes before the probe pass makes its own
    }
  }
  if (b.probe_rows > 0) {
    Timer t;
    if (!probe_) {
      probe_ = std::make_unique<ProbePass>(m_, tokens_, opt_.sink, layer_rows(k_all_),
                                           layer_rows(v_all_), opt_.probe, opt_.device);
    }
    probe_->step(b.probe_rows);
    probe_ms_ += t.ms();
    rows_done_ += b.probe_rows;
  }
  return b.work;
}

ChunkKV ChunkEncoding::finish(EncodeExtras* extras) {
  CT_THROW_IF_NOT(!finished_, "a chunk encoding finished twice");
  CT_THROW_IF_NOT(work_left() == 0, "a chunk encoding finished with {} rows of work left",
                  work_left());
  finished_ = true;
  const ModelConfig& c = m_.config();
  const int n = (int)tokens_.size(), off = off_;
  const int KV = c.kv_dim(), L = c.n_layer;
  Timer at;
  const std::vector<float> attn = encode_taps_attention(opt_)
                                      ? attention_received(probs_.data() + off, n, L)
                                      : std::vector<float>();
  forward_ms_ += at.ms();
  const std::vector<const float*> kl = layer_rows(k_all_), vl = layer_rows(v_all_);
  std::optional<ChunkRanking> probed;
  if (probe_) {
    Timer pt;
    probed = probe_->ranking();
    probe_.reset();
    probe_ms_ += pt.ms();
  }
  Timer rt;
  Ranker rank_with(m_, tokens_, opt_.sink, kl, vl, KV, attn, opt_.probe, opt_.device,
                   std::move(probed), probe_ms_);
  ChunkRanking rank = rank_with(opt_.rank);
  ChunkKV out;
  ChunkMeta& meta = out.meta;
  meta.rank_ms = rt.ms() + rank_with.take_probe_ms();
  if (extras) {
    extras->forward_ms = forward_ms_;
    extras->rank_ms = meta.rank_ms;
    extras->rankings.clear();
    extras->also_ms.clear();
    for (const RankOptions& ro : opt_.also) {
      Timer at;
      extras->rankings.push_back(rank_with(ro));
      extras->also_ms.push_back(at.ms() + rank_with.take_probe_ms());
    }
  }
  meta.rank_params = rank_params(opt_.rank, opt_.probe);
  meta.id = chunk_id(m_.fingerprint(), tokens_, opt_);
  meta.model_fingerprint = m_.fingerprint();
  meta.n_tok = n;
  meta.n_layer = L;
  meta.kv_dim = KV;
  meta.dtype = opt_.dtype;
  meta.sink = opt_.sink;
  meta.rank_mode = rank_mode_name(opt_.rank.mode);
  meta.alpha = opt_.rank.alpha;
  meta.tokens = tokens_;
  meta.order = rank.order;
  meta.scores = rank.scores;
  const size_t row_bytes = kv_bytes(opt_.dtype, KV);
  out.k.resize(L);
  out.v.resize(L);
  for (int l = 0; l < L; ++l) {
    out.k[l].resize(row_bytes * n);
    out.v[l].resize(row_bytes * n);
    for (int j = 0; j < n; ++j) {
      const int t = rank.order[j];
      kv_pack(opt_.dtype, kl[l] + (size_t)t * KV, out.k[l].data() + j * row_bytes, KV);
      kv_pack(opt_.dtype, vl[l] + (size_t)t * KV, out.v[l].data() + j * row_bytes, KV);
    }
  }
  // The taps are not needed any more.
  k_all_ = std::vector<float>();
  v_all_ = std::vector<float>();
  return out;
}

ChunkKV encode_chunk(const Model& m, const std::vector<int32_t>& tokens, const EncodeOptions& opt,
                     EncodeExtras* extras) {
  ChunkEncoding enc(m, tokens, opt);
  enc.step(enc.work_left());
  return enc.finish(extras);
}

ChunkKVF32 unpack_text_order(const ChunkKV& c) {
  const ChunkMeta& m = c.meta;
  const int n = m.n_tok, KV = m.kv_dim;
  const size_t row_bytes = kv_bytes(m.dtype, KV);
  ChunkKVF32 out;
  out.k.resize((size_t)m.n_layer * n * KV);
  out.v.resize((size_t)m.n_layer * n * KV);
  for (int l = 0; l < m.n_layer; ++l) {
    for (int j = 0; j < n; ++j) {
      const int t = m.order[j];
      kv_unpack(m.dtype, c.k[l].data() + j * row_bytes, out.k.data() + ((size_t)l * n + t) * KV,
                KV);
      kv_unpack(m.dtype, c.v[l].data() + j * row_bytes, out.v.data() + ((size_t)l * n + t) * KV,
                KV);
    }
  }
  return out;
}

ChunkRanking rank_stored_chunk(const ChunkKV& c, const RankOptions& opt) {
  const ChunkMeta& m = c.meta;
  ChunkKVF32 f = unpack_text_order(c);
  std::vector<const float*> kl(m.n_layer), vl(m.n_layer);
  for (int l = 0; l < m.n_layer; ++l) {
    kl[l] = f.k_layer(l, m.n_tok, m.kv_dim);
    vl[l] = f.v_layer(l, m.n_tok, m.kv_dim);
  }
  return rank_chunk_tokens(kl, vl, m.n_tok, m.kv_dim, opt);
}

}  // namespace ct
