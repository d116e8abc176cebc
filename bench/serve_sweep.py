#!/usr/bin/env python3
"""Request-rate sweep of `cachetune serve` over loopback (paper Sec. 5.3, Fig. 4).

Workload (RAG with recurring documents): a pool of examples from ../shared/data/<task>.jsonl;
each request draws an example with Zipf popularity (p(k) ~ 1/k^s), shuffles its chunks, and asks
its question with the policy under test. Arrivals are Poisson at each rate. Every request is
streamed, so TTFT is the time to the first content delta as a client sees it (queueing, lookup,
prefill and first token included).

Before the sweep the pool's documents are ingested once (POST /v1/chunks), as a serving system
would have them cached; the unloaded TTFT of each policy is the p90 of requests sent one at a
time. A policy saturates at the first rate whose p90 TTFT exceeds 5x its unloaded p90, or whose
drain (last answer after the last arrival) exceeds 5x its unloaded end-to-end p90 (the queue
grew during the window); its saturating rate is the last rate
before that (the sweep's highest rate, reported as a lower bound, if it never saturates).

    python3 bench/serve_sweep.py --model smollm2-135m --rates 0.25 0.5 1 2 4 \\
        --policies full prefix cacheblend epic cachetune --duration 40 --out bench/results/serve_sweep

Also reports inter-token latency (ITL: gaps between a stream's content deltas) per rate; with
--prefill-chunk 0 against the default 512 it shows what chunked prefill does to the running
requests' token gaps while long prompts are prefilled.

Writes <out>.json (every request's figures, the summaries, the command, CPU and load) and
<out>.png (p90 TTFT against request rate, one line per policy) when matplotlib is installed.
"""
import argparse
import http.client
import json
import os
import random
import shlex
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from serve_common import ServeProcess, cpu_name, post_json  # noqa: E402


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    fl = line.split(":", 1)[1].split()
                    return [x for x in ("avx2", "avx512f", "avx512_vnni", "amx_tile") if x in fl]
    except OSError:
        pass
    return []


def load_examples(data_dir, task, n):
    path = os.path.join(data_dir, task + ".jsonl")
    out = []
    with open(path) as f:
        for line in f:
            ex = json.loads(line)
            out.append({"id": ex["id"], "chunks": ex["chunks"], "question": ex["question"]})
            if len(out) == n:
                break
    if not out:
        sys.exit(f"serve_sweep: no examples in {path}")
    return out


def start_server(args):
    return ServeProcess(
        args.binary,
        ["--model", args.model, "--tiers", f"host:{args.host_tier}", "--kv-budget", args.kv_budget,
         "--max-batch", str(args.max_batch), "--max-queue", str(args.max_queue),
         "--http-threads", str(args.max_batch + args.max_queue + 16),
         "--max-tokens-limit", str(max(args.max_tokens, 16)), "--request-timeout", "0",
         "--prefill-chunk", str(args.prefill_chunk)],
        args.out + ".server.log", "serve_sweep")


def one_request(port, ex, policy, max_tokens, rng_seed, extra=None):
    """Streams one chat completion; returns its timings (seconds from its own start). extra:
    more request fields (e.g. {"ignore_eos": True})."""
    rng = random.Random(rng_seed)
    chunks = list(ex["chunks"])
    rng.shuffle(chunks)
    name, _, ratio = policy.partition("@")  # "cachetune@0.15": the policy at that ratio
    opts = {"policy": name}
    if ratio:
        opts["ratio"] = float(ratio)
    body = {"messages": [{"role": "user", "content": ex["question"]}], "chunks": chunks,
            "max_tokens": max_tokens, "stream": True, "cachetune": opts}
    body.update(extra or {})
    t0 = time.perf_counter()
    rec = {"example": ex["id"], "policy": policy, "ok": False}
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
        c.request("POST", "/v1/chat/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            rec["status"] = r.status
            rec["error"] = r.read()[:300].decode("utf-8", "replace")
            return rec
        ttft = None
        n_tok = 0
        stamps = []  # arrival of each content delta
        buf = b""
        while True:
            line = r.readline()
            if not line:
                break
            buf = line.strip()
            if not buf.startswith(b"data: "):
                continue
            payload = buf[6:]
            if payload == b"[DONE]":
                break
            ev = json.loads(payload)
            if "error" in ev:
                rec["error"] = ev["error"].get("message", "")
                return rec
            ch = ev.get("choices") or [{}]
            if ch[0].get("delta", {}).get("content"):
                stamps.append(time.perf_counter())
                if ttft is None:
                    ttft = stamps[-1] - t0
            if "usage" in ev:
                n_tok = ev["usage"].get("completion_tokens", 0)
                rec["server_ttft_ms"] = ev.get("cachetune", {}).get("ttft_ms")
        rec["e2e"] = time.perf_counter() - t0
        rec["ttft"] = ttft if ttft is not None else rec["e2e"]
        rec["tokens"] = n_tok
        # Inter-token latency: the gaps between consecutive content deltas as the client saw them.
        rec["itl"] = [b - a for a, b in zip(stamps, stamps[1:])]
        rec["ok"] = True
    except Exception as e:  # noqa: BLE001 - a failed request is a data point, not a crash
        rec["error"] = repr(e)
    return rec


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, int(round(q / 100.0 * (len(xs) - 1)))))
    return xs[i]


