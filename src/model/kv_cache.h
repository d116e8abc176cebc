// The working KV cache of one sequence: post-RoPE keys and values per layer, indexed by global
// position. Selective recomputation fills rows from two sources (recomputed and reused) per layer.
#pragma once

#include <vector>

#include "core/error.h"

namespace ct {

class KVCache {
 public:
  KVCache() = default;
  KVCache(int n_layer, int n_ctx, int kv_dim) { reset(n_layer, n_ctx, kv_dim); }
  void reset(int n_layer, int n_ctx, int kv_dim) {
    n_layer_ = n_layer;
    n_ctx_ = n_ctx;
    kv_dim_ = kv_dim;
    k_.assign((size_t)n_layer * n_ctx * kv_dim, 0.0f);
    v_.assign((size_t)n_layer * n_ctx * kv_dim, 0.0f);
    n_pos = 0;
  }
  // F32 [n_ctx][kv_dim] for layer l
  float* k(int l) { return k_.data() + (size_t)l * n_ctx_ * kv_dim_; }
  float* v(int l) { return v_.data() + (size_t)l * n_ctx_ * kv_dim_; }
  const float* k(int l) const { return k_.data() + (size_t)l * n_ctx_ * kv_dim_; }
  const float* v(int l) const { return v_.data() + (size_t)l * n_ctx_ * kv_dim_; }
  int n_layer() const { return n_layer_; }
  int n_ctx() const { return n_ctx_; }
  int kv_dim() const { return kv_dim_; }
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

  int n_pos = 0;  // positions [0, n_pos) hold valid K/V in every layer

 private:
  int n_layer_ = 0, n_ctx_ = 0, kv_dim_ = 0;
  std::vector<float> k_, v_;  // F32 [n_layer][n_ctx][kv_dim]
};

}  // namespace ct
