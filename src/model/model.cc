// Loading a Llama-family GGUF and the decoder forward pass (pre-norm, GQA, SwiGLU). Weights stay
// in their file encoding (mapped): decode steps read the blocks directly (cpu::qgemv); multi-row
// products dequantise one matrix at a time into the workspace and run SGEMM.
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

// y[n][R] = x[n][K] [W_0; W_1; ...]^T (+ bias[R]), R the matrices' total rows, K their shared
// columns. One row (decoding, memory-bound): dot products straight from the blocks (qgemv),
// reading each weight once in its encoding. Several rows (prefill, compute-bound): the matrices
// are dequantised one after another, stacked, into the workspace's scratch and multiplied by one
// SGEMM, so Q/K/V and gate/up each stay one product.
// decode_rows: every row is one decoding sequence's token; they all take the dot-product kernels
// (qgemv_batch, kMaxBatchRows rows at a time), so each row's result is the same as alone.
void project(std::initializer_list<const cpu::QMatrix*> mats, const float* x, int n, float* y,
             const float* bias, Workspace& ws, bool decode_rows = false) {
  const int K = (*mats.begin())->cols;
  int R = 0;
  for (const cpu::QMatrix* m : mats) R += m->rows;
  if (decode_rows && n > 1 && !ws.use_reference) {
    const cpu::QMatrix* ms[cpu::kMaxMany];
    int i = 0;
    for (const cpu::QMatrix* m : mats) ms[i++] = m;
    for (int r0 = 0; r0 < n; r0 += cpu::kMaxBatchRows) {
      const int nr = std::min(cpu::kMaxBatchRows, n - r0);
      cpu::qgemv_batch(ms, i, x + (size_t)r0 * K, nr, y + (size_t)r0 * R, R, ws.decode_path);
    }
    if (bias) {
      for (int r = 0; r < n; ++r)
        for (int j = 0; j < R; ++j) y[(size_t)r * R + j] += bias[j];
    }
    return;
  }
  if (n == 1 && !ws.use_reference) {
    const cpu::QMatrix* ms[cpu::kMaxMany];
    float* ys[cpu::kMaxMany];
    int i = 0, off = 0;
    for (const cpu::QMatrix* m : mats) {
      ms[i] = m;
      ys[i++] = y + off;
      off += m->rows;
    }
    cpu::qgemv_many(ms, ys, i, x, ws.decode_path);
    if (bias) {
      for (int j = 0; j < R; ++j) y[j] += bias[j];
    }
    return;
  }
  if (ws.wbuf.size() < (size_t)R * K) ws.wbuf.resize((size_t)R * K);
  float* w = ws.wbuf.data();
  for (const cpu::QMatrix* m : mats) {
    CT_ASSERT(m->cols == K, "stacked matrices with {} and {} columns", m->cols, K);
    if (ws.use_reference) {
      for (int r = 0; r < m->rows; ++r) {
        ggml_to_f32_ref(m->type, m->data + (size_t)r * m->row_bytes, w + (size_t)r * K, K);
      }
    } else {
      cpu::qmatrix_to_f32(*m, 0, m->rows, w);
    }
    w += (size_t)m->rows * K;
  }
  (ws.use_reference ? cpu::matmul_wt_ref : cpu::matmul_wt)(x, n, K, ws.wbuf.data(), R, y, bias, 0);
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
    ggml_to_f32(tok_embd_.type, tok_embd_.data + (size_t)tokens[i] * tok_embd_.row_bytes,
                x + (size_t)i * E, E);
  }
}

void Model::forward_layer(int l, float* x, const int32_t* pos, int n, KVCache& kv, Workspace& ws,
                          const LayerTap* tap) const {
  const BatchSeq seq{&kv, n};
  forward_batch(l, x, pos, n, &seq, 1, ws, /*decode_rows=*/false, tap);
}

