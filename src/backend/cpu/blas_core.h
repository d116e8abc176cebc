// OpenBLAS picks its kernels by the CPU's model number. A CPU newer than the installed OpenBLAS
// (an Intel Xeon of model 207 against Debian 12's 0.3.21, for one) falls back to "Prescott", the
// SSE3 kernels: about a quarter of the SGEMM rate of the right AVX-512 ones (measured: 25 vs
// 117 GFLOP/s on one core; docs/PERFORMANCE.md). The core can only be chosen before OpenBLAS
// loads, through the environment variable OPENBLAS_CORETYPE, so the command-line tool restarts
// itself once with it set (tools/cli/main.cc) when this module says the choice is wrong.
#pragma once

#include <string>
#include <string_view>

namespace ct::cpu {

// The instruction sets that decide OpenBLAS's x86 kernel family.
struct BlasCpu {
  bool avx2_fma = false;     // AVX2 and FMA
  bool avx512 = false;       // AVX-512 F, VL, BW and DQ
  bool avx512_bf16 = false;  // AVX-512 BF16
};

// This CPU's (cpuid through the compiler's builtins).
BlasCpu host_blas_cpu();

// OpenBLAS's name for the core it runs (openblas_get_corename()).
std::string blas_core_name();

// The OPENBLAS_CORETYPE to restart with, or "" to keep `current`: only when `current` is a core
// without AVX2 (Prescott, Core2, Penryn, Dunnington, Nehalem, Atom, Sandybridge, Katmai,
// Coppermine, Northwood, Banias, Barcelona, Bobcat, Bulldozer, Piledriver, Steamroller, Opteron)
// while the CPU has AVX2 and FMA. Then Cooperlake (AVX-512 with BF16), SkylakeX (AVX-512) or
// Haswell (AVX2).
std::string better_blas_core(std::string_view current, const BlasCpu& cpu);

}  // namespace ct::cpu
