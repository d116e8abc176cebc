// Glue between the loaded Model and the GPU decoder (see gpu_decoder.h).
#include "backend/gpu_decoder.h"

#include <numeric>
#include <vector>

#include "backend/backend.h"

#include "backend/registry.h"
#include "core/error.h"

namespace ct {

std::unique_ptr<cuda::Decoder> make_cuda_decoder(const Model& m, int n_ctx, int n_seq) {
  CT_THROW_IF_NOT(backend::backend_built("cuda"), "GPU decoder: {}", backend::kNoCudaMessage);
  const ModelConfig& c = m.config();
  cuda::DecoderDims d;
  d.n_layer = c.n_layer;
  d.n_embd = c.n_embd;
  d.n_head = c.n_head;
  d.n_head_kv = c.n_head_kv;
  d.head_dim = c.head_dim;
  d.n_ff = c.n_ff;
  d.n_vocab = c.n_vocab;
  d.n_rot = c.n_rot;
  d.neox = c.rope_style == cpu::RopeStyle::kNeox;
  d.rms_eps = c.rms_eps;
  // The decoder uploads F32 weights; the model keeps them in their file encoding, so each
  // block's matrices are dequantised here and dropped once uploaded (host peak: the F32 model).
  std::vector<LayerWeightsF32> f32(c.n_layer);
  cuda::DecoderWeights w;
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& lw = m.layer_weights(l);
    f32[l] = m.layer_weights_f32(l);
    w.layers.push_back({lw.attn_norm.data(), f32[l].wqkv.data(),
                        lw.bqkv.empty() ? nullptr : lw.bqkv.data(), f32[l].wo.data(),
                        lw.ffn_norm.data(), f32[l].w_gate_up.data(), f32[l].w_down.data()});
  }
  auto to_f32 = [](const cpu::QMatrix& q) {
    std::vector<float> v((size_t)q.rows * q.cols);
    cpu::qmatrix_to_f32(q, 0, q.rows, v.data());
    return v;
  };
  const std::vector<float> tok_embd = to_f32(m.token_embedding());
  const bool tied = m.output_matrix().data == m.token_embedding().data;
  const std::vector<float> output = tied ? std::vector<float>() : to_f32(m.output_matrix());
  w.tok_embd = tok_embd.data();
  w.output = tied ? tok_embd.data() : output.data();  // the decoder recognises tying by pointer
  w.out_norm = m.output_norm();
  return std::make_unique<cuda::Decoder>(d, w, n_ctx, n_seq);
}

std::vector<float> cuda_prefill(cuda::Decoder& dec, const Model& m, const int32_t* tokens, int n,
                                int pos0) {
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), pos0);
  std::vector<float> cos, sin;
  m.rope().angle_table(pos.data(), n, cos, sin);
  return dec.forward(tokens, pos.data(), n, cos.data(), sin.data());
}

std::vector<float> cuda_decode_batch(cuda::Decoder& dec, const Model& m, const int32_t* tokens,
                                     const int32_t* pos, const int32_t* seqs, int n) {
  std::vector<float> cos, sin;
  m.rope().angle_table(pos, n, cos, sin);
  return dec.decode_batch(tokens, pos, seqs, n, cos.data(), sin.data());
}

namespace {

// The "cuda" DeviceSequence (backend.h): one cuda::Decoder built from the model.
class CudaSequence final : public DeviceSequence {
 public:
  CudaSequence(const Model& m, int n_ctx, int n_seq)
      : m_(m), dec_(make_cuda_decoder(m, n_ctx, n_seq)) {}
  const char* name() const override { return "cuda"; }
  int n_ctx() const override { return dec_->n_ctx(); }
  int n_seq() const override { return dec_->n_seq(); }
  void select(int slot) override { dec_->select(slot); }
  std::vector<float> decode_batch(const int32_t* tokens, const int32_t* pos, const int32_t* slots,
                                  int n) override {
    return cuda_decode_batch(*dec_, m_, tokens, pos, slots, n);
  }
  std::unique_ptr<LayerBackend> layers(KVCache* kv_to_host) override {
    return make_cuda_layers(m_, *dec_, kv_to_host);
  }
  std::vector<float> prefill(const int32_t* tokens, int n, int pos0) override {
    return cuda_prefill(*dec_, m_, tokens, n, pos0);
  }

 private:
  const Model& m_;
  std::unique_ptr<cuda::Decoder> dec_;
};

}  // namespace

std::unique_ptr<DeviceSequence> make_device(const std::string& name, const Model& m, int n_ctx,
                                            int n_seq) {
  CT_THROW_IF_NOT(name == "cuda", "device '{}': expected cuda (the CPU is not a device sequence)",
                  name);
  return std::make_unique<CudaSequence>(m, n_ctx, n_seq);
}

}  // namespace ct
