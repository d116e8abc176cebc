// Kernels of the GPU frequency ranking (see band_norms.h): layout transpose, band mask, norms.
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

}  // namespace

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
