#!/usr/bin/env python3
"""What JSON output costs per generated token: `response_format` json_object and json_schema
(without and with patterns on its strings) against free text, on the same server, the same prompts, alternating request by request.

Each request asks the model for a JSON object (greedy, --max-tokens tokens); the decode time per
token is the response's cachetune.decode_ms over its tokens after the first. JSON output adds the
vocabulary mask of each step (src/model/json_constraint.h: a walk of the vocabulary's trie from
the recognizer's state, with the schema's checks in json_schema mode). Prints, per model, the
median per-token decode time of each mode, their ratios to free text, how many JSON answers
ended on their own and parse as an object, and how many json_schema answers the prompt's schema
accepts (checked here by a plain validator of the schemas' keywords). Example:

    python3 bench/json_mode.py build/cachetune --model smollm2-135m qwen2.5-coder-0.5b \\
        --rounds 5 --out bench/results/xeon-2t/json-mode
"""
import argparse
import json
import os
import re
import statistics

from serve_common import ServeProcess, cpu_name, post_json

PROMPTS = [
    "Describe a cat as a JSON object with the keys name, age and color.",
    "List three European capitals as a JSON object whose key capitals holds an array.",
    "Give a JSON object describing a book: title, author, year and a list of genres.",
    "Reply with a JSON object with the keys city, country and population of a large city.",
]


def obj(props, **kw):
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False, **kw}


S, I = {"type": "string"}, {"type": "integer"}
SCHEMAS = [  # each prompt's, as an OpenAI strict schema
    obj({"name": S, "age": I, "color": S}),
    obj({"capitals": {"type": "array", "items": S, "maxItems": 3}}),
    obj({"title": S, "author": S, "year": I, "genres": {"type": "array", "items": S}}),
    obj({"city": S, "country": S, "population": I}),
]
# The same schemas with patterns on their strings (json_pattern.h: each string's characters go
# through a position automaton as the vocabulary mask is computed).
NAME, WORDS = {"type": "string", "pattern": "^[A-Z][a-z]+$"}, {"type": "string", "pattern": "^[a-z ]+$"}
PLACE = {"type": "string", "pattern": "^[A-Z][A-Za-z]+( [A-Z][A-Za-z]+)*$"}
PATTERN_SCHEMAS = [
    obj({"name": NAME, "age": I, "color": WORDS}),
    obj({"capitals": {"type": "array", "items": PLACE, "maxItems": 3}}),
    obj({"title": PLACE, "author": PLACE, "year": I, "genres": {"type": "array", "items": WORDS}}),
    obj({"city": PLACE, "country": PLACE, "population": I}),
]


def valid(v, s):
    """The schemas above: object, array, string, integer; properties, required, additionalProperties
    false, items, maxItems, pattern (Python's re takes these ECMA-262 patterns alike), minLength,
    maxLength (len() counts code points, as JSON Schema does)."""
    t = s["type"]
    if t == "string":
        return (isinstance(v, str) and re.search(s.get("pattern", ""), v) is not None
                and s.get("minLength", 0) <= len(v) <= s.get("maxLength", len(v)))
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "array":
        return (isinstance(v, list) and len(v) <= s.get("maxItems", len(v))
                and all(valid(x, s["items"]) for x in v))
    return (isinstance(v, dict) and set(v) <= set(s["properties"]) and set(s["required"]) <= set(v)
            and all(valid(x, s["properties"][k]) for k, x in v.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--model", nargs="+", default=["smollm2-135m"])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="folder for summary.json and the server logs")
    ap.add_argument("--pattern-lengths", action="store_true",
                    help="the pattern mode's strings also bounded by minLength / maxLength "
                         "(a pattern beside length bounds: the lengths each position completes in)")
    args = ap.parse_args()
    if args.pattern_lengths:
        for s, (lo, hi) in ((NAME, (2, 12)), (WORDS, (1, 24)), (PLACE, (2, 32))):
            s.update(minLength=lo, maxLength=hi)
    out = args.out or "."
    os.makedirs(out, exist_ok=True)
    summary = {"cpu": cpu_name(), "threads": args.threads, "max_tokens": args.max_tokens,
               "rounds": args.rounds, "pattern_lengths": args.pattern_lengths, "models": {}}
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    for model in args.model:
        srv = ServeProcess(args.binary, ["--model", model, "--max-tokens-limit",
                                         str(args.max_tokens)],
                           os.path.join(out, f"serve-{model}.log"), model)
        modes = ("free", "json", "schema", "pattern")
        per_token = {m: [] for m in modes}
        ended = {m: 0 for m in modes[1:]}
        parsed = {m: 0 for m in modes[1:]}
        try:
            for _ in range(args.rounds):
                for q, plain, patterned in zip(PROMPTS, SCHEMAS, PATTERN_SCHEMAS):
                    for mode in modes:
                        schema = patterned if mode == "pattern" else plain
                        body = {"messages": [{"role": "user", "content": q}],
                                "max_tokens": args.max_tokens, "temperature": 0}
                        if mode == "json":
                            body["response_format"] = {"type": "json_object"}
                        elif mode in ("schema", "pattern"):
                            body["response_format"] = {
                                "type": "json_schema",
                                "json_schema": {"name": "answer", "strict": True, "schema": schema}}
                        r = post_json(srv.port, "/v1/chat/completions", body)
                        n = r["usage"]["completion_tokens"]
                        if n > 1:
                            per_token[mode].append(r["cachetune"]["decode_ms"] / (n - 1))
                        if mode != "free" and r["choices"][0]["finish_reason"] == "stop":
                            ended[mode] += 1
                            try:
                                v = json.loads(r["choices"][0]["message"]["content"])
                                parsed[mode] += (isinstance(v, dict) if mode == "json"
                                                 else valid(v, schema))
                            except ValueError:
                                pass
        finally:
            srv.stop()
        free = statistics.median(per_token["free"])
        js = statistics.median(per_token["json"])
        sc = statistics.median(per_token["schema"])
        pt = statistics.median(per_token["pattern"])
        summary["models"][model] = {
            "free_ms_per_token": free, "json_ms_per_token": js, "ratio": js / free,
            "schema_ms_per_token": sc, "schema_ratio": sc / free,
            "pattern_ms_per_token": pt, "pattern_ratio": pt / free,
            "pattern_requests": len(per_token["pattern"]), "pattern_ended": ended["pattern"],
            "pattern_ended_and_valid": parsed["pattern"],
            "json_requests": len(per_token["json"]), "json_ended": ended["json"],
            "json_ended_and_parsed": parsed["json"],
            "schema_requests": len(per_token["schema"]), "schema_ended": ended["schema"],
            "schema_ended_and_valid": parsed["schema"], "samples": per_token}
        print(f"{model}: decode ms/token free {free:.2f}, json_object {js:.2f} ({js / free:.2f}x), "
              f"json_schema {sc:.2f} ({sc / free:.2f}x); json_object answers ended on their own "
              f"{ended['json']}/{len(per_token['json'])}, parsed as objects {parsed['json']}; "
              f"json_schema answers ended {ended['schema']}/{len(per_token['schema'])}, "
              f"valid {parsed['schema']}; with patterns {pt:.2f} ({pt / free:.2f}x, "
              f"{pt / sc:.2f}x json_schema's), ended {ended['pattern']}/"
              f"{len(per_token['pattern'])}, valid {parsed['pattern']}")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
