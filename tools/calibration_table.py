#!/usr/bin/env python3
"""Markdown tables for docs/PERFORMANCE.md from `cachetune calibrate --sweep` outputs.

Reads the per-tier files written by bench/calibrate_tiers.sh (default
bench/results/calibrate_tiers/{device,host,disk,disk_100M,disk_10M}.txt) and prints two tables:
one row per tier (profile, analytic guess, probes, chosen r, sweep best, criterion, speedups) and
the sweeps side by side. Nothing is computed here that the calibrate output does not print.
"""
import argparse
import os
import re
import sys

TIERS = ["device", "host", "disk", "disk_100M", "disk_10M"]
LABEL = {"device": "device", "host": "host", "disk": "disk (page cache)",
         "disk_100M": "disk bw=100M", "disk_10M": "disk bw=10M"}


def num(pattern, text, cast=float, default=None):
    m = re.search(pattern, text, re.M)
    return cast(m.group(1)) if m else default


def parse(path):
    text = open(path).read()
    if "chosen vs sweep best" not in text:
        raise SystemExit(f"{path}: no 'chosen vs sweep best' line; was it run with --sweep "
                         "and did it finish?")
    d = {"path": path}
    d["header"] = num(r"^# (.*)$", text, str, "")
    d["t_c"] = num(r"t_c =\s+([\d.]+) us", text)
    d["t_i"] = num(r"t_i =\s+([\d.]+) us", text)
    d["t_o"] = num(r"t_o =\s+([\d.]+) us", text)
    d["r_bal"] = num(r"r_balance = (-?[\d.]+)", text)
    d["r0"] = num(r"-> r0 = ([\d.]+)", text)
    m = re.search(r"search: (\d+) probes \((\d+) of them (?:in paired rounds|paired "
                  r"re-measurements) for (\d+) (?:close )?comparisons\)", text)
    if m:
        d["probes"], d["remeasured"], d["paired"] = (int(m.group(i)) for i in (1, 2, 3))
    else:  # output of a build before paired re-measurement
        d["probes"], d["remeasured"], d["paired"] = num(r"search: (\d+) probes", text, int), 0, 0
    d["chosen"] = num(r"^chosen r = ([\d.]+)", text)
    d["bound"] = num(r"^lower-bound check: r_min was (faster|slower)", text, str, "")
    d["cal_s"] = num(r"calibration took ([\d.]+) s", text)
    d["sweep"] = [(float(r), float(t)) for r, t in
                  re.findall(r"^  r = ([\d.]+)  mean TTFT ([\d.]+) ms", text, re.M)]
    m = re.search(r"re-measured: sweep best r = ([\d.]+) ([\d.]+) ms, chosen r = ([\d.]+) "
                  r"([\d.]+) ms, r_min = ([\d.]+) ([\d.]+) ms, full recompute ([\d.]+) ms", text)
    d["best_r"], d["t_best"], _, d["t_chosen"], d["r_min"], d["t_rmin"], d["t_full"] = (
        float(m.group(i)) for i in range(1, 8))
    m = re.search(r"\|dr\| = ([\d.]+), TTFT ([+-][\d.]+)% -> criterion (holds|FAILS)", text)
    d["dr"], d["dt"], d["holds"] = float(m.group(1)), float(m.group(2)), m.group(3) == "holds"
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", default="bench/results/calibrate_tiers")
    a = ap.parse_args()
    rows = [parse(os.path.join(a.dir, t + ".txt")) for t in TIERS
            if os.path.exists(os.path.join(a.dir, t + ".txt"))]
    if not rows:
        sys.exit(f"{a.dir}: none of {', '.join(t + '.txt' for t in TIERS)}")
    out = []
    out.append("| tier | t_c us | t_i us | t_o ms | analytic r0 | probes (paired) | r_min check "
               "| chosen r "
               "| sweep best r | chosen vs best (re-measured) | criterion | full TTFT "
               "| speedup at r_min | speedup at chosen r | calibration |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d in rows:
        tier = LABEL[os.path.basename(d["path"])[:-4]]
        verdict = "holds" if d["holds"] else "**fails**"
        check = {"faster": "r_min won", "slower": "kept"}.get(d["bound"], "–")
        why = " (dr)" if d["holds"] and d["dr"] <= 0.02 else (" (TTFT)" if d["holds"] else "")
        out.append(
            f"| {tier} | {d['t_c']:.0f} | {d['t_i']:.1f} | {d['t_o'] / 1e3:.1f} "
            f"| {d['r0']:.3f} (r_bal {d['r_bal']:.3f}) | {d['probes']} ({d['remeasured']}) "
            f"| {check} | {d['chosen']:.4f} | {d['best_r']:.2f} | dr {d['dr']:.3f}, {d['dt']:+.1f}% "
            f"| {verdict}{why} | {d['t_full'] / 1e3:.1f} s | {d['t_full'] / d['t_rmin']:.2f}x "
            f"| {d['t_full'] / d['t_chosen']:.2f}x | {d['cal_s']:.0f} s |")
    out.append("")
    rs = sorted({r for d in rows for r, _ in d["sweep"]})
    out.append("| r | " + " | ".join(LABEL[os.path.basename(d["path"])[:-4]] for d in rows) + " |")
    out.append("|---|" + "---|" * len(rows))
    for r in rs:
        cells = []
        for d in rows:
            sw = dict(d["sweep"])
            best = min(sw.values()) if sw else None
            t = sw.get(r)
            cells.append("" if t is None else (f"**{t:.0f}**" if t == best else f"{t:.0f}"))
        out.append(f"| {r:.2f} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("Conditions: " + "; ".join(
        f"{LABEL[os.path.basename(d['path'])[:-4]]}: {d['header'] or 'not recorded'}"
        for d in rows) + ".")
    print("\n".join(out))


if __name__ == "__main__":
    main()
