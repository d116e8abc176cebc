// Which OpenBLAS core to run (blas_core.h).
#include "backend/cpu/blas_core.h"

#include <cblas.h>
#include <strings.h>

#include <array>

namespace ct::cpu {

BlasCpu host_blas_cpu() {
  __builtin_cpu_init();
  BlasCpu c;
  c.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  c.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  c.avx512_bf16 = c.avx512 && __builtin_cpu_supports("avx512bf16");
  return c;
}

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name != nullptr ? std::string(name) : std::string();
}

std::string better_blas_core(std::string_view current, const BlasCpu& cpu) {
  static constexpr std::array<std::string_view, 17> kWithoutAvx2 = {
      "Prescott",   "Core2",   "Penryn",   "Dunnington", "Nehalem",    "Atom",
      "Sandybridge", "Katmai", "Coppermine", "Northwood", "Banias",     "Barcelona",
      "Bobcat",     "Bulldozer", "Piledriver", "Steamroller", "Opteron"};
  if (!cpu.avx2_fma) return "";
  const std::string name(current);
  bool old = false;
  for (std::string_view n : kWithoutAvx2) {
    old = old || (n.size() == name.size() && ::strncasecmp(name.c_str(), n.data(), n.size()) == 0);
  }
  if (!old) return "";
  if (cpu.avx512_bf16) return "Cooperlake";
  if (cpu.avx512) return "SkylakeX";
  return "Haswell";
}

}  // namespace ct::cpu
