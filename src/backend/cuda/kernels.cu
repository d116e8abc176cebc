// Kernels of the GPU frequency ranking (see band_norms.h): layout transpose, band mask, norms.
#include <cuda_fp16.h>

#include "backend/cuda/kernels.h"

namespace ct::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kTileRows = 8;

// 32 x 32 tiles through shared memory so both the read and the write are coalesced; the extra
// column avoids shared-memory bank conflicts on the transposed read.
__global__ void transpose_tiles(const float* __restrict__ src, int rows, int cols,
                                float* __restrict__ dst) {
  __shared__ float tile[kTile][kTile + 1];
  const int c0 = blockIdx.x * kTile, r0 = blockIdx.y * kTile;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = src[static_cast<size_t>(r) * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[static_cast<size_t>(c) * rows + r] = tile[threadIdx.x][i];
  }
}

__global__ void band_mask(float2* __restrict__ spec, int n_seq, int n_bins, int lo, int hi) {
  const int drop = lo + (n_bins - hi);  // bins zeroed per sequence
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(n_seq) * drop) return;
  const int seq = static_cast<int>(i / drop), j = static_cast<int>(i % drop);
  const int bin = j < lo ? j : hi + (j - lo);
  spec[static_cast<size_t>(seq) * n_bins + bin] = make_float2(0.0f, 0.0f);
}

// One thread per (token, matrix); neighbouring threads take neighbouring tokens, so every
// channel's read is coalesced.
__global__ void channel_norms(const float* __restrict__ y, int n_tok, int n_mat, int kv_dim,
                              float scale, float* __restrict__ mag) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int m = blockIdx.y;
  if (t >= n_tok) return;
  const float* base = y + static_cast<size_t>(m) * kv_dim * n_tok + t;
  float acc = 0.0f;
  for (int c = 0; c < kv_dim; ++c) {
    const float v = base[static_cast<size_t>(c) * n_tok];
    acc += v * v;
  }
  mag[static_cast<size_t>(m) * n_tok + t] = sqrtf(acc) * scale;
}

// ---- decoder kernels ---------------------------------------------------------------------------

constexpr int kBlock = 256;

unsigned blocks_for(size_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

__global__ void embed_rows(const float* __restrict__ table, const int32_t* __restrict__ tokens,
                           int n, int dim, float* __restrict__ x) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(n) * dim) return;
  const int r = static_cast<int>(i / dim), c = static_cast<int>(i % dim);
  x[i] = table[static_cast<size_t>(tokens[r]) * dim + c];
}

// Sum over a block of kBlock threads; every thread gets the total.
__device__ float block_sum(float v, float* scratch) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kBlock / 32; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

__device__ float block_max(float v, float* scratch) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < kBlock / 32; ++w) m = fmaxf(m, scratch[w]);
  __syncthreads();
  return m;
}

__global__ void rms_norm_rows(const float* __restrict__ x, const float* __restrict__ w,
                              float* __restrict__ y, int dim, float eps) {
  __shared__ float scratch[kBlock / 32];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * dim;
  float* yr = y + static_cast<size_t>(blockIdx.x) * dim;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < dim; j += kBlock) ss += xr[j] * xr[j];
  ss = block_sum(ss, scratch);
  const float s = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  for (int j = threadIdx.x; j < dim; j += kBlock) yr[j] = xr[j] * s * w[j];
}

__global__ void add_bias_rows(float* __restrict__ y, const float* __restrict__ b, int n, int cols) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < static_cast<size_t>(n) * cols) y[i] += b[i % cols];
}

__global__ void rope_rows(float* __restrict__ x, int n, int stride, int n_heads, int head_dim,
                          int half, const float* __restrict__ cs, const float* __restrict__ sn,
                          bool neox) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(n) * n_heads * half) return;
  const int p = static_cast<int>(i % half);
  const int h = static_cast<int>((i / half) % n_heads);
  const int r = static_cast<int>(i / (static_cast<size_t>(half) * n_heads));
  float* hd = x + static_cast<size_t>(r) * stride + static_cast<size_t>(h) * head_dim;
  const int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
  const float c = cs[static_cast<size_t>(r) * half + p], s = sn[static_cast<size_t>(r) * half + p];
  const float x0 = hd[a], x1 = hd[b];
  hd[a] = x0 * c - x1 * s;
  hd[b] = x0 * s + x1 * c;
}

__global__ void scatter_rows(const float* __restrict__ src, int src_stride, int n, int cols,
                             const int32_t* __restrict__ pos, float* __restrict__ dst) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(n) * cols) return;
  const int r = static_cast<int>(i / cols), c = static_cast<int>(i % cols);
  dst[static_cast<size_t>(pos[r]) * cols + c] = src[static_cast<size_t>(r) * src_stride + c];
}

