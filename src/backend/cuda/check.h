// Status checks for the CUDA runtime, cuFFT and cuBLAS (a failure becomes ct::Error naming the
// call and the library's status, so a missing device or exhausted GPU memory is a clear error),
// and an owning device array. Host-compiler code only (band_norms.cc, decoder.cc).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cufft.h>

#include <cstddef>

#include "core/error.h"

namespace ct::cuda {

inline void check(cudaError_t e, const char* what) {
  CT_THROW_IF_NOT(e == cudaSuccess, "CUDA: {} failed: {} ({})", what, cudaGetErrorString(e),
                  static_cast<int>(e));
}

inline void check(cufftResult r, const char* what) {
  CT_THROW_IF_NOT(r == CUFFT_SUCCESS, "cuFFT: {} failed with cufftResult {}", what,
                  static_cast<int>(r));
}

inline void check(cublasStatus_t s, const char* what) {
  CT_THROW_IF_NOT(s == CUBLAS_STATUS_SUCCESS, "cuBLAS: {} failed with status {}", what,
                  static_cast<int>(s));
}

// A device array that frees itself; grow() keeps the contents only when it need not reallocate.
template <typename T>
struct DeviceArray {
  T* p = nullptr;
  size_t n = 0;
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(p); }
  void grow(size_t want, const char* what) {
    if (want <= n) return;
    cudaFree(p);
    p = nullptr;
    n = 0;
    check(cudaMalloc(&p, want * sizeof(T)), what);
    n = want;
  }
};

}  // namespace ct::cuda
