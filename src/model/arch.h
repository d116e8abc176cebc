// Architectures as data (issue 12 item 2): what differs between the decoder-only families the
// engine runs, one row each in arch.cc. A new architecture built from the same block (RMSNorm,
// grouped-query attention with RoPE, SwiGLU MLP) is one row; a genuinely new element (a norm on
// Q and K, another activation, fused QKV tensors) is a new field here plus its kernel.
#pragma once

#include <string>
#include <vector>

#include "backend/cpu/ops.h"

namespace ct {

// GGUF tensor names, llama.cpp's scheme. Per-layer names are suffixes of "blk.N.".
struct TensorNames {
  const char* token_embd;
  const char* output;  // absent: tied to token_embd
  const char* output_norm;
  const char* rope_freqs;  // optional (Llama 3.1 per-pair frequency factors)
  const char* attn_norm;
  const char* attn_q;
  const char* attn_k;
  const char* attn_v;
  const char* attn_q_bias;
  const char* attn_k_bias;
  const char* attn_v_bias;
  const char* attn_output;
  const char* ffn_norm;
  const char* ffn_gate;
  const char* ffn_up;
  const char* ffn_down;
};

enum class BiasRule {
  kNone,      // no Q/K/V biases; a file that has them is refused
  kOptional,  // biases when the file has blk.0's (llama.cpp loads them as optional)
  kRequired,  // every layer must have them (Qwen2)
};

struct ArchTraits {
  const char* name;          // general.architecture; also the prefix of its metadata keys
  cpu::RopeStyle rope_style;  // kNorm: adjacent pairs (llama), kNeox: the two halves (qwen2)
  BiasRule qkv_bias;
  const TensorNames* tensors;
};

// The row for `arch`; ct::Error naming `file`, the value and every known architecture otherwise.
const ArchTraits& find_arch(const std::string& arch, const std::string& file);
const std::vector<const ArchTraits*>& all_archs();

// "blk.<l>.<suffix>"
std::string layer_tensor(int l, const char* suffix);

}  // namespace ct
