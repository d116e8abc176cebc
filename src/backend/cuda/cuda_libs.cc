// cuBLAS and cuFFT, opened when the CUDA backend first calls them. Linked as shared libraries
// they were loaded with every process of a CUDA build, GPU or not, and libcublas with its
// libcublasLt alone holds about 220 MB resident once loaded (relocated data and zeroed tables),
// in `cachetune models` as much as in a server. So the build does not link them: this file
// defines the few functions the backend calls (decoder.cc, band_norms.cc), each resolving the
// library's own on its first call, from the toolkit's library directory the build found
// (CT_CUDA_LIB_DIR) or else by soname through the loader's search path. A library that cannot
// be opened, or lacks the symbol, is a ct::Error naming the file and the loader's reason. The
// CUDA runtime itself is linked statically and opens the driver only when first used.
// A backend call of a function not defined here fails to link: add it below.
#include <cublas_v2.h>
#include <cufft.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "core/error.h"

#define CT_STR2(x) #x
#define CT_STR(x) CT_STR2(x)

namespace ct::cuda {
namespace {

struct SharedLibrary {
  explicit SharedLibrary(const char* name) : soname(name) {}
  const char* soname;
  void* handle = nullptr;
  std::string error;  // why it could not be opened
  std::once_flag once;
};

SharedLibrary& cublas_library() {
  static SharedLibrary lib("libcublas.so." CT_STR(CUBLAS_VER_MAJOR));
  return lib;
}

SharedLibrary& cufft_library() {
  static SharedLibrary lib("libcufft.so." CT_STR(CUFFT_VER_MAJOR));
  return lib;
}

void* open_library(SharedLibrary& lib) {
  std::call_once(lib.once, [&lib] {
    std::string tried;
#ifdef CT_CUDA_LIB_DIR
    const std::string in_dir = std::string(CT_CUDA_LIB_DIR) + "/" + lib.soname;
    lib.handle = dlopen(in_dir.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib.handle) return;
    tried = in_dir + ": " + dlerror() + "; ";
#endif
    lib.handle = dlopen(lib.soname, RTLD_NOW | RTLD_LOCAL);
    if (!lib.handle) lib.error = tried + lib.soname + ": " + dlerror();
  });
  CT_THROW_IF_NOT(lib.handle != nullptr,
                  "the CUDA backend cannot load {} ({}); it needs the CUDA toolkit's libraries "
                  "where the loader finds them (e.g. LD_LIBRARY_PATH)",
                  lib.soname, lib.error);
  return lib.handle;
}

// The library's own definition of `name`, of type F.
template <typename F>
F* resolve(SharedLibrary& lib, const char* name) {
  void* h = open_library(lib);
  dlerror();
  void* f = dlsym(h, name);
  CT_THROW_IF_NOT(f != nullptr, "{} has no function {} ({})", lib.soname, name, dlerror());
  return reinterpret_cast<F*>(f);
}

}  // namespace
}  // namespace ct::cuda

// Each forwards to the library's function of the same name, resolved once.
#define CT_CUBLAS(name) \
  static decltype(&name) const real = ct::cuda::resolve<decltype(name)>(ct::cuda::cublas_library(), #name)
#define CT_CUFFT(name) \
  static decltype(&name) const real = ct::cuda::resolve<decltype(name)>(ct::cuda::cufft_library(), #name)

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  CT_CUBLAS(cublasCreate_v2);
  return real(handle);
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  CT_CUBLAS(cublasDestroy_v2);
  return real(handle);
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  CT_CUBLAS(cublasSetStream_v2);
  return real(handle, stream);
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  CT_CUBLAS(cublasSetMathMode);
  return real(handle, mode);
}

cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                           cublasOperation_t transb, int m, int n, int k,
                                           const float* alpha, const float* A, int lda,
                                           const float* B, int ldb, const float* beta, float* C,
                                           int ldc) {
  CT_CUBLAS(cublasSgemm_v2);
  return real(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

cublasStatus_t CUBLASWINAPI cublasSgemmStridedBatched(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    int k, const float* alpha, const float* A, int lda, long long int strideA, const float* B,
    int ldb, long long int strideB, const float* beta, float* C, int ldc, long long int strideC,
    int batchCount) {
  CT_CUBLAS(cublasSgemmStridedBatched);
  return real(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C,
              ldc, strideC, batchCount);
}

cufftResult CUFFTAPI cufftPlanMany(cufftHandle* plan, int rank, int* n, int* inembed, int istride,
                                   int idist, int* onembed, int ostride, int odist,
                                   cufftType type, int batch) {
  CT_CUFFT(cufftPlanMany);
  return real(plan, rank, n, inembed, istride, idist, onembed, ostride, odist, type, batch);
}

cufftResult CUFFTAPI cufftSetStream(cufftHandle plan, cudaStream_t stream) {
  CT_CUFFT(cufftSetStream);
  return real(plan, stream);
}

cufftResult CUFFTAPI cufftDestroy(cufftHandle plan) {
  CT_CUFFT(cufftDestroy);
  return real(plan);
}

cufftResult CUFFTAPI cufftExecR2C(cufftHandle plan, cufftReal* idata, cufftComplex* odata) {
  CT_CUFFT(cufftExecR2C);
  return real(plan, idata, odata);
}

cufftResult CUFFTAPI cufftExecC2R(cufftHandle plan, cufftComplex* idata, cufftReal* odata) {
  CT_CUFFT(cufftExecC2R);
  return real(plan, idata, odata);
}

}  // extern "C"
