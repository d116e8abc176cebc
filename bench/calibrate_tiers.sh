#!/usr/bin/env bash
# Evidence for docs/PERFORMANCE.md "Recompute ratio calibration (paper Table 5)": calibrates the
# recompute ratio on each cache tier and sweeps r beside it, with TTFT against full recompute.
# Every run holds /tmp/ct_bench.lock so that timings never overlap with other benchmark runs.
set -euo pipefail

BIN=${BIN:-build/cachetune}
OUT=${OUT:-/tmp/ct_cal}                          # chunk files and the calibration store
LOGS=${LOGS:-bench/results/calibrate_tiers}      # one output file per tier (docs/PERFORMANCE.md)
# One OpenMP thread: on a shared, oversubscribed 2-core machine every OpenMP barrier can wait a
# whole scheduler slice for a descheduled worker (measured: ~85 ms of fixed cost per layer with
# two threads at load 7, 2 ms with one), which buries the recompute/load balance in noise.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# A small calibration set: the first three example documents, two requests (two orders).
mkdir -p "$OUT/docs3" "$OUT/disk" "$LOGS"
cp examples/docs/0[123]_*.txt "$OUT/docs3/"
# --noise: comparisons closer than 5% are re-measured back to back (golden_section.h).
common=(--data "$OUT/docs3" --limit 2 --repeats 2 --noise "${NOISE:-0.05}" --force --sweep
        --sweep-max "${SWEEP_MAX:-0.6}" --calibration "$OUT/calibration.json")

run() {  # run NAME TIER
  echo "== $1 ($2)"
  { echo "# OMP_NUM_THREADS=$OMP_NUM_THREADS OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-} load $(cut -d' ' -f1-3 /proc/loadavg)"
    flock /tmp/ct_bench.lock "$BIN" calibrate --tier "$2" "${common[@]}"; } | tee "$LOGS/$1.txt"
}

run device device:2G
run host host:8G
run disk "disk:$OUT/disk"
run disk_100M "disk:$OUT/disk:bw=100M"
run disk_10M "disk:$OUT/disk:bw=10M"
