#!/usr/bin/env bash
# Builds the CUDA targets here (no GPU needed: nvcc compiles, nothing runs) and packs them with
# the shared libraries the GPU machine lacks into .gpu/ (ignored by git), for tools/gpu_check.sh
# on the device machine: `run` with carry [".gpu"] and command `tools/gpu_check.sh`.
# CT_NATIVE=OFF: the GPU machine's processor need not have this one's instruction extensions.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${CT_CUDA_BUILD_DIR:-$ROOT/build-cuda}"
cmake -S "$ROOT" -B "$BUILD" -DCT_CUDA=ON -DCT_NATIVE=OFF -DCT_WERROR=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target ct_cuda_tests ct_micro_bench
grep -qxF '/.gpu/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >>"$ROOT/.git/info/exclude"
rm -rf "$ROOT/.gpu" && mkdir -p "$ROOT/.gpu/lib"
cp "$BUILD/tests/ct_cuda_tests" "$BUILD/bench/ct_micro_bench" "$ROOT/.gpu/"
# Every shared library they need except the C/C++ runtime (newer on the GPU machine) and the CUDA
# libraries, which the GPU machine's toolkit provides (libcufft alone is ~290 MB).
for bin in "$ROOT"/.gpu/ct_*; do
  ldd "$bin" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt)\.so|/libcu' |
  while read -r lib; do cp -L "$lib" "$ROOT/.gpu/lib/"; done
du -sh "$ROOT/.gpu"
ls "$ROOT/.gpu" "$ROOT/.gpu/lib"
