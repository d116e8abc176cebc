// Kernel launchers compiled by nvcc (kernels.cu), called from band_norms.cc. Plain C++ types
// plus cudaStream_t/cudaError_t, so the caller needs only the CUDA runtime header. Each returns
// the launch's error status.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

// ---- decoder (decoder.cc) -------------------------------------------------------------------
// All matrices row-major; n rows of the current batch.

// x[i][:] = table[tokens[i]][:] for x: F32 [n][dim], table: F32 [n_vocab][dim].
cudaError_t launch_embed(const float* table, const int32_t* tokens, int n, int dim, float* x,
                         cudaStream_t stream);

// y[i][j] = x[i][j] / sqrt(mean_j x[i][j]^2 + eps) * w[j]; x, y: F32 [n][dim].
cudaError_t launch_rms_norm(const float* x, const float* w, float* y, int n, int dim, float eps,
                            cudaStream_t stream);

// y[i][j] += b[j] for y: F32 [n][cols].
cudaError_t launch_add_bias(float* y, const float* b, int n, int cols, cudaStream_t stream);

// Rotates heads [0, n_heads) of rows x (row stride `stride`, head h at h * head_dim) with
// cos/sin: F32 [n][half] (half = n_rot / 2). neox: pairs (i, i + half), else (2i, 2i + 1).
cudaError_t launch_rope(float* x, int n, int stride, int n_heads, int head_dim, int half,
                        const float* cos, const float* sin, bool neox, cudaStream_t stream);

// dst[pos[i]][:] = src[i][:] (cols floats; src row stride src_stride, dst row stride cols).
cudaError_t launch_scatter_rows(const float* src, int src_stride, int n, int cols,
                                const int32_t* pos, float* dst, cudaStream_t stream);

// In place, for each of n_mat * n rows of s: F32 [n_mat][n][n_keys]: softmax over keys
// [0, pos[i]] of row i, zeros beyond (causal mask by global position).
cudaError_t launch_causal_softmax(float* s, int n_mat, int n, int n_keys, const int32_t* pos,
                                  cudaStream_t stream);

// Reused rows: row r of raw_k / raw_v (n rows of kv_dim elements of type 0 F32, 1 F16, 2 BF16)
// goes to cache row pos[r] of kc / vc (F32 [n_ctx][kv_dim]) unless pos[r] < 0; keys are rotated
// with cos/sin: F32 [n][half] (pairs as launch_rope; dims >= 2 * half copied unrotated).
cudaError_t launch_unpack_reused(const void* raw_k, const void* raw_v, int type, const int32_t* pos,
                                 const float* cos, const float* sin, int n, int n_head_kv,
                                 int head_dim, int half, bool neox, float* kc, float* vc,
                                 cudaStream_t stream);

// dst[i][:] = src[idx[i]][:] for i < n (cols floats per row; src and dst must not overlap).
cudaError_t launch_gather_rows(const float* src, int n, int cols, const int32_t* idx, float* dst,
                               cudaStream_t stream);

// The attention tap: accum[j] += weight * sum over m < n_mat and rows r in [row0, n) of
// s[m][r][j], for s: F32 [n_mat][n][n_keys] (softmaxed scores, zero beyond each row's position)
// and accum: F32 [n_keys].
cudaError_t launch_accum_probs(const float* s, int n_mat, int n, int n_keys, int row0,
                               float weight, float* accum, cudaStream_t stream);

// h[i][j] = silu(gu[i][j]) * gu[i][n_ff + j] for gu: F32 [n][2 * n_ff], h: F32 [n][n_ff].
cudaError_t launch_silu_mul(const float* gu, int n, int n_ff, float* h, cudaStream_t stream);

}  // namespace ct::cuda
