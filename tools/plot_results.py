#!/usr/bin/env python3
"""Figures and docs/RESULTS.md from one `cachetune eval` output directory.

Reads DIR/results.jsonl, DIR/summary.json and DIR/run.json (written by src/eval/runner.cc),
draws the figures into docs/figures/ and regenerates docs/RESULTS.md, including a plain
statement of whether each quality target is met. Needs tools/deps/requirements-eval.txt.

    python3 tools/plot_results.py DIR [--figures docs/figures] [--results docs/RESULTS.md]
"""

import argparse
import json
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

# Plot order and colours: the policies of the paper's comparison, then the ablations.
POLICIES = ["full", "prefix", "reuse", "cachetune", "cacheblend", "epic", "prophetkv", "random",
            "l2", "highfreq", "lfonly"]
COLORS = {p: c for p, c in zip(POLICIES, plt.get_cmap("tab20").colors[::2] +
                                plt.get_cmap("tab20").colors[1::2])}
SELECTION_POLICIES = ["cachetune", "l2", "highfreq", "random", "epic", "cacheblend", "prophetkv"]
BASELINES_TO_BEAT = ["reuse", "random", "highfreq", "epic", "cacheblend"]
RATIO_TARGET = 0.95
RECALL_TARGET = 0.85
# Below this full-recompute task score (metrics in [0, 1]) the task is beyond the model, and the
# verdicts on task score are flagged as uninformative (they are still stated).
UNINFORMATIVE_SCORE = 0.2


def load(dirname):
    with open(os.path.join(dirname, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(dirname, "run.json")) as f:
        run = json.load(f)
    records = []
    with open(os.path.join(dirname, "results.jsonl")) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"{dirname}/results.jsonl:{n}: invalid JSON ({e})")
    return summary, run, records


def ordered(policies):
    known = [p for p in POLICIES if p in policies]
    return known + sorted(p for p in policies if p not in POLICIES)


def has_gold(task_summary):
    full = task_summary["settings"].get("base", {}).get("full", {})
    return full.get("task_score") is not None


def quality(p, gold):
    """Task score where the task has gold answers, else agreement with full (F1/ROUGE-L)."""
    return p.get("task_score") if gold else p.get("fid_score")


def fmt(v, spec=".3f"):
    return "–" if v is None else format(v, spec)


def setting_values(settings, prefix):
    """Sweep settings named prefix=<v>, sorted by v."""
    out = []
    for name, pols in settings.items():
        if name.startswith(prefix + "="):
            out.append((float(name.split("=", 1)[1]), name, pols))
    return sorted(out)


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


MARKERS = "osD^v<>phX*"


