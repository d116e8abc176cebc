// Chunk encoding (paper Sec. 4.1 / App. B.1, offline stage): a chunk's tokens are prefilled alone,
// its pre-RoPE keys and values are kept per layer, the frequency ranking orders its tokens, and
// the record is laid out in ranking order (store/chunk.h). The id is a content hash.
#pragma once

#include <string>
#include <vector>

#include "model/model.h"
#include "reuse/freq_rank.h"
#include "store/chunk.h"

namespace ct {

struct EncodeOptions {
  KvDtype dtype = KvDtype::F16;
  // Encode after a BOS/attention-sink token (not stored): the chunk's first token then does not
  // have to act as the attention sink, so its K/V look like any other position's when the chunk
  // is reused in the middle of a prompt. See docs/ARCHITECTURE.md for the measurement.
  bool sink = true;
  RankOptions rank;  // the stored ranking (default: low-frequency, alpha 0.5)
};

const char* rank_mode_name(RankMode m);

// Content hash of (model fingerprint, token ids, dtype, sink, rank mode, alpha): the same text
// encoded the same way by the same model gets the same id in any request.
std::string chunk_id(const std::string& model_fingerprint, const std::vector<int32_t>& tokens,
                     const EncodeOptions& opt);

// Prefills `tokens` alone and returns the record. Throws ct::Error for an empty chunk or one
// longer than the model context.
ChunkKV encode_chunk(const Model& m, const std::vector<int32_t>& tokens, const EncodeOptions& opt);

// Unpacked K (pre-RoPE) and V of a record in text order: F32 [n_layer][n_tok][kv_dim] each.
struct ChunkKVF32 {
  std::vector<float> k, v;
  const float* k_layer(int l, int n_tok, int kv_dim) const {
    return k.data() + (size_t)l * n_tok * kv_dim;
  }
  const float* v_layer(int l, int n_tok, int kv_dim) const {
    return v.data() + (size_t)l * n_tok * kv_dim;
  }
};
ChunkKVF32 unpack_text_order(const ChunkKV& c);

// Ranks a stored chunk with other options (for the l2/highfreq baselines and alpha sweeps).
ChunkRanking rank_stored_chunk(const ChunkKV& c, const RankOptions& opt);

}  // namespace ct
