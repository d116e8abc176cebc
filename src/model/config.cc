// Reading and validating hyper-parameters; every rejected value is named with what was expected.
// Every size is range-checked and cross-checked against the tensor shapes before anything is
// allocated from it, so a mutated file is refused with a message instead of a huge allocation,
// a wrapped int or a run that prints garbage.
#include "model/config.h"

#include <fmt/ranges.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "model/gguf.h"

namespace ct {
namespace {

// RoPE scaling: {arch}.rope.scaling.type/.factor and the rope_freqs.weight tensor, read as
// llama.cpp reads them (llama-model.cpp): an absent type means "linear", a factor of 0 or an absent
// one means no scaling, and the older key rope.scale_linear stands in for rope.scaling.factor.
// Types that change more than the frequencies (yarn's attention factor and ramp, longrope's
// per-length tables) are refused rather than approximated.
void read_rope_scaling(const GgufFile& f, const std::string& a, ModelConfig& c) {
  const std::string type_key = a + "rope.scaling.type";
  const std::string type = f.get_string(type_key, "linear");
  std::string factor_key = a + "rope.scaling.factor";
  if (!f.has(factor_key) && f.has(a + "rope.scale_linear")) factor_key = a + "rope.scale_linear";
  const double factor = f.get_float(factor_key, 0.0);
  if (type == "linear") {
    CT_THROW_IF_NOT(std::isfinite(factor) && factor >= 0,
                    "{}: {} is {}, expected a positive factor (or 0: no scaling)", f.path(),
                    factor_key, factor);
    c.rope_freq_scale = factor == 0 ? 1.0f : (float)(1.0 / factor);
  } else if (type != "none") {  // llama.cpp never scales positions with type "none"
    CT_THROW(
        "{}: {} is '{}'; supported: linear, none (yarn, longrope and other scaling types "
        "are not implemented)",
        f.path(), type_key, type);
  }

  const char* name = c.traits->tensors->rope_freqs;
  const GgufTensorInfo* t = f.find_tensor(name);
  if (t == nullptr) return;
  const int half = c.n_rot / 2;
  CT_THROW_IF_NOT(t->type == GgmlType::F32 && t->ne.size() == 1 && t->ne[0] == half,
                  "{}: tensor {} is {} with {} dims (ne[0]={}), expected F32 [{}] "
                  "(rope.dimension_count / 2)",
                  f.path(), name, ggml_type_name(t->type), t->ne.size(), t->ne.empty() ? 0 : t->ne[0],
                  half);
  c.rope_freq_factors.resize(half);
  std::memcpy(c.rope_freq_factors.data(), t->data, half * sizeof(float));
  for (int i = 0; i < half; ++i) {
    const float v = c.rope_freq_factors[i];
    CT_THROW_IF_NOT(std::isfinite(v) && v > 0,
                    "{}: {}[{}] is {}, expected a positive finite factor", f.path(), name, i, v);
  }
}

// Upper bounds well above any released model, low enough that products of them stay in range.
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxWidth = 1 << 17;  // embedding, feed-forward, head dims
constexpr int64_t kMaxHeads = 1 << 12;
constexpr int64_t kMaxContext = 1 << 24;  // positions

int read_size(const GgufFile& f, const std::string& key, int64_t lo, int64_t hi,
              std::optional<int64_t> def = std::nullopt) {
  const int64_t v = def ? f.get_int(key, *def) : f.get_int(key);
  CT_THROW_IF_NOT(v >= lo && v <= hi, "{}: {}={}, expected {} to {}", f.path(), key, v, lo, hi);
  return (int)v;
}

// Second dimension (rows) of a 2-D tensor, checking its first dimension is `cols`.
int64_t rows_of(const GgufFile& f, const std::string& name, int64_t cols, const char* cols_what) {
  const GgufTensorInfo& t = f.tensor(name);
  CT_THROW_IF_NOT(t.ne.size() == 2 && t.ne[0] == cols,
                  "{}: tensor {} has shape [{}], expected 2 dimensions with ne[0] = {} ({})",
                  f.path(), name, fmt::join(t.ne, ", "), cols, cols_what);
  return t.ne[1];
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch = f.get_string("general.architecture");
  c.traits = &find_arch(c.arch, f.path());
  const TensorNames& tn = *c.traits->tensors;
  const std::string a = c.arch + ".";
  c.n_layer = read_size(f, a + "block_count", 1, kMaxLayers);
  c.n_embd = read_size(f, a + "embedding_length", 1, kMaxWidth);
  c.n_head = read_size(f, a + "attention.head_count", 1, kMaxHeads);
  c.n_head_kv = read_size(f, a + "attention.head_count_kv", 1, kMaxHeads, c.n_head);
  c.n_ff = read_size(f, a + "feed_forward_length", 1, kMaxWidth);
  c.n_ctx_train = read_size(f, a + "context_length", 1, kMaxContext, 4096);
  const double theta = f.get_float(a + "rope.freq_base", 10000.0);
  CT_THROW_IF_NOT(std::isfinite(theta) && theta > 1.0 && theta < 1e12,
                  "{}: {}rope.freq_base={}, expected a finite number in (1, 1e12)", f.path(), a,
                  theta);
  c.rope_theta = (float)theta;
  const double eps = f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5);
  CT_THROW_IF_NOT(std::isfinite(eps) && eps > 0 && eps < 1,
                  "{}: {}attention.layer_norm_rms_epsilon={}, expected a number in (0, 1)",
                  f.path(), a, eps);
  c.rms_eps = (float)eps;
  CT_THROW_IF_NOT(c.n_head % c.n_head_kv == 0,
                  "{}: {}attention.head_count_kv={} must divide head_count={}", f.path(), a,
                  c.n_head_kv, c.n_head);
  CT_THROW_IF_NOT(c.n_embd % c.n_head == 0,
                  "{}: embedding_length={} not divisible by head_count={}", f.path(), c.n_embd,
                  c.n_head);
  c.head_dim = read_size(f, a + "attention.key_length", 1, kMaxWidth, c.n_embd / c.n_head);
  const int value_length =
      read_size(f, a + "attention.value_length", 1, kMaxWidth, (int64_t)c.head_dim);
  CT_THROW_IF_NOT(value_length == c.head_dim,
                  "{}: {}attention.value_length={} differs from key_length={}, which this engine "
                  "does not support",
                  f.path(), a, value_length, c.head_dim);
  c.n_rot = read_size(f, a + "rope.dimension_count", 1, kMaxWidth, c.head_dim);
  CT_THROW_IF_NOT(c.n_rot <= c.head_dim && c.n_rot % 2 == 0,
                  "{}: {}rope.dimension_count={} must be even and <= head_dim={} "
                  "({}attention.key_length)",
                  f.path(), a, c.n_rot, c.head_dim, a);
  c.rope_style = c.traits->rope_style;
  read_rope_scaling(f, a, c);

