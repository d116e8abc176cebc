#!/usr/bin/env python3
"""Batched decoding of two builds of `cachetune`, alternating, on a noisy machine.

Runs `cachetune bench --batch ...` of binary A, then of B, for --rounds rounds per model, so
that slow and fast moments of a shared machine fall on both, and prints per model and batch size
the median tokens/s of each and of its ratio to one sequence in the same run (the issue's
measure: 8 sequences against 1). Each run's JSON is kept in --out. Example (the previous
commit's build against this one, two threads):

    python3 bench/batch_ab.py /tmp/old/cachetune build/cachetune \\
        --model smollm2-135m qwen2.5-coder-0.5b --rounds 3 --out bench/results/xeon-2t/batch_ab

One binary under two settings is an A/B too: give it twice with --a-args / --b-args, e.g.
`build/cachetune build/cachetune --a-args="--cache-type f32" --b-args="--cache-type f16"`.
--context sets the tokens each sequence decodes after (`cachetune bench --decode-context`).
"""
import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess

from serve_common import cpu_name


def cpu_detail():
    """Family, model and the vector extensions that choose kernels, from /proc/cpuinfo."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k in ("cpu family", "model", "flags") and k not in info:
                    info[k] = v.strip()
    except OSError:
        return {}
    flags = set(info.get("flags", "").split())
    return {"family": info.get("cpu family"), "model": info.get("model"),
            "simd": [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni",
                                 "amx_int8") if f in flags]}


def run_once(binary, extra, model, batches, context, decode_tokens, out_json):
    ctx = ["--decode-context", str(context)] if context != 128 else []  # older builds lack it
    subprocess.run([binary, "bench", "--model", model, "--prompt-lengths", "64", *ctx,
                    "--repeats", "1", "--decode-tokens", str(decode_tokens),
                    "--batch", *map(str, batches), "--json", out_json, *extra],
                   check=True, capture_output=True, text=True)
    with open(out_json) as f:
        rows = json.load(f)["batched_decode"]
    return {r["sequences"]: (r["tok_per_s"], r["vs_one"]) for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="baseline cachetune binary")
    ap.add_argument("b", help="candidate cachetune binary")
    ap.add_argument("--model", nargs="+", default=["smollm2-135m"])
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    ap.add_argument("--decode-tokens", type=int, default=24)
    ap.add_argument("--context", type=int, default=128,
                    help="tokens each sequence decodes after (default 128, the bench's own)")
    ap.add_argument("--a-args", default="", help="extra `cachetune bench` arguments for A")
    ap.add_argument("--b-args", default="", help="extra `cachetune bench` arguments for B")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True, help="directory for each run's JSON and summary.json")
    a = ap.parse_args()
    if a.batch[0] != 1:
        ap.error("--batch must start with 1 (the ratios are to one sequence)")
    os.makedirs(a.out, exist_ok=True)
    summary = {"cpu": cpu_name(), "cpu_detail": cpu_detail(), "machine": platform.machine(),
               "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "(all cores)"),
               "a": a.a, "b": a.b, "a_args": a.a_args, "b_args": a.b_args,
               "context": a.context, "decode_tokens": a.decode_tokens,
               "rounds": a.rounds, "models": {}}
    for model in a.model:
        runs = {"a": [], "b": []}
        for r in range(a.rounds):
            for tag, binary, extra in (("a", a.a, a.a_args), ("b", a.b, a.b_args)):
                path = os.path.join(a.out, f"{model}_{tag}{r}.json")
                runs[tag].append(run_once(binary, shlex.split(extra), model, a.batch,
                                          a.context, a.decode_tokens, path))
        table = {}
        print(f"{model} ({summary['cpu']}, {a.rounds} rounds, medians)")
        print("  seq   A tok/s  A vs 1   B tok/s  B vs 1   B/A tok/s")
        for n in a.batch:
            med = {t: (statistics.median(x[n][0] for x in runs[t]),
                       statistics.median(x[n][1] if n > 1 else 1.0 for x in runs[t]))
                   for t in runs}
            table[n] = {"a_tok_per_s": med["a"][0], "a_vs_one": med["a"][1],
                        "b_tok_per_s": med["b"][0], "b_vs_one": med["b"][1],
                        "b_vs_one_range": [min(x[n][1] if n > 1 else 1.0 for x in runs["b"]),
                                           max(x[n][1] if n > 1 else 1.0 for x in runs["b"])]}
            print(f"  {n:3d}  {med['a'][0]:8.1f}  {med['a'][1]:5.2f}x  {med['b'][0]:8.1f}  "
                  f"{med['b'][1]:5.2f}x  {med['b'][0] / med['a'][0]:6.2f}")
        summary["models"][model] = table
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
