// A chunk's isolated encoding as it is stored and moved between cache tiers: metadata, the
// token ranking, and per-layer pre-RoPE keys and values laid out in *ranking order*, so that for
// any recompute ratio r the rows to load (the complement of the top ceil(r*N)) are one
// contiguous suffix [n_sel, N) of every layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/kv_dtype.h"

namespace ct {

struct ChunkMeta {
  std::string id;                 // hex SHA-256 of (model fingerprint, tokens, encoding settings)
  std::string model_fingerprint;  // Model::fingerprint()
  int32_t n_tok = 0;
  int32_t n_layer = 0;
  int32_t kv_dim = 0;  // n_kv_head * head_dim
  KvDtype dtype = KvDtype::F16;
  bool sink = false;      // encoded after a BOS/attention-sink token (not stored)
  // "lowfreq" | "highfreq" | "l2" | "head" | "probe" | "attn" | "probe-attn" (reuse/ owns the
  // names; the store checks 1-32 characters of [a-z0-9_-])
  std::string rank_mode;
  double alpha = 0.5;
  // Settings of a non-spectral ranking that are part of the id ("probe2:layers=6:text=..." for
  // "probe", "attn2:last=64:prior=16" for "attn", both for "probe-attn"; see
  // reuse/policy/probe.h); "" for the others. Optional in the record's meta JSON, so
  // records written before it existed read back with "".
  std::string rank_params;
  std::vector<int32_t> tokens;  // [n_tok] token ids in text order
  std::vector<int32_t> order;   // [n_tok] ranking: order[j] = token index of rank j
  std::vector<float> scores;    // [n_tok] importance score per token index
  double rank_ms = 0;           // time the ranking took when encoded

  size_t layer_bytes() const;  // bytes of one layer's K (or V) block: n_tok * kv_dim * dtype
  size_t kv_bytes() const;     // all layers, K and V
};

struct ChunkKV {
  ChunkMeta meta;
  // [n_layer] blocks of [n_tok][kv_dim] in meta.dtype; row j holds token meta.order[j].
  std::vector<std::vector<uint8_t>> k;  // keys before RoPE
  std::vector<std::vector<uint8_t>> v;
};

}  // namespace ct
