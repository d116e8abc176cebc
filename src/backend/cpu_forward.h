// The CPU backend's forward pass over a loaded Model (model/model.h holds only the weights): one
// decoder block on the rows of one or several sequences at arbitrary global positions, the output
// head, and the plain prefill and batched decode built from them. The CPU LayerBackend
// (backend.h, cpu_layers.cc) runs the selective prefill's layer loop on forward_layer; the
// continuous-batching scheduler steps decode_batch.
#pragma once

#include <functional>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/qgemm.h"
#include "backend/cpu/qgemv.h"
#include "model/model.h"

namespace ct {

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
  // RoPE angles of the rows' positions (Rope::angle_table), kept from the layer that computed
  // them: every layer of a forward rotates the same positions. Valid for rope_id and rope_pos.
  uint64_t rope_id = 0;
  std::vector<int32_t> rope_pos;
  std::vector<float> rope_cos, rope_sin;
  bool use_reference = false;  // run the plain-loop reference operators (tests only)
  // Kernels of single-row (decode) products; kF32 skips the 8-bit rounding of the input (tests).
  cpu::QgemvPath decode_path = cpu::QgemvPath::kNative;
  // Kernels of multi-row (prefill) products: the quantised GEMM (8-bit activations) or
  // dequantise + SGEMM (F32 activations); cpu::default_prefill_kernel() explains the default.
  cpu::PrefillKernel prefill_kernel = cpu::default_prefill_kernel();
  // The spans a decode step's down projection prefetches (the next layer's K/V caches).
  std::vector<cpu::SidePrefetch::Span> next_kv;
};

// Optional observation points of one layer's forward.
struct LayerTap {
  float* k_pre_rope = nullptr;   // out F32 [n][kv_dim]: keys before RoPE of the computed rows
  float* v = nullptr;            // out F32 [n][kv_dim]
  float* probs_accum = nullptr;  // in/out F32 [n_ctx]: see cpu::AttnArgs
  int probs_from_row = 0;
};

// Consecutive rows of a batch that belong to one sequence: the next n rows, attending over kv.
// decode: the rows are decode tokens (one per sequence and step), multiplied by the quantised
// dot-product kernels (qgemv_batch) whatever their number, so each row's result equals that of
// the same row alone, bit for bit. Otherwise they are prefill rows: one product per sequence
// (SGEMM for more than one row), the same as the sequence alone.
struct BatchSeq {
  KVCache* kv = nullptr;
  int n = 0;
  bool decode = false;
};

namespace cpu {

// One decoder block on n rows at positions pos[n] (strictly increasing). Writes the rows'
// post-RoPE K and V into kv at their positions, then attends causally over kv rows
// [0, pos[i]] which must all be valid for this layer. x is updated in place (residual stream).
void forward_layer(const Model& m, int l, float* x, const int32_t* pos, int n, KVCache& kv,
                   Workspace& ws, const LayerTap* tap = nullptr);
// The same block on the rows of several sequences at once (continuous batching): rows
// [0, n_rows) at positions pos[], split into seqs[0..n_seqs) in order, each writing and
// attending over its own cache. Norms and activations run over all rows together, attention per
// sequence; products run once over each stretch of consecutive decode sequences and once per
// prefill sequence (BatchSeq::decode), so every row's result is what it would be with its
// sequence alone: a step may mix decode rows with prefill rows of other sequences. A tap with
// probs_accum needs n_seqs == 1.
void forward_batch(const Model& m, int l, float* x, const int32_t* pos, int n_rows,
                   const BatchSeq* seqs, int n_seqs, Workspace& ws, const LayerTap* tap = nullptr);
// Layer l's keys before RoPE and values of n rows of the residual stream x[n][n_embd]: its
// attention norm and K/V products (with their bias) only, into k and v (F32 [n][kv_dim] each).
// Each row is what forward_layer's tap would give for the same rows (one prefill product).
void project_kv(const Model& m, int l, const float* x, int n, Workspace& ws, float* k, float* v);
// One decode step of n sequences: tokens[i] is fed at position kvs[i]->n_pos of its cache
// (which grows by one). Writes the next-token logits into logits, F32 [n][n_vocab] (resized;
// a caller that keeps the vector between steps allocates nothing). Each sequence's logits equal
// prefill(m, &tokens[i], 1, kvs[i]->n_pos, ...) alone, bit for bit.
void decode_batch(const Model& m, const int32_t* tokens, KVCache* const* kvs, int n, Workspace& ws,
                  std::vector<float>& logits);
// logits[n][n_vocab] from final hidden rows x[n][n_embd] (output norm + head).
void logits(const Model& m, const float* x, int n, float* out, Workspace& ws);
// The same for decode rows: every row through the quantised head kernel (see forward_batch).
void decode_logits(const Model& m, const float* x, int n, float* out, Workspace& ws);

// Deferred RoPE of reused keys placed in kv: rotates layer l's K rows at positions pos[n] to
// those positions, with angle_table(pos, n) in cos/sin. An F16 cache's rows are rotated in F32
// (in scratch) as an F32 cache's are, and rounded when they go back (a second rounding for
// keys that were not F16 records; a Q8_0 cache takes rotate_and_store_keys instead).
void rotate_placed_keys(const Model& m, KVCache& kv, int l, const int32_t* pos, int n,
                        const float* cos, const float* sin, std::vector<float>& scratch);
// The same for keys not yet placed: keys holds the n rows as F32 [n][kv_dim] (in pos's order);
// they are rotated there and stored into layer l at pos, so a quantised cache rounds them once.
void rotate_and_store_keys(const Model& m, KVCache& kv, int l, const int32_t* pos, int n,
                           const float* cos, const float* sin, float* keys);

// Plain prefill of tokens at positions [pos0, pos0+n) on top of kv (which must hold
// [0, pos0)); all layers, all rows. Returns the last row's logits, or all rows' when all_rows.
// progress, when set, is called after each layer with (layers done, n_layer).
std::vector<float> prefill(const Model& m, const int32_t* tokens, int n, int pos0, KVCache& kv,
                           Workspace& ws, bool all_rows = false,
                           const std::function<void(int, int)>& progress = nullptr);

}  // namespace cpu
}  // namespace ct
