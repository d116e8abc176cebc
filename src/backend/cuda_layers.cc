// The GPU LayerBackend (backend.h) on a cuda::Decoder. Each layer's reused rows are read as stored
// into the decoder's pinned staging, copied to the device and unpacked, rotated to their global
// positions (deferred RoPE) and placed in that layer's cache there, just before the layer is
// queued. The decoder's calls return before the GPU is done, so reading layer l+1 overlaps the
// GPU computing layer l. Taps (K/V before RoPE, query attention) and keep_rows run on the device
// too, so every layer-loop policy (CacheBlend's layer-0 selection, ProphetKV's attention pass)
// and the chunk encoding run here; one sequence per pass (caps().max_seqs 1). In a build without
// CUDA the decoder cannot exist (backend/registry.cc), so neither can this.
#include <algorithm>

#include "backend/backend.h"
#include "backend/cuda/decoder.h"
#include "core/error.h"
#include "core/timer.h"

namespace ct {
namespace {

class CudaLayers final : public LayerBackend {
 public:
  CudaLayers(const Model& m, cuda::Decoder& dec, KVCache* kv_to_host)
      : m_(m), dec_(dec), kv_(kv_to_host) {
    const ModelConfig& c = m.config();
    CT_THROW_IF_NOT(dec.dims().n_layer == c.n_layer && dec.dims().kv_dim() == c.kv_dim(),
                    "GPU decoder ({} layers, kv_dim {}) was not built for this model ({} layers, "
                    "kv_dim {})",
                    dec.dims().n_layer, dec.dims().kv_dim(), c.n_layer, c.kv_dim());
  }
  BackendCaps caps() const override { return {"cuda", true, true, 1}; }
  void begin(const int32_t* tokens, const int32_t* pos, int n) override {
    CT_THROW_IF_NOT(n > 0, "a pass needs at least one active row");
    CT_THROW_IF_NOT(pos[n - 1] < dec_.n_ctx(),
                    "GPU decoder ({} positions) does not fit this request ({} positions)",
                    dec_.n_ctx(), pos[n - 1] + 1);
    n_pos_ = pos[n - 1] + 1;
    act_.assign(pos, pos + n);
    std::vector<float> cos, sin;
    m_.rope().angle_table(pos, n, cos, sin);
    pass_.reset();
    load_ms_ = 0;
    dec_.begin(tokens, pos, n, cos.data(), sin.data());
  }
  void set_reused(const ReusedRows& rows, int first_layer) override {
    rows_ = rows;
    first_ = first_layer;
    if (rows_.pos.empty()) return;
    const KvDtype dtype = rows_.segments.at(0).dtype;
    for (const ReusedRows::Segment& s : rows_.segments) {
      CT_THROW_IF_NOT(s.dtype == dtype,
                      "GPU prefill needs one K/V type per request; {} is {}, {} is {}", s.label,
                      kv_dtype_name(s.dtype), rows_.segments[0].label, kv_dtype_name(dtype));
    }
    for (int32_t g : rows_.pos) n_pos_ = std::max(n_pos_, g + 1);
    CT_THROW_IF_NOT(n_pos_ <= dec_.n_ctx(),
                    "GPU decoder ({} positions) does not fit this request ({} positions)",
                    dec_.n_ctx(), n_pos_);
    std::vector<int32_t> angle_pos(rows_.pos);
    for (int32_t& g : angle_pos) g = std::max(g, 0);
    std::vector<float> cos, sin;
    m_.rope().angle_table(angle_pos.data(), (int)angle_pos.size(), cos, sin);
    if (rows_.rotated) {  // the identity rotation: x * 1 - y * 0 is x, bit for bit
      std::fill(cos.begin(), cos.end(), 1.0f);
      std::fill(sin.begin(), sin.end(), 0.0f);
    }
    // The device unpacks the record types (a host cache's rows reach it as their cache type).
    CT_THROW_IF_NOT(kv_record_type(dtype),
                    "the GPU cannot take reused rows of type {}: expected f32, f16 or bf16",
                    kv_dtype_name(dtype));
    const cuda::RowType type = dtype == KvDtype::F32    ? cuda::RowType::kF32
                               : dtype == KvDtype::BF16 ? cuda::RowType::kBF16
                                                        : cuda::RowType::kF16;
    row_bytes_ = kv_bytes(dtype, m_.config().kv_dim());
    dec_.set_reused_rows(type, rows_.pos.data(), (int)rows_.pos.size(), cos.data(), sin.data());
  }
  void layer(int l, LayerTap* tap) override {
    if (l >= first_ && !rows_.pos.empty()) {
      Timer t;
      auto [k_dst, v_dst] = dec_.reused_staging(l);
      size_t off = 0;
      for (size_t s = 0; s < rows_.segments.size(); ++s) {
        const int n = rows_.segments[s].n_rows;
        if (n == 0) continue;
        rows_.read(l, (int)s, static_cast<uint8_t*>(k_dst) + off,
                   static_cast<uint8_t*>(v_dst) + off);
        off += row_bytes_ * n;
      }
      dec_.write_reused(l);
      load_ms_ += t.ms();
    }
    cuda::DecoderTap t;
    if (tap) t = {tap->k_pre_rope, tap->v, tap->probs_accum, tap->probs_from_row};
    dec_.layer(l, tap ? &t : nullptr);
  }
  void keep_rows(const std::vector<int32_t>& to) override {
    std::vector<int32_t> idx;
    idx.reserve(to.size());
    for (size_t i = 0; i < act_.size() && idx.size() < to.size(); ++i) {
      if (act_[i] == to[idx.size()]) idx.push_back((int32_t)i);
    }
    CT_ASSERT(idx.size() == to.size(), "active set is not a subset ({} of {})", idx.size(),
              to.size());
    std::vector<float> cos, sin;
    m_.rope().angle_table(to.data(), (int)to.size(), cos, sin);
    dec_.keep_rows(idx.data(), (int)idx.size(), to.data(), cos.data(), sin.data());
    act_ = to;
  }
  void project_kv(int l, float* k, float* v) override { dec_.project_kv(l, k, v); }
  std::vector<float> finish() override {
    std::vector<float> logits = dec_.finish();
    times_.compute_ms += pass_.ms() - load_ms_;
    times_.load_ms += load_ms_;
    times_.load_wait_ms += load_ms_;
    if (kv_) {
      CT_THROW_IF_NOT(kv_->n_ctx() >= n_pos_,
                      "host KV cache of {} positions cannot take the GPU's {} positions",
                      kv_->n_ctx(), n_pos_);
      Timer t;
      // The device keeps F32 rows; a host cache of another type takes them through F32.
      std::vector<float> k, v;
      for (int l = 0; l < m_.config().n_layer; ++l) {
        if (kv_->dtype() == KvDtype::F32) {
          dec_.read_kv(l, n_pos_, kv_->k(l), kv_->v(l));
          continue;
        }
        const size_t KV = kv_->kv_dim();
        k.resize(n_pos_ * KV);
        v.resize(k.size());
        dec_.read_kv(l, n_pos_, k.data(), v.data());
        for (int j = 0; j < n_pos_; ++j) kv_->store_row(l, j, &k[j * KV], &v[j * KV]);
      }
      times_.kv_to_host_ms += t.ms();
    }
    return logits;
  }

 private:
  const Model& m_;
  cuda::Decoder& dec_;
  KVCache* kv_;
  ReusedRows rows_;
  std::vector<int32_t> act_;  // global positions of the active rows
  int first_ = 0;
  int n_pos_ = 0;
  size_t row_bytes_ = 0;
  Timer pass_;
  double load_ms_ = 0;
};

}  // namespace

std::unique_ptr<LayerBackend> make_cuda_layers(const Model& m, cuda::Decoder& dec,
                                               KVCache* kv_to_host) {
  return std::make_unique<CudaLayers>(m, dec, kv_to_host);
}

}  // namespace ct