def summarize(recs, duration):
    ok = [r for r in recs if r["ok"]]
    tt = [r["ttft"] for r in ok]
    e2e = [r["e2e"] for r in ok]
    toks = sum(r.get("tokens", 0) for r in ok)
    itl = [g for r in ok for g in r.get("itl", [])]
    return {"requests": len(recs), "ok": len(ok), "errors": len(recs) - len(ok),
            "ttft_p50": pct(tt, 50), "ttft_p90": pct(tt, 90), "ttft_p99": pct(tt, 99),
            "itl_p50": pct(itl, 50), "itl_p90": pct(itl, 90), "itl_p99": pct(itl, 99),
            "itl_max": max(itl) if itl else None,
            "e2e_p50": pct(e2e, 50), "e2e_p90": pct(e2e, 90),
            "completed_per_s": len(ok) / duration if duration > 0 else 0,
            "output_tok_per_s": toks / duration if duration > 0 else 0}


def zipf_sampler(n, s, rng):
    w = [1.0 / (k + 1) ** s for k in range(n)]
    tot = sum(w)
    cdf, acc = [], 0.0
    for x in w:
        acc += x / tot
        cdf.append(acc)

    def draw():
        u = rng.random()
        for i, c in enumerate(cdf):
            if u <= c:
                return i
        return n - 1
    return draw


