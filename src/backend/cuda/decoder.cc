// Decoder: weights on the device, cuBLAS FP32 GEMMs, and the kernels of kernels.cu; the same
// operation order as cpu::forward_layer on the CPU (see decoder.h).
#include "backend/cuda/decoder.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace ct::cuda {
struct Decoder::Impl {
  DecoderDims d;
  int n_ctx = 0;
  int n_seq = 1;
  int seq = 0;  // the selected slot
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;

  struct Layer {
    DeviceArray<float> attn_norm, wqkv, bqkv, wo, ffn_norm, w_gate_up, w_down;
    DeviceArray<float> k, v;  // F32 [n_seq][n_ctx][kv_dim]: the cache of this layer
  };
  std::vector<Layer> layers;
  DeviceArray<float> tok_embd, output, out_norm;

  int n_rows = 0, n_keys = 0;  // the batch begin() set up
  // The rows' places in the caches (slot * n_ctx + position), where layer() writes their K/V.
  DeviceArray<int32_t> cache_idx;
  // decode_batch's rows: their slots and positions (host); empty for a single-sequence pass.
  std::vector<int32_t> batch_seq, batch_pos;

  size_t slot_offset(int q) const { return static_cast<size_t>(q) * n_ctx * d.kv_dim(); }

  // Reused rows of the current request (set_reused_rows).
  RowType reuse_type = RowType::kF32;
  int reuse_n = 0;
  size_t reuse_bytes = 0;  // one layer's K (or V) rows
  DeviceArray<int32_t> reuse_pos;
  DeviceArray<float> reuse_cos, reuse_sin;
  DeviceArray<unsigned char> reuse_raw;  // [2][reuse_bytes]: K rows, then V rows
  // Pinned host staging, two layers deep; `done` marks the slot's copy to the device finished.
  struct PinnedSlot {
    void* k = nullptr;
    void* v = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
    bool pending = false;
  };
  PinnedSlot slots[2];
  // Scratch, grown to the largest batch.
  DeviceArray<int32_t> tokens, pos;
  DeviceArray<float> cos, sin, x, xn, qkv, attn, gu, h, scores, logits;
  DeviceArray<int32_t> keep_idx;  // keep_rows' indices
  DeviceArray<float> probs;       // F32 [n_keys]: one layer's attention tap