def fig_quality_vs_ttft(summary, out):
    """Row 1: task score (or agreement with full) vs TTFT; row 2: KL to full vs TTFT."""
    tasks = list(summary["tasks"])
    width = 5.4 * len(tasks) + 1.6
    fig, axes = plt.subplots(2, len(tasks), figsize=(width, 7.6), squeeze=False)
    handles = {}
    for col, task in enumerate(tasks):
        ts = summary["tasks"][task]
        base = ts["settings"].get("base", {})
        gold = has_gold(ts)
        ax_q, ax_k = axes[0][col], axes[1][col]
        for i, pol in enumerate(ordered(base)):
            p = base[pol]
            if p.get("ttft_ms") is None:
                continue
            style = dict(s=70, color=COLORS.get(pol, "k"), marker=MARKERS[i % len(MARKERS)],
                         edgecolor="k", zorder=3)
            if quality(p, gold) is not None:
                handles[pol] = ax_q.scatter(p["ttft_ms"], quality(p, gold), **style)
            if p.get("kl") is not None and pol != "full":
                ax_k.scatter(p["ttft_ms"], max(p["kl"], 1e-4), **style)
        ax_q.set_ylabel(("task score (" + base.get("full", {}).get("metric", "") + ")") if gold
                        else "agreement with full (F1)")
        ax_q.set_title(f"{task} (n={ts['n_examples']}, "
                       f"r={base.get('cachetune', {}).get('ratio', '')})")
        ax_k.set_yscale("log")
        ax_k.set_ylabel("KL(full || policy), first answer tokens\n(0 drawn at 1e-4)")
        for ax in (ax_q, ax_k):
            ax.set_xlabel("mean TTFT (ms)")
            ax.grid(alpha=0.3, which="both")
    fig.legend([handles[p] for p in ordered(handles)], ordered(handles), loc="center right",
               fontsize=9)
    fig.tight_layout(rect=(0, 0, 1 - 1.4 / width, 1))
    path = os.path.join(out, "quality_vs_ttft.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fig_sweep(summary, out, prefix, xlabel, fname):
    tasks = [t for t in summary["tasks"] if setting_values(summary["tasks"][t]["settings"], prefix)]
    if not tasks:
        return None
    fig, axes = plt.subplots(3, len(tasks), figsize=(5.2 * len(tasks), 10), squeeze=False)
    for col, task in enumerate(tasks):
        ts = summary["tasks"][task]
        gold = has_gold(ts)
        sweep = setting_values(ts["settings"], prefix)
        pols = sorted({p for _, _, ps in sweep for p in ps})
        ax_q, ax_k, ax_t = axes[0][col], axes[1][col], axes[2][col]
        for pol in ordered(pols):
            xs = [v for v, _, ps in sweep if pol in ps]
            ax_q.plot(xs, [quality(ps[pol], gold) for _, _, ps in sweep if pol in ps], "o-",
                      color=COLORS.get(pol, "k"), label=f"{pol} score")
            ax_q.plot(xs, [ps[pol]["fid_score"] for _, _, ps in sweep if pol in ps], "s--",
                      color=COLORS.get(pol, "k"), alpha=0.6, label=f"{pol} F1 vs full")
            ax_k.plot(xs, [ps[pol]["kl"] for _, _, ps in sweep if pol in ps], "o-",
                      color=COLORS.get(pol, "k"), label=f"{pol} KL")
            ax_t.plot(xs, [ps[pol]["ttft_ms"] for _, _, ps in sweep if pol in ps], "o-",
                      color=COLORS.get(pol, "k"), label=f"{pol} TTFT")
        # Full recompute over the same examples as the sweep (the summary pairs them).
        first = next(iter(sweep[0][2].values()))
        full_q = first.get("full_task_score") if gold else 1.0
        if full_q is not None:
            ax_q.axhline(full_q, color="k", ls=":", label="full score")
        if first.get("full_ttft_ms") is not None:
            ax_t.axhline(first["full_ttft_ms"], color="k", ls=":", label="full TTFT")
        for ax, what, ylabel in ((ax_q, "quality", "score"),
                                 (ax_k, "KL(full || policy)", "mean KL, first answer tokens"),
                                 (ax_t, "TTFT", "mean TTFT (ms)")):
            ax.set_title(f"{task}: {what} vs {xlabel}")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        ax_k.set_ylim(bottom=0)
    return save(fig, os.path.join(out, fname))


def fig_bars(summary, out, key, ylabel, fname, policies=None, setting="base", target=None):
    tasks = list(summary["tasks"])
    pols = set()
    for t in tasks:
        pols |= {p for p, v in summary["tasks"][t]["settings"].get(setting, {}).items()
                 if v.get(key) is not None and (policies is None or p in policies)}
    pols = ordered(pols)
    if not pols:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(pols) * len(tasks) / 2 + 3), 4.2))
    width = 0.8 / len(tasks)
    for i, t in enumerate(tasks):
        vals = [summary["tasks"][t]["settings"].get(setting, {}).get(p, {}).get(key) for p in pols]
        xs = np.arange(len(pols)) + i * width
        ax.bar(xs, [v if v is not None else 0 for v in vals], width, label=t)
        for x, v in zip(xs, vals):
            if v is not None:
                ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    if target is not None:
        ax.axhline(target, color="r", ls="--", label=f"target {target:g}")
    ax.set_xticks(np.arange(len(pols)) + width * (len(tasks) - 1) / 2)
    ax.set_xticklabels(pols, rotation=20)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, os.path.join(out, fname))


