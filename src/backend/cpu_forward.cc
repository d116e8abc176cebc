// The CPU decoder forward pass over a loaded Model's weights (pre-norm, GQA, SwiGLU; the
// architecture's choices come from the model's config): cpu_forward.h. Decode steps read the
// weight blocks directly (cpu::qgemv); multi-row products dequantise one matrix at a time into the
// workspace and run SGEMM.
#include "backend/cpu_forward.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <numeric>

#include "backend/cpu/ops.h"
#include "backend/cpu/qgemv.h"
#include "core/error.h"
#include "core/ggml_types.h"

namespace ct {

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

namespace cpu {
namespace {

cpu::QgemmPath qgemm_path(const Workspace& ws) {
  return ws.prefill_kernel == cpu::PrefillKernel::kQgemm ? cpu::QgemmPath::kNative
                                                         : cpu::QgemmPath::kAvx2;
}

// True when the multi-row product over mats runs on qgemm: the workspace asks for it and every
// matrix is of a type qgemm is faster for on its path (cpu::qgemm_prefers).
bool quantised_prefill(std::initializer_list<const cpu::QMatrix*> mats, const Workspace& ws) {
  if (ws.prefill_kernel == cpu::PrefillKernel::kSgemm) return false;
  for (const cpu::QMatrix* m : mats) {
    if (!cpu::qgemm_prefers(m->type)) return false;
  }
  return true;
}

// y[n][R] = x[n][K] [W_0; W_1; ...]^T (+ bias[R]), R the matrices' total rows, K their shared
// columns. One row (decoding, memory-bound): dot products straight from the blocks (qgemv),
// reading each weight once in its encoding. Several rows (prefill, compute-bound): one product
// over the stacked matrices (Q/K/V, gate/up), by the quantised GEMM (qgemm) where
// Workspace::prefill_kernel asks for it and every matrix is block-quantised; otherwise the
// matrices are dequantised one after another into the workspace's scratch and multiplied by one
// SGEMM.
// decode_rows: every row is one decoding sequence's token; they all take the dot-product kernels
// (qgemv_batch, kMaxBatchRows rows at a time), so each row's result is the same as alone.
// side: memory the decode-row products prefetch while they run (cpu::SidePrefetch).
void project(std::initializer_list<const cpu::QMatrix*> mats, const float* x, int n, float* y,
             const float* bias, Workspace& ws, bool decode_rows = false,
             const cpu::SidePrefetch* side = nullptr) {
  const int K = (*mats.begin())->cols;
  const cpu::QMatrix* ms[cpu::kMaxMany];
  float* ys[cpu::kMaxMany];
  int n_mats = 0, R = 0;
  CT_ASSERT(mats.size() <= (size_t)cpu::kMaxMany, "{} stacked matrices", mats.size());
  for (const cpu::QMatrix* m : mats) {
    ms[n_mats] = m;
    ys[n_mats++] = y + R;
    R += m->rows;
  }
  // The quantised kernels leave the bias to be added here.
  auto add_bias = [&] {
    if (!bias) return;
    for (int r = 0; r < n; ++r)
      for (int j = 0; j < R; ++j) y[(size_t)r * R + j] += bias[j];
  };
  if (decode_rows && n > 1 && !ws.use_reference) {
    for (int r0 = 0; r0 < n; r0 += cpu::kMaxBatchRows) {
      const int nr = std::min(cpu::kMaxBatchRows, n - r0);
      cpu::qgemv_batch(ms, n_mats, x + (size_t)r0 * K, nr, y + (size_t)r0 * R, R, ws.decode_path,
                       r0 == 0 ? side : nullptr);
    }
    add_bias();
    return;
  }
  if (n == 1 && !ws.use_reference) {
    cpu::qgemv_many(ms, ys, n_mats, x, ws.decode_path, side);
    add_bias();
    return;
  }
  if (!ws.use_reference && quantised_prefill(mats, ws)) {
    cpu::qgemm(ms, n_mats, x, n, y, R, qgemm_path(ws));
    add_bias();
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

// project() over a batch's rows stretch by stretch (BatchSeq::decode): consecutive decode
// sequences together, each prefill sequence alone, so that every row is multiplied exactly as
// with its sequence alone.
void project_seqs(std::initializer_list<const cpu::QMatrix*> mats, const float* x, float* y,
                  const float* bias, Workspace& ws, const BatchSeq* seqs, int n_seqs,
                  const cpu::SidePrefetch* side = nullptr) {
  const int K = (*mats.begin())->cols;
  int R = 0;
  for (const cpu::QMatrix* m : mats) R += m->rows;
  for (int s = 0, row = 0; s < n_seqs;) {
    int e = s + 1, n = seqs[s].n;
    if (seqs[s].decode) {
      while (e < n_seqs && seqs[e].decode) n += seqs[e++].n;
    }
    project(mats, x + (size_t)row * K, n, y + (size_t)row * R, bias, ws, seqs[s].decode,
            seqs[s].decode ? side : nullptr);
    row += n;
    s = e;
  }
}

}  // namespace

void forward_layer(const Model& m, int l, float* x, const int32_t* pos, int n, KVCache& kv,
                   Workspace& ws, const LayerTap* tap) {
  const BatchSeq seq{&kv, n, false};
  forward_batch(m, l, x, pos, n, &seq, 1, ws, tap);
}

void project_kv(const Model& m, int l, const float* x, int n, Workspace& ws, float* k, float* v) {
  const ModelConfig& c = m.config();
  const LayerWeights& w = m.layer_weights(l);
  const int E = c.n_embd, Q = c.q_dim(), KV = c.kv_dim(), QKV = Q + 2 * KV;
  CT_ASSERT(n >= 1, "project_kv on {} rows", n);
  ws.reserve(c, n);
  (ws.use_reference ? cpu::rms_norm_ref : cpu::rms_norm)(x, w.attn_norm.data(), ws.xn.data(), n, E,
                                                          c.rms_eps);
  // The stacked product forward_batch runs, so that each row's K and V are the tap's.
  project({&w.wq, &w.wk, &w.wv}, ws.xn.data(), n, ws.qkv.data(),
          w.bqkv.empty() ? nullptr : w.bqkv.data(), ws);
  for (int i = 0; i < n; ++i) {
    const float* row = ws.qkv.data() + (size_t)i * QKV;
    std::memcpy(k + (size_t)i * KV, row + Q, KV * sizeof(float));
    std::memcpy(v + (size_t)i * KV, row + Q + KV, KV * sizeof(float));
  }
}

void forward_batch(const Model& m, int l, float* x, const int32_t* pos, int n, const BatchSeq* seqs,
                   int n_seqs, Workspace& ws, const LayerTap* tap) {
  const ModelConfig& c = m.config();
  const LayerWeights& w = m.layer_weights(l);
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
  project_seqs({&w.wq, &w.wk, &w.wv}, ws.xn.data(), ws.qkv.data(),
               w.bqkv.empty() ? nullptr : w.bqkv.data(), ws, seqs, n_seqs);
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
    m.rope().apply_ref(q, n, QKV, c.n_head, pos);
    m.rope().apply_ref(k, n, QKV, c.n_head_kv, pos);
  } else {
    const Rope& rope = m.rope();
    if (ws.rope_id != rope.id() || ws.rope_pos.size() != (size_t)n ||
        !std::equal(pos, pos + n, ws.rope_pos.begin())) {
      rope.angle_table(pos, n, ws.rope_cos, ws.rope_sin);
      ws.rope_pos.assign(pos, pos + n);
      ws.rope_id = rope.id();
    }
    rope.apply_table(q, n, QKV, c.n_head, ws.rope_cos.data(), ws.rope_sin.data());
    rope.apply_table(k, n, QKV, c.n_head_kv, ws.rope_cos.data(), ws.rope_sin.data());
  }
  thread_local std::vector<cpu::AttnArgs> attn_args;
  attn_args.assign(n_seqs, cpu::AttnArgs{});
  for (int s = 0, row0 = 0; s < n_seqs; row0 += seqs[s].n, ++s) {
    const int ns = seqs[s].n;
    KVCache& kv = *seqs[s].kv;
    for (int i = row0; i < row0 + ns; ++i) {
      kv.store_row(l, pos[i], k + (size_t)i * QKV, v + (size_t)i * QKV);
    }
    cpu::AttnArgs& a = attn_args[s];
    a.q = q + (size_t)row0 * QKV;
    a.q_stride = QKV;
    a.q_pos = pos + row0;
    a.n_q = ns;
    a.k = kv.k_data(l);
    a.v = kv.v_data(l);
    a.kv_dtype = kv.dtype();
    a.n_head = c.n_head;
    a.n_kv_head = c.n_head_kv;
    a.head_dim = c.head_dim;
    a.out = ws.attn.data() + (size_t)row0 * Q;
    if (tap) {
      a.probs_accum = tap->probs_accum;
      a.probs_from_row = tap->probs_from_row;
    }
    if (ref) cpu::attention_ref(a);
  }
  // Every sequence's attention in one parallel region (one barrier per layer, not one per
  // sequence); each result is that of the sequence alone.
  if (!ref) cpu::attention(attn_args.data(), n_seqs);
  project_seqs({&w.wo}, ws.attn.data(), ws.proj.data(), nullptr, ws, seqs, n_seqs);
  for (size_t i = 0; i < (size_t)n * E; ++i) x[i] += ws.proj[i];

  rms(x, w.ffn_norm.data(), ws.xn.data(), n, E, c.rms_eps);
  project_seqs({&w.w_gate, &w.w_up}, ws.xn.data(), ws.gu.data(), nullptr, ws, seqs, n_seqs);
  if (ref) {
    for (int i = 0; i < n; ++i) {
      const float* g = ws.gu.data() + (size_t)i * 2 * F;
      cpu::silu_mul_ref(g, g + F, ws.h.data() + (size_t)i * F, F);
    }
  } else {
    cpu::silu_mul_rows(ws.gu.data(), n, F, ws.h.data());
  }
  // The decode rows' down projection prefetches their sequences' next-layer keys and values
  // (every cached row, which attention reads next): at several rows the product is compute-bound,
  // and attention, which streams each sequence's cache from memory, finds them in cache.
  ws.next_kv.clear();
  if (!ref && l + 1 < c.n_layer) {
    for (int s = 0, row0 = 0; s < n_seqs; row0 += seqs[s].n, ++s) {
      const KVCache& kv = *seqs[s].kv;
      if (!seqs[s].decode || l + 1 >= kv.n_layer()) continue;
      const size_t bytes = kv.row_bytes() * (size_t)(pos[row0 + seqs[s].n - 1] + 1);
      ws.next_kv.push_back({kv.k_data(l + 1), bytes});
      ws.next_kv.push_back({kv.v_data(l + 1), bytes});
    }
  }
  const cpu::SidePrefetch next{ws.next_kv.data(), (int)ws.next_kv.size()};
  project_seqs({&w.w_down}, ws.h.data(), ws.proj.data(), nullptr, ws, seqs, n_seqs, &next);
  for (size_t i = 0; i < (size_t)n * E; ++i) x[i] += ws.proj[i];
}

void logits(const Model& m, const float* x, int n, float* out, Workspace& ws) {
  const ModelConfig& c = m.config();
  ws.reserve(c, n);
  auto rms = ws.use_reference ? cpu::rms_norm_ref : cpu::rms_norm;
  rms(x, m.output_norm(), ws.xn.data(), n, c.n_embd, c.rms_eps);
  const cpu::QMatrix& head = m.output_matrix();
  if (n == 1 && !ws.use_reference) {
    cpu::qgemv(head, ws.xn.data(), out, ws.decode_path);
    return;
  }
  if (!ws.use_reference && quantised_prefill({&head}, ws)) {
    const cpu::QMatrix* hp = &head;
    cpu::qgemm(&hp, 1, ws.xn.data(), n, out, c.n_vocab, qgemm_path(ws));
    return;
  }
  // Otherwise the head, by far the largest matrix (n_vocab rows), is dequantised and multiplied in
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
        ggml_to_f32_ref(head.type, head.data + (size_t)r * head.row_bytes,
                        ws.wbuf.data() + (size_t)(r - r0) * E, E);
      }
    } else {
      cpu::qmatrix_to_f32(head, r0, r1, ws.wbuf.data());
    }
    matmul(ws.xn.data(), n, E, ws.wbuf.data(), r1 - r0, out + r0, nullptr, V);
  }
}