  ~Impl() {
    for (PinnedSlot& p : slots) {
      if (p.done != nullptr) cudaEventSynchronize(p.done), cudaEventDestroy(p.done);
      cudaFreeHost(p.k);
      cudaFreeHost(p.v);
    }
    if (blas != nullptr) cublasDestroy(blas);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // Host (pageable) to device on the decoder's stream, ordered with its kernels. From pageable
  // memory the call returns once the source has been staged, so the caller may reuse it.
  void to_device(void* dst, const void* src, size_t bytes, const char* what) {
    if (bytes == 0) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), what);
  }

  void upload(DeviceArray<float>& dst, const float* src, size_t n, const char* what) {
    CT_THROW_IF_NOT(src != nullptr, "cuda::Decoder: weight {} is null", what);
    dst.grow(n, what);
    to_device(dst.p, src, n * sizeof(float), what);
  }

  // y[n][out] = x[n][in] * W[out][in]^T + beta * y (row-major; column-major cuBLAS sees the
  // transposes: y^T = W * x^T).
  void gemm_wt(const float* x, int n, int in, const float* w, int out, float* y, float beta) {
    const float one = 1.0f;
    check(
        cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, in, x, in, &beta, y, out),
        "cublasSgemm");
  }

  // Device to host, rows of `cols` floats from a strided source (a column block of qkv).
  void rows_to_host(float* dst, const float* src, int src_stride, int n, int cols,
                    const char* what) {
    check(cudaMemcpy2DAsync(dst, cols * sizeof(float), src, src_stride * sizeof(float),
                            cols * sizeof(float), n, cudaMemcpyDeviceToHost, stream),
          what);
  }

  // Attention of rows [r0, r0 + n) (positions pos[r0..], the last at n_keys - 1) over the cache
  // at `off` in layer l, per KV head: its G query heads as one strided batch (the shared K and V
  // have stride 0), scores F32 [G][n][n_keys], causal softmax by position, then P * V into the
  // heads' columns of attn. tap: its probs_accum gets the rows >= probs_from_row (single pass).
  void attend(int l, int r0, int n, int n_keys, size_t off, const DecoderTap* tap) {
    const int Q = d.q_dim(), KV = d.kv_dim(), QKV = Q + 2 * KV;
    const int hd = d.head_dim, G = d.n_head / d.n_head_kv;
    const float* kc = layers[l].k.p + off;
    const float* vc = layers[l].v.p + off;
    const float* q = qkv.p + static_cast<size_t>(r0) * QKV;
    float* out = attn.p + static_cast<size_t>(r0) * Q;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd)), one = 1.0f, zero = 0.0f;
    const long long s_stride = static_cast<long long>(n) * n_keys;
    for (int g = 0; g < d.n_head_kv; ++g) {
      check(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, n_keys, n, hd, &scale,
                                      kc + static_cast<size_t>(g) * hd, KV, 0,
                                      q + static_cast<size_t>(g) * G * hd, QKV, hd, &zero,
                                      scores.p, n_keys, s_stride, G),
            "cublasSgemmStridedBatched(scores)");
      check(launch_causal_softmax(scores.p, G, n, n_keys, pos.p + r0, stream), "causal_softmax");
      if (tap) {
        check(launch_accum_probs(scores.p, G, n, n_keys, tap->probs_from_row,
                                 1.0f / static_cast<float>(d.n_head), probs.p, stream),
              "accum_probs");
      }
      check(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, n, n_keys, &one,
                                      vc + static_cast<size_t>(g) * hd, KV, 0, scores.p, n_keys,
                                      s_stride, &zero, out + static_cast<size_t>(g) * G * hd, Q,
                                      hd, G),
            "cublasSgemmStridedBatched(values)");
    }
  }

  // Uploads a pass's rows (tokens, positions, their cache places, rotations), grows the scratch
  // for n rows and scores of n_score_rows x n_keys per query head, and embeds the rows.
  void stage(const int32_t* toks, const int32_t* ps, const int32_t* places, int n, int n_score_rows,
             int keys, const float* cs, const float* sn) {
    const size_t E = d.n_embd, Q = d.q_dim(), KV = d.kv_dim(), F = d.n_ff;
    const size_t half = d.n_rot / 2;
    const size_t G = d.n_head / d.n_head_kv;
    // The previous batch's work must be done before its scratch is reused or reallocated.
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize(begin)");
    tokens.grow(n, "cudaMalloc(tokens)");
    pos.grow(n, "cudaMalloc(pos)");
    cache_idx.grow(n, "cudaMalloc(cache places)");
    cos.grow(n * half, "cudaMalloc(cos)");
    sin.grow(n * half, "cudaMalloc(sin)");
    x.grow(n * E, "cudaMalloc(x)");
    xn.grow(n * E, "cudaMalloc(xn)");
    qkv.grow(n * (Q + 2 * KV), "cudaMalloc(qkv)");
    attn.grow(n * Q, "cudaMalloc(attn)");
    gu.grow(n * 2 * F, "cudaMalloc(gu)");
    h.grow(n * F, "cudaMalloc(h)");
    scores.grow(G * n_score_rows * static_cast<size_t>(keys), "cudaMalloc(scores)");
    to_device(tokens.p, toks, n * sizeof(int32_t), "tokens");
    to_device(pos.p, ps, n * sizeof(int32_t), "positions");
    to_device(cache_idx.p, places, n * sizeof(int32_t), "cache places");
    to_device(cos.p, cs, n * half * sizeof(float), "cos");
    to_device(sin.p, sn, n * half * sizeof(float), "sin");
    check(launch_embed(tok_embd.p, tokens.p, n, d.n_embd, x.p, stream), "embed");
  }

  void layer(int l, int n, int n_keys, const DecoderTap* tap) {
    const int E = d.n_embd, Q = d.q_dim(), KV = d.kv_dim(), F = d.n_ff, QKV = Q + 2 * KV;
    const int hd = d.head_dim;
    Layer& w = layers[l];
    check(launch_rms_norm(x.p, w.attn_norm.p, xn.p, n, E, d.rms_eps, stream), "rms_norm");
    gemm_wt(xn.p, n, E, w.wqkv.p, QKV, qkv.p, 0.0f);
    if (w.bqkv.p != nullptr) check(launch_add_bias(qkv.p, w.bqkv.p, n, QKV, stream), "add_bias");
    // The taps read K before the rotation below, which the stream orders after the copy.
    if (tap && tap->k_pre_rope) rows_to_host(tap->k_pre_rope, qkv.p + Q, QKV, n, KV, "tap K");
    if (tap && tap->v) rows_to_host(tap->v, qkv.p + Q + KV, QKV, n, KV, "tap V");
    const bool tap_probs = tap && tap->probs_accum && tap->probs_from_row < n;
    if (tap_probs) {
      probs.grow(n_keys, "cudaMalloc(attention tap)");
      check(cudaMemsetAsync(probs.p, 0, n_keys * sizeof(float), stream), "cudaMemset(tap)");
    }
    const int half = d.n_rot / 2;
    check(launch_rope(qkv.p, n, QKV, d.n_head, hd, half, cos.p, sin.p, d.neox, stream), "rope q");
    check(launch_rope(qkv.p + Q, n, QKV, d.n_head_kv, hd, half, cos.p, sin.p, d.neox, stream),
          "rope k");
    check(launch_scatter_rows(qkv.p + Q, QKV, n, KV, cache_idx.p, w.k.p, stream), "scatter k");
    check(launch_scatter_rows(qkv.p + Q + KV, QKV, n, KV, cache_idx.p, w.v.p, stream),
          "scatter v");
    if (batch_seq.empty()) {
      attend(l, 0, n, n_keys, slot_offset(seq), tap_probs ? tap : nullptr);
    } else {
      // decode_batch: each row over its own slot's cache.
      for (int i = 0; i < n; ++i) {
        attend(l, i, 1, batch_pos[i] + 1, slot_offset(batch_seq[i]), nullptr);
      }
    }
    gemm_wt(attn.p, n, Q, w.wo.p, E, x.p, 1.0f);  // x += attn * Wo^T
    check(launch_rms_norm(x.p, w.ffn_norm.p, xn.p, n, E, d.rms_eps, stream), "rms_norm");
    gemm_wt(xn.p, n, E, w.w_gate_up.p, 2 * F, gu.p, 0.0f);
    check(launch_silu_mul(gu.p, n, F, h.p, stream), "silu_mul");
    gemm_wt(h.p, n, F, w.w_down.p, E, x.p, 1.0f);  // x += h * Wdown^T
    if (!tap) return;
    std::vector<float> host(tap_probs ? n_keys : 0);
    if (tap_probs) {
      check(cudaMemcpyAsync(host.data(), probs.p, n_keys * sizeof(float), cudaMemcpyDeviceToHost,
                            stream),
            "cudaMemcpyAsync(attention tap)");
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize(tap)");
    for (size_t j = 0; j < host.size(); ++j) tap->probs_accum[j] += host[j];
  }
};

