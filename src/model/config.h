// Model hyper-parameters of a Llama-family decoder, read from GGUF metadata. Kept apart from
// per-request state (KV cache, workspace), as llama.cpp separates hparams from context params.
#pragma once

#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "model/arch.h"

namespace ct {

class GgufFile;

struct ModelConfig {
  std::string arch;  // general.architecture: "llama" (also Mistral/SmolLM2 GGUFs), "qwen2", ...
  const ArchTraits* traits = nullptr;  // its row of the architecture table (model/arch.h)
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_rot = 0;  // rotated dims per head
  int n_ff = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  cpu::RopeStyle rope_style = cpu::RopeStyle::kNorm;
  // RoPE frequency scaling (read_rope_scaling in config.cc). The angle of pair i at position p is
  // p * rope_freq_scale * rope_theta^(-2i/n_rot) / rope_freq_factors[i], as llama.cpp computes it.
  float rope_freq_scale = 1.0f;  // 1 / {arch}.rope.scaling.factor ("linear"), else 1
  std::vector<float>
      rope_freq_factors;  // F32 [n_rot/2] from rope_freqs.weight (Llama 3.1); empty: 1
  bool has_qkv_bias = false;
  bool tied_output = true;

  int q_dim() const { return n_head * head_dim; }
  int kv_dim() const { return n_head_kv * head_dim; }

  // Throws ct::Error naming the file and key for missing/invalid values or an unknown arch.
  static ModelConfig from_gguf(const GgufFile& f);
};

}  // namespace ct
