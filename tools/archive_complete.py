#!/usr/bin/env python3
"""Copies the complete examples of an evaluation run into an archive directory.

A resumable `cachetune eval` run (bench/quality_offline.sh) that was stopped holds some examples
with only part of their policies. This keeps the result rows of the examples (task, example,
setting) that have every policy of --policies (default: every policy the run has), writes them to
ARCHIVE/results.jsonl with the run's run.json, and prints what it kept. Then summarise:

    python3 tools/archive_complete.py runs/qwen15-v1 docs/results/offline/qwen2.5-coder-1.5b
    build/cachetune eval --summarize-only --data ../shared/data --out docs/results/offline/qwen2.5-coder-1.5b
"""
import argparse
import collections
import json
import os
import shutil
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="the run's results directory (results.jsonl, run.json)")
    ap.add_argument("archive", help="where to write results.jsonl and run.json")
    ap.add_argument("--policies", help="comma-separated policies an example must have")
    args = ap.parse_args()
    path = os.path.join(args.run, "results.jsonl")
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"archive_complete: {path}: {e}")
    need = set(args.policies.split(",")) if args.policies else {r["policy"] for r in rows}
    have = collections.defaultdict(set)
    for r in rows:
        have[(r["task"], r["example"], r.get("setting", ""))].add(r["policy"])
    done = {k for k, ps in have.items() if need <= ps}
    kept = [r for r in rows if (r["task"], r["example"], r.get("setting", "")) in done and r["policy"] in need]
    os.makedirs(args.archive, exist_ok=True)
    with open(os.path.join(args.archive, "results.jsonl"), "w") as f:
        for r in kept:
            f.write(json.dumps(r) + "\n")
    shutil.copyfile(os.path.join(args.run, "run.json"), os.path.join(args.archive, "run.json"))
    per_task = collections.Counter(k[0] for k in done)
    print(f"kept {len(done)} complete examples ({', '.join(f'{t} {n}' for t, n in sorted(per_task.items()))}), "
          f"{len(kept)} rows; left out {len(have) - len(done)} incomplete")


if __name__ == "__main__":
    main()