Decoder::Decoder(const DecoderDims& dims, const DecoderWeights& w, int n_ctx, int n_seq)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.d = dims;
  s.n_ctx = n_ctx;
  s.n_seq = n_seq;
  CT_THROW_IF_NOT(dims.n_layer >= 1 && dims.n_embd >= 1 && dims.n_head >= 1 &&
                      dims.n_head_kv >= 1 && dims.n_head % dims.n_head_kv == 0 &&
                      dims.head_dim >= 1 && dims.n_ff >= 1 && dims.n_vocab >= 1 &&
                      dims.n_rot >= 2 && dims.n_rot % 2 == 0 && dims.n_rot <= dims.head_dim,
                  "cuda::Decoder: inconsistent dimensions (layers {}, embd {}, heads {}/{}, head "
                  "dim {}, rot {}, ff {}, vocab {})",
                  dims.n_layer, dims.n_embd, dims.n_head, dims.n_head_kv, dims.head_dim, dims.n_rot,
                  dims.n_ff, dims.n_vocab);
  CT_THROW_IF_NOT(n_ctx >= 1, "cuda::Decoder: n_ctx = {}; expected >= 1", n_ctx);
  CT_THROW_IF_NOT(n_seq >= 1 && static_cast<long long>(n_seq) * n_ctx <= INT32_MAX,
                  "cuda::Decoder: {} sequences of {} positions; expected 1 or more, at most 2^31 "
                  "positions in all",
                  n_seq, n_ctx);
  CT_THROW_IF_NOT(w.layers.size() == static_cast<size_t>(dims.n_layer),
                  "cuda::Decoder: {} layer weight sets for {} layers", w.layers.size(),
                  dims.n_layer);
  int n_dev = 0;
  CT_THROW_IF_NOT(cudaGetDeviceCount(&n_dev) == cudaSuccess && n_dev > 0,
                  "cuda::Decoder: no CUDA device is available");
  check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cublasCreate(&s.blas), "cublasCreate");
  check(cublasSetStream(s.blas, s.stream), "cublasSetStream");
  // Plain FP32 (no TF32 tensor-op rounding), so the results track the CPU backend's SGEMM.
  check(cublasSetMathMode(s.blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  const size_t E = dims.n_embd, Q = dims.q_dim(), KV = dims.kv_dim(), F = dims.n_ff;
  s.layers = std::vector<Impl::Layer>(dims.n_layer);
  for (int l = 0; l < dims.n_layer; ++l) {
    const DecoderLayerWeights& lw = w.layers[l];
    Impl::Layer& L = s.layers[l];
    s.upload(L.attn_norm, lw.attn_norm, E, "attn_norm");
    s.upload(L.wqkv, lw.wqkv, (Q + 2 * KV) * E, "wqkv");
    if (lw.bqkv != nullptr) s.upload(L.bqkv, lw.bqkv, Q + 2 * KV, "bqkv");
    s.upload(L.wo, lw.wo, E * Q, "wo");
    s.upload(L.ffn_norm, lw.ffn_norm, E, "ffn_norm");
    s.upload(L.w_gate_up, lw.w_gate_up, 2 * F * E, "w_gate_up");
    s.upload(L.w_down, lw.w_down, E * F, "w_down");
    const size_t cache = static_cast<size_t>(n_seq) * n_ctx * KV;
    L.k.grow(cache, "cudaMalloc(K cache)");
    L.v.grow(cache, "cudaMalloc(V cache)");
    check(cudaMemsetAsync(L.k.p, 0, cache * sizeof(float), s.stream), "cudaMemset(K cache)");
    check(cudaMemsetAsync(L.v.p, 0, cache * sizeof(float), s.stream), "cudaMemset(V cache)");
  }
  s.upload(s.tok_embd, w.tok_embd, static_cast<size_t>(dims.n_vocab) * E, "token_embd");
  if (w.output == w.tok_embd) {
    s.output.grow(0, "output");  // tied: forward() reads tok_embd
  } else {
    s.upload(s.output, w.output, static_cast<size_t>(dims.n_vocab) * E, "output");
  }
  s.upload(s.out_norm, w.out_norm, E, "output_norm");
  s.logits.grow(dims.n_vocab, "cudaMalloc(logits)");
  check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize(upload)");
}

Decoder::~Decoder() = default;

const DecoderDims& Decoder::dims() const { return impl_->d; }
int Decoder::n_ctx() const { return impl_->n_ctx; }
int Decoder::n_seq() const { return impl_->n_seq; }

void Decoder::select(int seq) {
  Impl& s = *impl_;
  CT_THROW_IF_NOT(seq >= 0 && seq < s.n_seq, "cuda::Decoder::select: slot {}; expected 0 to {}",
                  seq, s.n_seq - 1);
  s.seq = seq;
  s.n_rows = 0;  // a pass does not carry over to another slot
}

std::vector<float> Decoder::forward(const int32_t* tokens, const int32_t* pos, int n,
                                    const float* cos, const float* sin) {
  begin(tokens, pos, n, cos, sin);
  for (int l = 0; l < impl_->d.n_layer; ++l) layer(l);
  return finish();
}

void Decoder::begin(const int32_t* tokens, const int32_t* pos, int n, const float* cos,
                    const float* sin) {
  Impl& s = *impl_;
  const DecoderDims& d = s.d;
  CT_THROW_IF_NOT(n >= 1, "cuda::Decoder::begin: n = {}; expected >= 1", n);
  for (int i = 0; i < n; ++i) {
    CT_THROW_IF_NOT(pos[i] >= 0 && pos[i] < s.n_ctx && (i == 0 || pos[i] > pos[i - 1]),
                    "cuda::Decoder::begin: pos[{}] = {}; expected strictly increasing "
                    "positions in [0, {})",
                    i, pos[i], s.n_ctx);
    CT_THROW_IF_NOT(tokens[i] >= 0 && tokens[i] < d.n_vocab,
                    "cuda::Decoder::begin: token {} at row {}; expected an id below {}", tokens[i],
                    i, d.n_vocab);
  }
  s.batch_seq.clear();
  s.batch_pos.clear();
  s.n_rows = n;
  s.n_keys = pos[n - 1] + 1;
  std::vector<int32_t> places(n);
  for (int i = 0; i < n; ++i) places[i] = s.seq * s.n_ctx + pos[i];
  s.stage(tokens, pos, places.data(), n, n, s.n_keys, cos, sin);
}

void Decoder::set_reused_rows(RowType type, const int32_t* pos, int n, const float* cos,
                              const float* sin) {
  Impl& s = *impl_;
  CT_THROW_IF_NOT(n >= 0, "cuda::Decoder::set_reused_rows: n = {}; expected >= 0", n);
  for (int i = 0; i < n; ++i) {
    CT_THROW_IF_NOT(pos[i] < s.n_ctx,
                    "cuda::Decoder::set_reused_rows: pos[{}] = {}; expected a position below {}", i,
                    pos[i], s.n_ctx);
  }
  const size_t elem = type == RowType::kF32 ? 4 : 2;
  const size_t half = s.d.n_rot / 2;
  s.reuse_type = type;
  s.reuse_n = n;
  s.reuse_bytes = static_cast<size_t>(n) * s.d.kv_dim() * elem;
  if (n == 0) return;
  s.reuse_pos.grow(n, "cudaMalloc(reused positions)");
  s.reuse_cos.grow(n * half, "cudaMalloc(reused cos)");
  s.reuse_sin.grow(n * half, "cudaMalloc(reused sin)");
  s.reuse_raw.grow(2 * s.reuse_bytes, "cudaMalloc(reused rows)");
  s.to_device(s.reuse_pos.p, pos, n * sizeof(int32_t), "reused positions");
  s.to_device(s.reuse_cos.p, cos, n * half * sizeof(float), "reused cos");
  s.to_device(s.reuse_sin.p, sin, n * half * sizeof(float), "reused sin");
  for (Impl::PinnedSlot& p : s.slots) {
    if (p.done == nullptr) {
      check(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming), "cudaEventCreate");
    }
    if (p.pending) check(cudaEventSynchronize(p.done), "cudaEventSynchronize(staging)");
    p.pending = false;
    if (p.bytes >= s.reuse_bytes) continue;
    cudaFreeHost(p.k);
    cudaFreeHost(p.v);
    p.k = p.v = nullptr;
    p.bytes = 0;
    check(cudaMallocHost(&p.k, s.reuse_bytes), "cudaMallocHost(K staging)");
    check(cudaMallocHost(&p.v, s.reuse_bytes), "cudaMallocHost(V staging)");
    p.bytes = s.reuse_bytes;
  }
}

