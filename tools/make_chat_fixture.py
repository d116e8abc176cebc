#!/usr/bin/env python3
# Writes tests/fixtures/chat_tools_<model>.json: conversations with tools, tool calls and tool
# results rendered by the model's own chat template (read from the GGUF through llama-cpp-python,
# rendered by jinja2 with the `tojson` Hugging Face's chat templates use: json.dumps with
# ensure_ascii=False, keys in order), so that Tokenizer::apply_chat_template and
# server::template_json can be checked against the template without Python at test time.
# Usage: python3 tools/make_chat_fixture.py [--model qwen2.5-coder-0.5b] [--out PATH]
# (one fixture per file: the two Qwen2.5-Coder files' templates differ, the 1.5B's writing the
# instructions' example call with doubled braces).
import argparse
import hashlib
import json
import os

import jinja2
import llama_cpp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.environ.get("CACHETUNE_MODEL_DIR", os.path.expanduser("~/.cache/cachetune/models"))
FILES = {"qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
         "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf"}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city, \"now\"",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "e.g. Zürich"},
        "unit": {"type": "string", "enum": ["c", "f"]}, "days": {"type": "integer", "maximum": 7}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}}}}
NO_PARAMS = {"function": {"name": "ping"}, "type": "function"}

CASES = [
    {"tools": [WEATHER], "messages": [{"role": "user", "content": "Weather in Paris?"}]},
    {"tools": [WEATHER, TIME, NO_PARAMS], "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather and time in Oslo?"}]},
    {"tools": [WEATHER, TIME], "messages": [
        {"role": "user", "content": "Weather and time in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "Oslo", "days": 2}}},
            {"type": "function", "function": {"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}}]},
        {"role": "tool", "content": "{\"temp\": -3.5}"},
        {"role": "tool", "content": "09:41"}]},
    {"tools": [WEATHER], "messages": [
        {"role": "system", "content": "You check facts."},
        {"role": "user", "content": "Is it warm in Rome?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "Rome \u2014 \"centro\"\n", "unit": "c"}}}]},
        {"role": "tool", "content": "24 C"},
        {"role": "assistant", "content": "Yes, 24 C."},
        {"role": "user", "content": "Thanks!"}]},
    {"tools": [], "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "ping", "arguments": {}}}]},
        {"role": "tool", "content": "pong"}]},
]

JSON_VALUES = [{"a": 1, "b": [1, 2.5, -0.001, 1e-07, True, None], "c": {"d": "\u00e9\u4e2d\U0001F600"}},
               {"z": "tab\tquote\"back\\slash\nnl\u0001ctl\u007f", "a": []}, {"empty": {}}]


def tojson(x):
    return json.dumps(x, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--out")
    a = ap.parse_args()
    a.out = a.out or os.path.join(REPO, f"tests/fixtures/chat_tools_{a.model}.json")
    path = os.path.join(MODELS_DIR, FILES[a.model])
    m = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    tmpl = env.from_string(m.metadata["tokenizer.chat_template"])
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    out = {"model": a.model, "sha256": sha, "cases": [], "json": []}
    for c in CASES:
        rendered = tmpl.render(messages=c["messages"], tools=c["tools"] or None,
                               add_generation_prompt=True)
        msgs = []
        for msg in c["messages"]:
            one = {"role": msg["role"], "content": msg["content"]}
            if "tool_calls" in msg:
                one["tool_calls"] = [{"name": t["function"]["name"],
                                      "arguments": tojson(t["function"]["arguments"])}
                                     for t in msg["tool_calls"]]
            msgs.append(one)
        out["cases"].append({"tools": [tojson(t) for t in c["tools"]], "tool_objects": c["tools"],
                             "messages": msgs, "rendered": rendered})
    for v in JSON_VALUES:
        out["json"].append({"value": v, "text": tojson(v)})
    with open(a.out, "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {a.out}: {len(out['cases'])} conversations, {len(out['json'])} values")


if __name__ == "__main__":
    main()
