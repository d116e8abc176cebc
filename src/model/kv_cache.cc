#include "model/kv_cache.h"

#include <cstring>

namespace ct {

void KVCache::place_row(int l, int pos, KvDtype src_t, const void* k, const void* v) {
  char* kd = static_cast<char*>(k_data(l)) + row_bytes() * pos;
  char* vd = static_cast<char*>(v_data(l)) + row_bytes() * pos;
  if (src_t == dtype_) {
    if (k) std::memcpy(kd, k, row_bytes());
    if (v) std::memcpy(vd, v, row_bytes());
    return;
  }
  thread_local std::vector<float> row;
  row.resize(kv_dim_);
  if (k) {
    kv_unpack(src_t, k, row.data(), kv_dim_);
    kv_pack(dtype_, row.data(), kd, kv_dim_);
  }
  if (v) {
    kv_unpack(src_t, v, row.data(), kv_dim_);
    kv_pack(dtype_, row.data(), vd, kv_dim_);
  }
}

void KVCache::copy_rows(const KVCache& src, int n) {
  CT_ASSERT(src.n_layer() >= n_layer_ && src.kv_dim() == kv_dim_ && n <= src.n_ctx() &&
                n <= n_ctx_,
            "copying {} rows of a {}-layer cache of {} x {} into one of {} layers, {} x {}", n,
            src.n_layer(), src.n_ctx(), src.kv_dim(), n_layer_, n_ctx_, kv_dim_);
  for (int l = 0; l < n_layer_; ++l) {
    if (src.dtype() == dtype_) {  // whole layers at once
      std::memcpy(k_data(l), src.k_data(l), (size_t)n * row_bytes());
      std::memcpy(v_data(l), src.v_data(l), (size_t)n * row_bytes());
      continue;
    }
    for (int j = 0; j < n; ++j) {
      place_row(l, j, src.dtype(), static_cast<const char*>(src.k_data(l)) + src.row_bytes() * j,
                static_cast<const char*>(src.v_data(l)) + src.row_bytes() * j);
    }
  }
}

}  // namespace ct
