#!/usr/bin/env python3
"""Quality against the recompute ratio r (issue 15 item 4), from `cachetune eval --sweep-ratio`.

usage: tools/r_curve.py RUN_DIR [RUN_DIR ...] [--policy cachetune] [--slack 0.10] [--plot PNG]
                        [--into docs/RESULTS.md]

A RUN_DIR is one model's results directory of bench/quality_r_sweep.sh (settings "r=<v>" beside
"base"). For each model: a table of the policy at every swept r, all tasks pooled (KL ratio to
full reuse with its 95% bootstrap interval and median, F1 of the greedy answer against full's,
task score, Recall@r, TTFT speedup over full), and the quality floor r_min by the rule

    floor = the lowest mean KL ratio over the swept r;
    r_min = the smallest swept r whose mean KL ratio is at most floor + slack,

with slack 0.10: 10% of full reuse's KL (a KL ratio of 1) above the floor. Larger r then buys
less than a tenth of what reuse loses. The r_min column of tools/models.tsv holds this value per
model; `cachetune generate`, `serve` and `calibrate` take it as their floor and default ratio.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quality_tables import replace_between  # noqa: E402


def sweep_rows(summary, policy):
    rows = []
    for setting, st in summary.get("overall", {}).items():
        if not setting.startswith("r="):
            continue
        p = st.get("policies", {}).get(policy)
        if p and p["kl_ratio"].get("n"):
            rows.append((float(setting[2:]), p))
    return sorted(rows, key=lambda x: x[0])


def rule(rows, slack):
    floor = min(p["kl_ratio"]["mean"] for _, p in rows)
    r_min = next(r for r, p in rows if p["kl_ratio"]["mean"] <= floor + slack)
    return floor, r_min


def fmt_ci(s):
    if not s or not s.get("n"):
        return "–"
    return f"{s['mean']:.2f} [{s['lo']:.2f}, {s['hi']:.2f}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--policy", default="cachetune")
    ap.add_argument("--slack", type=float, default=0.10)
    ap.add_argument("--plot", help="draw each model's KL ratio against r with intervals (matplotlib)")
    ap.add_argument("--into", help="replace the text between the r-curve markers of this Markdown file")
    a = ap.parse_args()
    out, curves = [], []
    for d in a.dirs:
        s = json.load(open(os.path.join(d, "summary.json")))
        cfg = (s.get("run") or {}).get("config", {})
        model = cfg.get("model", d)
        rows = sweep_rows(s, a.policy)
        if not rows:
            sys.exit(f"r_curve: {d}: no 'r=' settings with policy '{a.policy}' in summary.json")
        ns = {t: s["tasks"][t]["n_examples"] for t in s["tasks"]}
        floor, r_min = rule(rows, a.slack)
        curves.append((os.path.basename(model), rows, floor, r_min))
        out.append(f"**{model}**, policy `{a.policy}`, {sum(ns.values())} examples (" +
                   ", ".join(f"{t} {n}" for t, n in sorted(ns.items())) + f"), `{os.path.normpath(d)}`\n")
        out.append("| r | n | KL ratio to reuse, mean [95% CI] | median | F1 vs full's answer | task score | "
                   "Recall@r | TTFT speedup over full |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r, p in rows:
            kr = p["kl_ratio"]
            rec = p.get("recall_pooled")
            out.append(f"| {r:g} | {kr['n']} | {fmt_ci(kr)} | {kr['median']:.2f} | {fmt_ci(p['fid_score'])} | "
                       f"{fmt_ci(p['task_score'])} | {'–' if rec is None else f'{rec:.3f}'} | "
                       f"{p['speedup']['mean']:.2f} |")
        out.append(f"\nFloor {floor:.3f}; r_min = **{r_min:g}** (smallest r with mean KL ratio <= "
                   f"floor + {a.slack:g}).\n")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for name, rows, floor, r_min in curves:
            rs = [r for r, _ in rows]
            m = [p["kl_ratio"]["mean"] for _, p in rows]
            lo = [p["kl_ratio"]["mean"] - p["kl_ratio"]["lo"] for _, p in rows]
            hi = [p["kl_ratio"]["hi"] - p["kl_ratio"]["mean"] for _, p in rows]
            line = ax.errorbar(rs, m, yerr=[lo, hi], fmt="o-", capsize=3, label=f"{name} (r_min {r_min:g})")
            ax.axvline(r_min, color=line[0].get_color(), lw=0.8, ls=":")
        ax.set_xlabel("recompute ratio r")
        ax.set_ylabel(f"KL ratio to full reuse, {a.policy} (95% CI)")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
        plt.close(fig)
    text = "\n".join(out)
    if not a.into:
        print(text)
        return 0
    replace_between(a.into, "<!-- r-curve: generated begin -->", "<!-- r-curve: generated end -->", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
