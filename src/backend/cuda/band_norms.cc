// BandNorms: device buffers, cuFFT plans and the run sequence (see band_norms.h).
#include "backend/cuda/band_norms.h"

#include <cuda_runtime.h>
#include <cufft.h>

#include <cstdint>
#include <limits>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace ct::cuda {
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device / no driver" status
    return 0;
  }
  return n;
}

struct BandNorms::Impl {
  int n_mat = 0, n_tok = 0, kv_dim = 0;
  size_t width = 0;  // n_mat * kv_dim: sequences per transform, and the packed row length
  cudaStream_t stream = nullptr;
  cufftHandle r2c = 0, c2r = 0;
  bool have_plans = false;
  DeviceArray<float> x;            // F32 [width][n_tok]: the uploaded matrices, channel-major
  DeviceArray<float> y;            // F32 [width][n_tok]: band-limited x (times n_tok); also the
                                   // token-major staging area [n_tok][width] during upload
  DeviceArray<cufftComplex> spec;  // C64 [width][n_tok/2+1]
  DeviceArray<float> mag;          // F32 [n_mat][n_tok]

  ~Impl() {
    if (have_plans) {
      cufftDestroy(r2c);
      cufftDestroy(c2r);
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

BandNorms::BandNorms(int n_mat, int n_tok, int kv_dim) : impl_(std::make_unique<Impl>()) {
  CT_THROW_IF_NOT(n_mat >= 1 && n_tok >= 0 && kv_dim >= 1,
                  "BandNorms: shape n_mat={} n_tok={} kv_dim={}; expected n_mat >= 1, n_tok >= 0, "
                  "kv_dim >= 1",
                  n_mat, n_tok, kv_dim);
  Impl& s = *impl_;
  s.n_mat = n_mat;
  s.n_tok = n_tok;
  s.kv_dim = kv_dim;
  s.width = static_cast<size_t>(n_mat) * kv_dim;
  const int n_bins = n_tok / 2 + 1;
  // cufftPlanMany takes int strides and batch counts; the norm kernel's grid has n_mat rows.
  CT_THROW_IF_NOT(n_mat <= 65535, "BandNorms: {} matrices; expected at most 65535", n_mat);
  CT_THROW_IF_NOT(s.width * static_cast<size_t>(n_bins) <
                          static_cast<size_t>(std::numeric_limits<int>::max()) &&
                      s.width * static_cast<size_t>(n_tok) <
                          static_cast<size_t>(std::numeric_limits<int>::max()),
                  "BandNorms: {} sequences of {} tokens exceed the 2^31 elements one cuFFT plan "
                  "addresses; rank fewer layers per call",
                  s.width, n_tok);
  CT_THROW_IF_NOT(device_count() > 0, "BandNorms: no CUDA device is available");
  check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const size_t cells = s.width * static_cast<size_t>(n_tok);
  s.x.grow(cells, "cudaMalloc(packed K/V)");
  s.y.grow(cells, "cudaMalloc(filtered K/V)");
  s.mag.grow(static_cast<size_t>(n_mat) * n_tok, "cudaMalloc(norms)");
  if (n_tok >= 2) {
    s.spec.grow(s.width * n_bins, "cudaMalloc(spectrum)");
    // width contiguous sequences: unit stride, one sequence after another.
    int n = n_tok, in_embed = n_tok, spec_embed = n_bins;
    const int w = static_cast<int>(s.width);
    check(cufftPlanMany(&s.r2c, 1, &n, &in_embed, 1, n_tok, &spec_embed, 1, n_bins, CUFFT_R2C, w),
          "cufftPlanMany(R2C)");
    if (cufftPlanMany(&s.c2r, 1, &n, &spec_embed, 1, n_bins, &in_embed, 1, n_tok, CUFFT_C2R, w) !=
        CUFFT_SUCCESS) {
      cufftDestroy(s.r2c);
      CT_THROW("cuFFT: cufftPlanMany(C2R) failed for {} sequences of {} tokens", w, n_tok);
    }
    s.have_plans = true;
    check(cufftSetStream(s.r2c, s.stream), "cufftSetStream(R2C)");
    check(cufftSetStream(s.c2r, s.stream), "cufftSetStream(C2R)");
  }
}

BandNorms::~BandNorms() = default;

int BandNorms::n_mat() const { return impl_->n_mat; }
int BandNorms::n_tok() const { return impl_->n_tok; }
int BandNorms::kv_dim() const { return impl_->kv_dim; }

void BandNorms::upload(const std::vector<const float*>& mats) {
  Impl& s = *impl_;
  CT_THROW_IF_NOT(mats.size() == static_cast<size_t>(s.n_mat),
                  "BandNorms::upload: {} matrices given; expected {}", mats.size(), s.n_mat);
  if (s.n_tok == 0) return;
  const size_t row_bytes = static_cast<size_t>(s.kv_dim) * sizeof(float);
  for (int m = 0; m < s.n_mat; ++m) {
    CT_THROW_IF_NOT(mats[m] != nullptr, "BandNorms::upload: matrix {} is null", m);
  }
  // Side by side into the token-major staging area (one 2D copy per matrix), then one transpose
  // to the channel-major layout the transforms and norms read contiguously.
  for (int m = 0; m < s.n_mat; ++m) {
    check(
        cudaMemcpy2DAsync(s.y.p + static_cast<size_t>(m) * s.kv_dim, s.width * sizeof(float),
                          mats[m], row_bytes, row_bytes, s.n_tok, cudaMemcpyHostToDevice, s.stream),
        "cudaMemcpy2DAsync(K/V to device)");
  }
  check(launch_transpose(s.y.p, s.n_tok, static_cast<int>(s.width), s.x.p, s.stream),
        "transpose launch");
  check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize(upload)");
}

std::vector<float> BandNorms::run(bool filter, int lo, int hi) {
  Impl& s = *impl_;
  const int n_bins = s.n_tok / 2 + 1;
  std::vector<float> out(static_cast<size_t>(s.n_mat) * s.n_tok);
  if (s.n_tok == 0) return out;
  CT_THROW_IF_NOT(!filter || (0 <= lo && lo < hi && hi <= n_bins),
                  "BandNorms::run: kept bins [{}, {}) of {}; expected 0 <= lo < hi <= {}", lo, hi,
                  n_bins, n_bins);
  const float* src = s.x.p;
  float scale = 1.0f;
  // With one token the only bin is DC, which every filter keeps: the signal is unchanged.
  if (filter && s.n_tok >= 2) {
    check(cufftExecR2C(s.r2c, s.x.p, s.spec.p), "cufftExecR2C");
    check(launch_band_mask(reinterpret_cast<float2*>(s.spec.p), static_cast<int>(s.width), n_bins,
                           lo, hi, s.stream),
          "band mask launch");
    check(cufftExecC2R(s.c2r, s.spec.p, s.y.p), "cufftExecC2R");
    src = s.y.p;
    scale = 1.0f / static_cast<float>(s.n_tok);  // cuFFT's inverse is unnormalised
  }
  check(launch_channel_norms(src, s.n_tok, s.n_mat, s.kv_dim, scale, s.mag.p, s.stream),
        "channel norms launch");
  check(cudaMemcpyAsync(out.data(), s.mag.p, out.size() * sizeof(float), cudaMemcpyDeviceToHost,
                        s.stream),
        "cudaMemcpyAsync(norms to host)");
  check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize(run)");
  return out;
}

}  // namespace ct::cuda
