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

// Reusable per-sequence scratch; grown on demand, never shrunk, so the layer loop allocates
// nothing once warmed up to the largest batch.
struct Workspace {
  void reserve(const ModelConfig& c, int n_rows);
  int capacity = 0;
  std::vector<float> xn;    // F32 [n][n_embd]
  std::vector<float> qkv;   // F32 [n][q_dim + 2*kv_dim]
  std::vector<float> attn;  // F32 [n][q_dim]
  std::vector<float> gu;    // F32 [n][2*n_ff]
  std::vector<float> h;     // F32 [n][n_ff]
  std::vector<float> proj;  // F32 [n][n_embd]
  // F32 [rows][cols]: the weight matrix (or stacked matrices, or a slice of the output head) of
  // the current multi-row product, dequantised from the file encoding. One layer matrix at a
  // time, so its size is that of the largest one (gate and up stacked), not the model's.
  std::vector<float> wbuf;
  bool use_reference = false;  // run the plain-loop reference operators (tests only)
  // Kernels of single-row (decode) products; kF32 skips the 8-bit rounding of the input (tests).
  cpu::QgemvPath decode_path = cpu::QgemvPath::kNative;
};

// Optional observation points of one layer's forward.
struct LayerTap {
  float* k_pre_rope = nullptr;   // out F32 [n][kv_dim]: keys before RoPE of the computed rows
  float* v = nullptr;            // out F32 [n][kv_dim]
  float* probs_accum = nullptr;  // in/out F32 [n_ctx]: see cpu::AttnArgs
  int probs_from_row = 0;
};

// Consecutive rows of a batch that belong to one sequence: the next n rows, attending over kv.
struct BatchSeq {
  KVCache* kv = nullptr;
  int n = 0;
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
  // One decoder block on n rows at positions pos[n] (strictly increasing). Writes the rows'
  // post-RoPE K and V into kv at their positions, then attends causally over kv rows
  // [0, pos[i]] which must all be valid for this layer. x is updated in place (residual stream).
  void forward_layer(int l, float* x, const int32_t* pos, int n, KVCache& kv, Workspace& ws,
                     const LayerTap* tap = nullptr) const;
  // The same block on the rows of several sequences at once (continuous batching): rows
  // [0, n_rows) at positions pos[], split into seqs[0..n_seqs) in order, each writing and
  // attending over its own cache. Norms, projections and the MLP run over all rows together;
  // attention runs per sequence. decode_rows: the rows are single decode tokens, multiplied by
  // the quantised dot-product kernels (qgemv_batch) whatever their number, so each row's result
  // equals that of the same row alone, bit for bit. Otherwise rows go through the prefill path
  // (SGEMM for more than one). A tap with probs_accum needs n_seqs == 1.
  void forward_batch(int l, float* x, const int32_t* pos, int n_rows, const BatchSeq* seqs,
                     int n_seqs, Workspace& ws, bool decode_rows,
                     const LayerTap* tap = nullptr) const;
  // One decode step of n sequences: tokens[i] is fed at position kvs[i]->n_pos of its cache
  // (which grows by one). Returns the next-token logits, F32 [n][n_vocab]. Each sequence's
  // logits equal prefill(&tokens[i], 1, kvs[i]->n_pos, ...) alone, bit for bit.
  std::vector<float> decode_batch(const int32_t* tokens, KVCache* const* kvs, int n,
                                  Workspace& ws) const;
  // logits[n][n_vocab] from final hidden rows x[n][n_embd] (output norm + head).
  void logits(const float* x, int n, float* out, Workspace& ws) const;
  // The same for decode rows: every row through the quantised head kernel (see forward_batch).
  void decode_logits(const float* x, int n, float* out, Workspace& ws) const;

  // Plain prefill of tokens at positions [pos0, pos0+n) on top of kv (which must hold
  // [0, pos0)); all layers, all rows. Returns the last row's logits, or all rows' when all_rows.
  // progress, when set, is called after each layer with (layers done, n_layer).
  std::vector<float> prefill(const int32_t* tokens, int n, int pos0, KVCache& kv, Workspace& ws,
                             bool all_rows = false,
                             const std::function<void(int, int)>& progress = nullptr) const;

  KVCache make_cache(int n_ctx) const { return KVCache(cfg_.n_layer, n_ctx, cfg_.kv_dim()); }
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
