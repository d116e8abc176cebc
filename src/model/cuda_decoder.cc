// Glue between the loaded Model and the GPU decoder (see cuda_decoder.h).
#include "model/cuda_decoder.h"

#ifdef CT_HAVE_CUDA
#include <numeric>

namespace ct {

std::unique_ptr<cuda::Decoder> make_cuda_decoder(const Model& m, int n_ctx) {
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
  cuda::DecoderWeights w;
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& lw = m.layer_weights(l);
    w.layers.push_back({lw.attn_norm.data(), lw.wqkv.data(),
                        lw.bqkv.empty() ? nullptr : lw.bqkv.data(), lw.wo.data(),
                        lw.ffn_norm.data(), lw.w_gate_up.data(), lw.w_down.data()});
  }
  w.tok_embd = m.token_embedding();
  w.output = m.output_matrix();
  w.out_norm = m.output_norm();
  return std::make_unique<cuda::Decoder>(d, w, n_ctx);
}

std::vector<float> cuda_prefill(cuda::Decoder& dec, const Model& m, const int32_t* tokens, int n,
                                int pos0) {
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), pos0);
  std::vector<float> cos, sin;
  m.rope().angle_table(pos.data(), n, cos, sin);
  return dec.forward(tokens, pos.data(), n, cos.data(), sin.data());
}

}  // namespace ct
#endif