def fig_attention(summary, out):
    """Cosines sit between 0.99 and 1, so bars of 1 - cosine on a log axis show the differences."""
    tasks = list(summary["tasks"])
    pols = ordered({p for t in tasks for p, v in summary["tasks"][t]["settings"].get("base", {}).items()
                    if v.get("attn_cos") is not None and p != "full"})
    if not pols:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(pols) * len(tasks) + 3), 4.2))
    width = 0.8 / len(tasks)
    for i, t in enumerate(tasks):
        base = summary["tasks"][t]["settings"].get("base", {})
        cos = [base.get(p, {}).get("attn_cos") for p in pols]
        xs = np.arange(len(pols)) + i * width
        ax.bar(xs, [max(1 - c, 1e-7) if c is not None else 0 for c in cos], width, label=t)
        for x, c in zip(xs, cos):
            if c is not None:
                ax.text(x, max(1 - c, 1e-7), f"{c:.4f}", ha="center", va="bottom", fontsize=7,
                        rotation=90)
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(pols)) + width * (len(tasks) - 1) / 2)
    ax.set_xticklabels(pols, rotation=20)
    ax.set_ylabel("1 − cosine(policy, full)")
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, os.path.join(out, "attention_cosine.png"))


def fig_recall_vs_ratio(summary, out):
    tasks = [t for t in summary["tasks"] if setting_values(summary["tasks"][t]["settings"], "r")]
    if not tasks:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for t in tasks:
        sweep = setting_values(summary["tasks"][t]["settings"], "r")
        for pol in ordered({p for _, _, ps in sweep for p in ps}):
            pts = [(v, ps[pol]["recall"]) for v, _, ps in sweep
                   if pol in ps and ps[pol].get("recall") is not None]
            if pts:
                ax.plot(*zip(*pts), "o-", label=f"{t} {pol}")
    xs = np.linspace(0.05, 0.4, 8)
    ax.plot(xs, xs, "k:", label="random (expected = r)")
    ax.set_xlabel("recompute ratio r")
    ax.set_ylabel("Recall@r of high-drift tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, os.path.join(out, "recall_vs_ratio.png"))


def read_ref_drift(path):
    """Per-chunk drift vectors from a refs/<example>.<setting>.bin file (runner.cc Reference:
    magic, then length-prefixed answer bytes, forced int32, forced logits f32, attention f32,
    then a chunk count and one length-prefixed f32 drift vector per chunk)."""
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:8] != b"CTEVREF1":
        return None
    off = 8
    for size in (1, 4, 4, 4):
        n = int(np.frombuffer(buf, np.uint64, 1, off)[0])
        off += 8 + n * size
    nc = int(np.frombuffer(buf, np.uint64, 1, off)[0])
    off += 8
    out = []
    for _ in range(nc):
        n = int(np.frombuffer(buf, np.uint64, 1, off)[0])
        out.append(np.frombuffer(buf, np.float32, n, off + 8))
        off += 8 + 4 * n
    return out


def drift_positions(dirname, ratio):
    """Per task: where the top-r drift tokens sit in their chunk (base layout references)."""
    refs = os.path.join(dirname, "refs")
    if not os.path.isdir(refs):
        return {}
    out = defaultdict(lambda: {"abs": np.zeros(64), "rel": np.zeros(10), "n_ref": 0,
                               "first3": 0, "first16": 0, "n_chunks": 0, "n_tok": 0})
    for name in sorted(os.listdir(refs)):
        if not name.endswith(".base.bin"):
            continue
        task = name.rsplit("-", 1)[0]
        chunks = read_ref_drift(os.path.join(refs, name))
        for d in chunks or []:
            n = len(d)
            k = min(n, int(np.ceil(ratio * n - 1e-6)))
            top = np.argsort(-d, kind="stable")[:k]
            o = out[task]
            o["n_chunks"] += 1
            o["n_tok"] += n
            o["n_ref"] += k
            o["first3"] += int(np.sum(top < 3))
            o["first16"] += int(np.sum(top < 16))
            for t in top:
                if t < 64:
                    o["abs"][t] += 1
                o["rel"][min(9, int(10 * t / n))] += 1
    return dict(out)