def run_rate(port, pool, policy, rate, duration, max_tokens, seed, exact=False):
    """exact: round(rate * duration) arrivals at uniform random times (a Poisson process
    conditioned on its count, so the offered rate is the nominal one); else a free Poisson
    process, whose count in a short window can stray far from rate * duration."""
    rng = random.Random(seed)
    draw = zipf_sampler(len(pool), 1.0, rng)
    recs, threads = [], []
    lock = threading.Lock()

    def fire(ex, s):
        rec = one_request(port, ex, policy, max_tokens, s)
        with lock:
            recs.append(rec)

    def offsets():  # seconds after the start of each arrival
        if exact:
            yield from sorted(rng.uniform(0, duration) for _ in range(round(rate * duration)))
            return
        t = 0.0
        while t < duration:
            yield t
            t += rng.expovariate(rate)

    t_start = time.perf_counter()
    for off in offsets():
        now = time.perf_counter()
        if t_start + off > now:
            time.sleep(t_start + off - now)
        th = threading.Thread(target=fire, args=(pool[draw()], rng.randrange(1 << 30)), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    # Completed rate over the whole time the requests took (arrivals plus the drain).
    elapsed = time.perf_counter() - t_start
    return recs, summarize(recs, elapsed), elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "cachetune"))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(ROOT), "shared", "data"))
    ap.add_argument("--task", default="hotpotqa")
    ap.add_argument("--pool", type=int, default=12, help="examples in the request pool")
    ap.add_argument("--policies", nargs="+", default=["full", "prefix", "cacheblend", "epic", "cachetune"],
                    help="policies; POLICY@R runs it at ratio R (else the server's default, the "
                         "model's r_min), e.g. cachetune@0.15 cacheblend@0.3")
    ap.add_argument("--rates", nargs="+", type=float, default=[0.25, 0.5, 1, 2, 4])
    ap.add_argument("--duration", type=float, default=40, help="seconds of arrivals per rate")
    ap.add_argument("--exact-arrivals", action="store_true",
                    help="round(rate x duration) arrivals per rate at uniform random times (the "
                         "offered rate is the nominal one); default: a free Poisson process, whose "
                         "count in a 60 s window strays (e.g. 17 or 43 arrivals for 24 or 30)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--unloaded", type=int, default=5, help="one-at-a-time requests per policy")
    ap.add_argument("--host-tier", default="4G")
    ap.add_argument("--kv-budget", default="6G")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-queue", type=int, default=256)
    ap.add_argument("--prefill-chunk", type=int, default=512,
                    help="the server's --prefill-chunk (0: whole prefills)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "serve_sweep"))
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    pool = load_examples(args.data, args.task, args.pool)
    result = {"command": " ".join(shlex.quote(a) for a in sys.argv), "cpu": cpu_name(),
              "cpu_flags": cpu_flags(), "nproc": os.cpu_count(), "load_before": os.getloadavg(),
              "model": args.model, "task": args.task, "pool": len(pool), "max_tokens": args.max_tokens,
              "saturation_rule": "first rate with p90 TTFT > 5x unloaded p90, or drain > 5x unloaded e2e p90, or any error",
              "policies": {}}
    srv = start_server(args)
    result["server_command"] = " ".join(srv.cmd)
    try:
        t = time.perf_counter()
        for ex in pool:  # the documents are in the cache before the sweep, as in serving
            post_json(srv.port, "/v1/chunks", {"chunks": ex["chunks"]})
        result["ingest_s"] = time.perf_counter() - t
        print(f"ingested {len(pool)} examples' chunks in {result['ingest_s']:.1f} s", flush=True)
        for policy in args.policies:
            unl = [one_request(srv.port, pool[i % len(pool)], policy, args.max_tokens, 100 + i)
                   for i in range(args.unloaded)]
            bad = [r for r in unl if not r["ok"]]
            if bad:
                sys.exit(f"serve_sweep: unloaded {policy} request failed: {bad[0]}")
            base = summarize(unl, 1.0)
            pr = {"unloaded": base, "rates": []}
            print(f"{policy}: unloaded TTFT p50 {base['ttft_p50']:.3f} s p90 {base['ttft_p90']:.3f} s",
                  flush=True)
            sat = None
            for rate in args.rates:
                recs, s, elapsed = run_rate(srv.port, pool, policy, rate, args.duration,
                                            args.max_tokens, args.seed + int(rate * 1000), args.exact_arrivals)
                s["rate"] = rate
                s["elapsed_s"] = elapsed
                s["load"] = os.getloadavg()
                s["offered_per_s"] = s["requests"] / args.duration
                # The drain: time after the last arrival until the last answer. Unsaturated it is
                # about one request's latency; a growing queue makes it many.
                s["drain_s"] = elapsed - args.duration
                saturated = (s["ttft_p90"] is None or s["errors"] > 0
                             or s["ttft_p90"] > 5 * base["ttft_p90"]
                             or s["drain_s"] > 5 * base["e2e_p90"])
                s["saturated"] = bool(saturated)
                pr["rates"].append({"summary": s, "requests": recs})
                print(f"  rate {rate:5.2f}/s: {s['ok']}/{s['requests']} ok, TTFT p50 {s['ttft_p50']} "
                      f"p90 {s['ttft_p90']} p99 {s['ttft_p99']}, ITL p50 {s['itl_p50']} "
                      f"p99 {s['itl_p99']} max {s['itl_max']}, {s['completed_per_s']:.2f} req/s, "
                      f"{s['output_tok_per_s']:.1f} tok/s{'  SATURATED' if saturated else ''}",
                      flush=True)
                if saturated:
                    sat = rate
                    break
            ok_rates = [r["summary"]["rate"] for r in pr["rates"] if not r["summary"]["saturated"]]
            pr["saturating_rate"] = max(ok_rates) if ok_rates else 0.0
            pr["saturating_rate_is_lower_bound"] = sat is None
            result["policies"][policy] = pr
    finally:
        srv.stop()
    full = result["policies"].get("full", {}).get("saturating_rate")
    for p, pr in result["policies"].items():
        if full:
            pr["vs_full"] = pr["saturating_rate"] / full
        print(f"{p}: saturating rate {pr['saturating_rate']} req/s"
              f"{' (lower bound)' if pr['saturating_rate_is_lower_bound'] else ''}"
              + (f", {pr['vs_full']:.2f}x full" if full else ""))
    result["load_after"] = os.getloadavg()
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for p, pr in result["policies"].items():
            xs = [r["summary"]["rate"] for r in pr["rates"]]
            ys = [r["summary"]["ttft_p90"] for r in pr["rates"]]
            ax.plot(xs, ys, marker="o", label=p)
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.set_ylabel("p90 TTFT (s)")
        ax.set_yscale("log")
        ax.set_title(f"{args.model}, {args.task} (pool {len(pool)}), {cpu_name()[:40]}", fontsize=8)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out + ".png", dpi=120)
        print(f"wrote {args.out}.json and {args.out}.png")
    except ImportError:
        print(f"wrote {args.out}.json (matplotlib not installed: no plot)")


if __name__ == "__main__":
    main()
