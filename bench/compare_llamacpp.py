#!/usr/bin/env python3
"""Prefill and decode speed of cachetune and llama.cpp on the same GGUF, in the same run.

Runs `cachetune bench --json` (prefill at 512/2,048/4,096 tokens, decode, and the machine's
OpenBLAS SGEMM rate) and then llama.cpp through llama-cpp-python (built from its sdist) on the same
prompt lengths with the same thread count, and prints/writes the ratios. Both use random token ids
from the same range; both keep the best of --repeats (default 2) prefill repeats, each after one
untimed 64-token prefill.

Usage: python3 bench/compare_llamacpp.py [--cachetune build/cachetune] [--model NAME|PATH]
                                        [--threads N] [--rounds R] [--repeats N] [--out FILE]
--threads (default: all cores) is both engines' thread count (cachetune's OMP_NUM_THREADS).
Each prompt length and the decode are measured as a pair of runs back to back, one engine's and
then the other's, the order flipping from pair to pair: on a shared machine whose speed drifts
during a run, each ratio compares the engines under the same conditions. --rounds R (default 1)
repeats the whole and reports each ratio as the median of the rounds' with their range.

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


def load_llamacpp(model, threads):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=model, n_ctx=max(LENGTHS) + 256, n_batch=512, n_ubatch=512,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    # One untimed evaluation, as `cachetune bench` does: the first pass faults in the mapped
    # file's pages.
    llm.eval([random.Random(3).randrange(100, llm.n_vocab()) for _ in range(64)])
    llm.reset()
    return llm, f"llama.cpp via llama-cpp-python {llama_cpp.__version__}"


def llamacpp_prefill(llm, n, repeats, seed):
    """llama.cpp's prefill of n random tokens in tok/s, the best of `repeats`."""
    rng = random.Random(seed)
    toks = [rng.randrange(100, llm.n_vocab()) for _ in range(n)]
    best = 1e30
    for _ in range(repeats):
        llm.reset()
        t = time.perf_counter()
        llm.eval(toks)
        best = min(best, time.perf_counter() - t)
    return n / best


def llamacpp_decode(llm, seed, context=128, tokens=64):
    """llama.cpp's decode in tok/s: `tokens` single-token steps after `context` tokens."""
    rng = random.Random(seed)
    llm.reset()
    llm.eval([rng.randrange(100, llm.n_vocab()) for _ in range(context)])
    t = time.perf_counter()
    for _ in range(tokens):
        llm.eval([rng.randrange(100, llm.n_vocab())])
    return tokens / (time.perf_counter() - t)


def cachetune_bench(binary, model, threads, repeats, lengths, decode_tokens):
    """One `cachetune bench` run (its JSON): prefill at `lengths`, decode, the SGEMM rate."""
    # The same thread count for both: cachetune's OpenMP team, llama.cpp's n_threads.
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        subprocess.run([binary, "bench", "--model", model, "--json", tmp.name, "--repeats",
                        str(repeats), "--decode-tokens", str(decode_tokens), "--prompt-lengths"]
                       + [str(n) for n in lengths], check=True, env=env, stdout=subprocess.DEVNULL)
        return json.load(open(tmp.name))


def bench_round(args, llm, first):
    """One round: each prompt length, then decode, as a pair of runs back to back (cachetune's
    and llama.cpp's), `first` naming which engine opens the first pair; the order flips from
    one pair to the next. Returns (cachetune, llama.cpp) results with per-length tok/s."""
    ours = {"prefill": [], "sgemm": []}
    theirs = {"prefill": []}
    engine = first
    for k, n in enumerate(LENGTHS + ["decode"]):
        for e in (engine, "llamacpp" if engine == "cachetune" else "cachetune"):
            if e == "cachetune":
                lengths, dt = ([128], 64) if n == "decode" else ([n], 1)
                r = cachetune_bench(args.cachetune, args.model, args.threads, args.repeats,
                                    lengths, dt)
                ours["sgemm"].append(r["sgemm_gflops"])
                if n == "decode":
                    ours["decode"] = r["decode"]["tok_per_s"]
                else:
                    ours["prefill"].append({"n_prompt": n, "tok_per_s": r["prefill"][0]["tok_per_s"],
                                            "gflops": r["prefill"][0]["gflops"]})
            elif n == "decode":
                theirs["decode"] = llamacpp_decode(llm, seed=7)
            else:
                theirs["prefill"].append({"n_prompt": n, "tok_per_s":
                                          llamacpp_prefill(llm, n, args.repeats, seed=7 + k)})
        engine = "llamacpp" if engine == "cachetune" else "cachetune"
    ours["sgemm_gflops"] = median(ours["sgemm"])
    return ours, theirs


