// Reading and validating hyper-parameters; every rejected value is named with what was expected.
#include "model/config.h"

#include "core/error.h"
#include "model/gguf.h"

namespace ct {

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch = f.get_string("general.architecture");
  if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "mistral") {
    CT_THROW("{}: general.architecture is '{}', expected one of llama, mistral, qwen2", f.path(),
             c.arch);
  }
  const std::string a = c.arch + ".";
  c.n_layer = (int)f.get_int(a + "block_count");
  c.n_embd = (int)f.get_int(a + "embedding_length");
  c.n_head = (int)f.get_int(a + "attention.head_count");
  c.n_head_kv = (int)f.get_int(a + "attention.head_count_kv", c.n_head);
  c.n_ff = (int)f.get_int(a + "feed_forward_length");
  c.n_ctx_train = (int)f.get_int(a + "context_length", 4096);
  c.rope_theta = (float)f.get_float(a + "rope.freq_base", 10000.0);
  c.rms_eps = (float)f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5);
  CT_THROW_IF_NOT(c.n_layer > 0 && c.n_embd > 0 && c.n_head > 0 && c.n_ff > 0,
                  "{}: non-positive size (block_count={}, embedding_length={}, head_count={}, "
                  "feed_forward_length={})",
                  f.path(), c.n_layer, c.n_embd, c.n_head, c.n_ff);
  CT_THROW_IF_NOT(c.n_head_kv > 0 && c.n_head % c.n_head_kv == 0,
                  "{}: {}attention.head_count_kv={} must divide head_count={}", f.path(), a,
                  c.n_head_kv, c.n_head);
  CT_THROW_IF_NOT(c.n_embd % c.n_head == 0, "{}: embedding_length={} not divisible by head_count={}",
                  f.path(), c.n_embd, c.n_head);
  c.head_dim = (int)f.get_int(a + "attention.key_length", c.n_embd / c.n_head);
  c.n_rot = (int)f.get_int(a + "rope.dimension_count", c.head_dim);
  CT_THROW_IF_NOT(c.n_rot > 0 && c.n_rot <= c.head_dim && c.n_rot % 2 == 0,
                  "{}: {}rope.dimension_count={} must be even and <= head_dim={}", f.path(), a,
                  c.n_rot, c.head_dim);
  c.rope_style = c.arch == "qwen2" ? cpu::RopeStyle::kNeox : cpu::RopeStyle::kNorm;
  const auto& emb = f.tensor("token_embd.weight");
  CT_THROW_IF_NOT(emb.ne.size() == 2 && emb.ne[0] == c.n_embd,
                  "{}: tensor token_embd.weight has ne[0]={}, expected embedding_length={}",
                  f.path(), emb.ne.empty() ? 0 : emb.ne[0], c.n_embd);
  c.n_vocab = (int)emb.ne[1];
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  c.has_qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  return c;
}

}  // namespace ct