void decode_logits(const Model& m, const float* x, int n, float* out, Workspace& ws) {
  if (n == 1 || ws.use_reference) {
    logits(m, x, n, out, ws);
    return;
  }
  const ModelConfig& c = m.config();
  ws.reserve(c, n);
  cpu::rms_norm(x, m.output_norm(), ws.xn.data(), n, c.n_embd, c.rms_eps);
  const cpu::QMatrix* head = &m.output_matrix();
  for (int r0 = 0; r0 < n; r0 += cpu::kMaxBatchRows) {
    const int nr = std::min(cpu::kMaxBatchRows, n - r0);
    cpu::qgemv_batch(&head, 1, ws.xn.data() + (size_t)r0 * c.n_embd, nr,
                     out + (size_t)r0 * c.n_vocab, c.n_vocab, ws.decode_path);
  }
}

void decode_batch(const Model& m, const int32_t* tokens, KVCache* const* kvs, int n, Workspace& ws,
                  std::vector<float>& logits) {
  CT_THROW_IF_NOT(n > 0, "decode step needs at least one sequence");
  const int E = m.config().n_embd;
  std::vector<float> x((size_t)n * E);
  std::vector<int32_t> pos(n);
  std::vector<BatchSeq> seqs(n);
  for (int i = 0; i < n; ++i) {
    CT_THROW_IF_NOT(kvs[i]->n_pos < kvs[i]->n_ctx(),
                    "KV cache of sequence {} full at {} positions while decoding", i,
                    kvs[i]->n_ctx());
    pos[i] = kvs[i]->n_pos;
    seqs[i] = BatchSeq{kvs[i], 1, true};
  }
  m.embed(tokens, n, x.data());
  for (int l = 0; l < m.config().n_layer; ++l) {
    forward_batch(m, l, x.data(), pos.data(), n, seqs.data(), n, ws);
  }
  for (int i = 0; i < n; ++i) kvs[i]->n_pos = pos[i] + 1;
  logits.resize((size_t)n * m.config().n_vocab);
  decode_logits(m, x.data(), n, logits.data(), ws);
}

