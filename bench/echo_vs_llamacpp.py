#!/usr/bin/env python3
"""Prompt scoring (`/v1/completions` with echo and logprobs) against llama.cpp's, on the same GGUF.

For each model, takes documents from a task file of ../shared/data (or --texts), tokenises each
with llama.cpp's tokenizer (llama-cpp-python, built from its sdist), cut to at most --max-tokens
tokens, and scores the same token ids twice: by a `cachetune serve` on a loopback port
(`{"prompt": ids, "echo": true, "max_tokens": 0, "logprobs": 1}`) and by llama.cpp (all rows'
logits, `logits_all=True`, log-softmax in float64). Reports, per model, the largest and mean
absolute difference of the tokens' log-probabilities, the difference of each prompt's summed
log-probability (what a log-likelihood task compares), and how often the two agree on the most
likely token at a position. The CPU is recorded with the figures.

Usage: python3 bench/echo_vs_llamacpp.py [--cachetune build/cachetune] [--model NAME|PATH ...]
           [--data ../shared/data/hotpotqa.jsonl] [--prompts 8] [--max-tokens 512]
           [--threads 2] [--out FILE]
"""
import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare_llamacpp import resolve_model  # noqa: E402
from serve_common import ServeProcess, cpu_name, post_json  # noqa: E402


def texts_from(args):
    if args.texts:
        return args.texts
    out = []
    with open(args.data) as f:
        for line in f:
            ex = json.loads(line)
            out += ex["chunks"]
            if len(out) >= args.prompts:
                break
    return out[:args.prompts]


def log_softmax_at(row, ids):
    """log-softmax of one row of logits (float64) at the given ids, and its argmax."""
    import numpy as np
    x = np.asarray(row, dtype=np.float64)
    m = x.max()
    lse = m + math.log(np.exp(x - m).sum())
    return [float(x[i] - lse) for i in ids], int(x.argmax())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cachetune", default=os.path.join(os.path.dirname(HERE), "build", "cachetune"))
    ap.add_argument("--model", nargs="+", default=["smollm2-135m"])
    ap.add_argument("--data", default=os.path.join(os.path.dirname(HERE), "..", "shared", "data",
                                                   "hotpotqa.jsonl"))
    ap.add_argument("--texts", nargs="*", help="score these texts instead of --data's documents")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", help="JSON results (default: print only)")
    args = ap.parse_args()
    try:
        from llama_cpp import Llama
    except ImportError:
        sys.exit("echo_vs_llamacpp: needs llama-cpp-python (pip install --no-binary llama-cpp-python "
                 "llama-cpp-python==0.3.36)")
    texts = texts_from(args)
    results = {"cpu": cpu_name(), "threads": args.threads, "max_tokens": args.max_tokens,
               "data": None if args.texts else os.path.basename(args.data), "models": {}}
    for name_arg in args.model:
        name, path = resolve_model(name_arg)
        llm = Llama(model_path=path, n_ctx=args.max_tokens + 8, logits_all=True,
                    n_threads=args.threads, n_batch=args.max_tokens, verbose=False)
        prompts = []
        for t in texts:
            ids = llm.tokenize(t.encode(), add_bos=True, special=False)[:args.max_tokens]
            if len(ids) >= 2:
                prompts.append(ids)
        ref = []
        for ids in prompts:
            llm.reset()
            llm.eval(ids)
            lps, best = [], []
            for i in range(1, len(ids)):
                (lp,), b = log_softmax_at(llm.scores[i - 1], [ids[i]])
                lps.append(lp)
                best.append(b)
            ref.append((lps, best))
        del llm
        log = os.path.join("/tmp", f"echo_vs_llamacpp_{name}.log")
        srv = ServeProcess(args.cachetune, ["--model", path], log, "echo_vs_llamacpp")
        diffs, sum_diffs, agree, n_pos, secs = [], [], 0, 0, 0.0
        try:
            for ids, (lps, best) in zip(prompts, ref):
                t0 = time.time()
                r = post_json(srv.port, "/v1/completions",
                         {"prompt": ids, "echo": True, "max_tokens": 0, "logprobs": 1,
                          "temperature": 0})
                secs += time.time() - t0
                lp = r["choices"][0]["logprobs"]
                got = lp["token_logprobs"][1:]
                if len(got) != len(lps):
                    sys.exit(f"echo_vs_llamacpp: {len(got)} scores for {len(lps)} tokens")
                d = [abs(a - b) for a, b in zip(got, lps)]
                diffs += d
                sum_diffs.append(abs(sum(got) - sum(lps)))
                for i, alt in enumerate(lp["top_logprobs"][1:]):
                    # The alternatives are the most likely token and the prompt's own: one entry
                    # when the prompt's token is the most likely.
                    agree += (best[i] == ids[i + 1]) == (len(alt) == 1)
                    n_pos += 1
        finally:
            srv.stop()
        m = {"prompts": len(prompts), "tokens_scored": len(diffs),
             "max_abs_diff": max(diffs), "mean_abs_diff": sum(diffs) / len(diffs),
             "max_abs_sum_diff": max(sum_diffs),
             "mean_abs_sum_diff": sum(sum_diffs) / len(sum_diffs),
             "best_token_agreement": agree / n_pos, "cachetune_seconds": secs}
        results["models"][name] = m
        print(f"{name}: {m['prompts']} prompts, {m['tokens_scored']} tokens scored: |diff| max "
              f"{m['max_abs_diff']:.4f} mean {m['mean_abs_diff']:.5f}; summed log-prob |diff| "
              f"max {m['max_abs_sum_diff']:.4f} mean {m['mean_abs_sum_diff']:.4f}; "
              f"'is the prompt's token the most likely' agrees at "
              f"{100 * m['best_token_agreement']:.2f}% of positions; cachetune {secs:.1f} s")
    print(f"CPU: {results['cpu']}, {args.threads} threads")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
