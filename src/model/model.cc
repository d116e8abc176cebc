// Loading a Llama-family GGUF and the decoder forward pass (pre-norm, GQA, SwiGLU).
#include "model/model.h"

#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/ggml_types.h"
#include "core/sha256.h"
#include "model/gguf.h"

namespace ct {
namespace {

// Dequantises a tensor into `dst` after checking its shape; the message names file and tensor.
void load_tensor(const GgufFile& f, const std::string& name, const std::vector<int64_t>& ne,
                 float* dst) {
  const GgufTensorInfo& t = f.tensor(name);
  std::vector<int64_t> got = t.ne;
  while (got.size() > ne.size() && got.back() == 1) got.pop_back();
  if (got != ne) {
    auto dims = [](const std::vector<int64_t>& v) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    };
    CT_THROW("{}: tensor '{}' has shape {}, expected {}", f.path(), name, dims(t.ne), dims(ne));
  }
  if (!ggml_type_supported(t.type)) {
    CT_THROW("{}: tensor '{}' has type {}, expected one of f32, f16, bf16, q4_0, q4_1, q8_0",
             f.path(), name, ggml_type_name(t.type));
  }
  const int64_t row = ne[0], rows = t.n_rows();
  const size_t row_bytes = ggml_row_bytes(t.type, row);
#pragma omp parallel for if (rows > 256)
  for (int64_t r = 0; r < rows; ++r) {
    ggml_to_f32(t.type, t.data + (size_t)r * row_bytes, dst + (size_t)r * row, row);
  }
}

std::vector<float> load_vec(const GgufFile& f, const std::string& name,
                            const std::vector<int64_t>& ne) {
  int64_t n = 1;
  for (auto d : ne) n *= d;
  std::vector<float> v((size_t)n);
  load_tensor(f, name, ne, v.data());
  return v;
}

// The packed form of a 2-D tensor for the decode path, or an invalid QMatrix.
cpu::QMatrix packed(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo& t = f.tensor(name);
  cpu::QMatrix q;
  if (!cpu::qgemv_supported(t.type) || t.ne.size() < 2 || t.ne[0] % 32 != 0) return q;
  q.type = t.type;
  q.data = t.data;
  q.cols = (int)t.ne[0];
  q.rows = (int)t.n_rows();
  q.row_bytes = ggml_row_bytes(t.type, t.ne[0]);
  return q;
}

std::string compute_fingerprint(const GgufFile& f) {
  Sha256 h;
  h.update_pod((uint64_t)f.file_size());
  for (const auto& t : f.tensors()) {
    h.update(t.name);
    h.update_pod((uint32_t)t.type);
    for (auto d : t.ne) h.update_pod(d);
    // Sample each tensor's first and last 256 bytes: cheap, and any re-quantisation changes them.
    const size_t n = std::min<size_t>(t.nbytes, 256);
    if (n > 0) {
      h.update(t.data, n);
      h.update(t.data + t.nbytes - n, n);
    }
  }
  for (const auto& [k, v] : f.metadata()) {
    h.update(k);
    h.update_pod((uint32_t)v.type);
    h.update(v.s);
    h.update_pod(v.i);
    h.update_pod(v.f);
    h.update_pod((uint64_t)v.array_size());
  }
  return h.hex_digest().substr(0, 16);
}

}  // namespace

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& path) {
  auto f = GgufFile::open(path);
  std::unique_ptr<Model> m(new Model());
  m->path_ = path;
  m->cfg_ = ModelConfig::from_gguf(*f);
  m->tok_ = Tokenizer::from_gguf(*f);
  const ModelConfig& c = m->cfg_;
  CT_THROW_IF_NOT(m->tok_.n_vocab() == c.n_vocab,
                  "{}: tokenizer has {} tokens but token_embd.weight has {} rows", path,
                  m->tok_.n_vocab(), c.n_vocab);
  m->rope_ = cpu::Rope(c.head_dim, c.n_rot, c.rope_theta, c.rope_style, c.rope_freq_scale,
                       c.rope_freq_factors);
  const int64_t E = c.n_embd, Q = c.q_dim(), KV = c.kv_dim(), F = c.n_ff;
  m->tok_embd_ = load_vec(*f, "token_embd.weight", {E, c.n_vocab});
  if (!c.tied_output) m->output_ = load_vec(*f, "output.weight", {E, c.n_vocab});
  m->out_norm_ = load_vec(*f, "output_norm.weight", {E});
  m->layers_.resize(c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) {
    LayerWeights& w = m->layers_[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    w.attn_norm = load_vec(*f, p + "attn_norm.weight", {E});
    w.wqkv.resize((size_t)(Q + 2 * KV) * E);
    load_tensor(*f, p + "attn_q.weight", {E, Q}, w.wqkv.data());
    load_tensor(*f, p + "attn_k.weight", {E, KV}, w.wqkv.data() + (size_t)Q * E);
    load_tensor(*f, p + "attn_v.weight", {E, KV}, w.wqkv.data() + (size_t)(Q + KV) * E);
    if (c.has_qkv_bias) {
      w.bqkv.resize(Q + 2 * KV);
      load_tensor(*f, p + "attn_q.bias", {Q}, w.bqkv.data());
      load_tensor(*f, p + "attn_k.bias", {KV}, w.bqkv.data() + Q);
      load_tensor(*f, p + "attn_v.bias", {KV}, w.bqkv.data() + Q + KV);
    }
    w.wo = load_vec(*f, p + "attn_output.weight", {Q, E});
    w.ffn_norm = load_vec(*f, p + "ffn_norm.weight", {E});
    w.w_gate_up.resize((size_t)2 * F * E);
    load_tensor(*f, p + "ffn_gate.weight", {E, F}, w.w_gate_up.data());
    load_tensor(*f, p + "ffn_up.weight", {E, F}, w.w_gate_up.data() + (size_t)F * E);
    w.w_down = load_vec(*f, p + "ffn_down.weight", {F, E});
    w.q_q = packed(*f, p + "attn_q.weight");
    w.q_k = packed(*f, p + "attn_k.weight");
    w.q_v = packed(*f, p + "attn_v.weight");
    w.q_o = packed(*f, p + "attn_output.weight");
    w.q_gate = packed(*f, p + "ffn_gate.weight");
    w.q_up = packed(*f, p + "ffn_up.weight");
    w.q_down = packed(*f, p + "ffn_down.weight");
  }
  m->q_head_ = packed(*f, c.tied_output ? "token_embd.weight" : "output.weight");
  m->fingerprint_ = compute_fingerprint(*f);
  m->file_ = std::move(f);
  return m;
}

size_t Model::weight_bytes() const {
  size_t n = tok_embd_.size() + output_.size() + out_norm_.size();
  for (const auto& w : layers_) {
    n += w.attn_norm.size() + w.wqkv.size() + w.bqkv.size() + w.wo.size() + w.ffn_norm.size() +
         w.w_gate_up.size() + w.w_down.size();
  }
  return n * sizeof(float);
}

void Workspace::reserve(const ModelConfig& c, int n) {
  if (n <= capacity) return;
  capacity = n;
  xn.resize((size_t)n * c.n_embd);
  qkv.resize((size_t)n * (c.q_dim() + 2 * c.kv_dim()));
  attn.resize((size_t)n * c.q_dim());
  gu.resize((size_t)n * 2 * c.n_ff);
  h.resize((size_t)n * c.n_ff);
  proj.resize((size_t)n * c.n_embd);
}

void Model::embed(const int32_t* tokens, int n, float* x) const {
  const int E = cfg_.n_embd;
  for (int i = 0; i < n; ++i) {
    CT_THROW_IF_NOT(tokens[i] >= 0 && tokens[i] < cfg_.n_vocab,
                    "token id {} at index {} outside the vocabulary [0, {})", tokens[i], i,
                    cfg_.n_vocab);
    std::memcpy(x + (size_t)i * E, tok_embd_.data() + (size_t)tokens[i] * E, E * sizeof(float));
  }
}

void Model::forward_layer(int l, float* x, const int32_t* pos, int n, KVCache& kv, Workspace& ws,
                          const LayerTap* tap) const {
  const ModelConfig& c = cfg_;
  const LayerWeights& w = layers_[l];
  const int E = c.n_embd, Q = c.q_dim(), KV = c.kv_dim(), F = c.n_ff, QKV = Q + 2 * KV;
  ws.reserve(c, n);
  CT_ASSERT(pos[n - 1] < kv.n_ctx(), "position {} beyond cache size {}", pos[n - 1], kv.n_ctx());
  const bool ref = ws.use_reference;
  auto matmul = ref ? cpu::matmul_wt_ref : cpu::matmul_wt;
  auto rms = ref ? cpu::rms_norm_ref : cpu::rms_norm;

  // One row (decoding) with quantised weights: read the packed blocks, not the F32 copies.
  const bool packed_row = n == 1 && !ref && w.q_q.valid() && w.q_k.valid() && w.q_v.valid() &&
                          w.q_o.valid() && w.q_gate.valid() && w.q_up.valid() && w.q_down.valid();
  rms(x, w.attn_norm.data(), ws.xn.data(), n, E, c.rms_eps);
  if (packed_row) {
    const cpu::QMatrix* qkv_w[3] = {&w.q_q, &w.q_k, &w.q_v};
    float* qkv_y[3] = {ws.qkv.data(), ws.qkv.data() + Q, ws.qkv.data() + Q + KV};
    cpu::qgemv_many(qkv_w, qkv_y, 3, ws.xn.data());
    for (size_t i = 0; i < w.bqkv.size(); ++i) ws.qkv[i] += w.bqkv[i];
  } else {
    matmul(ws.xn.data(), n, E, w.wqkv.data(), QKV, ws.qkv.data(),
           w.bqkv.empty() ? nullptr : w.bqkv.data());
  }
  float* q = ws.qkv.data();
  float* k = q + Q;
  float* v = k + KV;
  if (tap && tap->k_pre_rope) {
    for (int i = 0; i < n; ++i) {
      std::memcpy(tap->k_pre_rope + (size_t)i * KV, k + (size_t)i * QKV, KV * sizeof(float));
    }
  }
  if (tap && tap->v) {
    for (int i = 0; i < n; ++i) {
      std::memcpy(tap->v + (size_t)i * KV, v + (size_t)i * QKV, KV * sizeof(float));
    }
  }
  if (ref) {
    rope_.apply_ref(q, n, QKV, c.n_head, pos);
    rope_.apply_ref(k, n, QKV, c.n_head_kv, pos);
  } else {
    rope_.apply(q, n, QKV, c.n_head, pos);
    rope_.apply(k, n, QKV, c.n_head_kv, pos);
  }
  float* kc = kv.k(l);
  float* vc = kv.v(l);
  for (int i = 0; i < n; ++i) {
    std::memcpy(kc + (size_t)pos[i] * KV, k + (size_t)i * QKV, KV * sizeof(float));
    std::memcpy(vc + (size_t)pos[i] * KV, v + (size_t)i * QKV, KV * sizeof(float));
  }
  cpu::AttnArgs a;
  a.q = q;
  a.q_stride = QKV;
  a.q_pos = pos;
  a.n_q = n;
  a.k = kc;
  a.v = vc;
  a.n_head = c.n_head;
  a.n_kv_head = c.n_head_kv;
  a.head_dim = c.head_dim;
  a.out = ws.attn.data();
  if (tap) {
    a.probs_accum = tap->probs_accum;
    a.probs_from_row = tap->probs_from_row;
  }
  if (ref) {
    cpu::attention_ref(a);
  } else {
    cpu::attention(a);
  }
  if (packed_row) {
    cpu::qgemv(w.q_o, ws.attn.data(), ws.proj.data());
  } else {
    matmul(ws.attn.data(), n, Q, w.wo.data(), E, ws.proj.data(), nullptr);
  }
  for (size_t i = 0; i < (size_t)n * E; ++i) x[i] += ws.proj[i];

  rms(x, w.ffn_norm.data(), ws.xn.data(), n, E, c.rms_eps);
  if (packed_row) {
    const cpu::QMatrix* gu_w[2] = {&w.q_gate, &w.q_up};
    float* gu_y[2] = {ws.gu.data(), ws.gu.data() + F};
    cpu::qgemv_many(gu_w, gu_y, 2, ws.xn.data());
  } else {
    matmul(ws.xn.data(), n, E, w.w_gate_up.data(), 2 * F, ws.gu.data(), nullptr);
  }
  for (int i = 0; i < n; ++i) {
    float* g = ws.gu.data() + (size_t)i * 2 * F;
    std::memcpy(ws.h.data() + (size_t)i * F, g, F * sizeof(float));
    if (ref) {
      cpu::silu_mul_ref(ws.h.data() + (size_t)i * F, g + F, F);
    } else {
      cpu::silu_mul(ws.h.data() + (size_t)i * F, g + F, F);
    }
  }
  if (packed_row) {
    cpu::qgemv(w.q_down, ws.h.data(), ws.proj.data());
  } else {
    matmul(ws.h.data(), n, F, w.w_down.data(), E, ws.proj.data(), nullptr);
  }
  for (size_t i = 0; i < (size_t)n * E; ++i) x[i] += ws.proj[i];
}

void Model::logits(const float* x, int n, float* out, Workspace& ws) const {
  const ModelConfig& c = cfg_;
  ws.reserve(c, n);
  auto rms = ws.use_reference ? cpu::rms_norm_ref : cpu::rms_norm;
  auto matmul = ws.use_reference ? cpu::matmul_wt_ref : cpu::matmul_wt;
  rms(x, out_norm_.data(), ws.xn.data(), n, c.n_embd, c.rms_eps);
  if (n == 1 && !ws.use_reference && q_head_.valid()) {
    cpu::qgemv(q_head_, ws.xn.data(), out);
    return;
  }
  const float* head = output_.empty() ? tok_embd_.data() : output_.data();
  matmul(ws.xn.data(), n, c.n_embd, head, c.n_vocab, out, nullptr);
}

std::vector<float> Model::prefill(const int32_t* tokens, int n, int pos0, KVCache& kv,
                                  Workspace& ws, bool all_rows,
                                  const std::function<void(int, int)>& progress) const {
  CT_THROW_IF_NOT(n > 0, "prefill needs at least one token");
  CT_THROW_IF_NOT(pos0 + n <= kv.n_ctx(),
                  "prompt of {} tokens at position {} exceeds the {}-token cache", n, pos0,
                  kv.n_ctx());
  const int E = cfg_.n_embd;
  std::vector<float> x((size_t)n * E);
  std::vector<int32_t> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = pos0 + i;
  embed(tokens, n, x.data());
  for (int l = 0; l < cfg_.n_layer; ++l) {
    forward_layer(l, x.data(), pos.data(), n, kv, ws);
    if (progress) progress(l + 1, cfg_.n_layer);
  }
  kv.n_pos = std::max(kv.n_pos, pos0 + n);
  std::vector<float> out((size_t)(all_rows ? n : 1) * cfg_.n_vocab);
  if (all_rows) {
    logits(x.data(), n, out.data(), ws);
  } else {
    logits(x.data() + (size_t)(n - 1) * E, 1, out.data(), ws);
  }
  return out;
}

}  // namespace ct
