// Kernel launchers compiled by nvcc (kernels.cu), called from band_norms.cc. Plain C++ types
// plus cudaStream_t/cudaError_t, so the caller needs only the CUDA runtime header. Each returns
// the launch's error status.
#pragma once

#include <cuda_runtime.h>

namespace ct::cuda {

// dst: F32 [cols][rows] <- src: F32 [rows][cols] (row-major both).
cudaError_t launch_transpose(const float* src, int rows, int cols, float* dst, cudaStream_t stream);

// Zeroes bins [0, lo) and [hi, n_bins) of each of n_seq spectra laid out C64 [n_seq][n_bins].
cudaError_t launch_band_mask(float2* spec, int n_seq, int n_bins, int lo, int hi,
                             cudaStream_t stream);

// mag[m][t] = scale * sqrt(sum over c < kv_dim of y[m * kv_dim + c][t]^2) for the channel-major
// y: F32 [n_mat * kv_dim][n_tok]; mag: F32 [n_mat][n_tok].
cudaError_t launch_channel_norms(const float* y, int n_tok, int n_mat, int kv_dim, float scale,
                                 float* mag, cudaStream_t stream);

}  // namespace ct::cuda
