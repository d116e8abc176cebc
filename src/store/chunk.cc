// Sizes of a chunk's KV blocks.
#include "store/chunk.h"

namespace ct {

size_t ChunkMeta::layer_bytes() const { return (size_t)n_tok * ct::kv_bytes(dtype, kv_dim); }
size_t ChunkMeta::kv_bytes() const { return layer_bytes() * 2 * n_layer; }

}  // namespace ct
