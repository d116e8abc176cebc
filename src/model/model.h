// A loaded Llama-family decoder and its forward pass, exposed layer by layer so that selective
// recomputation (src/reuse) can choose, per layer, which token rows are computed and which K/V
// rows come from a chunk cache.
#pragma once

#include <functional>
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

// Weights of one block, dequantised to F32 at load time; matrices are [out][in] row-major.
struct LayerWeights {
  std::vector<float> attn_norm;  // F32 [n_embd]
  std::vector<float> wqkv;       // F32 [q_dim + 2*kv_dim][n_embd]: Q, K, V projections stacked
  std::vector<float> bqkv;       // F32 [q_dim + 2*kv_dim], empty without QKV bias
  std::vector<float> wo;         // F32 [n_embd][q_dim]
  std::vector<float> ffn_norm;   // F32 [n_embd]
  std::vector<float> w_gate_up;  // F32 [2*n_ff][n_embd]: gate rows then up rows
  std::vector<float> w_down;     // F32 [n_embd][n_ff]
  // The same matrices in their packed GGUF form, when quantised: the single-row (decode) path
  // reads these instead of the F32 copies. Invalid (null) for F32/F16/BF16 files.
  cpu::QMatrix q_q, q_k, q_v, q_o, q_gate, q_up, q_down;
};

// Reusable per-sequence scratch; grown on demand, never shrunk, so the layer loop allocates
// nothing once warmed up to the largest batch.
struct Workspace {
  void reserve(const ModelConfig& c, int n_rows);
  int capacity = 0;
  std::vector<float> xn;      // F32 [n][n_embd]
  std::vector<float> qkv;     // F32 [n][q_dim + 2*kv_dim]
  std::vector<float> attn;    // F32 [n][q_dim]
  std::vector<float> gu;      // F32 [n][2*n_ff]
  std::vector<float> h;       // F32 [n][n_ff]
  std::vector<float> proj;    // F32 [n][n_embd]
  bool use_reference = false;  // run the plain-loop reference operators (tests only)
};

// Optional observation points of one layer's forward.
struct LayerTap {
  float* k_pre_rope = nullptr;  // out F32 [n][kv_dim]: keys before RoPE of the computed rows
  float* v = nullptr;           // out F32 [n][kv_dim]
  float* probs_accum = nullptr;  // in/out F32 [n_ctx]: see cpu::AttnArgs
  int probs_from_row = 0;
};

class Model {
 public:
  // Loads the GGUF at `path`: config, tokenizer, weights (dequantised to F32). Throws ct::Error
  // naming the file and tensor for a missing tensor, a wrong shape, or an unsupported type.
  static std::unique_ptr<Model> load(const std::string& path);
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  const Tokenizer& tokenizer() const { return tok_; }
  const std::string& path() const { return path_; }
  // Identifies the weights: SHA-256 over the GGUF header (metadata and tensor table), the file
  // size and 16 sampled 64 KiB blocks of tensor data. Part of every chunk id.
  const std::string& fingerprint() const { return fingerprint_; }
  size_t weight_bytes() const;

  // x[n][n_embd] = embedding rows of tokens[n].
  void embed(const int32_t* tokens, int n, float* x) const;
  // One decoder block on n rows at positions pos[n] (strictly increasing). Writes the rows'
  // post-RoPE K and V into kv at their positions, then attends causally over kv rows
  // [0, pos[i]] which must all be valid for this layer. x is updated in place (residual stream).
  void forward_layer(int l, float* x, const int32_t* pos, int n, KVCache& kv, Workspace& ws,
                     const LayerTap* tap = nullptr) const;
  // logits[n][n_vocab] from final hidden rows x[n][n_embd] (output norm + head).
  void logits(const float* x, int n, float* out, Workspace& ws) const;

  // Plain prefill of tokens at positions [pos0, pos0+n) on top of kv (which must hold
  // [0, pos0)); all layers, all rows. Returns the last row's logits, or all rows' when all_rows.
  // progress, when set, is called after each layer with (layers done, n_layer).
  std::vector<float> prefill(const int32_t* tokens, int n, int pos0, KVCache& kv, Workspace& ws,
                             bool all_rows = false,
                             const std::function<void(int, int)>& progress = nullptr) const;

  KVCache make_cache(int n_ctx) const { return KVCache(cfg_.n_layer, n_ctx, cfg_.kv_dim()); }
  const cpu::Rope& rope() const { return rope_; }

  // The F32 weights, for other backends that upload them (src/model/cuda_decoder.h).
  const LayerWeights& layer_weights(int l) const { return layers_[l]; }
  const float* token_embedding() const { return tok_embd_.data(); }  // F32 [n_vocab][n_embd]
  const float* output_matrix() const {  // F32 [n_vocab][n_embd]; the embedding when tied
    return output_.empty() ? tok_embd_.data() : output_.data();
  }
  const float* output_norm() const { return out_norm_.data(); }  // F32 [n_embd]

 private:
  Model() = default;
  std::string path_;
  std::string fingerprint_;
  ModelConfig cfg_;
  Tokenizer tok_;
  cpu::Rope rope_;
  std::vector<float> tok_embd_;  // F32 [n_vocab][n_embd]
  std::vector<float> output_;    // F32 [n_vocab][n_embd], empty when tied to tok_embd_
  std::vector<float> out_norm_;  // F32 [n_embd]
  cpu::QMatrix q_head_;          // packed output head (or tied embedding), when quantised
  std::unique_ptr<GgufFile> file_;  // kept mapped: the packed matrices point into it
  std::vector<LayerWeights> layers_;
};

}  // namespace ct
