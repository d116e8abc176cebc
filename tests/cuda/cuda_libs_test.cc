// cuBLAS and cuFFT are opened on the CUDA backend's first call (src/backend/cuda/cuda_libs.cc),
// not with the process: a CUDA build that never touches the GPU does not hold them. Runs without
// a device too (the calls then return the libraries' own error status, after loading them); each
// test runs in a process of its own under ctest, so nothing has loaded them before it.
#include <cublas_v2.h>
#include <cufft.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace ct {
namespace {

bool mapped(const std::string& file) {
  std::ifstream f("/proc/self/maps");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str().find(file) != std::string::npos;
}

TEST(CudaLibs, CublasAndCufftAreOpenedOnTheirFirstCallOnly) {
  ASSERT_FALSE(mapped("libcublas")) << "cuBLAS loaded with the process";
  ASSERT_FALSE(mapped("libcufft")) << "cuFFT loaded with the process";

  cublasHandle_t h = nullptr;
  const cublasStatus_t st = cublasCreate(&h);  // without a device: an error status, not a crash
  if (st == CUBLAS_STATUS_SUCCESS) {
    EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
  }
  EXPECT_TRUE(mapped("libcublas.so")) << "status " << static_cast<int>(st);
  EXPECT_FALSE(mapped("libcufft"));

  cufftHandle plan = 0;
  int n = 8;
  const cufftResult fr =
      cufftPlanMany(&plan, 1, &n, nullptr, 1, n, nullptr, 1, n / 2 + 1, CUFFT_R2C, 1);
  if (fr == CUFFT_SUCCESS) {
    EXPECT_EQ(cufftDestroy(plan), CUFFT_SUCCESS);
  }
  EXPECT_TRUE(mapped("libcufft.so")) << "result " << static_cast<int>(fr);

  // Every other forwarded function resolves: on no handle or plan each library answers with its
  // error status (a missing symbol would throw ct::Error instead).
  float x = 0;
  EXPECT_NE(cublasSetStream(nullptr, nullptr), CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(cublasSetMathMode(nullptr, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(cublasSgemm(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &x, &x, 1, &x, 1, &x, &x, 1),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(cublasSgemmStridedBatched(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &x, &x, 1, 1,
                                      &x, 1, 1, &x, &x, 1, 1, 1),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(cublasDestroy(nullptr), CUBLAS_STATUS_SUCCESS);
  cufftReal r = 0;
  cufftComplex c{};
  EXPECT_NE(cufftSetStream(0, nullptr), CUFFT_SUCCESS);
  EXPECT_NE(cufftExecR2C(0, &r, &c), CUFFT_SUCCESS);
  EXPECT_NE(cufftExecC2R(0, &c, &r), CUFFT_SUCCESS);
  EXPECT_NE(cufftDestroy(0), CUFFT_SUCCESS);
}

}  // namespace
}  // namespace ct
