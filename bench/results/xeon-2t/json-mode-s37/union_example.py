#!/usr/bin/env python3
"""A discriminated union, a tuple and a duration through `cachetune serve` (thirty-seventh session).

Sends a pydantic model's schema as the official openai client makes it (type_to_response_format_param)
to a running server and checks the answer with pydantic. Run:

    build/cachetune serve --model qwen2.5-coder-0.5b --port 8080 &
    python3 bench/results/xeon-2t/json-mode-s37/union_example.py --base-url http://127.0.0.1:8080
"""
import argparse
import datetime
import json
import typing
import urllib.request

import pydantic
from openai.lib._parsing._completions import type_to_response_format_param


class Lamp(pydantic.BaseModel):
    kind: typing.Literal["lamp"]
    watts: int = pydantic.Field(ge=1, le=5000)


class Horn(pydantic.BaseModel):
    kind: typing.Literal["horn"]
    blasts: typing.Tuple[int, int]  # prefixItems


class Signal(pydantic.BaseModel):
    device: typing.Union[Lamp, Horn] = pydantic.Field(discriminator="kind")  # oneOf + discriminator
    every: datetime.timedelta  # format duration


ap = argparse.ArgumentParser()
ap.add_argument("--base-url", default="http://127.0.0.1:8080")
ap.add_argument("--out", default=None)
args = ap.parse_args()
questions = [
    "The lighthouse lamp burns at 1000 watts and flashes every 10 seconds. Describe the signal as JSON.",
    "In fog the horn sounds 2 blasts then 3 blasts, every 30 seconds. Describe the signal as JSON.",
]
results = []
for q in questions:
    body = {"messages": [{"role": "user", "content": q}], "max_tokens": 96,
            "response_format": type_to_response_format_param(Signal)}
    req = urllib.request.Request(args.base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    r = json.loads(urllib.request.urlopen(req).read())
    choice = r["choices"][0]
    text = choice["message"]["content"]
    try:
        parsed = repr(Signal.model_validate_json(text))
    except pydantic.ValidationError as e:
        parsed = f"not a Signal: {e}"
    print(f"{choice['finish_reason']}: {text!r}\n  -> {parsed}")
    results.append({"question": q, "finish_reason": choice["finish_reason"], "answer": text,
                    "parsed": parsed})
if args.out:
    with open(args.out, "w") as f:
        json.dump({"schema": type_to_response_format_param(Signal), "results": results}, f, indent=1)
