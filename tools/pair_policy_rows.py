#!/usr/bin/env python3
"""One results directory from two `cachetune eval` runs of the same examples by two binaries: all
of A's rows, plus B's rows of some policies renamed, so that the tables pair the two versions of
a policy example by example.

usage: tools/pair_policy_rows.py A B OUT --policies cacheblend --suffix layer0

The pairing is only valid when both binaries measure the same thing: every (example, policy)
that both runs have for the reference policies (--check, default full,reuse) must agree exactly
(KL and answer), or the script refuses. (An older archive made by an older binary does not pair:
its KL of reuse differed by up to 5x on some examples.) Only the examples both runs have go to
OUT. Then:
    cachetune eval --summarize-only --data - --out OUT
    python3 tools/quality_tables.py OUT --vs POLICY
Used for the thirty-third session's CacheBlend check layer (B a build of 16dd8a4, before it).
"""
import argparse
import json
import os
import sys


def rows(d):
    with open(os.path.join(d, "results.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("out")
    ap.add_argument("--policies", required=True, help="B's policies to add, comma-separated")
    ap.add_argument("--suffix", required=True, help="their rows are named POLICY-SUFFIX")
    ap.add_argument("--check", default="full,reuse", help="policies both runs must agree on")
    args = ap.parse_args()
    pols = set(args.policies.split(","))
    check = set(args.check.split(","))
    a, b = rows(args.a), rows(args.b)
    a_by = {(r["example"], r["policy"]): r for r in a}
    b_by = {(r["example"], r["policy"]): r for r in b}
    compared = 0
    for key, r in b_by.items():
        if key[1] in check and key in a_by:
            s = a_by[key]
            if s["kl"] != r["kl"] or s["answer"] != r["answer"]:
                sys.exit(f"{key}: the runs differ (KL {s['kl']} against {r['kl']}); they do not pair")
            compared += 1
    added = {r["example"] for r in b if r["policy"] in pols}
    examples = {r["example"] for r in a} & added
    out = [r for r in a if r["example"] in examples]
    out += [dict(r, policy=f"{r['policy']}-{args.suffix}") for r in b
            if r["policy"] in pols and r["example"] in examples]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.jsonl"), "w") as f:
        for r in out:
            f.write(json.dumps(r) + "\n")
    print(f"{len(examples)} examples, {len(out)} rows into {args.out}/results.jsonl; "
          f"{compared} reference rows agreed")


if __name__ == "__main__":
    main()
