// GPU forward pass of a Llama-family decoder (cuBLAS FP32 GEMMs plus small kernels), checked
// against the CPU backend's cpu::prefill (tests/cuda/decoder_test.cc). It takes plain weight
// pointers, so this layer does not depend on src/model; src/backend/gpu_decoder.h builds one from
// a loaded Model. No CUDA types here (see band_norms.h). Only in CT_CUDA builds.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace ct::cuda {

struct DecoderDims {
  int n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, n_vocab = 0;
  int n_rot = 0;      // rotated dims per head (even, <= head_dim)
  bool neox = false;  // RoPE pairs (i, i + n_rot/2) instead of (2i, 2i + 1)
  float rms_eps = 1e-5f;
  int q_dim() const { return n_head * head_dim; }
  int kv_dim() const { return n_head_kv * head_dim; }
};

// Host F32 weights of one block, matrices [out][in] row-major (as in model/model.h).
struct DecoderLayerWeights {
  const float* attn_norm = nullptr;  // [n_embd]
  const float* wqkv = nullptr;       // [q_dim + 2*kv_dim][n_embd]
  const float* bqkv = nullptr;       // [q_dim + 2*kv_dim] or null
  const float* wo = nullptr;         // [n_embd][q_dim]
  const float* ffn_norm = nullptr;   // [n_embd]
  const float* w_gate_up = nullptr;  // [2*n_ff][n_embd]
  const float* w_down = nullptr;     // [n_embd][n_ff]
};

struct DecoderWeights {
  std::vector<DecoderLayerWeights> layers;
  const float* tok_embd = nullptr;  // [n_vocab][n_embd]
  const float* output = nullptr;    // [n_vocab][n_embd]
  const float* out_norm = nullptr;  // [n_embd]
};

// Observation points of one layer (host memory; any may be null), as the CPU's LayerTap: the
// rows' keys before RoPE and their values, F32 [n][kv_dim] each; and, for rows >= probs_from_row,
// their attention probabilities averaged over heads and added into probs_accum, F32 [n_keys]
// (key position j of the causal sequence; keys beyond a row's position add nothing).
struct DecoderTap {
  float* k_pre_rope = nullptr;
  float* v = nullptr;
  float* probs_accum = nullptr;
  int probs_from_row = 0;
};

// Element type of reused K/V rows as stored in chunk records (store/chunk.h's KvDtype).
enum class RowType { kF32, kF16, kBF16 };

// Sequences on the GPU: the weights (uploaded once), a KV cache of n_ctx positions per layer for
// each of n_seq sequence slots (post-RoPE keys and values, indexed by global position, like
// model/kv_cache.h) and scratch grown to the largest batch. The calls below work on the selected
// slot (select(); 0 at first), except decode_batch, which takes one row of each of several.
// Not thread-safe. Throws ct::Error naming the failing CUDA or cuBLAS call.
class Decoder {
 public:
  Decoder(const DecoderDims& dims, const DecoderWeights& w, int n_ctx, int n_seq = 1);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  const DecoderDims& dims() const;
  int n_ctx() const;
  int n_seq() const;
  // The slot the single-sequence calls (forward ... read_kv) work on, in [0, n_seq).
  void select(int seq);

  // One decode step for n sequences at once (continuous batching): row i is token tokens[i] of
  // slot seqs[i] (distinct slots) at position pos[i] (< n_ctx), attending over that slot's cache
  // rows [0, pos[i]], which must be valid; its K/V is written there. The products run over all n
  // rows together, the attention per row over its own slot. cos, sin: F32 [n][n_rot/2] as in
  // forward. Returns F32 [n][n_vocab], row i's logits equal (up to float rounding: cuBLAS may
  // sum in another order for another n) to forward() of that row alone on its slot.
  std::vector<float> decode_batch(const int32_t* tokens, const int32_t* pos, const int32_t* seqs,
                                  int n, const float* cos, const float* sin);

  // All layers on n tokens at global positions pos[n] (strictly increasing, < n_ctx), as
  // cpu::prefill: each layer writes the rows' K/V at their positions, then row i attends over
  // cache rows [0, pos[i]], which must all be valid (written by this or an earlier call).
  // cos, sin: F32 [n][n_rot/2], the rotation of each row's position (cpu::Rope::angle_table, so
  // both backends rotate by the same angles). Returns the last row's logits, F32 [n_vocab].
  // Equals begin(), layer(l) for every l, finish().
  std::vector<float> forward(const int32_t* tokens, const int32_t* pos, int n, const float* cos,
                             const float* sin);

  // The same, a layer at a time, for selective recomputation: begin() embeds the active rows,
  // write_reused() (below) puts the reused chunk rows into layer l's cache before layer(l) reads
  // them, finish() returns the last active row's logits. The calls queue work on the GPU and
  // return before it is done (finish() waits), so host work between them, such as reading the
  // next layer's rows, overlaps the GPU's.
  void begin(const int32_t* tokens, const int32_t* pos, int n, const float* cos, const float* sin);
  // With a tap, the call waits for the layer, so the tap's host arrays are filled on return.
  void layer(int l, const DecoderTap* tap = nullptr);
  // Keeps rows idx[0..n) of the current ones (ascending indices into the rows of begin() or of
  // the last keep_rows), whose residual stream carries on into the next layer; pos, cos, sin:
  // their global positions and rotations as in begin(). For a selection made after a layer
  // (CacheBlend chooses from layer 0's K/V).
  void keep_rows(const int32_t* idx, int n, const int32_t* pos, const float* cos,
                 const float* sin);
  // Layer l's keys before RoPE and values of the current rows into host k and v (F32
  // [n][kv_dim] each; waits for them): its attention norm and K/V products only, changing
  // nothing else (CacheBlend's check layer, before the layer runs).
  void project_kv(int l, float* k, float* v);
  std::vector<float> finish();

  // Reused chunk rows copied as stored and unpacked, rotated and placed on the device (the
  // paper's transfer path: only the rows' bytes cross the bus, RoPE is deferred to the GPU).
  // set_reused_rows describes the request's raw rows, the same in every layer: n rows of `type`
  // (rank rows as read from the chunk records, one chunk after another), row r going to global
  // position pos[r], or nowhere when pos[r] < 0 (a recomputed token inside a range read whole).
  // cos, sin: F32 [n][n_rot/2], the rotation of each row's position (any values where pos < 0).
  // It allocates pinned host staging for two layers.
  void set_reused_rows(RowType type, const int32_t* pos, int n, const float* cos, const float* sin);
  // Pinned host buffers to read layer l's raw K and V rows into ([n][kv_dim] elements of the row
  // type each). Waits until the copy staged there two layers earlier has left.
  std::pair<void*, void*> reused_staging(int l);
  // Queues the copy of layer l's staged rows to the device, their unpacking to F32, the keys'
  // RoPE at their positions and the scatter into layer l's cache; layer(l) then reads them.
  void write_reused(int l);

  // Copies the cache rows [0, n_pos) of layer l to the host: F32 [n_pos][kv_dim] each.
  void read_kv(int l, int n_pos, float* k, float* v) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ct::cuda
