#!/usr/bin/env python3
"""Ingest cost per stored ranking (issue 15, target: probe ingest <= 1.2x a plain encoding).

Encodes the same documents with `cachetune ingest --rank R` for each rank mode R, each into an
empty disk tier of its own, rounds in rotated order so that drift in the machine's load falls on
every mode alike, and reports each mode's total encoding time and its ratio to the plain encoding
(lowfreq, the paper's ranking) measured in the same round. The documents: the chunks of the first
--limit examples of a ../shared/data file. Example:

    python3 bench/ingest_cost.py --model smollm2-135m --data ../shared/data/hotpotqa.jsonl \\
        --limit 4 --rounds 3 --out bench/results/epyc-avx2-2t/ingest_cost_smollm2-135m.json
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_common import cpu_name  # noqa: E402


def ingest_seconds(binary, model, data, limit, rank, tier_dir):
    cmd = [binary, "ingest", "--model", model, "--rank", rank, "--tiers", f"disk:{tier_dir}",
           "--limit", str(limit), data]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"ingest_cost: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    m = re.search(r"(\d+) chunks, (\d+) newly encoded in ([0-9.]+) s", p.stderr)
    if not m:
        sys.exit(f"ingest_cost: no summary line in the output of {' '.join(cmd)}:\n{p.stderr[-2000:]}")
    new, secs = int(m.group(2)), float(m.group(3))
    if new == 0:
        sys.exit(f"ingest_cost: {rank}: no chunk was encoded (all cached in {tier_dir}?)")
    return new, secs  # a text that repeats among the documents is encoded once


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/cachetune")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default="../shared/data/hotpotqa.jsonl")
    ap.add_argument("--limit", type=int, default=4, help="examples of the data file")
    ap.add_argument("--ranks", default="lowfreq,probe,probe-attn", help="the first is the baseline")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write the results here (JSON)")
    a = ap.parse_args()
    ranks = a.ranks.split(",")
    secs = {r: [] for r in ranks}
    n_chunks = None
    work = tempfile.mkdtemp(prefix="ct_ingest_cost_")
    try:
        for k in range(a.rounds):
            order = ranks[k % len(ranks):] + ranks[:k % len(ranks)]
            for r in order:
                d = os.path.join(work, f"{r}-{k}")
                n, s = ingest_seconds(a.binary, a.model, a.data, a.limit, r, d)
                shutil.rmtree(d, ignore_errors=True)
                n_chunks = n
                secs[r].append(s)
                print(f"round {k + 1}: {r:<12} {n} chunks in {s:.2f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = ranks[0]
    result = {"command": " ".join(sys.argv), "cpu": cpu_name(), "model": a.model, "data": a.data,
              "limit": a.limit, "chunks": n_chunks, "rounds": a.rounds, "seconds": secs,
              "ratio_to_" + base: {}}
    for r in ranks:
        ratios = [s / b for s, b in zip(secs[r], secs[base])]
        result["ratio_to_" + base][r] = {"median": statistics.median(ratios), "min": min(ratios),
                                         "max": max(ratios)}
        print(f"{r:<12} median {statistics.median(secs[r]):.2f} s, {statistics.median(ratios):.2f}x "
              f"{base} (rounds {min(ratios):.2f}-{max(ratios):.2f})")
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