def median(xs):
    xs = sorted(xs)
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else 0.5 * (xs[m - 1] + xs[m])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cachetune", default=os.path.join(ROOT, "build", "cachetune"))
    ap.add_argument("--model", default=None,
                    help="registry name (cachetune models) or GGUF path; default: the default model")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of the paired runs; the table gives the median of the rounds' "
                         "ratios and their range")
    ap.add_argument("--repeats", type=int, default=2,
                    help="prefill repeats per length in each round, the best kept")
    ap.add_argument("--out", default=None,
                    help="default: bench/results/compare_llamacpp[_NAME].json")
    args = ap.parse_args()
    if args.rounds < 1 or args.repeats < 1:
        sys.exit(f"compare_llamacpp: --rounds {args.rounds} and --repeats {args.repeats}: "
                 "each must be at least 1")
    name, args.model = resolve_model(args.model)
    if args.out is None:
        default_name = parse_registry(REGISTRY)[0]["name"]
        suffix = "" if name == default_name else f"_{name}"
        args.out = os.path.join(ROOT, "bench", "results", f"compare_llamacpp{suffix}.json")
    loadavg = open("/proc/loadavg").read().split()[:3]
    llm, engine = load_llamacpp(args.model, args.threads)
    rounds = []
    for i in range(args.rounds):
        # Pairs back to back, the order flipping from pair to pair and round to round, so that
        # a drift of the machine's speed during the run falls on both engines alike.
        ours, theirs = bench_round(args, llm, "cachetune" if i % 2 == 0 else "llamacpp")
        rounds.append((ours, theirs))
        print(f"round {i + 1}/{args.rounds}: prefill ratios "
              + ", ".join(f"{a['n_prompt']}: {a['tok_per_s'] / b['tok_per_s']:.2f}"
                          for a, b in zip(ours["prefill"], theirs["prefill"]))
              + f"; decode {ours['decode'] / theirs['decode']:.2f}", file=sys.stderr)
    sgemm = median([o["sgemm_gflops"] for o, _ in rounds])
    rows = []
    for k, n in enumerate(LENGTHS):
        ratios = [o["prefill"][k]["tok_per_s"] / t["prefill"][k]["tok_per_s"] for o, t in rounds]
        gflops = median([o["prefill"][k]["gflops"] for o, _ in rounds])
        rows.append({"n_prompt": n,
                     "cachetune_tok_s": median([o["prefill"][k]["tok_per_s"] for o, _ in rounds]),
                     "llamacpp_tok_s": median([t["prefill"][k]["tok_per_s"] for _, t in rounds]),
                     "ratio": median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "ratios": ratios, "cachetune_gflops": gflops,
                     "fraction_of_sgemm": gflops / sgemm})
    d_ratios = [o["decode"] / t["decode"] for o, t in rounds]
    result = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": args.threads,
                    "loadavg_at_start": loadavg},
        "command": f"python3 bench/compare_llamacpp.py --model {name} --threads {args.threads} "
                   f"--rounds {args.rounds} --repeats {args.repeats}",
        "model": {"name": name, "path": args.model},
        "rounds": args.rounds,
        "sgemm_gflops": sgemm,
        "prefill": rows,
        "decode": {"n_context": 128, "n_tokens": 64,
                   "cachetune_tok_s": median([o["decode"] for o, _ in rounds]),
                   "llamacpp_tok_s": median([t["decode"] for _, t in rounds]),
                   "ratio": median(d_ratios), "ratio_min": min(d_ratios),
                   "ratio_max": max(d_ratios), "ratios": d_ratios},
        "llamacpp": engine,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nmachine: {result['machine']['cpu']}, {result['machine']['cores']} cores, "
          f"{args.threads} threads; OpenBLAS SGEMM {sgemm:.1f} GFLOP/s; {args.rounds} round(s), "
          f"best of {args.repeats} prefill repeats in each"
          + (" (medians of the rounds, ratio ranges in brackets)" if args.rounds > 1 else ""))
    print("| prompt tokens | cachetune tok/s | llama.cpp tok/s | ratio | cachetune GFLOP/s | of SGEMM |")
    print("|---|---|---|---|---|---|")

    def span(r):
        return f" [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}]" if args.rounds > 1 else ""
    for r in rows:
        print(f"| {r['n_prompt']} | {r['cachetune_tok_s']:.1f} | {r['llamacpp_tok_s']:.1f} | "
              f"{r['ratio']:.2f}{span(r)} | {r['cachetune_gflops']:.1f} | "
              f"{100 * r['fraction_of_sgemm']:.0f}% |")
    d = result["decode"]
    print(f"| decode (128 ctx) | {d['cachetune_tok_s']:.1f} | {d['llamacpp_tok_s']:.1f} | "
          f"{d['ratio']:.2f}{span(d)} | | |")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