void rotate_placed_keys(const Model& m, KVCache& kv, int l, const int32_t* pos, int n,
                        const float* cos, const float* sin, std::vector<float>& scratch) {
  const int KV = kv.kv_dim(), n_head_kv = m.config().n_head_kv;
  if (kv.dtype() == KvDtype::F32) {
    m.rope().apply_at_positions(kv.k(l), KV, n_head_kv, pos, n, cos, sin);
    return;
  }
  scratch.resize((size_t)n * KV);
  for (int i = 0; i < n; ++i) kv.load_rows(l, pos[i], 1, scratch.data() + (size_t)i * KV, nullptr);
  rotate_and_store_keys(m, kv, l, pos, n, cos, sin, scratch.data());
}

void rotate_and_store_keys(const Model& m, KVCache& kv, int l, const int32_t* pos, int n,
                           const float* cos, const float* sin, float* keys) {
  const int KV = kv.kv_dim();
  // The F32 path's rotation (serial, the same angles) on the gathered rows 0..n-1.
  thread_local std::vector<int32_t> rows;
  if ((int)rows.size() < n) {
    rows.resize(n);
    std::iota(rows.begin(), rows.end(), 0);
  }
  m.rope().apply_at_positions(keys, KV, m.config().n_head_kv, rows.data(), n, cos, sin);
  for (int i = 0; i < n; ++i) kv.store_row(l, pos[i], keys + (size_t)i * KV, nullptr);
}