std::pair<void*, void*> Decoder::reused_staging(int l) {
  Impl& s = *impl_;
  CT_THROW_IF_NOT(s.reuse_n > 0, "cuda::Decoder::reused_staging: no reused rows set");
  Impl::PinnedSlot& p = s.slots[l & 1];
  if (p.pending) check(cudaEventSynchronize(p.done), "cudaEventSynchronize(staging)");
  p.pending = false;
  return {p.k, p.v};
}

void Decoder::write_reused(int l) {
  Impl& s = *impl_;
  CT_THROW_IF_NOT(l >= 0 && l < s.d.n_layer, "cuda::Decoder::write_reused: layer {} of {}", l,
                  s.d.n_layer);
  if (s.reuse_n == 0) return;
  Impl::PinnedSlot& p = s.slots[l & 1];
  unsigned char* raw_k = s.reuse_raw.p;
  unsigned char* raw_v = s.reuse_raw.p + s.reuse_bytes;
  check(cudaMemcpyAsync(raw_k, p.k, s.reuse_bytes, cudaMemcpyHostToDevice, s.stream),
        "cudaMemcpyAsync(reused K rows)");
  check(cudaMemcpyAsync(raw_v, p.v, s.reuse_bytes, cudaMemcpyHostToDevice, s.stream),
        "cudaMemcpyAsync(reused V rows)");
  check(cudaEventRecord(p.done, s.stream), "cudaEventRecord(staging)");
  p.pending = true;
  check(launch_unpack_reused(raw_k, raw_v, static_cast<int>(s.reuse_type), s.reuse_pos.p,
                             s.reuse_cos.p, s.reuse_sin.p, s.reuse_n, s.d.n_head_kv, s.d.head_dim,
                             s.d.n_rot / 2, s.d.neox, s.layers[l].k.p + s.slot_offset(s.seq),
                             s.layers[l].v.p + s.slot_offset(s.seq), s.stream),
        "unpack_reused launch");
}