def fig_drift_positions(pos, out):
    if not pos:
        return None
    fig, (ax_a, ax_r) = plt.subplots(1, 2, figsize=(11, 4))
    for t, o in pos.items():
        ax_a.plot(np.arange(64), o["abs"] / max(1, o["n_chunks"]), "o-", ms=3, label=t)
        ax_r.plot((np.arange(10) + 0.5) / 10, o["rel"] / max(1, o["n_ref"]), "o-", label=t)
    ax_a.set_xlabel("token index in chunk")
    ax_a.set_ylabel("share of chunks with this token in the reference set")
    ax_a.set_title("High-drift tokens by position (first 64)")
    ax_r.set_xlabel("relative position in chunk")
    ax_r.set_ylabel("fraction of reference tokens")
    ax_r.set_title("High-drift tokens by relative position (deciles)")
    for ax in (ax_a, ax_r):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, os.path.join(out, "drift_positions.png"))


def fig_band_energy(summary, out):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for t, ts in summary["tasks"].items():
        e = ts.get("band_energy") or []
        if e:
            ax.plot(np.arange(len(e)) + 1, e, "o-", label=t)
    ax.set_yscale("log")
    ax.set_xlabel("frequency band (1 = lowest 10% of the token-axis spectrum)")
    ax.set_ylabel("fraction of K/V energy")
    ax.set_title("KV energy per frequency band (isolated chunks, mean over chunks)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, os.path.join(out, "band_energy.png"))


def robustness_table(records):
    """Per task: the layouts run, and per policy and layout (mean score, mean KL, n) over the
    examples that have a full reference in every layout."""
    by = defaultdict(lambda: defaultdict(dict))  # task -> example -> (setting, policy) -> rec
    for r in records:
        s = r["setting"]
        if s == "base" or s == "shuffle" or s.startswith("prefix"):
            by[r["task"]][r["example"]][(s, r["policy"])] = r
    out = {}
    for task, exs in by.items():
        settings = sorted({s for e in exs.values() for s, _ in e}, key=lambda s: (s != "base", s))
        if len(settings) < 2:
            continue
        ex_ok = [e for e, d in exs.items() if all((s, "full") in d for s in settings)]
        pols = ordered({p for e in ex_ok for _, p in exs[e]
                        if all((s, p) in exs[e] for s in settings)})
        rows = []
        for p in pols:
            row = [p]
            for s in settings:
                vals = [exs[e][(s, p)] for e in ex_ok if (s, p) in exs[e]]
                gold = any(v.get("task_score") is not None for v in vals)
                sc = [v["task_score"] if gold else v["fid_score"] for v in vals]
                kl = [v["kl"] for v in vals]
                row.append((float(np.mean(sc)) if sc else None,
                            float(np.mean(kl)) if kl else None, len(vals)))
            rows.append(row)
        out[task] = (settings, rows, len(ex_ok))
    return out


def fig_robustness(rob, out):
    if not rob:
        return None
    tasks = list(rob)
    fig, axes = plt.subplots(2, len(tasks), figsize=(7 * len(tasks), 7.5), squeeze=False)
    for col, t in enumerate(tasks):
        settings, rows, n_ex = rob[t]
        pols = [r[0] for r in rows]
        width = 0.8 / len(settings)
        for i, s in enumerate(settings):
            xs = np.arange(len(pols)) + i * width
            axes[0][col].bar(xs, [r[1 + i][0] or 0 for r in rows], width, label=s)
            axes[1][col].bar(xs, [max(r[1 + i][1] or 0, 1e-4) for r in rows], width, label=s)
        for row, ylabel in ((0, "score (task metric; F1 vs full without gold)"),
                            (1, "KL vs the layout's full recompute")):
            ax = axes[row][col]
            ax.set_xticks(np.arange(len(pols)) + width * (len(settings) - 1) / 2)
            ax.set_xticklabels(pols, rotation=20)
            ax.set_ylabel(ylabel)
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=8)
        axes[1][col].set_yscale("log")
        axes[0][col].set_title(f"{t} (n={n_ex}): chunk order and preceding context")
    return save(fig, os.path.join(out, "robustness.png"))


