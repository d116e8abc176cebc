#!/usr/bin/env python3
"""Tool calls through the official openai client against a running `cachetune serve` (Qwen2.5).

    build/cachetune serve --model qwen2.5-coder-0.5b --port 8391 &
    python3 bench/results/xeon-2t/tools-s38/tool_example.py --base-url http://127.0.0.1:8391/v1

Asks one question with two tools under tool_choice "auto", "required" and a named function,
each whole and streamed (greedy), then answers the tool's result; then a tool made by
openai.pydantic_function_tool from a model with a nested model (its schema has $defs and
$ref) under "required". Prints what came back.
"""
import argparse

import openai
import pydantic


class Place(pydantic.BaseModel):
    city: str
    country: str


class Booking(pydantic.BaseModel):
    place: Place
    nights: int

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Get the local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    a = ap.parse_args()
    c = openai.OpenAI(base_url=a.base_url, api_key="unused")
    for choice in ["auto", "required", {"type": "function", "function": {"name": "get_time"}}]:
        r = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=choice,
                                      max_tokens=80, temperature=0)
        m = r.choices[0]
        calls = [(t.function.name, t.function.arguments) for t in (m.message.tool_calls or [])]
        print(f"tool_choice={choice}: finish_reason={m.finish_reason} content={m.message.content!r}"
              f" tool_calls={calls}")
        content, calls, finish = "", [], None
        for ev in c.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                            tool_choice=choice, max_tokens=80, temperature=0,
                                            stream=True):
            if not ev.choices:
                continue
            d = ev.choices[0].delta
            content += d.content or ""
            calls += [(t.function.name, t.function.arguments) for t in (d.tool_calls or [])]
            finish = ev.choices[0].finish_reason or finish
        print(f"  streamed: finish_reason={finish} content={content!r} tool_calls={calls}")
    turn = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 18, \"sky\": \"cloudy\"}"}]
    r = c.chat.completions.create(model="m", messages=turn, tools=TOOLS, max_tokens=60,
                                  temperature=0)
    print(f"after the result: finish_reason={r.choices[0].finish_reason} "
          f"content={r.choices[0].message.content!r}")
    book = [{"role": "user", "content": "Book two nights in Lyon, France."}]
    r = c.chat.completions.create(model="m", messages=book,
                                  tools=[openai.pydantic_function_tool(Booking)],
                                  tool_choice="required", max_tokens=80, temperature=0)
    m = r.choices[0]
    calls = [(t.function.name, t.function.arguments) for t in (m.message.tool_calls or [])]
    print(f"pydantic tool with $defs, required: finish_reason={m.finish_reason} tool_calls={calls}")


if __name__ == "__main__":
    main()
