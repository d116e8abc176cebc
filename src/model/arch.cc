#include "model/arch.h"

#include "core/error.h"

namespace ct {

namespace {

constexpr TensorNames kLlamaCppNames = {
    .token_embd = "token_embd.weight",
    .output = "output.weight",
    .output_norm = "output_norm.weight",
    .rope_freqs = "rope_freqs.weight",
    .attn_norm = "attn_norm.weight",
    .attn_q = "attn_q.weight",
    .attn_k = "attn_k.weight",
    .attn_v = "attn_v.weight",
    .attn_q_bias = "attn_q.bias",
    .attn_k_bias = "attn_k.bias",
    .attn_v_bias = "attn_v.bias",
    .attn_output = "attn_output.weight",
    .ffn_norm = "ffn_norm.weight",
    .ffn_gate = "ffn_gate.weight",
    .ffn_up = "ffn_up.weight",
    .ffn_down = "ffn_down.weight",
};

// One row per architecture. llama covers Llama 2/3.x, SmolLM2 and most Mistral GGUFs (which
// llama.cpp writes as "llama"); "mistral" is what some converters write for the same block.
constexpr ArchTraits kArchs[] = {
    {"llama", cpu::RopeStyle::kNorm, BiasRule::kOptional, &kLlamaCppNames},
    {"mistral", cpu::RopeStyle::kNorm, BiasRule::kOptional, &kLlamaCppNames},
    {"qwen2", cpu::RopeStyle::kNeox, BiasRule::kRequired, &kLlamaCppNames},
};

}  // namespace

const std::vector<const ArchTraits*>& all_archs() {
  static const std::vector<const ArchTraits*> all = [] {
    std::vector<const ArchTraits*> v;
    for (const ArchTraits& a : kArchs) v.push_back(&a);
    return v;
  }();
  return all;
}

const ArchTraits& find_arch(const std::string& arch, const std::string& file) {
  std::string known;
  for (const ArchTraits* a : all_archs()) {
    if (arch == a->name) return *a;
    known += std::string(known.empty() ? "" : ", ") + a->name;
  }
  CT_THROW("{}: general.architecture is '{}', expected one of {}", file, arch, known);
}

std::string layer_tensor(int l, const char* suffix) {
  return "blk." + std::to_string(l) + "." + suffix;
}

}  // namespace ct