void Decoder::layer(int l, const DecoderTap* tap) {
  Impl& s = *impl_;
  CT_THROW_IF_NOT(s.n_rows > 0, "cuda::Decoder::layer: begin() first");
  CT_THROW_IF_NOT(l >= 0 && l < s.d.n_layer, "cuda::Decoder::layer: layer {} of {}", l,
                  s.d.n_layer);
  s.layer(l, s.n_rows, s.n_keys, tap);
}

void Decoder::keep_rows(const int32_t* idx, int n, const int32_t* pos, const float* cos,
                        const float* sin) {
  Impl& s = *impl_;
  CT_THROW_IF_NOT(s.n_rows > 0, "cuda::Decoder::keep_rows: begin() first");
  CT_THROW_IF_NOT(n >= 1 && n <= s.n_rows,
                  "cuda::Decoder::keep_rows: {} rows of {}; expected 1 to {}", n, s.n_rows,
                  s.n_rows);
  for (int i = 0; i < n; ++i) {
    CT_THROW_IF_NOT(idx[i] >= 0 && idx[i] < s.n_rows && (i == 0 || idx[i] > idx[i - 1]),
                    "cuda::Decoder::keep_rows: idx[{}] = {}; expected strictly increasing "
                    "indices below {}",
                    i, idx[i], s.n_rows);
    CT_THROW_IF_NOT(pos[i] >= 0 && pos[i] < s.n_ctx && (i == 0 || pos[i] > pos[i - 1]),
                    "cuda::Decoder::keep_rows: pos[{}] = {}; expected strictly increasing "
                    "positions in [0, {})",
                    i, pos[i], s.n_ctx);
  }
  // Kept rows attend over at most the keys the scores buffer was sized for in begin().
  CT_THROW_IF_NOT(pos[n - 1] < s.n_keys,
                  "cuda::Decoder::keep_rows: last position {} beyond the pass's {} keys",
                  pos[n - 1], s.n_keys);
  const size_t E = s.d.n_embd, half = s.d.n_rot / 2;
  s.keep_idx.grow(n, "cudaMalloc(kept rows)");
  s.to_device(s.keep_idx.p, idx, n * sizeof(int32_t), "kept rows");
  // xn is free between layers (each layer writes it before reading it) and holds n_rows rows.
  check(launch_gather_rows(s.x.p, n, static_cast<int>(E), s.keep_idx.p, s.xn.p, s.stream),
        "gather_rows");
  check(cudaMemcpyAsync(s.x.p, s.xn.p, n * E * sizeof(float), cudaMemcpyDeviceToDevice, s.stream),
        "cudaMemcpyAsync(kept rows)");
  std::vector<int32_t> places(n);
  for (int i = 0; i < n; ++i) places[i] = s.seq * s.n_ctx + pos[i];
  s.to_device(s.pos.p, pos, n * sizeof(int32_t), "positions");
  s.to_device(s.cache_idx.p, places.data(), n * sizeof(int32_t), "cache places");
  s.to_device(s.cos.p, cos, n * half * sizeof(float), "cos");
  s.to_device(s.sin.p, sin, n * half * sizeof(float), "sin");
  s.n_rows = n;
  s.n_keys = pos[n - 1] + 1;
}

