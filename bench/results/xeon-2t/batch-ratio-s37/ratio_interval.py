#!/usr/bin/env python3
"""The 8-vs-1 batched decode ratio of every run in this folder (`cachetune bench --batch 1 8`,
one ratio per run, measured within the run), per model: median, a 95% bootstrap interval of
the median (10,000 resamples, seed 1), and the share of runs at or above 3x.

    python3 bench/results/xeon-2t/batch-ratio-s37/ratio_interval.py bench/results/xeon-2t/batch-ratio-s37
"""
import glob
import json
import os
import random
import statistics
import sys

folder = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
out = {}
for model in sorted({os.path.basename(f).rsplit("_", 1)[0] for f in glob.glob(f"{folder}/*_[ab]*.json")}):
    ratios = []
    for f in sorted(glob.glob(f"{folder}/{model}_[ab]*.json")):
        runs = {r["sequences"]: r for r in json.load(open(f))["batched_decode"]}
        ratios.append(runs[8]["vs_one"])
    rng = random.Random(1)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(10000))
    lo, hi = meds[249], meds[9749]
    med = statistics.median(ratios)
    above = sum(r >= 3.0 for r in ratios)
    out[model] = {"runs": len(ratios), "median": med, "ci95": [lo, hi], "at_or_above_3x": above,
                  "ratios": ratios}
    print(f"{model}: {len(ratios)} runs, 8-vs-1 median {med:.2f}x [{lo:.2f}, {hi:.2f}], "
          f"{above}/{len(ratios)} at or above 3x, range {min(ratios):.2f}-{max(ratios):.2f}")
with open(os.path.join(folder, "ratio_interval.json"), "w") as f:
    json.dump(out, f, indent=1)