__global__ void gather_rows(const float* __restrict__ src, int n, int cols,
                            const int32_t* __restrict__ idx, float* __restrict__ dst) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(n) * cols) return;
  const int r = static_cast<int>(i / cols), c = static_cast<int>(i % cols);
  dst[i] = src[static_cast<size_t>(idx[r]) * cols + c];
}

// One thread per key: the column sum over the tapped rows of every matrix, so each key's total
// is added in one fixed order (no atomics: the same sums on every run).
__global__ void accum_probs_cols(const float* __restrict__ s, int n_mat, int n, int n_keys,
                                 int row0, float weight, float* __restrict__ accum) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n_keys) return;
  float acc = 0.0f;
  for (int m = 0; m < n_mat; ++m) {
    const float* col = s + static_cast<size_t>(m) * n * n_keys + j;
    for (int r = row0; r < n; ++r) acc += col[static_cast<size_t>(r) * n_keys];
  }
  accum[j] += acc * weight;
}

__global__ void causal_softmax_rows(float* __restrict__ s, int n, int n_keys,
                                    const int32_t* __restrict__ pos) {
  __shared__ float scratch[kBlock / 32];
  const int row = blockIdx.x;  // over n_mat * n
  float* sr = s + static_cast<size_t>(row) * n_keys;
  const int last = pos[row % n];  // keys [0, last] are visible
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= last; j += kBlock) m = fmaxf(m, sr[j]);
  m = block_max(m, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= last; j += kBlock) {
    const float e = expf(sr[j] - m);
    sr[j] = e;
    sum += e;
  }
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < n_keys; j += kBlock) sr[j] = j <= last ? sr[j] * inv : 0.0f;
}

__global__ void silu_mul_rows(const float* __restrict__ gu, int n, int n_ff,
                              float* __restrict__ h) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(n) * n_ff) return;
  const size_t r = i / n_ff, j = i % n_ff;
  const float g = gu[r * 2 * n_ff + j], u = gu[r * 2 * n_ff + n_ff + j];
  h[i] = g / (1.0f + expf(-g)) * u;
}

__device__ float load_elem(const void* base, int type, size_t i) {
  if (type == 0) return static_cast<const float*>(base)[i];
  const unsigned short bits = static_cast<const unsigned short*>(base)[i];
  if (type == 1) return __half2float(__ushort_as_half(bits));
  return __uint_as_float(static_cast<unsigned int>(bits) << 16);  // BF16: the top half of an F32
}

// One thread per (row, channel) of the kv_dim channels: V is copied; K channel d of head h is
// combined with its RoPE partner.
__global__ void unpack_reused(const void* __restrict__ raw_k, const void* __restrict__ raw_v,
                              int type, const int32_t* __restrict__ pos,
                              const float* __restrict__ cs, const float* __restrict__ sn, int n,
                              int n_head_kv, int head_dim, int half, bool neox,
                              float* __restrict__ kc, float* __restrict__ vc) {
  const int kv_dim = n_head_kv * head_dim;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(n) * kv_dim) return;
  const int r = static_cast<int>(i / kv_dim), ch = static_cast<int>(i % kv_dim);
  const int p = pos[r];
  if (p < 0) return;
  const size_t dst = static_cast<size_t>(p) * kv_dim + ch;
  vc[dst] = load_elem(raw_v, type, i);
  const int d = ch % head_dim;  // channel within its head
  const size_t head0 = i - d;
  float out;
  if (d >= 2 * half) {
    out = load_elem(raw_k, type, i);
  } else {
    // The pair (a, b) this channel belongs to and its frequency index q.
    const int q = neox ? (d < half ? d : d - half) : d / 2;
    const int a = neox ? q : 2 * q, b = neox ? q + half : 2 * q + 1;
    const float x0 = load_elem(raw_k, type, head0 + a), x1 = load_elem(raw_k, type, head0 + b);
    const float c = cs[static_cast<size_t>(r) * half + q],
                s = sn[static_cast<size_t>(r) * half + q];
    out = d == a ? x0 * c - x1 * s : x0 * s + x1 * c;
  }
  kc[dst] = out;
}

}  // namespace