void Decoder::project_kv(int l, float* k, float* v) {
  Impl& s = *impl_;
  CT_THROW_IF_NOT(s.n_rows > 0, "cuda::Decoder::project_kv: begin() first");
  CT_THROW_IF_NOT(l >= 0 && l < s.d.n_layer, "cuda::Decoder::project_kv: layer {} of {}", l,
                  s.d.n_layer);
  const DecoderDims& d = s.d;
  const int n = s.n_rows, E = d.n_embd, Q = d.q_dim(), KV = d.kv_dim(), QKV = Q + 2 * KV;
  Impl::Layer& w = s.layers[l];
  // The start of layer(): xn and qkv are scratch that every layer writes before it reads them.
  check(launch_rms_norm(s.x.p, w.attn_norm.p, s.xn.p, n, E, d.rms_eps, s.stream), "rms_norm");
  s.gemm_wt(s.xn.p, n, E, w.wqkv.p, QKV, s.qkv.p, 0.0f);
  if (w.bqkv.p != nullptr)
    check(launch_add_bias(s.qkv.p, w.bqkv.p, n, QKV, s.stream), "add_bias");
  s.rows_to_host(k, s.qkv.p + Q, QKV, n, KV, "project_kv K");
  s.rows_to_host(v, s.qkv.p + Q + KV, QKV, n, KV, "project_kv V");
  check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize(project_kv)");
}

