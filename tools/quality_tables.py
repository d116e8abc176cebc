#!/usr/bin/env python3
"""Markdown tables with bootstrap intervals from `cachetune eval` summaries (issue 15).

usage: tools/quality_tables.py RUN_DIR [RUN_DIR ...] [--setting base] [--vs probe] [--plot PNG]
                               [--into docs/RESULTS.md [--block NAME]]

A RUN_DIR is one model's results directory, or a directory of them (`cachetune eval --model A,B`
writes one subdirectory per model). For each model: an overall table (all examples of all tasks pooled),
one table per task, the paired differences of the KL ratio against --vs, and the ingest cost of
the probe ranking from the full-recompute records (encode_forward_ms, encode_rank_ms,
encode_probe_ms). Every number comes from the directory's summary.json / results.jsonl.
--plot draws each model's pooled KL ratio per policy with its 95% bootstrap interval (needs
matplotlib, tools/deps/requirements-eval.txt).
"""
import argparse
import json
import os
import sys

ORDER = ["full", "reuse", "freq", "cachetune", "head", "probe", "random", "epic", "cacheblend",
         "prophetkv", "probe-shared", "probe-pos", "attn", "probe-attn", "probe-attn-shared", "oracle", "oracle-shared", "highfreq", "l2", "lfonly",
         "prefix"]


def fmt_ci(s, digits=2):
    if not s or s.get("n", 0) == 0 or s.get("mean") is None:
        return "–"
    f = "{:.%df}" % digits
    if s["lo"] == s["hi"]:
        return f.format(s["mean"])
    return (f + " [" + f + ", " + f + "]").format(s["mean"], s["lo"], s["hi"])


def fmt(v, spec):
    return "–" if v is None else spec.format(v)


def policy_rows(pols):
    names = sorted(pols, key=lambda p: (ORDER.index(p) if p in ORDER else 99, p))
    return names


def table(stats, title, out):
    pols = stats["policies"]
    out.append(f"**{title}**\n")
    out.append("| policy | n | KL ratio to reuse, mean [95% CI] | median | F1 vs full's answer | "
               "task score | Recall@r | TTFT ms | speedup |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for p in policy_rows(pols):
        s = pols[p]
        kr = s["kl_ratio"]
        out.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            p, kr.get("n", 0) or s["fid_score"].get("n", 0),
            fmt_ci(kr) if p != "full" else "0", fmt(kr.get("median"), "{:.2f}") if p != "full" else "0",
            fmt_ci(s["fid_score"]), fmt_ci(s["task_score"]),
            fmt(s.get("recall_pooled"), "{:.3f}"),
            fmt(s["ttft_ms"].get("mean"), "{:.0f}"), fmt(s["speedup"].get("mean"), "{:.2f}")))
    out.append("")


def paired(stats, vs, title, out):
    pr = stats["paired"]
    rows = []
    for key, v in pr.items():
        a, b = key.split("|")
        if a != vs or b == "full":
            continue
        rows.append((b, v))
    if not rows:
        return
    rows.sort(key=lambda r: (ORDER.index(r[0]) if r[0] in ORDER else 99, r[0]))
    out.append(f"**{title}: paired differences, {vs} − other (per example; negative KL = {vs} "
               "closer to full)**\n")
    out.append("| other | n | KL ratio difference [95% CI] | F1-vs-full difference [95% CI] |")
    out.append("|---|---|---|---|")
    for b, v in rows:
        out.append("| {} | {} | {} | {} |".format(b, v["kl_ratio"].get("n", 0),
                                                 fmt_ci(v["kl_ratio"], 3), fmt_ci(v["fid_score"], 3)))
    out.append("")