def targets(summary):
    """Plain statements of the three targets per task."""
    lines = []
    overall = {"ratio": [], "beats": [], "recall": []}
    for task, ts in summary["tasks"].items():
        base = ts["settings"].get("base", {})
        ct = base.get("cachetune")
        if not ct:
            lines.append(f"- **{task}**: cachetune was not run in the base setting; no verdict.")
            continue
        gold = has_gold(ts)
        parts = []
        if gold:
            r = ct.get("score_vs_full")
            met = r is not None and r >= RATIO_TARGET
            overall["ratio"].append(met)
            parts.append(f"keeps {fmt(r * 100 if r is not None else None, '.1f')}% of full's score "
                         f"({fmt(ct['task_score'])} vs {fmt(ct['full_task_score'])}): "
                         f"**{'met' if met else 'NOT met'}** (target ≥ {RATIO_TARGET:.0%})")
        else:
            parts.append("no gold answers: the ≥95% target is not applicable; agreement with full "
                         f"(F1) is {fmt(ct.get('fid_score'))}")
        full_q = ct.get("full_task_score")
        if gold and full_q is not None and full_q < UNINFORMATIVE_SCORE:
            parts.append(f"caveat: full recompute itself scores only {fmt(full_q)}, so task-score "
                         "comparisons on this task are at the noise floor; KL and agreement with "
                         "full are the informative measures here")
        q = quality(ct, gold)
        beaten, lost = [], []
        for b in BASELINES_TO_BEAT:
            if b in base and quality(base[b], gold) is not None and q is not None:
                (beaten if q > quality(base[b], gold) else lost).append(
                    f"{b} {fmt(quality(base[b], gold))}")
        met = not lost and beaten
        overall["beats"].append(bool(met))
        what = "task score" if gold else "agreement with full"
        parts.append(f"beats the same-budget baselines on {what} ({fmt(q)}): "
                     f"**{'met' if met else 'NOT met'}**"
                     + (f"; not beaten: {', '.join(lost)}" if lost else "")
                     + (f"; beaten: {', '.join(beaten)}" if beaten else ""))
        kl_b = [f"{b} {fmt(base[b].get('kl'), '.4f')}" for b in BASELINES_TO_BEAT
                if b in base and base[b].get("kl") is not None]
        if ct.get("kl") is not None and kl_b:
            n_better = sum(1 for b in BASELINES_TO_BEAT if b in base and base[b].get("kl") is not None
                           and ct["kl"] < base[b]["kl"])
            parts.append(f"on KL to full (lower is closer) cachetune has {fmt(ct['kl'], '.4f')}, "
                         f"lower than {n_better} of {len(kl_b)} baselines ({', '.join(kl_b)})")
        rc = ct.get("recall")
        met = rc is not None and rc >= RECALL_TARGET
        overall["recall"].append(met)
        parts.append(f"Recall@{ct['ratio']:.0%} = {fmt(rc)}: **{'met' if met else 'NOT met'}** "
                     f"(target ≥ {RECALL_TARGET:.0%})")
        lines.append(f"- **{task}**:")
        lines.extend(f"  - {x[0].upper() + x[1:]}." for x in parts)
    verdict = []
    for key, name in (("ratio", "≥95% of full's score"), ("beats", "beats reuse/random/highfreq/"
                      "epic/cacheblend"), ("recall", "Recall@15% ≥ 85%")):
        v = overall[key]
        verdict.append(f"- {name}: met on {sum(v)} of {len(v)} tasks — "
                       f"**{'met' if v and all(v) else 'NOT met'}** overall.")
    return lines, verdict


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="output directory of `cachetune eval`")
    ap.add_argument("--figures", default="docs/figures")
    ap.add_argument("--results", default="docs/RESULTS.md")
    ap.add_argument("--data-note", default="", help="extra sentence for the data section")
    ap.add_argument("--notes", help="Markdown file inserted verbatim as the 'Reading the results' "
                    "section (hand-written interpretation kept next to the generated numbers)")
    a = ap.parse_args()
    summary, run, records = load(a.dir)
    os.makedirs(a.figures, exist_ok=True)
    rel = os.path.relpath(a.figures, os.path.dirname(os.path.abspath(a.results)))

    figs = []
    figs.append(("Quality vs TTFT per policy (paper Fig. 3); base setting",
                 fig_quality_vs_ttft(summary, a.figures)))
    figs.append(("Quality and TTFT vs recompute ratio r (alpha fixed; paper Fig. 11b)",
                 fig_sweep(summary, a.figures, "r", "recompute ratio r", "quality_vs_ratio.png")))
    figs.append(("Quality and TTFT vs low-frequency cutoff alpha (r fixed; paper Fig. 11a)",
                 fig_sweep(summary, a.figures, "alpha", "alpha", "quality_vs_alpha.png")))
    figs.append(("Recall@r of high-drift tokens per selection policy (paper Table 3)",
                 fig_bars(summary, a.figures, "recall", "Recall@r (pooled over chunks)",
                          "recall.png", SELECTION_POLICIES, target=RECALL_TARGET)))
    figs.append(("Recall@r vs r (sweep)", fig_recall_vs_ratio(summary, a.figures)))
    figs.append(("Query attention over the context vs full (paper Fig. 1a): 1 − cosine, log "
                 "scale (lower is closer; labels give the cosine)",
                 fig_attention(summary, a.figures)))
    figs.append(("KV energy per frequency band (paper App. E.1)",
                 fig_band_energy(summary, a.figures)))
    ratio = float(run.get("config", {}).get("ratio", 0.15))
    pos = drift_positions(a.dir, ratio)
    figs.append(("Where the reference (top-r drift) tokens sit in their chunks (base layout)",
                 fig_drift_positions(pos, a.figures)))
    rob = robustness_table(records)
    figs.append(("Chunk order shuffled and 1,024 tokens of preceding context (paper Fig. 1c)",
                 fig_robustness(rob, a.figures)))

    cfg = run.get("config", {})
    mach = run.get("machine", {})
    L = []
    L.append("# Results\n")
    L.append("Generated by `tools/plot_results.py` from a `cachetune eval` run; do not edit by "
             "hand (rerun the script). Raw records: `results.jsonl` of the run directory "
             f"(archived next to this file under `docs/results/` when committed).\n")
    L.append("## Setup\n")
    L.append(f"- Model: `{cfg.get('model')}` (fingerprint `{cfg.get('model_fingerprint')}`), "
             f"greedy decoding, chunk K/V stored as {cfg.get('kv_dtype')}.")
    L.append(f"- Policies at r = {cfg.get('ratio')}, alpha = {cfg.get('alpha')} (EPIC: first 16 "
             "tokens of each chunk; cacheblend/prophetkv select r of each chunk online). "
             f"Answer budget {cfg.get('max_tokens_qa')} tokens for QA, "
             f"{cfg.get('max_tokens_summary')} for summaries; KL over the first "
             f"{cfg.get('kl_positions')} teacher-forced tokens of full's answer.")
    L.append(f"- Machine: {mach.get('cpu')}, {mach.get('cores')} cores (the load average at the "
             f"start of each invocation below shows what else was running); "
             f"OMP_WAIT_POLICY={mach.get('omp_wait_policy') or '(unset)'}. TTFT = wall time of "
             "`selective_prefill` + first-token sample, single request, chunk records in memory.")
    data = sorted({d for inv in run.get("invocations", []) for d in inv.get("data", [])})
    L.append("- Data: " + ", ".join(f"`{d}`" for d in data) +
             " (shared/data/README.md). " + a.data_note)
    L.append("")
    L.append("| task | examples | mean prompt tokens | metric |")
    L.append("|---|---|---|---|")
    for t, ts in summary["tasks"].items():
        m = ts["settings"].get("base", {}).get("full", {}).get("metric", "")
        m = m if has_gold(ts) else f"{m} vs full only (no gold answers)"
        L.append(f"| {t} | {ts['n_examples']} | {fmt(ts.get('mean_prompt_tokens'), '.0f')} | {m} |")
    L.append("\nCommands (in order; every invocation appended to the same directory, finished "
             "units skipped):\n")
    L.append("```")
    for inv in run.get("invocations", []):
        took = ""
        if isinstance(inv.get("seconds"), (int, float)):
            m, sec = divmod(int(round(inv["seconds"])), 60)
            took = f", took {m} min {sec:02d} s for {inv.get('units_run', '?')} units"
        L.append(f"OMP_WAIT_POLICY={mach.get('omp_wait_policy') or ''} {inv['command']}"
                 f"    # {inv.get('started')}, load {inv.get('loadavg_at_start', '?')}{took}")
    L.append("```\n")

    L.append("Regenerate this page (figures included) from the run directory with the command "
             "below; the archived copy in `docs/results/` works too, except for the drift "
             "positions, which are read from the run directory's `refs/`.\n")
    L.append("```")
    L.append("pip install -r tools/deps/requirements-eval.txt")
    L.append("python3 tools/plot_results.py " + " ".join(
        "'" + x + "'" if (" " in x or ";" in x) else x for x in sys.argv[1:]))
    L.append("```\n")
    L.append("The default run is `cachetune eval --data ../shared/data --out DIR` (all five "
             "tasks, `--limit 2`, policies full, reuse, cachetune, cacheblend, epic, random, "
             "highfreq, prophetkv); each invocation's wall time, where recorded, is in the "
             "comment after its command above. It is not part of the tests.\n")
    L.append("## Targets\n")
    tl, verdict = targets(summary)
    L.append("Targets: cachetune at r = 0.15 keeps ≥ 95% of full recompute's task score, beats "
             "reuse / random / highfreq / epic / cacheblend at the same budget, and reaches "
             "Recall@15% ≥ 85% of the high-drift tokens. With a handful of examples per task a "
             "difference of one answer moves a mean by 0.1–0.2, so ties and small gaps are noise.\n")
    L.extend(tl)
    L.append("\nOverall:\n")
    L.extend(verdict)
    L.append("")

    if a.notes:
        with open(a.notes) as f:
            L.append("## Reading the results\n")
            L.append(f.read().strip() + "\n")

    if pos:
        L.append("## Where the drift is\n")
        L.append(f"Reference sets (top {ratio:g} of each chunk's tokens by drift, base layout): "
                 "the share that lies in the first 3 and first 16 tokens of their chunk. A "
                 "position-blind selection would put about 3/N and 16/N of them there.\n")
        L.append("| task | chunks | mean chunk tokens | reference tokens | in first 3 | "
                 "in first 16 |")
        L.append("|---|---|---|---|---|---|")
        for t, o in pos.items():
            L.append(f"| {t} | {o['n_chunks']} | {o['n_tok'] / max(1, o['n_chunks']):.0f} | "
                     f"{o['n_ref']} | {o['first3'] / max(1, o['n_ref']):.3f} | "
                     f"{o['first16'] / max(1, o['n_ref']):.3f} |")
        L.append("")

    L.append("## Base setting per task\n")
    L.append("score: task metric vs gold (mean); vs full: score / full's score; F1 full: the "
             "answer scored against full's answer; KL: mean KL(full || policy) of the next-token "
             "distribution over full's first answer tokens; cos: cosine of the query tokens' "
             "attention over the context vs full; recall: Recall@r of the top-r high-drift tokens "
             "(pooled over chunks); TTFT: mean ms; speedup: mean full TTFT / mean policy TTFT.\n")
    for t, ts in summary["tasks"].items():
        base = ts["settings"].get("base", {})
        L.append(f"### {t}\n")
        L.append("| policy | score | vs full | F1 full | KL | cos | recall | TTFT ms | speedup |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for p in ordered(base):
            v = base[p]
            L.append(f"| {p} | {fmt(v.get('task_score'))} | {fmt(v.get('score_vs_full'), '.2f')} | "
                     f"{fmt(v.get('fid_score'))} | {fmt(v.get('kl'), '.4f')} | "
                     f"{fmt(v.get('attn_cos'), '.4f')} | {fmt(v.get('recall'))} | "
                     f"{fmt(v.get('ttft_ms'), '.0f')} | {fmt(v.get('speedup'), '.2f')} |")
        L.append("\nPrefill breakdown (mean ms; rows recomputed after selection / loaded per layer):\n")
        L.append("| policy | select | load (loader) | load wait | compute | logits | total | "
                 "active rows | loaded rows |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for p in ordered(base):
            b = base[p].get("breakdown", {})
            L.append(f"| {p} | {fmt(b.get('select_ms'), '.1f')} | {fmt(b.get('load_ms'), '.1f')} | "
                     f"{fmt(b.get('load_wait_ms'), '.1f')} | {fmt(b.get('compute_ms'), '.0f')} | "
                     f"{fmt(b.get('logits_ms'), '.1f')} | {fmt(b.get('total_ms'), '.0f')} | "
                     f"{fmt(b.get('n_active'), '.0f')} | {fmt(b.get('n_loaded'), '.0f')} |")
        L.append("")

    sweeps = []
    for t, ts in summary["tasks"].items():
        for prefix, name in (("r", "r"), ("alpha", "alpha")):
            sv = setting_values(ts["settings"], prefix)
            if sv:
                sweeps.append((t, name, sv, has_gold(ts)))
    if sweeps:
        L.append("## Sweeps\n")
        for t, name, sv, gold in sweeps:
            n = max(p["n"] for _, _, ps in sv for p in ps.values())
            L.append(f"### {t}: {name} (n = {n})\n")
            L.append(f"| {name} | policy | score | F1 full | KL | recall | TTFT ms | speedup |")
            L.append("|---|---|---|---|---|---|---|---|")
            for v, _, ps in sv:
                for p in ordered(ps):
                    x = ps[p]
                    L.append(f"| {v:g} | {p} | {fmt(quality(x, gold))} | {fmt(x.get('fid_score'))} | "
                             f"{fmt(x.get('kl'), '.4f')} | {fmt(x.get('recall'))} | "
                             f"{fmt(x.get('ttft_ms'), '.0f')} | {fmt(x.get('speedup'), '.2f')} |")
            L.append("")

    if rob:
        L.append("## Context robustness\n")
        L.append("Same chunk records and stored rankings; `shuffle` permutes the chunk order "
                 "(seeded), `prefix1024` puts 1,024 tokens of other examples' chunks before the "
                 "documents. Cells: score (task metric, or F1 vs full without gold) / KL vs the "
                 "setting's own full recompute, over the examples run in every setting.\n")
        for t, (settings, rows, n_ex) in rob.items():
            L.append(f"### {t} (n = {n_ex})\n")
            L.append("| policy | " + " | ".join(settings) + " |")
            L.append("|---|" + "---|" * len(settings))
            for row in rows:
                cells = [f"{fmt(sc)} / {fmt(kl, '.4f')}" if n else "–" for sc, kl, n in row[1:]]
                L.append(f"| {row[0]} | " + " | ".join(cells) + " |")
            L.append("")

    L.append("## Figures\n")
    for title, path in figs:
        if path:
            L.append(f"**{title}**\n")
            L.append(f"![{title}]({rel}/{os.path.basename(path)})\n")
    # A section written by tools/quality_tables.py (issue 15) between these markers is kept.
    keep = ""
    if os.path.exists(a.results):
        old = open(a.results).read()
        i, j = old.find(QUALITY_BEGIN), old.find(QUALITY_END)
        if i >= 0 and j > i:
            keep = old[i:j + len(QUALITY_END)] + "\n\n"
    if keep:
        L.insert(1, keep)
    with open(a.results, "w") as f:
        f.write("\n".join(L) + "\n")
    print(f"wrote {a.results} and {sum(1 for _, p in figs if p)} figures in {a.figures}")


QUALITY_BEGIN = "<!-- quality-tables: begin -->"
QUALITY_END = "<!-- quality-tables: end -->"


if __name__ == "__main__":
    main()