std::vector<float> Decoder::finish() {
  Impl& s = *impl_;
  const DecoderDims& d = s.d;
  CT_THROW_IF_NOT(s.n_rows > 0, "cuda::Decoder::finish: begin() first");
  // Output norm and head on the last row only.
  const float* last = s.x.p + static_cast<size_t>(s.n_rows - 1) * d.n_embd;
  check(launch_rms_norm(last, s.out_norm.p, s.xn.p, 1, d.n_embd, d.rms_eps, s.stream), "rms_norm");
  s.gemm_wt(s.xn.p, 1, d.n_embd, s.output.p != nullptr ? s.output.p : s.tok_embd.p, d.n_vocab,
            s.logits.p, 0.0f);
  std::vector<float> out(d.n_vocab);
  check(cudaMemcpyAsync(out.data(), s.logits.p, out.size() * sizeof(float), cudaMemcpyDeviceToHost,
                        s.stream),
        "cudaMemcpyAsync(logits)");
  check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize(finish)");
  return out;
}

std::vector<float> Decoder::decode_batch(const int32_t* tokens, const int32_t* pos,
                                         const int32_t* seqs, int n, const float* cos,
                                         const float* sin) {
  Impl& s = *impl_;
  const DecoderDims& d = s.d;
  CT_THROW_IF_NOT(n >= 1 && n <= s.n_seq, "cuda::Decoder::decode_batch: {} rows; expected 1 to {}",
                  n, s.n_seq);
  std::vector<char> taken(s.n_seq, 0);
  int max_keys = 0;
  std::vector<int32_t> places(n);
  for (int i = 0; i < n; ++i) {
    CT_THROW_IF_NOT(seqs[i] >= 0 && seqs[i] < s.n_seq && !taken[seqs[i]],
                    "cuda::Decoder::decode_batch: row {} has slot {}; expected distinct slots "
                    "below {}",
                    i, seqs[i], s.n_seq);
    taken[seqs[i]] = 1;
    CT_THROW_IF_NOT(pos[i] >= 0 && pos[i] < s.n_ctx,
                    "cuda::Decoder::decode_batch: pos[{}] = {}; expected a position below {}", i,
                    pos[i], s.n_ctx);
    CT_THROW_IF_NOT(tokens[i] >= 0 && tokens[i] < d.n_vocab,
                    "cuda::Decoder::decode_batch: token {} at row {}; expected an id below {}",
                    tokens[i], i, d.n_vocab);
    max_keys = std::max(max_keys, pos[i] + 1);
    places[i] = seqs[i] * s.n_ctx + pos[i];
  }
  // One row's scores at a time (attend per row, in stream order), so [G][1][max_keys].
  s.stage(tokens, pos, places.data(), n, 1, max_keys, cos, sin);
  s.batch_seq.assign(seqs, seqs + n);
  s.batch_pos.assign(pos, pos + n);
  s.n_rows = 0;  // not a pass finish() or keep_rows() could continue
  try {
    for (int l = 0; l < d.n_layer; ++l) s.layer(l, n, max_keys, nullptr);
  } catch (...) {
    s.batch_seq.clear();
    s.batch_pos.clear();
    throw;
  }
  s.batch_seq.clear();
  s.batch_pos.clear();
  // Output norm and head on every row.
  s.logits.grow(static_cast<size_t>(n) * d.n_vocab, "cudaMalloc(logits)");
  check(launch_rms_norm(s.x.p, s.out_norm.p, s.xn.p, n, d.n_embd, d.rms_eps, s.stream), "rms_norm");
  s.gemm_wt(s.xn.p, n, d.n_embd, s.output.p != nullptr ? s.output.p : s.tok_embd.p, d.n_vocab,
            s.logits.p, 0.0f);
  std::vector<float> out(static_cast<size_t>(n) * d.n_vocab);
  check(cudaMemcpyAsync(out.data(), s.logits.p, out.size() * sizeof(float), cudaMemcpyDeviceToHost,
                        s.stream),
        "cudaMemcpyAsync(logits)");
  check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize(decode_batch)");
  return out;
}

void Decoder::read_kv(int l, int n_pos, float* k, float* v) const {
  const Impl& s = *impl_;
  CT_THROW_IF_NOT(l >= 0 && l < s.d.n_layer && n_pos >= 0 && n_pos <= s.n_ctx,
                  "cuda::Decoder::read_kv: layer {} rows {}; expected layer < {}, rows <= {}", l,
                  n_pos, s.d.n_layer, s.n_ctx);
  const size_t bytes = static_cast<size_t>(n_pos) * s.d.kv_dim() * sizeof(float);
  check(cudaMemcpyAsync(k, s.layers[l].k.p + s.slot_offset(s.seq), bytes, cudaMemcpyDeviceToHost,
                        s.stream),
        "cudaMemcpyAsync(K)");
  check(cudaMemcpyAsync(v, s.layers[l].v.p + s.slot_offset(s.seq), bytes, cudaMemcpyDeviceToHost,
                        s.stream),
        "cudaMemcpyAsync(V)");
  check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize(read_kv)");
}

}  // namespace ct::cuda
