#!/usr/bin/env python3
"""Output tokens/s of `cachetune serve` for concurrent chat requests, greedy and sampled.

For each round and each binary (alternating, so that a shared machine's slow moments fall on
all of them) one server is started; then, for each sampling setting, --concurrency requests are
sent at once (whole responses, `ignore_eos`, --max-tokens each) and the generated tokens over
the wall time are recorded. Prints the median per binary and setting, and each setting's ratio
to greedy in the same binary. Example (a build before the sampler change against this one):

    python3 bench/sampled_decode.py /tmp/old/cachetune build/cachetune \\
        --model qwen2.5-coder-0.5b --concurrency 1 8 --rounds 3 \\
        --out bench/results/xeon-2t/sampled-decode
"""
import argparse
import http.client
import json
import os
import statistics
import threading
import time

from serve_common import ServeProcess, cpu_name

SETTINGS = {
    "greedy": {"temperature": 0},
    "t0.8_p0.95": {"temperature": 0.8, "top_p": 0.95},
    "t1.0": {"temperature": 1.0},
}


def one_request(port, body, out, i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise SystemExit(f"request failed: {r.status} {data[:300]!r}")
    out[i] = json.loads(data)["usage"]["completion_tokens"]


def burst(port, n, max_tokens, sampling, seed):
    out = [0] * n
    threads = []
    t0 = time.time()
    for i in range(n):
        body = {"messages": [{"role": "user", "content": f"Write a long story about lighthouse {i}."}],
                "max_tokens": max_tokens, "ignore_eos": True, "seed": seed + i, **sampling}
        th = threading.Thread(target=one_request, args=(port, body, out, i))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return sum(out) / (time.time() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join("bench", "results", "sampled_decode"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    runs = []
    for rnd in range(args.rounds):
        for bi, binary in enumerate(args.binaries):
            srv = ServeProcess(binary, ["--model", args.model],
                               os.path.join(args.out, f"server_{bi}_{rnd}.log"), "sampled_decode")
            try:
                burst(srv.port, 1, 4, SETTINGS["greedy"], 0)  # warm-up
                for n in args.concurrency:
                    for name, sampling in SETTINGS.items():
                        tps = burst(srv.port, n, args.max_tokens, sampling, 1000 * rnd)
                        runs.append({"round": rnd, "binary": binary, "concurrency": n,
                                     "setting": name, "tok_per_s": tps})
                        print(f"round {rnd} {binary} x{n} {name}: {tps:.1f} tok/s", flush=True)
            finally:
                srv.stop()
    summary = []
    for binary in args.binaries:
        for n in args.concurrency:
            greedy = statistics.median(r["tok_per_s"] for r in runs if r["binary"] == binary
                                       and r["concurrency"] == n and r["setting"] == "greedy")
            for name in SETTINGS:
                med = statistics.median(r["tok_per_s"] for r in runs if r["binary"] == binary
                                        and r["concurrency"] == n and r["setting"] == name)
                summary.append({"binary": binary, "concurrency": n, "setting": name,
                                "median_tok_per_s": med, "vs_greedy": med / greedy})
                print(f"{binary} x{n} {name}: median {med:.1f} tok/s ({med / greedy:.2f}x greedy)")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"cpu": cpu_name(), "model": args.model, "max_tokens": args.max_tokens,
                   "rounds": args.rounds, "runs": runs, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
