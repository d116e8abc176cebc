#include "model/kv_cache.h"

#include <cstring>

namespace ct {

void KVCache::place_row(int l, int pos, KvDtype src_t, const void* k, const void* v) {
  char* kd = static_cast<char*>(k_data(l)) + row_bytes() * pos;
  char* vd = static_cast<char*>(v_data(l)) + row_bytes() * pos;
  if (src_t == dtype_) {
    std::memcpy(kd, k, row_bytes());
    std::memcpy(vd, v, row_bytes());
    return;
  }
  thread_local std::vector<float> row;
  row.resize(kv_dim_);
  kv_unpack(src_t, k, row.data(), kv_dim_);
  kv_pack(dtype_, row.data(), kd, kv_dim_);
  kv_unpack(src_t, v, row.data(), kv_dim_);
  kv_pack(dtype_, row.data(), vd, kv_dim_);
}

}  // namespace ct
