// GPU path of the frequency ranking's heavy part (paper Sec. 4.1, App. B.1): band-limit every
// channel of many [n_tok][kv_dim] matrices along the token axis with cuFFT and take each token's
// L2 norm over the channels. The scoring that turns these norms into a ranking stays in
// reuse/freq_rank.cc, shared with the CPU path. This header has no CUDA types, so the layers
// above compile with the plain C++ compiler. In a build without CUDA (backend/registry.cc) the
// constructor throws the "no CUDA backend" error and device_count() is 0.
#pragma once

#include <memory>
#include <vector>

namespace ct::cuda {

// Number of CUDA devices this process can use; 0 when there is none or no driver. Never throws.
int device_count();

// Device buffers and cuFFT plans for one shape: n_mat matrices of F32 [n_tok][kv_dim]. On the
// device they are stored channel-major, X: F32 [n_mat * kv_dim][n_tok], so one batched plan
// transforms every channel of every matrix as a contiguous sequence and the norm kernel reads
// neighbouring tokens from neighbouring addresses. (Packing them token-major side by side and
// transforming with stride n_mat * kv_dim measured 1.9 ms for 60 x 192 x 3,000 on an H200:
// bench/results/gpu/rank_v1_token_major.)
// Not thread-safe: one BandNorms per thread, or a lock around it. Throws ct::Error naming the
// failing CUDA/cuFFT call (out of device memory, no device).
class BandNorms {
 public:
  BandNorms(int n_mat, int n_tok, int kv_dim);
  ~BandNorms();
  BandNorms(const BandNorms&) = delete;
  BandNorms& operator=(const BandNorms&) = delete;

  int n_mat() const;
  int n_tok() const;
  int kv_dim() const;

  // Copies the matrices (n_mat host pointers, each F32 [n_tok][kv_dim] row-major) into X.
  void upload(const std::vector<const float*>& mats);

  // Norms of the uploaded matrices (X itself is left unchanged, so run can repeat).
  // filter = true: rFFT of each channel, bins outside [lo, hi) of n_tok/2+1 zeroed, inverse rFFT
  // divided by n_tok, then norms. filter = false: norms of X as it is (lo and hi ignored).
  // Returns F32 [n_mat][n_tok]: out[m][t] = L2 norm over channels of row t of matrix m.
  std::vector<float> run(bool filter, int lo, int hi);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ct::cuda
