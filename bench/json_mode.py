#!/usr/bin/env python3
"""What JSON mode costs per generated token: `response_format: {"type": "json_object"}` against
free text, on the same server, the same prompts, alternating request by request.

Each request asks the model for a JSON object (greedy, --max-tokens tokens); the decode time per
token is the response's cachetune.decode_ms over its tokens after the first. JSON mode adds the
vocabulary mask of each step (src/model/json_constraint.h: a walk of the vocabulary's trie from
the recognizer's state). Prints, per model, the median per-token decode time of each mode, their
ratio, and how many JSON answers ended on their own and parse as an object. Example:

    python3 bench/json_mode.py build/cachetune --model smollm2-135m qwen2.5-coder-0.5b \\
        --rounds 5 --out bench/results/xeon-2t/json-mode
"""
import argparse
import json
import os
import statistics

from serve_common import ServeProcess, cpu_name, post_json

PROMPTS = [
    "Describe a cat as a JSON object with the keys name, age and color.",
    "List three European capitals as a JSON object whose key capitals holds an array.",
    "Give a JSON object describing a book: title, author, year and a list of genres.",
    "Reply with a JSON object with the keys city, country and population of a large city.",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--model", nargs="+", default=["smollm2-135m"])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="folder for summary.json and the server logs")
    args = ap.parse_args()
    out = args.out or "."
    os.makedirs(out, exist_ok=True)
    summary = {"cpu": cpu_name(), "threads": args.threads, "max_tokens": args.max_tokens,
               "rounds": args.rounds, "models": {}}
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    for model in args.model:
        srv = ServeProcess(args.binary, ["--model", model, "--max-tokens-limit",
                                         str(args.max_tokens)],
                           os.path.join(out, f"serve-{model}.log"), model)
        per_token = {"free": [], "json": []}
        ended, parsed = 0, 0
        try:
            for _ in range(args.rounds):
                for q in PROMPTS:
                    for mode in ("free", "json"):
                        body = {"messages": [{"role": "user", "content": q}],
                                "max_tokens": args.max_tokens, "temperature": 0}
                        if mode == "json":
                            body["response_format"] = {"type": "json_object"}
                        r = post_json(srv.port, "/v1/chat/completions", body)
                        n = r["usage"]["completion_tokens"]
                        if n > 1:
                            per_token[mode].append(r["cachetune"]["decode_ms"] / (n - 1))
                        if mode == "json" and r["choices"][0]["finish_reason"] == "stop":
                            ended += 1
                            try:
                                parsed += isinstance(
                                    json.loads(r["choices"][0]["message"]["content"]), dict)
                            except ValueError:
                                pass
        finally:
            srv.stop()
        free = statistics.median(per_token["free"])
        js = statistics.median(per_token["json"])
        summary["models"][model] = {
            "free_ms_per_token": free, "json_ms_per_token": js, "ratio": js / free,
            "json_requests": len(per_token["json"]), "json_ended": ended,
            "json_ended_and_parsed": parsed, "samples": per_token}
        print(f"{model}: decode ms/token free {free:.2f}, json {js:.2f} ({js / free:.2f}x); "
              f"json answers ended on their own {ended}/{len(per_token['json'])}, "
              f"parsed as objects {parsed}")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
