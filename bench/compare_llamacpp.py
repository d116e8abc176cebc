#!/usr/bin/env python3
"""Prefill and decode speed of cachetune and llama.cpp on the same GGUF, in the same run.

Runs `cachetune bench --json` (prefill at 512/2,048/4,096 tokens, decode, and the machine's
OpenBLAS SGEMM rate) and then llama.cpp through llama-cpp-python (built from its sdist) on the same
prompt lengths with the same thread count, and prints/writes the ratios. Both use random token ids
from the same range; both keep the best of two prefill repeats.

Usage: python3 bench/compare_llamacpp.py [--cachetune build/cachetune] [--model NAME|PATH]
                                        [--threads N] [--out FILE]
--threads (default: all cores) is both engines' thread count (cachetune's OMP_NUM_THREADS).

--model takes a name from tools/models.tsv (`cachetune models`; installed by `cachetune pull NAME`)
or a GGUF path; the default is the registry's default model. The result goes to
bench/results/compare_llamacpp.json for the default model and compare_llamacpp_<NAME>.json for
another, so the models' results sit side by side:
  for m in smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do
    python3 bench/compare_llamacpp.py --model $m; done
"""
import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from fetch_model import parse_registry  # noqa: E402  (the registry's one parser in Python)

MODEL_DIR = os.environ.get("CACHETUNE_MODEL_DIR") or os.path.expanduser("~/.cache/cachetune/models")
REGISTRY = os.environ.get("CACHETUNE_MODELS_TSV") or os.path.join(ROOT, "tools", "models.tsv")
LENGTHS = [512, 2048, 4096]


def resolve_model(arg):
    """(name, path) for a registry name (None: the default) or a path, as `--model` in the CLI."""
    rows = parse_registry(REGISTRY)
    entry = rows[0] if arg is None else next((r for r in rows if r["name"] == arg), None)
    if entry is not None:
        path = os.path.join(MODEL_DIR, entry["file"])
        if not os.path.exists(path):
            sys.exit(f"compare_llamacpp: model '{entry['name']}' is not installed (expected {path}): "
                     f"run: cachetune pull {entry['name']}")
        return entry["name"], path
    if not os.path.exists(arg):
        sys.exit(f"compare_llamacpp: --model '{arg}': no such file, and not a model name (known: "
                 + ", ".join(r["name"] for r in rows) + ")")
    return os.path.splitext(os.path.basename(arg))[0], arg


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def bench_llamacpp(model, threads, decode_tokens=64, repeats=2):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=model, n_ctx=max(LENGTHS) + 256, n_batch=512, n_ubatch=512,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    rng = random.Random(7)
    out = {"engine": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}", "prefill": []}
    for n in LENGTHS:
        toks = [rng.randrange(100, llm.n_vocab()) for _ in range(n)]
        best = 1e30
        for _ in range(repeats):
            llm.reset()
            t = time.perf_counter()
            llm.eval(toks)
            best = min(best, time.perf_counter() - t)
        out["prefill"].append({"n_prompt": n, "seconds": best, "tok_per_s": n / best})
    llm.reset()
    llm.eval([rng.randrange(100, llm.n_vocab()) for _ in range(128)])
    t = time.perf_counter()
    for _ in range(decode_tokens):
        llm.eval([rng.randrange(100, llm.n_vocab())])
    out["decode"] = {"n_context": 128, "n_tokens": decode_tokens,
                     "tok_per_s": decode_tokens / (time.perf_counter() - t)}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cachetune", default=os.path.join(ROOT, "build", "cachetune"))
    ap.add_argument("--model", default=None,
                    help="registry name (cachetune models) or GGUF path; default: the default model")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=None,
                    help="default: bench/results/compare_llamacpp[_NAME].json")
    args = ap.parse_args()
    name, args.model = resolve_model(args.model)
    if args.out is None:
        default_name = parse_registry(REGISTRY)[0]["name"]
        suffix = "" if name == default_name else f"_{name}"
        args.out = os.path.join(ROOT, "bench", "results", f"compare_llamacpp{suffix}.json")
    loadavg = open("/proc/loadavg").read().split()[:3]
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        # The same thread count for both: cachetune's OpenMP team, llama.cpp's n_threads.
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
        subprocess.run([args.cachetune, "bench", "--model", args.model, "--json", tmp.name,
                        "--prompt-lengths"] + [str(n) for n in LENGTHS], check=True, env=env)
        ours = json.load(open(tmp.name))
    theirs = bench_llamacpp(args.model, args.threads)
    rows = []
    for a, b in zip(ours["prefill"], theirs["prefill"]):
        rows.append({"n_prompt": a["n_prompt"], "cachetune_tok_s": a["tok_per_s"],
                     "llamacpp_tok_s": b["tok_per_s"], "ratio": a["tok_per_s"] / b["tok_per_s"],
                     "cachetune_gflops": a["gflops"],
                     "fraction_of_sgemm": a["gflops"] / ours["sgemm_gflops"]})
    result = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": args.threads,
                    "loadavg_at_start": loadavg},
        "command": f"python3 bench/compare_llamacpp.py --model {name} --threads {args.threads}",
        "model": {"name": name, "path": args.model},
        "sgemm_gflops": ours["sgemm_gflops"],
        "prefill": rows,
        "decode": {"cachetune_tok_s": ours["decode"]["tok_per_s"],
                   "llamacpp_tok_s": theirs["decode"]["tok_per_s"],
                   "ratio": ours["decode"]["tok_per_s"] / theirs["decode"]["tok_per_s"]},
        "llamacpp": theirs["engine"],
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nmachine: {result['machine']['cpu']}, {result['machine']['cores']} cores, "
          f"{args.threads} threads; "
          f"OpenBLAS SGEMM {result['sgemm_gflops']:.1f} GFLOP/s")
    print("| prompt tokens | cachetune tok/s | llama.cpp tok/s | ratio | cachetune GFLOP/s | of SGEMM |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n_prompt']} | {r['cachetune_tok_s']:.1f} | {r['llamacpp_tok_s']:.1f} | "
              f"{r['ratio']:.2f} | {r['cachetune_gflops']:.1f} | {100 * r['fraction_of_sgemm']:.0f}% |")
    d = result["decode"]
    print(f"| decode (128 ctx) | {d['cachetune_tok_s']:.1f} | {d['llamacpp_tok_s']:.1f} | "
          f"{d['ratio']:.2f} | | |")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
