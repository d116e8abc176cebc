#!/usr/bin/env python3
"""A/B comparison of two builds of ct_micro_bench on a noisy machine.

Runs the two binaries alternately (A, B, A, B, ...) for --rounds rounds on the same benchmark
filter, so that slow and fast moments of a shared machine fall on both, and prints per benchmark
the median wall time of each and the ratio A / B (above 1: B is faster), with the smallest and
largest per-round ratio. Example (a build of the previous commit against this one, one core):

    OMP_NUM_THREADS=1 python3 bench/ab_micro.py /tmp/mb_old build/bench/ct_micro_bench \
        --filter 'QGemv/q5_0_kernel|Prefill/q5_0_rows16/8$' --rounds 7 --json out.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run_once(binary, flt, min_time):
    out = subprocess.run(
        [binary, f"--benchmark_filter={flt}", f"--benchmark_min_time={min_time}",
         "--benchmark_format=json"],
        check=True, capture_output=True, text=True).stdout
    times = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type", "iteration") == "iteration":
            times[b["name"]] = b["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
    if not times:
        sys.exit(f"ab_micro: filter '{flt}' selects no benchmark in {binary}")
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="baseline ct_micro_bench")
    ap.add_argument("b", help="candidate ct_micro_bench")
    ap.add_argument("--filter", required=True, help="--benchmark_filter regex for both")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", default="0.2")
    ap.add_argument("--json", help="write the per-round times and the summary here")
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit("ab_micro: --rounds must be >= 1")
    rounds = []
    for r in range(args.rounds):
        ta = run_once(args.a, args.filter, args.min_time)
        tb = run_once(args.b, args.filter, args.min_time)
        rounds.append({"a": ta, "b": tb})
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    names = [n for n in rounds[0]["a"] if all(n in x["a"] and n in x["b"] for x in rounds)]
    summary = {}
    print(f"{'benchmark':40s} {'A median':>12s} {'B median':>12s} {'A/B':>6s} {'min':>6s} {'max':>6s}")
    for n in names:
        a = [x["a"][n] for x in rounds]
        b = [x["b"][n] for x in rounds]
        per = [x / y for x, y in zip(a, b)]
        ma, mb = statistics.median(a), statistics.median(b)
        summary[n] = {"a_median_s": ma, "b_median_s": mb, "ratio": ma / mb,
                      "ratio_min": min(per), "ratio_max": max(per)}
        print(f"{n:40s} {ma * 1e6:10.1f}us {mb * 1e6:10.1f}us {ma / mb:6.2f} {min(per):6.2f} {max(per):6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"a": args.a, "b": args.b, "filter": args.filter, "rounds": rounds,
                       "summary": summary, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
                      f, indent=1)


if __name__ == "__main__":
    main()
