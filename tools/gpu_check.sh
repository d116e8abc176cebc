#!/usr/bin/env bash
# Runs on the GPU machine over the binaries tools/gpu_pack.sh packed into .gpu/: the CUDA tests
# (GPU paths against the CPU reference), the ranking benchmarks and the full-prefill benchmarks, CPU
# and GPU in the same run, then the CUDA tests again under compute-sanitizer's memcheck (out-of-
# bounds and misaligned device accesses, leaks), bounded by CT_GPU_SANITIZE_S seconds (default
# 240; 0 skips it).
# Results go to $OUT (the device tool's return folder) or ./gpu-out.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK="$ROOT/.gpu"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
cufft="$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcufft.so.12' 2>/dev/null | head -1)"
export LD_LIBRARY_PATH="$PACK/lib:$(dirname "${cufft:-/nonexistent/x}"):${LD_LIBRARY_PATH:-}"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
  echo "libcufft: ${cufft:-not found}"
} | tee "$OUT/machine.txt"
rc=0
"$PACK/ct_cuda_tests" --gtest_output="json:$OUT/cuda_tests.json" 2>&1 | tee "$OUT/cuda_tests.txt" |
  grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Failure|error' || true
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
# CT_GPU_BENCH: which benchmark groups to run (default "rank prefill").
BENCH="${CT_GPU_BENCH:-rank prefill}"
if [[ " $BENCH " == *" rank "* ]]; then
OMP_NUM_THREADS="${CT_BENCH_THREADS:-2}" "$PACK/ct_micro_bench" --benchmark_filter='Rank|BandNorms' \
  --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_out="$OUT/rank_bench.json" --benchmark_out_format=json 2>&1 | tee "$OUT/rank_bench.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
# Prefill, CPU backend on every host core against the GPU decoder; and batched GPU decode steps.
if [[ " $BENCH " == *" prefill "* ]]; then
OMP_NUM_THREADS="$(nproc)" "$PACK/ct_micro_bench" --benchmark_filter='^BM_(PrefillCpu|PrefillCuda|Selective|DecodeCuda)/' \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$OUT/prefill_bench.json" --benchmark_out_format=json 2>&1 | tee "$OUT/prefill_bench.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
# Last, as it is the slowest: every CUDA test under memcheck. A timeout is reported, not failed.
SAN_S="${CT_GPU_SANITIZE_S:-240}"
san="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
if [ "$SAN_S" -gt 0 ] && [ -n "$san" ]; then
  timeout "$SAN_S" "$san" --tool memcheck --leak-check full --error-exitcode 3 \
    "$PACK/ct_cuda_tests" --gtest_filter="${CT_GPU_SANITIZE_FILTER:-*}" >"$OUT/memcheck.txt" 2>&1
  s=$?
  grep -E '^\[ *(PASSED|FAILED) *\]|ERROR SUMMARY|LEAK SUMMARY' "$OUT/memcheck.txt" || true
  case $s in
    0) echo "memcheck: clean" ;;
    124) echo "memcheck: stopped after ${SAN_S} s (see memcheck.txt for how far it got)" ;;
    *) echo "memcheck: exit $s (errors, or a failed test)"; rc=1 ;;
  esac
elif [ "$SAN_S" -gt 0 ]; then
  echo "memcheck: compute-sanitizer not found"
fi
exit $rc
