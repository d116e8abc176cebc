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
  Ranker(const Model& m, const std::vector<int32_t>& tokens, bool sink,
         const std::vector<const float*>& kl, const std::vector<const float*>& vl, int KV,
         const std::vector<float>& attn, const ProbeOptions& po, DeviceSequence* device)
      : m_(m),
        tokens_(tokens),
        sink_(sink),
        kl_(kl),
        vl_(vl),
        kv_(KV),
        attn_(attn),
        po_(po),
        device_(device) {}
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

 private:
  const ChunkRanking& probe() {
    if (!probe_) probe_ = probe_rank(m_, tokens_, sink_, kl_, vl_, po_, device_);
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
};
}  // namespace

ChunkEncoding::ChunkEncoding(const Model& m, std::vector<int32_t> tokens,
                             const EncodeOptions& opt)
    : m_(m), tokens_(std::move(tokens)), opt_(opt), off_(opt.sink ? 1 : 0) {
  const ModelConfig& c = m.config();
  const int n = (int)tokens_.size();
  CT_THROW_IF_NOT(n > 0, "cannot encode an empty chunk");
  CT_THROW_IF_NOT(kv_record_type(opt.dtype), "chunk record type '{}': expected f16, bf16 or f32",
                  kv_dtype_name(opt.dtype));
  CT_THROW_IF_NOT(n + off_ <= c.n_ctx_train, "chunk of {} tokens exceeds the model context of {}",
                  n, c.n_ctx_train);
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
}

ChunkEncoding::~ChunkEncoding() = default;

int ChunkEncoding::rows_left() const { return pass_ ? pass_->rows_left() : 0; }

void ChunkEncoding::step(int rows) {
  CT_THROW_IF_NOT(!finished_, "a step of a finished chunk encoding");
  Timer t;
  pass_->run(rows);
  forward_ms_ += t.ms();
}

int ChunkEncoding::finish_work() const {
  const auto probes = [](RankMode md) {
    return md == RankMode::kProbe || md == RankMode::kProbeAttn;
  };
  bool any = probes(opt_.rank.mode);
  for (const RankOptions& ro : opt_.also) any = any || probes(ro.mode);
  if (!any) return 0;
  const int L = m_.config().n_layer;
  return (int)(((int64_t)tokens_.size() * probe_layers(opt_.probe, L) + L - 1) / L);
}

ChunkKV ChunkEncoding::finish(EncodeExtras* extras) {
  CT_THROW_IF_NOT(!finished_, "a chunk encoding finished twice");
  CT_THROW_IF_NOT(rows_left() == 0, "a chunk encoding finished with {} of its {} rows left",
                  rows_left(), rows());
  finished_ = true;
  pass_.reset();  // its cache is not needed any more
  const ModelConfig& c = m_.config();
  const int n = (int)tokens_.size(), nt = rows(), off = off_;
  const int KV = c.kv_dim(), L = c.n_layer;
  const std::vector<float> attn = encode_taps_attention(opt_)
                                      ? attention_received(probs_.data() + off, n, L)
                                      : std::vector<float>();
  std::vector<const float*> kl(L), vl(L);
  for (int l = 0; l < L; ++l) {
    kl[l] = k_all_.data() + ((size_t)l * nt + off) * KV;
    vl[l] = v_all_.data() + ((size_t)l * nt + off) * KV;
  }
  Timer rt;
  Ranker rank_with(m_, tokens_, opt_.sink, kl, vl, KV, attn, opt_.probe, opt_.device);
  ChunkRanking rank = rank_with(opt_.rank);
  ChunkKV out;
  ChunkMeta& meta = out.meta;
  meta.rank_ms = rt.ms();
  if (extras) {
    extras->forward_ms = forward_ms_;
    extras->rank_ms = meta.rank_ms;
    extras->rankings.clear();
    extras->also_ms.clear();
    for (const RankOptions& ro : opt_.also) {
      Timer at;
      extras->rankings.push_back(rank_with(ro));
      extras->also_ms.push_back(at.ms());
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
  enc.step(enc.rows());
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