cudaError_t launch_unpack_reused(const void* raw_k, const void* raw_v, int type, const int32_t* pos,
                                 const float* cos, const float* sin, int n, int n_head_kv,
                                 int head_dim, int half, bool neox, float* kc, float* vc,
                                 cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n) * n_head_kv * head_dim;
  if (total == 0) return cudaSuccess;
  unpack_reused<<<blocks_for(total), kBlock, 0, stream>>>(raw_k, raw_v, type, pos, cos, sin, n,
                                                          n_head_kv, head_dim, half, neox, kc, vc);
  return cudaGetLastError();
}

cudaError_t launch_embed(const float* table, const int32_t* tokens, int n, int dim, float* x,
                         cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n) * dim;
  if (total == 0) return cudaSuccess;
  embed_rows<<<blocks_for(total), kBlock, 0, stream>>>(table, tokens, n, dim, x);
  return cudaGetLastError();
}

cudaError_t launch_rms_norm(const float* x, const float* w, float* y, int n, int dim, float eps,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  rms_norm_rows<<<n, kBlock, 0, stream>>>(x, w, y, dim, eps);
  return cudaGetLastError();
}

cudaError_t launch_add_bias(float* y, const float* b, int n, int cols, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n) * cols;
  if (total == 0) return cudaSuccess;
  add_bias_rows<<<blocks_for(total), kBlock, 0, stream>>>(y, b, n, cols);
  return cudaGetLastError();
}

cudaError_t launch_rope(float* x, int n, int stride, int n_heads, int head_dim, int half,
                        const float* cos, const float* sin, bool neox, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n) * n_heads * half;
  if (total == 0) return cudaSuccess;
  rope_rows<<<blocks_for(total), kBlock, 0, stream>>>(x, n, stride, n_heads, head_dim, half, cos,
                                                      sin, neox);
  return cudaGetLastError();
}

cudaError_t launch_scatter_rows(const float* src, int src_stride, int n, int cols,
                                const int32_t* pos, float* dst, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n) * cols;
  if (total == 0) return cudaSuccess;
  scatter_rows<<<blocks_for(total), kBlock, 0, stream>>>(src, src_stride, n, cols, pos, dst);
  return cudaGetLastError();
}

cudaError_t launch_causal_softmax(float* s, int n_mat, int n, int n_keys, const int32_t* pos,
                                  cudaStream_t stream) {
  if (n_mat == 0 || n == 0) return cudaSuccess;
  causal_softmax_rows<<<n_mat * n, kBlock, 0, stream>>>(s, n, n_keys, pos);
  return cudaGetLastError();
}

cudaError_t launch_gather_rows(const float* src, int n, int cols, const int32_t* idx, float* dst,
                               cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n) * cols;
  if (total == 0) return cudaSuccess;
  gather_rows<<<blocks_for(total), kBlock, 0, stream>>>(src, n, cols, idx, dst);
  return cudaGetLastError();
}

cudaError_t launch_accum_probs(const float* s, int n_mat, int n, int n_keys, int row0,
                               float weight, float* accum, cudaStream_t stream) {
  if (n_mat == 0 || n_keys == 0 || row0 >= n) return cudaSuccess;
  accum_probs_cols<<<blocks_for(static_cast<size_t>(n_keys)), kBlock, 0, stream>>>(
      s, n_mat, n, n_keys, row0 < 0 ? 0 : row0, weight, accum);
  return cudaGetLastError();
}

cudaError_t launch_silu_mul(const float* gu, int n, int n_ff, float* h, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n) * n_ff;
  if (total == 0) return cudaSuccess;
  silu_mul_rows<<<blocks_for(total), kBlock, 0, stream>>>(gu, n, n_ff, h);
  return cudaGetLastError();
}

cudaError_t launch_transpose(const float* src, int rows, int cols, float* dst,
                             cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile);
  transpose_tiles<<<grid, dim3(kTile, kTileRows), 0, stream>>>(src, rows, cols, dst);
  return cudaGetLastError();
}

cudaError_t launch_band_mask(float2* spec, int n_seq, int n_bins, int lo, int hi,
                             cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n_seq) * (lo + (n_bins - hi));
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  band_mask<<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      spec, n_seq, n_bins, lo, hi);
  return cudaGetLastError();
}

cudaError_t launch_channel_norms(const float* y, int n_tok, int n_mat, int kv_dim, float scale,
                                 float* mag, cudaStream_t stream) {
  if (n_tok == 0 || n_mat == 0) return cudaSuccess;
  constexpr int kThreads = 128;
  const dim3 grid((n_tok + kThreads - 1) / kThreads, n_mat);
  channel_norms<<<grid, kThreads, 0, stream>>>(y, n_tok, n_mat, kv_dim, scale, mag);
  return cudaGetLastError();
}

}  // namespace ct::cuda
