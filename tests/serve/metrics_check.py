#!/usr/bin/env python3
"""GET /metrics of a running `cachetune serve`, parsed by prometheus_client's own text parser.

Makes one chat request first so the histograms have samples, then checks that every series of
docs/SERVER.md "Metrics" is there with its type, that histogram buckets are cumulative and end in
+Inf equal to _count, and that the request was counted. Driven by
tests/serve/python_clients_test.cc; exit 0 = pass, 77 = skipped (no prometheus_client), other =
failure.

    python3 tests/serve/metrics_check.py --base-url http://127.0.0.1:8080 --api-key KEY
"""
import argparse
import json
import math
import sys
import urllib.request

SKIP = 77

EXPECTED = {  # family name as the parser reports it -> type
    "cachetune_http_requests": "counter",
    "cachetune_time_to_first_token_seconds": "histogram",
    "cachetune_inter_token_latency_seconds": "histogram",
    "cachetune_prompt_tokens": "counter",
    "cachetune_generation_tokens": "counter",
    "cachetune_chunk_lookups": "counter",
    "cachetune_prefill_rows": "counter",
    "cachetune_chunk_reencodes": "counter",
    "cachetune_tier_read_bytes": "counter",
    "cachetune_tier_errors": "counter",
    "cachetune_tier_used_bytes": "gauge",
    "cachetune_requests_cancelled": "counter",
    "cachetune_slow_connections_closed": "counter",
    "cachetune_http_overload_rejected": "counter",
    "cachetune_queue_length": "gauge",
    "cachetune_running_sequences": "gauge",
    "cachetune_kv_budget_bytes_in_use": "gauge",
    "cachetune_batch_rows": "histogram",
    "cachetune_step_seconds": "histogram",
    "cachetune_encode_rows": "counter",
}


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def request(url, key, body=None):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.headers.get("Content-Type", ""), r.read().decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080")
    ap.add_argument("--api-key", required=True)
    args = ap.parse_args()
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        print("SKIP: the Python module 'prometheus_client' is not installed "
              "(pip install -r tools/deps/requirements-serve.txt)")
        return SKIP

    request(args.base_url + "/v1/chat/completions", args.api_key,
            {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
             "chunks": ["A short document about tides."]})
    ctype, text = request(args.base_url + "/metrics", args.api_key)
    check(ctype.startswith("text/plain"), f"Content-Type {ctype}")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, typ in EXPECTED.items():
        check(name in families, f"family {name} missing; have {sorted(families)}")
        check(families[name].type == typ, f"{name} is a {families[name].type}, expected {typ}")

    for f in families.values():
        if f.type != "histogram":
            continue
        by_labels = {}
        for s in f.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            by_labels.setdefault(key, {"buckets": [], "count": None})
            if s.name.endswith("_bucket"):
                by_labels[key]["buckets"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                by_labels[key]["count"] = s.value
        for key, h in by_labels.items():
            b = h["buckets"]
            check(b and math.isinf(b[-1][0]), f"{f.name}{key}: last bucket is not +Inf")
            check(all(b[i][0] < b[i + 1][0] for i in range(len(b) - 1)), f"{f.name}: bounds")
            check(all(b[i][1] <= b[i + 1][1] for i in range(len(b) - 1)),
                  f"{f.name}{key}: buckets are not cumulative {b}")
            check(b[-1][1] == h["count"], f"{f.name}{key}: +Inf {b[-1][1]} != count {h['count']}")

    def value(family, sample_name, **labels):
        for s in families[family].samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        return None

    chats = value("cachetune_http_requests", "cachetune_http_requests_total",
                  route="/v1/chat/completions", code="200")
    check(chats is not None and chats >= 1, f"chat requests counted: {chats}")
    ttft = value("cachetune_time_to_first_token_seconds",
                 "cachetune_time_to_first_token_seconds_count")
    check(ttft is not None and ttft >= 1, f"TTFT observations: {ttft}")
    lookups = sum(s.value for s in families["cachetune_chunk_lookups"].samples
                  if s.name == "cachetune_chunk_lookups_total")
    check(lookups >= 1, f"chunk lookups: {lookups}")
    steps = value("cachetune_step_seconds", "cachetune_step_seconds_count")
    check(steps is not None and steps >= 1, f"engine steps timed: {steps}")
    print(f"metrics checks passed ({len(families)} families)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
