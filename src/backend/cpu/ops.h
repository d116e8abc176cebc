// CPU reference backend: the dense operators of a Llama-family decoder on F32 row-major data.
// Each fast operator has a plain-loop reference (`*_ref`) that tests compare against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/kv_dtype.h"

namespace ct::cpu {

// Y[m][n] = X[m][k] * W[n][k]^T (+ bias[n]). OpenBLAS SGEMM; W is the GGUF row layout. Rows of
// Y are ldy floats apart (0: n), so that a slice of W's rows fills a column block of Y.
void matmul_wt(const float* x, int m, int k, const float* w, int n, float* y,
               const float* bias = nullptr, int ldy = 0);
void matmul_wt_ref(const float* x, int m, int k, const float* w, int n, float* y,
                   const float* bias = nullptr, int ldy = 0);

// y[i] = x[i] / rms(x[i]) * w, rows of length d.
void rms_norm(const float* x, const float* w, float* y, int m, int d, float eps);
void rms_norm_ref(const float* x, const float* w, float* y, int m, int d, float eps);

// Rotary embedding. kNorm rotates adjacent pairs (x[2i], x[2i+1]) as llama.cpp does for LLaMA
// GGUFs (whose Q/K weights the converter permuted); kNeox rotates halves (x[i], x[i+d/2]) as Qwen2.
enum class RopeStyle { kNorm, kNeox };

// Precomputed inverse frequencies for one model; rotation angles are pos * inv_freq[i] with
// inv_freq[i] = freq_scale * theta^(-2i/n_rot) / freq_factors[i], as llama.cpp computes them:
// freq_scale is linear position interpolation (1 / rope.scaling.factor), freq_factors are
// per-pair divisors (Llama 3.1's rope_freqs.weight; empty means all 1).
class Rope {
 public:
  Rope() = default;
  Rope(int head_dim, int n_rot, float theta, RopeStyle style, float freq_scale = 1.0f,
       std::vector<float> freq_factors = {});  // freq_factors: F32 [n_rot/2] or empty
  // Rotates rows x[n][n_heads*head_dim] (row stride `stride` floats) in place to positions pos[n].
  void apply(float* x, int n, int stride, int n_heads, const int32_t* pos) const;
  void apply_ref(float* x, int n, int stride, int n_heads, const int32_t* pos) const;
  // cos and sin of every rotation angle at positions pos[n]: F32 [n][n_rot/2] each (resized).
  void angle_table(const int32_t* pos, int n, std::vector<float>& cos,
                   std::vector<float>& sin) const;
  // Rotates the rows of a position-indexed buffer: row pos[i] (at base + pos[i]*stride) to
  // position pos[i], with angle_table(pos, n) computed beforehand. Used for deferred RoPE of
  // reused keys written into the KV cache: the same positions are rotated in every layer, so
  // the table is computed once per request rather than once per layer.
  void apply_at_positions(float* base, int stride, int n_heads, const int32_t* pos, int n,
                          const float* cos, const float* sin) const;
  // Rotates rows x[n] (row stride `stride`) in place by the angles of table row r, the table
  // from angle_table() of their positions: every layer of a forward rotates the same positions,
  // so a forward computes the table once (apply() is angle_table() then this).
  void apply_table(float* x, int n, int stride, int n_heads, const float* cos,
                   const float* sin) const;
  int head_dim() const { return head_dim_; }
  // Tells Rope objects apart (copies share it): a table cached for one is not used for another.
  uint64_t id() const { return id_; }

 private:
  int head_dim_ = 0, n_rot_ = 0;
  float theta_ = 10000.0f;
  RopeStyle style_ = RopeStyle::kNorm;
  float freq_scale_ = 1.0f;
  std::vector<float> freq_factors_;  // F32 [n_rot/2] or empty
  std::vector<float> inv_freq_;      // F32 [n_rot/2]
  uint64_t id_ = 0;
};

// out[i] = silu(gate[i]) * up[i] (out may be gate).
void silu_mul(const float* gate, const float* up, float* out, size_t n);
void silu_mul_ref(const float* gate, const float* up, float* out, size_t n);
// The same on n rows of gate and up stacked (gu[n][2 * n_ff], gate first) into h[n][n_ff]; more
// than 16 rows in parallel (each element's result does not depend on it).
void silu_mul_rows(const float* gu, int n, int n_ff, float* h);

// Causal grouped-query attention of n_q query rows against a KV cache indexed by global position.
// Query row i sits at position q_pos[i] (strictly increasing) and attends to cache rows
// [0, q_pos[i]]; every such row must hold valid post-RoPE keys and values for this layer.
struct AttnArgs {
  const float* q = nullptr;      // F32 [n_q][q_stride], head h at q + h*head_dim, post-RoPE
  int q_stride = 0;              // floats between query rows; 0 means n_head*head_dim
  const int32_t* q_pos = nullptr;  // [n_q]
  int n_q = 0;
  const void* k = nullptr;       // kv_dtype [n_ctx][n_kv_head*head_dim], post-RoPE
  const void* v = nullptr;       // kv_dtype [n_ctx][n_kv_head*head_dim]
  KvDtype kv_dtype = KvDtype::F32;  // F32, F16 or Q8_0 (the live cache's types; Q8_0: hd % 32 == 0)
  int n_head = 0, n_kv_head = 0, head_dim = 0;
  float* out = nullptr;          // F32 [n_q][n_head*head_dim]
  // Optional: for query rows >= probs_from_row, add each row's attention probabilities (averaged
  // over heads) into probs_accum[key position]. Used by ProphetKV and the attention-fidelity eval.
  float* probs_accum = nullptr;  // F32 [n_ctx]
  int probs_from_row = 0;
};

// Tiled (flash-style online softmax) attention: memory per thread is one tile, never n x n. A
// task of one query row (a decode row) takes a direct kernel instead, chosen by that shape alone.
void attention(const AttnArgs& a);
// Several independent calls (the sequences of a decode step) in one parallel region: each
// call's result is what attention() alone gives it, bit for bit.
void attention(const AttnArgs* args, int n_args);
void attention_ref(const AttnArgs& a);

}  // namespace ct::cpu