void Model::forward_batch(int l, float* x, const int32_t* pos, int n, const BatchSeq* seqs,
                          int n_seqs, Workspace& ws, bool decode_rows,
                          const LayerTap* tap) const {
  const ModelConfig& c = cfg_;
  const LayerWeights& w = layers_[l];
  const int E = c.n_embd, Q = c.q_dim(), KV = c.kv_dim(), F = c.n_ff, QKV = Q + 2 * KV;
  ws.reserve(c, n);
  {
    int row = 0;
    for (int s = 0; s < n_seqs; ++s) {
      CT_ASSERT(seqs[s].n >= 1 && pos[row + seqs[s].n - 1] < seqs[s].kv->n_ctx(),
                "sequence {}: {} rows, position {} beyond cache size {}", s, seqs[s].n,
                pos[row + std::max(0, seqs[s].n - 1)], seqs[s].kv->n_ctx());
      row += seqs[s].n;
    }
    CT_ASSERT(row == n, "batch of {} rows split into sequences of {} rows", n, row);
    CT_ASSERT(!(tap && tap->probs_accum && n_seqs != 1), "attention tap on {} sequences", n_seqs);
  }
  const bool ref = ws.use_reference;
  auto rms = ref ? cpu::rms_norm_ref : cpu::rms_norm;

  rms(x, w.attn_norm.data(), ws.xn.data(), n, E, c.rms_eps);
  project({&w.wq, &w.wk, &w.wv}, ws.xn.data(), n, ws.qkv.data(),
          w.bqkv.empty() ? nullptr : w.bqkv.data(), ws, decode_rows);
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
  for (int s = 0, row0 = 0; s < n_seqs; row0 += seqs[s].n, ++s) {
    const int ns = seqs[s].n;
    float* kc = seqs[s].kv->k(l);
    float* vc = seqs[s].kv->v(l);
    for (int i = row0; i < row0 + ns; ++i) {
      std::memcpy(kc + (size_t)pos[i] * KV, k + (size_t)i * QKV, KV * sizeof(float));
      std::memcpy(vc + (size_t)pos[i] * KV, v + (size_t)i * QKV, KV * sizeof(float));
    }
    cpu::AttnArgs a;
    a.q = q + (size_t)row0 * QKV;
    a.q_stride = QKV;
    a.q_pos = pos + row0;
    a.n_q = ns;
    a.k = kc;
    a.v = vc;
    a.n_head = c.n_head;
    a.n_kv_head = c.n_head_kv;
    a.head_dim = c.head_dim;
    a.out = ws.attn.data() + (size_t)row0 * Q;
    if (tap) {
      a.probs_accum = tap->probs_accum;
      a.probs_from_row = tap->probs_from_row;
    }
    if (ref) {
      cpu::attention_ref(a);
    } else {
      cpu::attention(a);
    }
  }
  project({&w.wo}, ws.attn.data(), n, ws.proj.data(), nullptr, ws, decode_rows);
  for (size_t i = 0; i < (size_t)n * E; ++i) x[i] += ws.proj[i];

  rms(x, w.ffn_norm.data(), ws.xn.data(), n, E, c.rms_eps);
  project({&w.w_gate, &w.w_up}, ws.xn.data(), n, ws.gu.data(), nullptr, ws, decode_rows);
  for (int i = 0; i < n; ++i) {
    float* g = ws.gu.data() + (size_t)i * 2 * F;
    std::memcpy(ws.h.data() + (size_t)i * F, g, F * sizeof(float));
    if (ref) {
      cpu::silu_mul_ref(ws.h.data() + (size_t)i * F, g + F, F);
    } else {
      cpu::silu_mul(ws.h.data() + (size_t)i * F, g + F, F);
    }
  }
  project({&w.w_down}, ws.h.data(), n, ws.proj.data(), nullptr, ws, decode_rows);
  for (size_t i = 0; i < (size_t)n * E; ++i) x[i] += ws.proj[i];
}

void Model::logits(const float* x, int n, float* out, Workspace& ws) const {
  const ModelConfig& c = cfg_;
  ws.reserve(c, n);
  auto rms = ws.use_reference ? cpu::rms_norm_ref : cpu::rms_norm;
  rms(x, out_norm_.data(), ws.xn.data(), n, c.n_embd, c.rms_eps);
  if (n == 1 && !ws.use_reference) {
    cpu::qgemv(output_, ws.xn.data(), out, ws.decode_path);
    return;
  }
  // The head is by far the largest matrix (n_vocab rows); it is dequantised and multiplied in
  // slices of 2*n_ff rows, so the scratch stays the size of the largest layer matrix (gate and
  // up stacked) instead of an F32 copy of the head.
  const int E = c.n_embd, V = c.n_vocab;
  const int slice = std::max(256, 2 * c.n_ff);
  if (ws.wbuf.size() < (size_t)slice * E) ws.wbuf.resize((size_t)slice * E);
  auto matmul = ws.use_reference ? cpu::matmul_wt_ref : cpu::matmul_wt;
  for (int r0 = 0; r0 < V; r0 += slice) {
    const int r1 = std::min(V, r0 + slice);
    if (ws.use_reference) {
      for (int r = r0; r < r1; ++r) {
        ggml_to_f32_ref(output_.type, output_.data + (size_t)r * output_.row_bytes,
                        ws.wbuf.data() + (size_t)(r - r0) * E, E);
      }
    } else {
      cpu::qmatrix_to_f32(output_, r0, r1, ws.wbuf.data());
    }
    matmul(ws.xn.data(), n, E, ws.wbuf.data(), r1 - r0, out + r0, nullptr, V);
  }
}

void Model::decode_logits(const float* x, int n, float* out, Workspace& ws) const {
  if (n == 1 || ws.use_reference) {
    logits(x, n, out, ws);
    return;
  }
  const ModelConfig& c = cfg_;
  ws.reserve(c, n);
  cpu::rms_norm(x, out_norm_.data(), ws.xn.data(), n, c.n_embd, c.rms_eps);
  const cpu::QMatrix* head = &output_;
  for (int r0 = 0; r0 < n; r0 += cpu::kMaxBatchRows) {
    const int nr = std::min(cpu::kMaxBatchRows, n - r0);
    cpu::qgemv_batch(&head, 1, ws.xn.data() + (size_t)r0 * c.n_embd, nr,
                     out + (size_t)r0 * c.n_vocab, c.n_vocab, ws.decode_path);
  }
}

std::vector<float> Model::decode_batch(const int32_t* tokens, KVCache* const* kvs, int n,
                                       Workspace& ws) const {
  CT_THROW_IF_NOT(n > 0, "decode step needs at least one sequence");
  const int E = cfg_.n_embd;
  std::vector<float> x((size_t)n * E);
  std::vector<int32_t> pos(n);
  std::vector<BatchSeq> seqs(n);
  for (int i = 0; i < n; ++i) {
    CT_THROW_IF_NOT(kvs[i]->n_pos < kvs[i]->n_ctx(),
                    "KV cache of sequence {} full at {} positions while decoding", i,
                    kvs[i]->n_ctx());
    pos[i] = kvs[i]->n_pos;
    seqs[i] = BatchSeq{kvs[i], 1};
  }
  embed(tokens, n, x.data());
  for (int l = 0; l < cfg_.n_layer; ++l) {
    forward_batch(l, x.data(), pos.data(), n, seqs.data(), n, ws, /*decode_rows=*/true);
  }
  for (int i = 0; i < n; ++i) kvs[i]->n_pos = pos[i] + 1;
  std::vector<float> out((size_t)n * cfg_.n_vocab);
  decode_logits(x.data(), n, out.data(), ws);
  return out;
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
