#!/usr/bin/env python3
"""Quality-matched ratios of two policies from one `cachetune eval --sweep-ratio` directory.

usage: tools/r_match.py RUN_DIR [--a cachetune] [--b cacheblend] [--tasks T1,T2] [--json OUT]

RUN_DIR holds both policies swept over the same ratios on the same examples (`--sweep-policies
A,B --sweep-ratios ...`, with full and reuse as the references), e.g.

    cachetune eval --model qwen2.5-coder-0.5b --data ../shared/data/hotpotqa.jsonl --limit 20 \\
        --policies full,reuse --sweep-ratio --sweep-ratios 0.1,0.15,0.2,0.3 \\
        --sweep-policies cachetune,cacheblend --no-attention --out runs/rcb

Per example and ratio the KL ratio is the policy's KL to full recompute over the answer divided
by full reuse's (as `cachetune eval` computes it). Printed: each policy's pooled KL ratio at
every ratio (mean and 95% percentile-bootstrap interval, 10,000 resamples, fixed seed), and for
every pair (A at r_a, B at r_b) the paired mean difference A - B over the examples both ran,
with its interval: negative means A is closer to full. A pair whose interval lies below 0 at
r_a < r_b says A needs fewer recomputed rows for B's quality (the throughput argument of
docs/PERFORMANCE.md). Only Python's standard library.
"""
import argparse
import json
import os
import random
import statistics


def bootstrap(xs, seed, n=10000):
    rng = random.Random(seed)
    k = len(xs)
    means = sorted(sum(rng.choice(xs) for _ in range(k)) / k for _ in range(n))
    return statistics.fmean(xs), means[int(0.025 * n)], means[int(0.975 * n) - 1]


def load(run_dir, tasks=None):
    recs = [json.loads(line) for line in open(os.path.join(run_dir, "results.jsonl"))]
    if tasks:
        recs = [r for r in recs if r["task"] in tasks]
    reuse = {}
    for r in recs:
        if r["policy"] == "reuse" and r.get("kl") is not None:
            reuse[(r["example"], r["setting"])] = r["kl"]
    ratios = {}  # (policy, r) -> {example: kl ratio}
    for r in recs:
        s = r["setting"]
        if not s.startswith("r=") or r.get("kl") is None:
            continue
        ref = reuse.get((r["example"], s)) or reuse.get((r["example"], r.get("ref_setting", "base")))
        if not ref or ref <= 0:
            continue
        ratios.setdefault((r["policy"], float(s[2:])), {})[r["example"]] = r["kl"] / ref
    return ratios


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--a", default="cachetune")
    ap.add_argument("--b", default="cacheblend")
    ap.add_argument("--tasks", help="only these tasks (comma-separated, e.g. musique,multi_news)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    tasks = set(args.tasks.split(",")) if args.tasks else None
    ratios = load(args.run_dir, tasks)
    out = {"run_dir": args.run_dir, "tasks": sorted(tasks) if tasks else "all", "curves": {},
           "pairs": []}
    for pol in (args.a, args.b):
        rs = sorted(r for p, r in ratios if p == pol)
        print(f"**{pol}**: KL ratio to reuse, mean [95% CI]")
        for r in rs:
            xs = list(ratios[(pol, r)].values())
            m, lo, hi = bootstrap(xs, 1)
            out["curves"].setdefault(pol, []).append({"r": r, "n": len(xs), "mean": m, "lo": lo, "hi": hi})
            print(f"  r = {r:g}: n {len(xs)}, {m:.3f} [{lo:.3f}, {hi:.3f}]")
    print(f"\n**paired {args.a}@r_a − {args.b}@r_b** (negative: {args.a} closer to full)\n")
    ras = sorted(r for p, r in ratios if p == args.a)
    rbs = sorted(r for p, r in ratios if p == args.b)
    print("| r_a \\ r_b | " + " | ".join(f"{r:g}" for r in rbs) + " |")
    print("|---" * (len(rbs) + 1) + "|")
    for ra in ras:
        cells = []
        for rb in rbs:
            a, b = ratios[(args.a, ra)], ratios[(args.b, rb)]
            common = sorted(set(a) & set(b))
            d = [a[e] - b[e] for e in common]
            m, lo, hi = bootstrap(d, 2)
            out["pairs"].append({"r_a": ra, "r_b": rb, "n": len(d), "mean": m, "lo": lo, "hi": hi})
            cells.append(f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        print(f"| {ra:g} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
