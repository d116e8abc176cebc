// The OpenBLAS core choice (backend/cpu/blas_core.h).
#include "backend/cpu/blas_core.h"

#include <gtest/gtest.h>

#include <string>

namespace ct::cpu {
namespace {

TEST(BlasCore, AFallbackCoreOnANewerCpuGetsTheRightKernels) {
  const BlasCpu avx2{true, false, false}, avx512{true, true, false}, bf16{true, true, true};
  EXPECT_EQ(better_blas_core("Prescott", bf16), "Cooperlake");
  EXPECT_EQ(better_blas_core("prescott", avx512), "SkylakeX");
  EXPECT_EQ(better_blas_core("Nehalem", avx2), "Haswell");
  EXPECT_EQ(better_blas_core("Sandybridge", avx512), "SkylakeX");
  EXPECT_EQ(better_blas_core("Bulldozer", avx2), "Haswell");
}

TEST(BlasCore, AKnownCoreOrAnOldCpuIsLeftAlone) {
  const BlasCpu none{false, false, false}, bf16{true, true, true};
  for (const char* core : {"SkylakeX", "Cooperlake", "SapphireRapids", "Haswell", "Zen",
                           "Prescot", "Prescott2", ""}) {
    EXPECT_EQ(better_blas_core(core, bf16), "") << core;
  }
  EXPECT_EQ(better_blas_core("Prescott", none), "");  // a CPU without AVX2: nothing better
}

}  // namespace
}  // namespace ct::cpu