def ingest_cost(run_dir, out, stored):
    """The probe's ingest cost from the full-recompute records. encode_rank_ms is the stored
    ranking's time and encode_probe_ms the sum of the others' (the F32-tap rankings of
    EncodeOptions::also); newer records give them one by one (encode_also_ms). Older records'
    only other ranking was the probe pass when lowfreq is stored and the frequency ranking when
    probe is (run.json config "rank"). Records whose isolated prefill carried the attention tap
    of the attn rankings (encode_attention_tap) are left out: their prefill time includes it
    (bench/ingest_cost.py measures each stored ranking's encoding on its own)."""
    fw = rk = pb = 0.0
    n = n_tap = 0
    with open(os.path.join(run_dir, "results.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("policy") != "full" or "encode_probe_ms" not in r or r["encode_forward_ms"] <= 0:
                continue
            if r.get("encode_attention_tap"):
                n_tap += 1
                continue
            split = r.get("encode_also_ms")
            stored_ms = r["encode_rank_ms"]
            if split is not None:
                freq = [v for k, v in split.items() if k.startswith("lowfreq/")]
                probe = split.get("probe")
                if stored == "probe":
                    probe = stored_ms
                elif stored == "lowfreq":
                    freq = [stored_ms]
                if not freq or probe is None:
                    continue  # the run computed one of the two rankings only
                rk_ms, pb_ms = sum(freq), probe
            elif stored == "probe":
                rk_ms, pb_ms = r["encode_probe_ms"], stored_ms
            else:
                rk_ms, pb_ms = stored_ms, r["encode_probe_ms"]
            fw += r["encode_forward_ms"]
            rk += rk_ms
            pb += pb_ms
            n += 1
    if n:
        out.append(f"**Ingest cost over the chunks of {n} examples** (ms, summed): isolated prefill "
                   f"{fw:.0f}, frequency ranking {rk:.0f}, probe pass {pb:.0f}. A plain encoding "
                   f"(prefill + frequency ranking) costs {fw + rk:.0f}; a probe encoding (prefill + "
                   f"probe) {fw + pb:.0f}, **{(fw + pb) / (fw + rk):.2f}×** the plain one "
                   f"({(fw + pb) / fw:.2f}× the prefill alone).")
    if n_tap:
        out.append(f"{n_tap} examples' isolated prefills also tapped the attention of the attn "
                   f"rankings and are left out of this figure; `bench/ingest_cost.py` measures "
                   f"each stored ranking's encoding on its own.")
    if n or n_tap:
        out.append("")


def run_dirs(dirs):
    """Each argument as a model's results directory, or its subdirectories that are ones."""
    out = []
    for d in dirs:
        if os.path.exists(os.path.join(d, "summary.json")):
            out.append(d)
            continue
        if not os.path.isdir(d):
            sys.exit(f"{d}: no such results directory")
        subs = sorted(os.path.join(d, e) for e in os.listdir(d)
                      if os.path.exists(os.path.join(d, e, "summary.json")))
        if not subs:
            sys.exit(f"{d}: no summary.json in it or in any subdirectory (run `cachetune eval "
                     "--out DIR`, or `cachetune eval --summarize-only --data - --out DIR` to "
                     "rewrite the summaries from results.jsonl)")
        out.extend(subs)
    return out


def plot(models, setting, path):
    """models: [(name, summary)]. One panel per model: the pooled KL ratio to full reuse of every
    policy with its 95% bootstrap interval; 1 is full reuse, 0 full recompute."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 4.6), squeeze=False)
    for ax, (name, s) in zip(axes[0], models):
        pols = (s.get("overall", {}).get(setting) or {}).get("policies", {})
        rows = [(p, pols[p]["kl_ratio"]) for p in policy_rows(pols)
                if p != "full" and pols[p]["kl_ratio"].get("n")]
        rows.reverse()
        y = list(range(len(rows)))
        mean = [r["mean"] for _, r in rows]
        lo = [r["mean"] - r["lo"] for _, r in rows]
        hi = [r["hi"] - r["mean"] for _, r in rows]
        ax.errorbar(mean, y, xerr=[lo, hi], fmt="o", capsize=3, color="tab:blue")
        ax.set_yticks(y)
        ax.set_yticklabels([f"{p} (n={r['n']})" for p, r in rows], fontsize=8)
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.axvline(0.5, color="tab:red", lw=0.8, ls=":")
        ax.set_xlabel("KL ratio to full reuse (95% CI); red: target 0.5")
        ax.set_title(name, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def replace_between(path, begin, end, text):
    """Replaces what lies between the markers `begin` and `end` of the Markdown file at path."""
    doc = open(path).read()
    i, j = doc.find(begin), doc.find(end)
    if i < 0 or j < i:
        sys.exit(f"{path}: no '{begin}' ... '{end}' markers")
    open(path, "w").write(doc[:i + len(begin)] + "\n" + text + "\n" + doc[j:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--setting", default="base")
    ap.add_argument("--vs", default="probe")
    ap.add_argument("--plot", help="also draw the pooled KL ratios with intervals into this PNG")
    ap.add_argument("--into", help="replace the tables between the quality-tables markers of "
                    "this Markdown file (docs/RESULTS.md) instead of printing them")
    ap.add_argument("--block", default="generated",
                    help="with --into: the markers '<!-- quality-tables: BLOCK begin -->' and "
                    "'... BLOCK end -->' (default: generated)")
    a = ap.parse_args()
    out = []
    models = []
    for d in run_dirs(a.dirs):
        s = json.load(open(os.path.join(d, "summary.json")))
        cfg = (s.get("run") or {}).get("config", {})
        model = cfg.get("model", d)
        models.append((f"{model}\n({os.path.normpath(d)})", s))
        tasks = s["tasks"]
        ns = {t: tasks[t]["n_examples"] for t in tasks}
        out.append(f"### {model} (r = {cfg.get('ratio')}, {sum(ns.values())} examples: " +
                   ", ".join(f"{t} {n}" for t, n in sorted(ns.items())) +
                   f"; `{os.path.normpath(d)}`)\n")
        if a.setting in s.get("overall", {}):
            table(s["overall"][a.setting], "All tasks pooled (per-example KL ratio)", out)
            paired(s["overall"][a.setting], a.vs, "All tasks pooled", out)
        for t in sorted(tasks):
            st = tasks[t].get("stats", {}).get(a.setting)
            if st:
                table(st, f"{t} ({ns[t]} examples)", out)
        for t in sorted(tasks):
            st = tasks[t].get("stats", {}).get(a.setting)
            if st:
                paired(st, a.vs, t, out)
        ingest_cost(d, out, cfg.get("rank", "lowfreq"))
    if a.plot:
        plot(models, a.setting, a.plot)
    text = "\n".join(out)
    if not a.into:
        print(text)
        return 0
    replace_between(a.into, f"<!-- quality-tables: {a.block} begin -->",
                    f"<!-- quality-tables: {a.block} end -->", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