std::vector<float> prefill(const Model& m, const int32_t* tokens, int n, int pos0, KVCache& kv,
                           Workspace& ws, bool all_rows,
                           const std::function<void(int, int)>& progress) {
  CT_THROW_IF_NOT(n > 0, "prefill needs at least one token");
  CT_THROW_IF_NOT(pos0 + n <= kv.n_ctx(),
                  "prompt of {} tokens at position {} exceeds the {}-token cache", n, pos0,
                  kv.n_ctx());
  const int E = m.config().n_embd;
  std::vector<float> x((size_t)n * E);
  std::vector<int32_t> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = pos0 + i;
  m.embed(tokens, n, x.data());
  for (int l = 0; l < m.config().n_layer; ++l) {
    forward_layer(m, l, x.data(), pos.data(), n, kv, ws);
    if (progress) progress(l + 1, m.config().n_layer);
  }
  kv.n_pos = std::max(kv.n_pos, pos0 + n);
  std::vector<float> out((size_t)(all_rows ? n : 1) * m.config().n_vocab);
  if (all_rows) {
    logits(m, x.data(), n, out.data(), ws);
  } else {
    logits(m, x.data() + (size_t)(n - 1) * E, 1, out.data(), ws);
  }
  return out;
}

}  // namespace cpu
}  // namespace ct
