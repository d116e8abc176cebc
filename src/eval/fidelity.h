// Fidelity of a reuse policy to full recompute (paper App. E.2): KL divergence of next-token
// distributions, cosine of attention vectors, per-token K/V drift between isolated and
// full-context encoding, and Recall@r of a selection against the high-drift tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu_forward.h"
#include "model/model.h"
#include "store/chunk.h"

namespace ct {

class DeviceSequence;

// KL(P || Q) in nats, P = softmax(p_logits), Q = softmax(q_logits), both F32 [n]; computed in
// double with log-sum-exp, so shifting either logit vector by a constant changes nothing.
double kl_from_logits(const float* p_logits, const float* q_logits, int n);

// Mean of kl_from_logits over the first n_pos rows of two F32 [rows][n_vocab] blocks. Throws
// ct::Error if either block has fewer than n_pos rows or n_pos < 1.
double mean_kl_from_logits(const std::vector<float>& p, const std::vector<float>& q, int n_vocab,
                           int n_pos);

// Cosine of two F32 [n] vectors, in double. 0 when either vector is all zero (an attention
// vector is only all zero when it was not measured).
double cosine_similarity(const float* a, const float* b, int n);

// Per-token drift of one chunk between its isolated encoding and the full-context encoding.
//  k_iso[l], v_iso[l], k_ctx[l], v_ctx[l]: F32 [n_tok][kv_dim] per layer (keys before RoPE), the
//  chunk's rows in text order. For layer l and token t, dk = ||K_ctx - K_iso||_2 / mean_k and
//  dv = ||V_ctx - V_iso||_2 / mean_v, where mean_k (mean_v) is the mean L2 norm of the layer's
//  full-context key (value) rows over the chunk's tokens: the change relative to the layer's
//  scale, so that layers with large activations do not dominate (a layer whose mean is 0
//  contributes 0). drift(t) = sum over layers of 0.5 * (dk + dv). Normalising by the layer's
//  scale rather than by its mean change keeps a layer without real drift (layer 0 sees no
//  context; its difference is only storage rounding) from weighing as much as one with drift.
// Returns F32 [n_tok]. Throws ct::Error on mismatched layer counts or a bad shape.
std::vector<float> kv_drift(const std::vector<const float*>& k_iso,
                            const std::vector<const float*>& v_iso,
                            const std::vector<const float*>& k_ctx,
                            const std::vector<const float*>& v_ctx, int n_tok, int kv_dim);

// Largest absolute K or V difference between the two encodings (no normalisation); for tests.
double kv_max_abs_diff(const std::vector<const float*>& a_k, const std::vector<const float*>& a_v,
                       const std::vector<const float*>& b_k, const std::vector<const float*>& b_v,
                       int n_tok, int kv_dim);

// Overlap of one chunk's selection with its reference set: the top n_select(r, n_tok) tokens by
// drift (ties to the lower index). Pooled Recall@r over chunks = sum(hits) / sum(n_ref).
struct RecallCount {
  int hits = 0;
  int n_ref = 0;
  RecallCount& operator+=(const RecallCount& o) {
    hits += o.hits;
    n_ref += o.n_ref;
    return *this;
  }
  double recall() const { return n_ref > 0 ? (double)hits / n_ref : 0.0; }
};
// selected: token indices (any order, no duplicates) in [0, drift.size()). Throws ct::Error for
// an index out of range.
RecallCount recall_at(const std::vector<int32_t>& selected, const std::vector<float>& drift,
                      double r);

// K (before RoPE) and V of every row of a plain prefill of `tokens` at positions 0..n-1, taken
// layer by layer with LayerTap (tapped_prefill, backend/backend.h; on `device` when given):
// F32 [n_layer][n][kv_dim] each. With query_begin >= 0 the same pass also accumulates the
// attention of rows [query_begin, n) over all positions, averaged over those rows, heads and
// layers (as SelectiveOptions::query_attention does): F32 [n].
struct PrefillKV {
  int n_tok = 0;
  std::vector<float> k, v;
  std::vector<float> query_attention;
  const float* k_rows(int l, int row, int kv_dim) const {
    return k.data() + ((size_t)l * n_tok + row) * kv_dim;
  }
  const float* v_rows(int l, int row, int kv_dim) const {
    return v.data() + ((size_t)l * n_tok + row) * kv_dim;
  }
};
PrefillKV capture_prefill_kv(const Model& m, const std::vector<int32_t>& tokens,
                             int query_begin = -1, DeviceSequence* device = nullptr);

// kv_drift of one stored chunk: its isolated K/V (the record, unpacked to text order) against
// its rows [offset, offset + n_tok) of a captured full-context prefill. With max_abs_diff, also
// kv_max_abs_diff of the same pair. Throws ct::Error when the rows do not fit in ctx or the
// shapes disagree.
std::vector<float> chunk_drift(const ChunkKV& rec, const PrefillKV& ctx, int offset,
                               double* max_abs_diff = nullptr);

}  // namespace ct
