// In-memory chunk source and the whole-record read helper.
#include "reuse/chunk_source.h"

#include <cstring>

namespace ct {

void InMemoryChunk::read_rows(int layer, int row_begin, int row_end, void* k_dst,
                              void* v_dst) const {
  const ChunkMeta& m = kv_.meta;
  CT_ASSERT(layer >= 0 && layer < m.n_layer && 0 <= row_begin && row_begin <= row_end &&
                row_end <= m.n_tok,
            "layer {} rows [{}, {})", layer, row_begin, row_end);
  const size_t row_bytes = kv_bytes(m.dtype, m.kv_dim);
  const size_t off = row_bytes * row_begin, n = row_bytes * (row_end - row_begin);
  std::memcpy(k_dst, kv_.k[layer].data() + off, n);
  std::memcpy(v_dst, kv_.v[layer].data() + off, n);
}

ChunkKV read_whole_chunk(const ChunkSource& src) {
  ChunkKV kv;
  kv.meta = src.meta();
  const size_t bytes = kv.meta.layer_bytes();
  kv.k.resize(kv.meta.n_layer);
  kv.v.resize(kv.meta.n_layer);
  for (int l = 0; l < kv.meta.n_layer; ++l) {
    kv.k[l].resize(bytes);
    kv.v[l].resize(bytes);
    src.read_rows(l, 0, kv.meta.n_tok, kv.k[l].data(), kv.v[l].data());
  }
  return kv;
}

}  // namespace ct
