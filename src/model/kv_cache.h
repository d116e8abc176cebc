// The working KV cache of one sequence: post-RoPE keys and values per layer, indexed by global
// position. Selective recomputation fills rows from two sources (recomputed and reused) per layer.
// Elements are F32, F16 (llama.cpp's default cache type: half the bytes for attention to read and
// for a request to hold) or Q8_0 (blocks of 32 along a row, 34 bytes each: 0.53 of F16); a row is
// packed once when it is written and attention reads the stored type directly.
#pragma once

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/kv_dtype.h"

namespace ct {

class KVCache {
 public:
  KVCache() = default;
  KVCache(int n_layer, int n_ctx, int kv_dim, KvDtype dtype = KvDtype::F32) {
    reset(n_layer, n_ctx, kv_dim, dtype);
  }
  void reset(int n_layer, int n_ctx, int kv_dim, KvDtype dtype = KvDtype::F32) {
    CT_THROW_IF_NOT(kv_cache_type(dtype),
                    "KV cache type '{}' is not supported, expected f32, f16 or q8_0",
                    kv_dtype_name(dtype));
    CT_THROW_IF_NOT(kv_dim % kv_block_elems(dtype) == 0,
                    "KV cache type {} stores blocks of {} elements; a row of {} is not whole blocks",
                    kv_dtype_name(dtype), kv_block_elems(dtype), kv_dim);
    n_layer_ = n_layer;
    n_ctx_ = n_ctx;
    kv_dim_ = kv_dim;
    dtype_ = dtype;
    const size_t floats = bytes_for(n_layer, n_ctx, kv_dim, dtype) / 2 / sizeof(float);
    k_.assign(floats, 0.0f);
    v_.assign(floats, 0.0f);
    n_pos = 0;
  }
  // Bytes a cache of these dimensions holds (K and V, each rounded up to whole floats).
  static size_t bytes_for(int n_layer, int n_ctx, int kv_dim, KvDtype dtype) {
    const size_t block = (size_t)n_layer * n_ctx * kv_bytes(dtype, kv_dim);
    return 2 * ((block + 3) / 4 * 4);
  }
  KvDtype dtype() const { return dtype_; }
  // Bytes of one row (kv_dim elements) and of one layer ([n_ctx] rows).
  size_t row_bytes() const { return kv_bytes(dtype_, kv_dim_); }
  size_t layer_bytes() const { return row_bytes() * n_ctx_; }
  // Layer l's [n_ctx][kv_dim] block in the cache's type.
  void* k_data(int l) { return reinterpret_cast<char*>(k_.data()) + layer_bytes() * l; }
  void* v_data(int l) { return reinterpret_cast<char*>(v_.data()) + layer_bytes() * l; }
  const void* k_data(int l) const {
    return reinterpret_cast<const char*>(k_.data()) + layer_bytes() * l;
  }
  const void* v_data(int l) const {
    return reinterpret_cast<const char*>(v_.data()) + layer_bytes() * l;
  }
  // Row pos (store) or rows [pos0, pos0 + n) (load) of layer l as floats <-> the cache's type;
  // a null k or v leaves that side alone.
  void store_row(int l, int pos, const float* k, const float* v) {
    if (k) kv_pack(dtype_, k, static_cast<char*>(k_data(l)) + row_bytes() * pos, kv_dim_);
    if (v) kv_pack(dtype_, v, static_cast<char*>(v_data(l)) + row_bytes() * pos, kv_dim_);
  }
  void load_rows(int l, int pos0, int n, float* k, float* v) const {
    if (k) {
      kv_unpack(dtype_, static_cast<const char*>(k_data(l)) + row_bytes() * pos0, k,
                (size_t)n * kv_dim_);
    }
    if (v) {
      kv_unpack(dtype_, static_cast<const char*>(v_data(l)) + row_bytes() * pos0, v,
                (size_t)n * kv_dim_);
    }
  }
  // Row pos of layer l from a row stored as src_t (a chunk record's, another cache's): copied
  // when the types match, else converted through F32. A null k or v leaves that side alone.
  void place_row(int l, int pos, KvDtype src_t, const void* k, const void* v);
  // Rows [0, n) of every layer from src (same dimensions, any type).
  void copy_rows(const KVCache& src, int n);
  // F32 views, for caches made F32 (the reference paths and tools working on F32 rows).
  float* k(int l) { return static_cast<float*>(k_data(checked_f32(l))); }
  float* v(int l) { return static_cast<float*>(v_data(checked_f32(l))); }
  const float* k(int l) const { return static_cast<const float*>(k_data(checked_f32(l))); }
  const float* v(int l) const { return static_cast<const float*>(v_data(checked_f32(l))); }
  int n_layer() const { return n_layer_; }
  int n_ctx() const { return n_ctx_; }
  int kv_dim() const { return kv_dim_; }
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

  int n_pos = 0;  // positions [0, n_pos) hold valid K/V in every layer

 private:
  int checked_f32(int l) const {
    CT_ASSERT(dtype_ == KvDtype::F32, "F32 view of a {} KV cache", kv_dtype_name(dtype_));
    return l;
  }
  int n_layer_ = 0, n_ctx_ = 0, kv_dim_ = 0;
  KvDtype dtype_ = KvDtype::F32;
  // [n_layer][n_ctx] rows of kv_dim elements of dtype_, packed (F16: two to a float of storage)
  std::vector<float> k_, v_;
};

}  // namespace ct
