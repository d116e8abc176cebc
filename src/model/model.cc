// Loading a Llama-family GGUF: configuration, tokenizer, and weights kept in their file encoding
// (views into the mapping; only norms and biases are F32 copies). The forward pass over them is
// backend/cpu_forward.cc.
#include "model/model.h"

#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "core/error.h"
#include "core/ggml_types.h"
#include "core/sha256.h"
#include "model/gguf.h"

namespace ct {
namespace {

std::string dims(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The tensor `name` after checking its shape (trailing 1s ignored) and type; the messages name
// the file, the tensor, the value found and the one expected.
const GgufTensorInfo& checked_tensor(const GgufFile& f, const std::string& name,
                                     const std::vector<int64_t>& ne) {
  const GgufTensorInfo& t = f.tensor(name);
  std::vector<int64_t> got = t.ne;
  while (got.size() > ne.size() && got.back() == 1) got.pop_back();
  if (got != ne) {
    CT_THROW("{}: tensor '{}' has shape {}, expected {}", f.path(), name, dims(t.ne), dims(ne));
  }
  if (!ggml_type_supported(t.type)) {
    CT_THROW("{}: tensor '{}' has type {}, expected one of {}", f.path(), name,
             ggml_type_name(t.type), ggml_supported_type_names());
  }
  return t;
}

// A small tensor (norm gain, bias) dequantised to F32.
std::vector<float> load_vec(const GgufFile& f, const std::string& name,
                            const std::vector<int64_t>& ne) {
  const GgufTensorInfo& t = checked_tensor(f, name, ne);
  std::vector<float> v((size_t)t.n_elements());
  ggml_to_f32(t.type, t.data, v.data(), t.n_elements());
  return v;
}

// A weight matrix [rows][cols] as a view into the mapped file, in its encoding.
cpu::QMatrix load_matrix(const GgufFile& f, const std::string& name, int64_t cols, int64_t rows) {
  const GgufTensorInfo& t = checked_tensor(f, name, {cols, rows});
  cpu::QMatrix q;
  q.type = t.type;
  q.data = t.data;
  q.cols = (int)cols;
  q.rows = (int)rows;
  q.row_bytes = ggml_row_bytes(t.type, cols);
  // The reader sizes every tensor from its type and shape and checks it lies inside the file;
  // a matrix view must cover exactly that.
  CT_THROW_IF_NOT(t.nbytes == q.row_bytes * (size_t)rows,
                  "{}: tensor '{}' ({} {}) holds {} bytes, expected {} ({} rows of {} bytes)",
                  f.path(), name, ggml_type_name(t.type), dims(t.ne), t.nbytes,
                  q.row_bytes * (size_t)rows, rows, q.row_bytes);
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
  const TensorNames& tn = *c.traits->tensors;
  m->tok_embd_ = load_matrix(*f, tn.token_embd, E, c.n_vocab);
  m->output_ = c.tied_output ? m->tok_embd_ : load_matrix(*f, tn.output, E, c.n_vocab);
  m->out_norm_ = load_vec(*f, tn.output_norm, {E});
  m->layers_.resize(c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) {
    LayerWeights& w = m->layers_[l];
    auto name = [l](const char* suffix) { return layer_tensor(l, suffix); };
    w.attn_norm = load_vec(*f, name(tn.attn_norm), {E});
    w.wq = load_matrix(*f, name(tn.attn_q), E, Q);
    w.wk = load_matrix(*f, name(tn.attn_k), E, KV);
    w.wv = load_matrix(*f, name(tn.attn_v), E, KV);
    if (c.has_qkv_bias) {
      w.bqkv.reserve(Q + 2 * KV);
      for (const auto& [bias, len] :
           {std::pair{tn.attn_q_bias, Q}, {tn.attn_k_bias, KV}, {tn.attn_v_bias, KV}}) {
        const std::vector<float> b = load_vec(*f, layer_tensor(l, bias), {len});
        w.bqkv.insert(w.bqkv.end(), b.begin(), b.end());
      }
    }
    w.wo = load_matrix(*f, name(tn.attn_output), Q, E);
    w.ffn_norm = load_vec(*f, name(tn.ffn_norm), {E});
    w.w_gate = load_matrix(*f, name(tn.ffn_gate), E, F);
    w.w_up = load_matrix(*f, name(tn.ffn_up), E, F);
    w.w_down = load_matrix(*f, name(tn.ffn_down), F, E);
  }
  m->fingerprint_ = compute_fingerprint(*f);
  m->file_ = std::move(f);
  return m;
}

size_t Model::weight_bytes() const {
  auto bytes = [](const cpu::QMatrix& w) { return (size_t)w.rows * w.row_bytes; };
  size_t n = bytes(tok_embd_) + (output_.data == tok_embd_.data ? 0 : bytes(output_)) +
             out_norm_.size() * sizeof(float);
  for (const auto& w : layers_) {
    n += (w.attn_norm.size() + w.bqkv.size() + w.ffn_norm.size()) * sizeof(float);
    for (const cpu::QMatrix* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) {
      n += bytes(*m);
    }
  }
  return n;
}

LayerWeightsF32 Model::layer_weights_f32(int l) const {
  const LayerWeights& w = layers_[l];
  auto stacked = [](std::initializer_list<const cpu::QMatrix*> ms) {
    size_t n = 0;
    for (const cpu::QMatrix* m : ms) n += (size_t)m->rows * m->cols;
    std::vector<float> v(n);
    float* p = v.data();
    for (const cpu::QMatrix* m : ms) {
      cpu::qmatrix_to_f32(*m, 0, m->rows, p);
      p += (size_t)m->rows * m->cols;
    }
    return v;
  };
  LayerWeightsF32 f;
  f.wqkv = stacked({&w.wq, &w.wk, &w.wv});
  f.wo = stacked({&w.wo});
  f.w_gate_up = stacked({&w.w_gate, &w.w_up});
  f.w_down = stacked({&w.w_down});
  return f;
}

void Model::embed(const int32_t* tokens, int n, float* x) const {
  const int E = cfg_.n_embd;
  for (int i = 0; i < n; ++i) {
    CT_THROW_IF_NOT(tokens[i] >= 0 && tokens[i] < cfg_.n_vocab,
                    "token id {} at index {} outside the vocabulary [0, {})", tokens[i], i,
                    cfg_.n_vocab);
    ggml_to_f32(tok_embd_.type, tok_embd_.data + (size_t)tokens[i] * tok_embd_.row_bytes,
                x + (size_t)i * E, E);
  }
}

}  // namespace ct
