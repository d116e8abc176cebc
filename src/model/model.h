// A loaded Llama-family decoder: its configuration, tokenizer and weights (kept in their file
// encoding, mapped). The forward pass over them is a backend's (the CPU's: backend/cpu_forward.h;
// the GPU's: backend/gpu_decoder.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/qgemv.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/tokenizer.h"

namespace ct {

class GgufFile;

// Weights of one block. Matrices [out][in] stay in their file encoding (views into the mapped
// GGUF, any type of core/ggml_types.h); only the small vectors are F32 copies.
struct LayerWeights {
  std::vector<float> attn_norm;  // F32 [n_embd]
  std::vector<float> bqkv;       // F32 [q_dim + 2*kv_dim], empty without QKV bias
  std::vector<float> ffn_norm;   // F32 [n_embd]
  cpu::QMatrix wq;               // [q_dim][n_embd]
  cpu::QMatrix wk, wv;           // [kv_dim][n_embd]
  cpu::QMatrix wo;               // [n_embd][q_dim]
  cpu::QMatrix w_gate, w_up;     // [n_ff][n_embd]
  cpu::QMatrix w_down;           // [n_embd][n_ff]
};

// F32 copies of one block's matrices, stacked as the GPU decoder multiplies them.
struct LayerWeightsF32 {
  std::vector<float> wqkv;       // F32 [q_dim + 2*kv_dim][n_embd]: Q, K, V rows stacked
  std::vector<float> wo;         // F32 [n_embd][q_dim]
  std::vector<float> w_gate_up;  // F32 [2*n_ff][n_embd]: gate rows then up rows
  std::vector<float> w_down;     // F32 [n_embd][n_ff]
};

class Model {
 public:
  // Loads the GGUF at `path`: config, tokenizer, weights (kept in their file encoding, mapped).
  // Throws ct::Error naming the file and tensor for a missing tensor, a wrong shape, an
  // unsupported type, or a row length the type's blocks do not divide.
  static std::unique_ptr<Model> load(const std::string& path);
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  const Tokenizer& tokenizer() const { return tok_; }
  const std::string& path() const { return path_; }
  // Identifies the weights: SHA-256 over the GGUF header (metadata and tensor table), the file
  // size and 16 sampled 64 KiB blocks of tensor data. Part of every chunk id.
  const std::string& fingerprint() const { return fingerprint_; }
  // Bytes the weights occupy: the mapped matrices in their encoding plus the F32 vectors.
  size_t weight_bytes() const;

  // x[n][n_embd] = embedding rows of tokens[n], dequantised from the file encoding.
  void embed(const int32_t* tokens, int n, float* x) const;

  // Throws ct::Error naming the type and head size when this model's cache cannot hold dtype
  // (a live cache type whose blocks must not straddle two heads: Q8_0 needs head_dim % 32 == 0).
  void check_cache_type(KvDtype dtype) const {
    CT_THROW_IF_NOT(cfg_.head_dim % kv_block_elems(dtype) == 0,
                    "KV cache type {} stores blocks of {} elements; this model's heads have {}",
                    kv_dtype_name(dtype), kv_block_elems(dtype), cfg_.head_dim);
  }
  KVCache make_cache(int n_ctx, KvDtype dtype = KvDtype::F32) const {
    check_cache_type(dtype);
    return KVCache(cfg_.n_layer, n_ctx, cfg_.kv_dim(), dtype);
  }
  const cpu::Rope& rope() const { return rope_; }

  // The weights, for other backends (src/backend/gpu_decoder.h). The F32 copies cost the
  // model's F32 size in host memory while they live; they are made on request only.
  const LayerWeights& layer_weights(int l) const { return layers_[l]; }
  LayerWeightsF32 layer_weights_f32(int l) const;
  const cpu::QMatrix& token_embedding() const { return tok_embd_; }  // [n_vocab][n_embd]
  // [n_vocab][n_embd]; the same view as token_embedding() when tied (same data pointer).
  const cpu::QMatrix& output_matrix() const { return output_; }
  const float* output_norm() const { return out_norm_.data(); }  // F32 [n_embd]

 private:
  Model() = default;
  std::string path_;
  std::string fingerprint_;
  ModelConfig cfg_;
  Tokenizer tok_;
  cpu::Rope rope_;
  cpu::QMatrix tok_embd_;           // [n_vocab][n_embd]
  cpu::QMatrix output_;             // [n_vocab][n_embd]; equals tok_embd_ when tied
  std::vector<float> out_norm_;     // F32 [n_embd]
  std::unique_ptr<GgufFile> file_;  // kept mapped: every QMatrix points into it
  std::vector<LayerWeights> layers_;
};

}  // namespace ct
