#!/usr/bin/env python3
"""Prefill and decode speed of cachetune and llama.cpp on the same GGUF, in the same run.

Runs `cachetune bench --json` (prefill at 512/2,048/4,096 tokens, decode, and the machine's
OpenBLAS SGEMM rate) and then llama.cpp through llama-cpp-python (built from its sdist) on the same
prompt lengths with the same thread count, and prints/writes the ratios. Both use random token ids
from the same range; both keep the best of two prefill repeats.

Usage: python3 bench/compare_llamacpp.py [--cachetune build/cachetune] [--model PATH] [--out FILE]
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
DEFAULT_MODEL = os.path.join(
    os.environ.get("CACHETUNE_MODEL_DIR", os.path.expanduser("~/.cache/cachetune/models")),
    "SmolLM2-135M-Instruct.Q4_1.gguf")
LENGTHS = [512, 2048, 4096]


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
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "compare_llamacpp.json"))
    args = ap.parse_args()
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        subprocess.run([args.cachetune, "bench", "--model", args.model, "--json", tmp.name,
                        "--prompt-lengths"] + [str(n) for n in LENGTHS], check=True)
        ours = json.load(open(tmp.name))
    theirs = bench_llamacpp(args.model, args.threads)
    rows = []
    for a, b in zip(ours["prefill"], theirs["prefill"]):
        rows.append({"n_prompt": a["n_prompt"], "cachetune_tok_s": a["tok_per_s"],
                     "llamacpp_tok_s": b["tok_per_s"], "ratio": a["tok_per_s"] / b["tok_per_s"],
                     "cachetune_gflops": a["gflops"],
                     "fraction_of_sgemm": a["gflops"] / ours["sgemm_gflops"]})
    result = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "command": "python3 bench/compare_llamacpp.py",
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
    print(f"\nmachine: {result['machine']['cpu']}, {result['machine']['cores']} cores; "
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
