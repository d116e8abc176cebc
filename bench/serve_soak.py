#!/usr/bin/env python3
"""Soak test of `cachetune serve` (issue 13 item 8): many concurrent clients, streamed and whole,
bounded in count and time; reports errors, the server's resident memory over time and whether it
stayed flat after warm-up.

    python3 bench/serve_soak.py --model smollm2-135m --clients 64 --requests-per-client 6 \\
        --out bench/results/serve_soak

Each client sends its requests one after another (half of the clients stream), over a small set
of documents that recur, with questions that differ. The server's VmRSS is sampled every 0.5 s.
"Flat" means the largest RSS in the second half of the run is within --rss-slack (default 5%) of
the largest RSS in the first half (after warm-up the caches, pools and workspaces are at size).
Exit status 0 only with zero errors, a live server at the end and flat memory.
"""
import argparse
import http.client
import json
import os
import random
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from serve_common import ServeProcess  # noqa: E402

DOCS = [
    "The lighthouse on Gull Point was built in 1871 and painted red and white in 1903.",
    "Marta Olsen kept the lighthouse for forty years and wrote a diary of every storm.",
    "The ferry leaves the harbour at seven each morning and returns at six in the evening.",
    "Tickets are sold at the kiosk beside the pier; children under five travel free.",
    "The museum in the keeper's cottage opens on weekends in summer and on request in winter.",
]


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def request(port, i, stream, max_tokens):
    rng = random.Random(i)
    docs = rng.sample(DOCS, 3)
    body = {"messages": [{"role": "user", "content": f"Question {i}: who kept the lighthouse?"}],
            "chunks": docs, "max_tokens": max_tokens, "stream": stream}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        return f"HTTP {r.status}: {data[:200]!r}"
    if stream:
        if not data.rstrip().endswith(b"data: [DONE]"):
            return f"stream did not end with [DONE]: {data[-200:]!r}"
        if b'"error"' in data:
            return f"error event: {data[-300:]!r}"
    else:
        j = json.loads(data)
        if "choices" not in j:
            return f"no choices: {data[:200]!r}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "cachetune"))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests-per-client", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--time-limit", type=float, default=1800, help="seconds; the run fails beyond")
    ap.add_argument("--rss-slack", type=float, default=0.05)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "serve_soak"))
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    srv = ServeProcess(args.binary,
                       ["--model", args.model, "--tiers", "host:1G", "--max-queue", str(args.clients),
                        "--http-threads", str(args.clients + 16 + 16)],
                       args.out + ".server.log", "serve_soak")
    port, proc, cmd = srv.port, srv.proc, srv.cmd
    samples, errors = [], []
    done = threading.Event()

    def sampler():
        t0 = time.time()
        while not done.is_set():
            samples.append((time.time() - t0, rss_kib(proc.pid)))
            time.sleep(0.5)

    def client(k):
        for j in range(args.requests_per_client):
            i = k * args.requests_per_client + j
            try:
                e = request(port, i, stream=(k % 2 == 0), max_tokens=args.max_tokens)
            except Exception as ex:  # noqa: BLE001 - every failure is counted
                e = repr(ex)
            if e:
                errors.append({"request": i, "error": e})

    st = threading.Thread(target=sampler, daemon=True)
    st.start()
    t0 = time.time()
    ts = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(max(1.0, args.time_limit - (time.time() - t0)))
    elapsed = time.time() - t0
    timed_out = any(t.is_alive() for t in ts)
    done.set()
    st.join()
    alive = proc.poll() is None
    metrics = ""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/metrics")
        metrics = c.getresponse().read().decode()
    except OSError:
        pass
    srv.stop()
    rss = [r for _, r in samples if r]
    half = len(rss) // 2
    first, second = (max(rss[:half]) if half else 0), (max(rss[half:]) if rss else 0)
    flat = half > 0 and second <= first * (1 + args.rss_slack)
    batch_rows = [l for l in metrics.splitlines() if l.startswith("cachetune_batch_rows_")]
    total = args.clients * args.requests_per_client
    res = {"command": " ".join(sys.argv), "server_command": " ".join(cmd), "clients": args.clients,
           "requests": total, "errors": len(errors), "error_samples": errors[:10],
           "elapsed_s": elapsed, "timed_out": timed_out, "server_alive_at_end": alive,
           "rss_kib_first_half_max": first, "rss_kib_second_half_max": second, "rss_flat": flat,
           "rss_samples": samples, "batch_rows_metrics": batch_rows, "load": os.getloadavg()}
    with open(args.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    print(f"{total} requests from {args.clients} clients in {elapsed:.0f} s: {len(errors)} errors, "
          f"server alive {alive}, RSS max {first / 1024:.0f} MiB (first half) vs "
          f"{second / 1024:.0f} MiB (second half): {'flat' if flat else 'NOT flat'}")
    for l in batch_rows:
        print("  " + l)
    ok = not errors and alive and flat and not timed_out
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
