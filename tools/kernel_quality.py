#!/usr/bin/env python3
"""Does the prefill kernel change reuse quality? Compares two `cachetune eval` results
directories of the same model, examples and policies, run under two kernels
(CT_PREFILL_KERNEL=qgemm and =sgemm; docs/RESULTS.md, "Prefill kernel and quality").

usage: tools/kernel_quality.py DIR_A DIR_B [--setting base] [--boot 2000]

Per policy, over the examples both directories hold: the mean KL ratio to full reuse (kl / kl of
`reuse`, each run against its own full prefill) under A and under B, their paired difference
A - B with a percentile bootstrap 95% interval, and the mean task score under each. Also the
token F1 between the two runs' full-prefill answers (1 = the kernels answer alike).
"""
import argparse
import collections
import json
import os
import random
import sys


def load(run_dir, setting):
    recs = {}
    with open(os.path.join(run_dir, "results.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("setting") == setting:
                recs[(r["example"], r["policy"])] = r
    return recs


def token_f1(a, b):
    ta, tb = a.lower().split(), b.lower().split()
    if not ta and not tb:
        return 1.0
    common = sum((collections.Counter(ta) & collections.Counter(tb)).values())
    if common == 0:
        return 0.0
    p, r = common / len(ta), common / len(tb)
    return 2 * p * r / (p + r)


def mean(v):
    return sum(v) / len(v)


def boot_ci(v, n_boot, rng):
    means = sorted(mean([rng.choice(v) for _ in v]) for _ in range(n_boot))
    return means[int(0.025 * n_boot)], means[int(0.975 * n_boot) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--setting", default="base")
    ap.add_argument("--boot", type=int, default=2000)
    args = ap.parse_args()
    A, B = load(args.a, args.setting), load(args.b, args.setting)
    examples = sorted({e for e, p in A if p == "reuse" and (e, "reuse") in B})
    if not examples:
        sys.exit(f"no example has a 'reuse' record in both {args.a} and {args.b}")
    policies = sorted({p for e, p in A if (e, p) in B and p not in ("full", "reuse")})
    rng = random.Random(0)
    print(f"A = {args.a}, B = {args.b}, setting {args.setting}, {len(examples)} examples\n")
    print("| policy | n | KL ratio A | KL ratio B | A - B [95% CI] | score A | score B |")
    print("|---|---|---|---|---|---|---|")
    for p in policies:
        ra, rb, sa, sb = [], [], [], []
        for e in examples:
            if (e, p) not in A or (e, p) not in B:
                continue
            ka, kb = A[(e, "reuse")]["kl"], B[(e, "reuse")]["kl"]
            if ka <= 0 or kb <= 0:
                continue
            ra.append(A[(e, p)]["kl"] / ka)
            rb.append(B[(e, p)]["kl"] / kb)
            sa.append(A[(e, p)]["task_score"])
            sb.append(B[(e, p)]["task_score"])
        if not ra:
            continue
        d = [x - y for x, y in zip(ra, rb)]
        lo, hi = boot_ci(d, args.boot, rng)
        print(f"| {p} | {len(d)} | {mean(ra):.3f} | {mean(rb):.3f} | {mean(d):+.3f} [{lo:+.3f}, {hi:+.3f}] "
              f"| {mean(sa):.3f} | {mean(sb):.3f} |")
    f1 = [token_f1(A[(e, "full")]["answer"], B[(e, "full")]["answer"])
          for e in examples if (e, "full") in A and (e, "full") in B]
    same = sum(1 for e in examples if (e, "full") in A and (e, "full") in B
               and A[(e, "full")]["answer"] == B[(e, "full")]["answer"])
    if f1:
        print(f"\nfull prefill, A against B: answers identical on {same} of {len(f1)}, "
              f"mean token F1 {mean(f1):.3f}")
        sfa = mean([A[(e, "full")]["task_score"] for e in examples if (e, "full") in A])
        sfb = mean([B[(e, "full")]["task_score"] for e in examples if (e, "full") in B])
        print(f"full prefill task score: A {sfa:.3f}, B {sfb:.3f}")


if __name__ == "__main__":
    main()
