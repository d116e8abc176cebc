#!/usr/bin/env python3
"""Wall time of one chat request with n choices (`"n": N`) against n = 1, per binary.

For each round and each binary (alternating, so that a shared machine's slow moments fall on
all of them) one server is started; then for each policy and each n one request over the first
--examples examples of a task file of ../shared/data (its documents as `chunks`, its question,
sampled at temperature 0.8, --max-tokens tokens each, `ignore_eos`) is sent and timed, after a
warm-up request that stores the documents' chunks. Prints the median time per binary, policy
and n, and its ratio to n = 1 in the same binary. Example (a build before the shared prefill
against this one):

    python3 bench/n_choices.py /tmp/old/cachetune build/cachetune --model smollm2-135m \\
        --policies full cachetune --n 1 4 --rounds 3 --out bench/results/xeon-2t/n-choices
"""
import argparse
import json
import os
import statistics
import time

from serve_common import ServeProcess, cpu_name, post_json


def post(port, body):
    return post_json(port, "/v1/chat/completions", body, timeout=900)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                   "data", "hotpotqa.jsonl"))
    ap.add_argument("--examples", type=int, default=2)
    ap.add_argument("--policies", nargs="+", default=["full", "cachetune"])
    ap.add_argument("--n", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="folder for summary.json and the server logs")
    args = ap.parse_args()
    with open(args.data) as f:
        examples = [json.loads(next(f)) for _ in range(args.examples)]
    out_dir = args.out or "/tmp/n_choices"
    os.makedirs(out_dir, exist_ok=True)
    times = {}  # (binary index, policy, n) -> [seconds per round, summed over the examples]
    for rnd in range(args.rounds):
        for b, binary in enumerate(args.binaries):
            srv = ServeProcess(binary, ["--model", args.model, "--max-batch", str(max(args.n))],
                               os.path.join(out_dir, f"server_{b}_r{rnd}.log"), "n_choices")
            try:
                for policy in args.policies:
                    for n in args.n:
                        total = 0.0
                        for ex in examples:
                            body = {"messages": [{"role": "user", "content": ex["question"]}],
                                    "chunks": ex["chunks"], "max_tokens": args.max_tokens,
                                    "ignore_eos": True, "temperature": 0.8, "seed": rnd,
                                    "cachetune": {"policy": policy}}
                            if rnd == 0 or n == args.n[0]:
                                post(srv.port, dict(body, max_tokens=1))  # chunks stored
                            t0 = time.time()
                            r = post(srv.port, dict(body, n=n))
                            total += time.time() - t0
                            if len(r["choices"]) != n:
                                raise SystemExit(f"{len(r['choices'])} choices for n = {n}")
                        times.setdefault(f"{b}|{policy}|{n}", []).append(total)
            finally:
                srv.stop()
    summary = {"cpu": cpu_name(), "model": args.model, "binaries": args.binaries,
               "examples": args.examples, "max_tokens": args.max_tokens, "rounds": args.rounds,
               "seconds": times, "median": {}}
    for b, binary in enumerate(args.binaries):
        for policy in args.policies:
            base = statistics.median(times[f"{b}|{policy}|{args.n[0]}"])
            for n in args.n:
                med = statistics.median(times[f"{b}|{policy}|{n}"])
                summary["median"][f"{b}|{policy}|{n}"] = med
                print(f"{binary} {policy:10s} n={n:2d}: {med:7.2f} s "
                      f"({med / base:.2f}x n={args.n[0]})")
    print(f"CPU: {summary['cpu']}")
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
