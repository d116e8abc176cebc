#!/usr/bin/env python3
"""OpenAI compatibility of a running `cachetune serve`, checked with the official `openai` client.

Driven by tests/serve/python_clients_test.cc (CTest label "serve"); exit 0 = pass, 77 = skipped
(the `openai` module is not installed: pip install -r tools/deps/requirements-serve.txt),
anything else = failure, with the failed check on stderr.

    python3 tests/serve/openai_client_check.py --base-url http://127.0.0.1:8080/v1 --api-key KEY
"""
import argparse
import json
import sys

SKIP = 77


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", required=True, help="the key the server was started with")
    ap.add_argument("--model", default="tiny", help="model name to send (any is accepted)")
    args = ap.parse_args()
    try:
        import openai
    except ImportError:
        print("SKIP: the Python module 'openai' is not installed "
              "(pip install -r tools/deps/requirements-serve.txt)")
        return SKIP

    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0,
                           timeout=300)
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Who kept the lighthouse?"}]

    models = client.models.list()
    check(len(models.data) == 1 and models.data[0].id, f"models.list: {models}")

    # Whole completion.
    whole = client.chat.completions.create(model=args.model, messages=msgs, max_tokens=8,
                                           temperature=0)
    check(whole.object == "chat.completion", f"object {whole.object}")
    check(len(whole.choices) == 1, "one choice")
    text = whole.choices[0].message.content
    check(isinstance(text, str), f"content {text!r}")
    check(whole.choices[0].message.role == "assistant", "role")
    check(whole.choices[0].finish_reason in ("stop", "length"), whole.choices[0].finish_reason)
    check(whole.usage.completion_tokens >= 1 and whole.usage.prompt_tokens >= 1, f"{whole.usage}")
    check(whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens,
          "total_tokens")

    # Streamed: the deltas spell the same greedy answer; the last chunk has finish_reason.
    stream = client.chat.completions.create(model=args.model, messages=msgs, max_tokens=8,
                                            temperature=0, stream=True)
    parts, finish = [], None
    for chunk in stream:
        check(chunk.object == "chat.completion.chunk", f"chunk object {chunk.object}")
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    check("".join(parts) == text, f"streamed {''.join(parts)!r} != whole {text!r}")
    check(finish == whole.choices[0].finish_reason, f"streamed finish_reason {finish}")
    # Several choices: the client's types hold them, indexed.
    many = client.chat.completions.create(model=args.model, messages=msgs, max_tokens=4, n=2,
                                          temperature=1.0, seed=3)
    check([c.index for c in many.choices] == [0, 1], f"choices {many.choices}")

    # stream_options.include_usage: the last chunk has no choices and carries the usage.
    chunks = list(client.chat.completions.create(model=args.model, messages=msgs, max_tokens=8,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    check(not chunks[-1].choices and chunks[-1].usage is not None, f"last chunk {chunks[-1]}")
    check(chunks[-1].usage.completion_tokens == whole.usage.completion_tokens,
          f"streamed usage {chunks[-1].usage}")

    # The chunk-aware extension through extra_body: encoded once, then a hit with no re-encoding.
    docs = ["The lighthouse on Gull Point was built in 1871.",
            "Marta Olsen kept the lighthouse for forty years."]
    extra = {"chunks": docs, "cachetune": {"policy": "cachetune", "ratio": 0.15}}
    hits = []
    for _ in range(2):
        r = client.chat.completions.create(model=args.model, messages=msgs, max_tokens=6,
                                           extra_body=extra)
        ct = (r.model_extra or {}).get("cachetune")
        check(ct is not None, "response lacks the cachetune object")
        check(len(ct["chunks"]) == 2, f"cachetune.chunks {ct['chunks']}")
        check(ct["policy"] == "cachetune", f"policy {ct['policy']}")
        hits.append([c["hit"] for c in ct["chunks"]])
    check(hits[1] == [True, True], f"second request's chunks were not hits: {hits}")

    # Stop sequences: a piece of the free-running answer ends it early, with finish_reason stop.
    free = client.chat.completions.create(model=args.model, messages=msgs, max_tokens=24,
                                          extra_body={"ignore_eos": True})
    full = free.choices[0].message.content
    ascii_pairs = [i for i in range(len(full) // 2, len(full) - 1)
                   if full[i].isascii() and full[i + 1].isascii()]
    stop_note = "stop not checked: no ASCII pair in the free-running answer"
    if ascii_pairs:
        stop = full[ascii_pairs[0]:ascii_pairs[0] + 2]
        stop_note = f"stop checked with {stop!r}"
        for s in (stop, ["\u0001never", stop]):
            cut = client.chat.completions.create(model=args.model, messages=msgs, max_tokens=24,
                                                 stop=s, extra_body={"ignore_eos": True})
            want = full[:full.find(stop)]
            got = cut.choices[0].message.content
            check(got == want, f"stop {s!r}: {got!r} != {want!r}")
            check(cut.choices[0].finish_reason == "stop", cut.choices[0].finish_reason)
            streamed = client.chat.completions.create(model=args.model, messages=msgs,
                                                      max_tokens=24, stop=s, stream=True,
                                                      extra_body={"ignore_eos": True})
            got = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
            check(got == want, f"streamed stop {s!r}: {got!r} != {want!r}")

    # The legacy completions route with a raw prompt, whole and streamed (the text deltas spell
    # the same greedy answer); documents through extra_body are reused; two prompts are refused.
    cmpl = client.completions.create(model=args.model, prompt="Who kept the lighthouse?",
                                     max_tokens=8, temperature=0)
    check(cmpl.object == "text_completion", f"object {cmpl.object}")
    check(len(cmpl.choices) == 1 and isinstance(cmpl.choices[0].text, str), f"{cmpl.choices}")
    check(cmpl.choices[0].finish_reason in ("stop", "length"), cmpl.choices[0].finish_reason)
    check(cmpl.usage.total_tokens == cmpl.usage.prompt_tokens + cmpl.usage.completion_tokens,
          "completion total_tokens")
    got = "".join(c.choices[0].text for c in client.completions.create(
        model=args.model, prompt="Who kept the lighthouse?", max_tokens=8, temperature=0,
        stream=True) if c.choices)
    check(got == cmpl.choices[0].text, f"streamed completion {got!r} != {cmpl.choices[0].text!r}")
    hits = []
    for _ in range(2):
        r = client.completions.create(model=args.model, prompt="Question: who kept it?\nAnswer:",
                                      max_tokens=4, extra_body={"chunks": docs})
        hits.append([c["hit"] for c in (r.model_extra or {})["cachetune"]["chunks"]])
    check(hits[1] == [True, True], f"completion's chunks were not hits the second time: {hits}")
    try:
        client.completions.create(model=args.model, prompt=["one", "two"], max_tokens=2)
        check(False, "two prompts were accepted")
    except openai.BadRequestError as e:
        check(e.param == "prompt", f"param {e.param}")

    # Log-probabilities through the client's own types: one entry per generated token, the
    # greedy token the most likely of its alternatives.
    lp = client.chat.completions.create(model=args.model, messages=msgs, max_tokens=4,
                                        logprobs=True, top_logprobs=2)
    content = lp.choices[0].logprobs.content
    check(len(content) == lp.usage.completion_tokens, f"{len(content)} logprobs entries")
    for e in content:
        check(e.logprob <= 0 and len(e.top_logprobs) == 2, f"logprob entry {e}")
        check(e.top_logprobs[0].token == e.token, f"greedy token {e.token!r} not the top one")
    clp = client.completions.create(model=args.model, prompt="Who kept the lighthouse?",
                                    max_tokens=4, logprobs=2).choices[0].logprobs
    check(len(clp.tokens) == len(clp.token_logprobs) == len(clp.top_logprobs),
          f"completion logprobs {clp}")
    # Streamed, each chunk carries its tokens' entries: together the whole response's.
    streamed_lp = []
    for c in client.chat.completions.create(model=args.model, messages=msgs, max_tokens=4,
                                            logprobs=True, top_logprobs=2, stream=True):
        if c.choices and c.choices[0].logprobs:
            streamed_lp += [(e.token, e.logprob) for e in c.choices[0].logprobs.content]
    check(streamed_lp == [(e.token, e.logprob) for e in content],
          f"streamed logprobs {streamed_lp} != {[(e.token, e.logprob) for e in content]}")
    # best_of: the client's own field; one choice back, usage counting both generated.
    bo = client.completions.create(model=args.model, prompt="Who kept the lighthouse?",
                                   max_tokens=3, best_of=2, temperature=1.0, seed=1,
                                   extra_body={"ignore_eos": True})
    check(len(bo.choices) == 1 and bo.usage.completion_tokens == 6, f"best_of {bo}")
    # echo with max_tokens 0 (how lm-evaluation-harness scores text): the prompt's tokens, the
    # first with no logprob, each other one's after the tokens before it.
    ech = client.completions.create(model=args.model, prompt="Who kept the lighthouse?",
                                    max_tokens=0, echo=True, logprobs=1)
    el = ech.choices[0].logprobs
    check(ech.choices[0].text == "Who kept the lighthouse?", f"echo text {ech.choices[0].text!r}")
    check(len(el.tokens) == ech.usage.prompt_tokens and el.token_logprobs[0] is None
          and all(x is not None and x <= 0 for x in el.token_logprobs[1:]),
          f"echo logprobs {el}")

    # JSON mode: the answer is one JSON object (whole when it ended on its own; max_tokens may
    # cut it short), whole and streamed.
    jmsgs = [{"role": "user", "content": "Reply with a JSON object whose key name holds a name."}]
    def ask(stream, **kw):
        """One chat answer's text and finish reason, whole or gathered from the stream."""
        if not stream:
            r = client.chat.completions.create(model=args.model, **kw)
            return r.choices[0].message.content, r.choices[0].finish_reason
        text, finish = "", None
        for c in client.chat.completions.create(model=args.model, stream=True, **kw):
            if c.choices and c.choices[0].delta.content:
                text += c.choices[0].delta.content
            if c.choices and c.choices[0].finish_reason:
                finish = c.choices[0].finish_reason
        return text, finish

    for stream in (False, True):
        text, finish = ask(stream, messages=jmsgs, max_tokens=48,
                           response_format={"type": "json_object"})
        check(text.lstrip().startswith("{"), f"json_object answer {text!r}")
        if finish == "stop":
            check(isinstance(json.loads(text), dict), f"json_object answer {text!r}")
        print(f"json_object{' streamed' if stream else ''}: {finish}: {text!r}")
    # Structured output: a pydantic model, sent as the client makes it (a strict JSON Schema with
    # $defs, $ref, anyOf with null, an enum, an array, a tuple, bounds, a pattern, a date and a
    # duration format),
    # whole and streamed; an answer that ended
    # on its own must validate as the model. Then the client's parse() helper.
    import datetime
    import typing
    import pydantic
    from openai.lib._parsing._completions import type_to_response_format_param

    class Home(pydantic.BaseModel):
        street: str = pydantic.Field(min_length=1, max_length=24)
        zip: typing.Optional[str]

    class Keeper(pydantic.BaseModel):
        name: str
        age: int = pydantic.Field(ge=0, le=150)
        badge: str = pydantic.Field(pattern=r"^[A-Z]{2}-\d{3}$")
        since: datetime.date
        mood: typing.Literal["calm", "stormy"]
        home: Home
        tags: typing.List[str]
        shift: typing.Tuple[int, str]  # prefixItems
        watch: datetime.timedelta  # format duration

    rf = type_to_response_format_param(Keeper)
    kmsgs = [{"role": "user", "content": "Describe the lighthouse keeper as JSON."}]
    for stream in (False, True):
        text, finish = ask(stream, messages=kmsgs, max_tokens=64, response_format=rf)
        check(text.lstrip().startswith("{"), f"json_schema answer {text!r}")
        if finish == "stop":
            try:
                Keeper.model_validate_json(text)
            except pydantic.ValidationError as e:
                check(False, f"json_schema answer {text!r} is not a Keeper: {e}")
        print(f"json_schema{' streamed' if stream else ''}: {finish}: {text!r}")
    completions = getattr(client.beta.chat, "completions", None) or client.chat.completions
    try:
        parsed = completions.parse(model=args.model, messages=kmsgs, max_tokens=64,
                                   response_format=Keeper)
        check(isinstance(parsed.choices[0].message.parsed, Keeper),
              f"parse(): {parsed.choices[0].message}")
        print(f"parse(): {parsed.choices[0].message.parsed!r}")
    except openai.LengthFinishReasonError:
        print("parse(): cut by max_tokens (the tiny random model wanders)")
    # A schema with a keyword the server would not check is refused, naming it.
    try:
        client.chat.completions.create(
            model=args.model, messages=jmsgs, max_tokens=8,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "n", "schema": {"type": "integer",
                                                                     "multipleOf": 7}}})
        check(False, "a json_schema with multipleOf was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "'multipleOf' is not supported" in str(e.body),
              f"json_schema: {e.body}")

    # Error paths map onto the client's exception classes.
    wrong = openai.OpenAI(base_url=args.base_url, api_key="sk-wrong", max_retries=0)
    try:
        wrong.chat.completions.create(model=args.model, messages=msgs, max_tokens=2)
        check(False, "a wrong key was accepted")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, f"status {e.status_code}")
        check(e.code == "invalid_api_key", f"code {e.code}")
    for bad in ({"messages": [], "max_tokens": 2},
                {"messages": msgs, "max_tokens": 0},
                {"messages": msgs, "stop": ["a", "b", "c", "d", "e"]}):
        try:
            client.chat.completions.create(model=args.model, **bad)
            check(False, f"accepted {bad}")
        except openai.BadRequestError as e:
            check(e.status_code == 400, f"status {e.status_code}")
            check(isinstance(e.body, dict) and e.body.get("message"), f"body {e.body}")
    try:
        client.chat.completions.create(model=args.model, messages=msgs, max_tokens=2,
                                       extra_body={"chunks": "not a list"})
        check(False, "chunks as a string was accepted")
    except openai.BadRequestError as e:
        check(e.param == "chunks", f"param {e.param}")
    print(f"openai client checks passed ({stop_note})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
