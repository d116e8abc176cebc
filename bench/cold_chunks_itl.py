#!/usr/bin/env python3
"""How long new documents hold up the requests already decoding (issue 13, chunked prefill).

For each binary given (e.g. before and after a change, alternating rounds): start `cachetune
serve` with `--prefill-chunk`, stream one long answer over documents already in the cache (the
"decoder"), and once its tokens flow send --cold requests one after another, each with documents
the server has never seen (their chunks must be encoded). Reports, per binary and round, the
decoder's inter-token gaps while the cold requests were in flight (max, p99, median) and the
cold requests' TTFT. Before the chunk encodings were spread over engine steps, a cold request's
encodings all ran between two steps, so the decoder's longest gap was about one request's
encodings; with them spread, about one step's budget of them.

    python3 bench/cold_chunks_itl.py --binaries runs/old-cachetune build/cachetune \
        --model smollm2-135m --rounds 2 --out bench/results/cold_chunks_itl
"""
import argparse
import itertools
import json
import os
import shlex
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_common import ServeProcess, cpu_name  # noqa: E402
from serve_sweep import load_examples, one_request, post_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_round(binary, extra, args, warm, cold, log):
    more = shlex.split(args.server_args) + shlex.split(extra)
    # A binary's own --prefill-chunk (BINARY::ARGS) replaces --prefill-chunk's.
    chunk = [] if "--prefill-chunk" in more else ["--prefill-chunk", str(args.prefill_chunk)]
    srv = ServeProcess(binary, ["--model", args.model, "--tiers", "host:4G"] + chunk +
                       ["--max-tokens-limit", str(args.decoder_tokens),
                        "--request-timeout", "0"] + more, log,
                       "cold_chunks_itl")
    try:
        post_json(srv.port, "/v1/chunks", {"chunks": warm["chunks"]})
        out = {}

        def decoder():
            out["dec"] = one_request(srv.port, warm, "cachetune", args.decoder_tokens, 1,
                                     {"ignore_eos": True})

        t = threading.Thread(target=decoder)
        t0 = time.perf_counter()
        t.start()
        time.sleep(args.lead_s)  # its prefill is done and tokens flow
        c0 = time.perf_counter() - t0
        colds = [one_request(srv.port, ex, "cachetune", 4, 2 + i) for i, ex in enumerate(cold)]
        c1 = time.perf_counter() - t0
        t.join()
        dec = out["dec"]
        if not dec["ok"] or any(not c["ok"] for c in colds):
            sys.exit(f"cold_chunks_itl: a request failed: {dec} {colds}")
        # The decoder's gaps that ended while the cold requests were in flight (times from t0:
        # the decoder's own start is within microseconds of it).
        stamps = list(itertools.accumulate(dec["itl"], initial=dec["ttft"]))
        gaps = [b - a for a, b in zip(stamps, stamps[1:]) if c0 <= b <= c1]
        if not gaps:
            sys.exit("cold_chunks_itl: the decoder finished before the cold requests: raise "
                     "--decoder-tokens")
        gaps.sort()
        return {"gap_max": gaps[-1], "gap_p99": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))],
                "gap_median": statistics.median(gaps), "gaps": len(gaps), "window_s": c1 - c0,
                "decoder_itl_median_all": statistics.median(dec["itl"]),
                "cold_ttft": [c["ttft"] for c in colds]}
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binaries", nargs="+", required=True,
                    help="servers to compare; BINARY or BINARY::ARGS (more arguments for that "
                         "one, e.g. 'build/cachetune::--step-attn-keys 0')")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(ROOT), "shared", "data"))
    ap.add_argument("--task", default="hotpotqa")
    ap.add_argument("--cold", type=int, default=3, help="cold requests per round")
    ap.add_argument("--decoder-tokens", type=int, default=1500)
    ap.add_argument("--lead-s", type=float, default=2.0,
                    help="seconds between the decoder's start and the first cold request")
    ap.add_argument("--prefill-chunk", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--server-args", default="",
                    help="more arguments for every server, e.g. '--log-steps' (its step lines "
                         "go to OUT.server<i>.log, i the binary's index in --binaries)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "cold_chunks_itl"))
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    exs = load_examples(args.data, args.task, 1 + args.cold * args.rounds)
    warm, pool = exs[0], exs[1:]
    res = {"command": " ".join(shlex.quote(a) for a in sys.argv), "cpu": cpu_name(),
           "nproc": os.cpu_count(), "load_before": os.getloadavg(), "runs": []}
    for r in range(args.rounds):
        # The same new documents for every binary in a round (each run starts a fresh server, so
        # none has seen them), other ones in each round.
        cold = pool[r * args.cold:(r + 1) * args.cold]
        for i, b in enumerate(args.binaries):
            binary, _, extra = b.partition("::")
            # Each binary's server log (the last round's) in OUT.server<i>.log.
            m = one_round(binary, extra, args, warm, cold, f"{args.out}.server{i}.log")
            m.update({"binary": b, "round": r})
            res["runs"].append(m)
            print(f"round {r} {b}: decoder gap while cold requests ran: max {m['gap_max']:.3f} s, "
                  f"p99 {m['gap_p99']:.3f} s, median {m['gap_median']:.3f} s over {m['gaps']} "
                  f"in {m['window_s']:.1f} s; "
                  f"cold TTFT {', '.join(f'{t:.2f}' for t in m['cold_ttft'])} s", flush=True)
    with open(args.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {args.out}.json")


if __name__ == "__main__":
    main()