  // The hyper-parameters must describe the tensors: checked on layer 0 here (every layer's shapes
  // are checked again when its weights are loaded), before any buffer is sized from them.
  const int64_t vocab = rows_of(f, tn.token_embd, c.n_embd, "embedding_length");
  CT_THROW_IF_NOT(vocab >= 1 && vocab <= (int64_t)INT32_MAX - 1,
                  "{}: {} has {} rows, expected 1 to 2^31-2 tokens", f.path(), tn.token_embd,
                  vocab);
  c.n_vocab = (int)vocab;
  const std::string q0 = layer_tensor(0, tn.attn_q), k0 = layer_tensor(0, tn.attn_k),
                    g0 = layer_tensor(0, tn.ffn_gate);
  const int64_t q_rows = rows_of(f, q0, c.n_embd, "embedding_length");
  CT_THROW_IF_NOT(q_rows == (int64_t)c.q_dim(),
                  "{}: tensor {} has {} rows, expected head_count*key_length = {}", f.path(), q0,
                  q_rows, c.q_dim());
  const int64_t k_rows = rows_of(f, k0, c.n_embd, "embedding_length");
  CT_THROW_IF_NOT(k_rows == (int64_t)c.kv_dim(),
                  "{}: tensor {} has {} rows, expected head_count_kv*key_length = {}", f.path(), k0,
                  k_rows, c.kv_dim());
  const int64_t ff_rows = rows_of(f, g0, c.n_embd, "embedding_length");
  CT_THROW_IF_NOT(ff_rows == (int64_t)c.n_ff,
                  "{}: tensor {} has {} rows, expected {}feed_forward_length = {}", f.path(), g0,
                  ff_rows, a, c.n_ff);
  const std::string last = layer_tensor(c.n_layer - 1, tn.attn_norm);
  CT_THROW_IF_NOT(f.find_tensor(last) != nullptr, "{}: {}block_count={} but tensor {} is missing",
                  f.path(), a, c.n_layer, last);
  const std::string extra = layer_tensor(c.n_layer, tn.attn_norm);
  CT_THROW_IF_NOT(f.find_tensor(extra) == nullptr,
                  "{}: {}block_count={} but the file has tensor {}: the count is wrong", f.path(),
                  a, c.n_layer, extra);
  c.tied_output = f.find_tensor(tn.output) == nullptr;
  const std::string qb0 = layer_tensor(0, tn.attn_q_bias);
  const bool bias_in_file = f.find_tensor(qb0) != nullptr;
  switch (c.traits->qkv_bias) {
    case BiasRule::kNone:
      CT_THROW_IF_NOT(!bias_in_file, "{}: architecture {} has no Q/K/V biases, but the file has {}",
                      f.path(), c.arch, qb0);
      c.has_qkv_bias = false;
      break;
    case BiasRule::kOptional:
      c.has_qkv_bias = bias_in_file;
      break;
    case BiasRule::kRequired:
      CT_THROW_IF_NOT(bias_in_file, "{}: architecture {} needs Q/K/V biases; tensor {} is missing",
                      f.path(), c.arch, qb0);
      c.has_qkv_bias = true;
      break;
  }
  return c;
}

}  // namespace ct
