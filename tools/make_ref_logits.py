#!/usr/bin/env python3
"""Writes the llama.cpp reference fixtures for the logits test (tests/fixtures/ref_logits_<model>_*.json).

llama.cpp (through llama-cpp-python built from its sdist) is the independent implementation: for a
handful of prompts of 8 to ~2,000 tokens it records, at sampled positions, the 16 largest logits
(id and value) and the 64-token greedy continuation. The prompts' token ids come from llama.cpp's
own tokenizer, so the logits test does not depend on ours.

Two variants: `file` runs llama.cpp on the GGUF itself (llama.cpp then quantises activations to 8
bits inside its quantised dot products, so agreement is loose; for SmolLM2's Q4_1 file this variant
is named `q4_1`); `f32` runs it on an exactly dequantised F32 copy (tools/dequantize_gguf.py), which
isolates implementation differences (tight agreement).

The committed fixtures ran llama.cpp's default cache (f16 keys and values). `--cache-type q8_0`
runs its quantised cache instead (type_k = type_v = q8_0, with flash attention, which llama.cpp
needs for a quantised V), to compare `--cache-type q8_0` with it (docs/PERFORMANCE.md).

Usage: python3 tools/make_ref_logits.py [--model NAME|PATH] [--variant file|f32] [--out FILE]
         [--cache-type f16|q8_0]
  NAME is a registry name of tools/models.tsv (default smollm2-135m); the fixture is written to
  tests/fixtures/ref_logits_<short>_<variant>.json (short: smollm2, qwen2.5-coder-0.5b, ...).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from fetch_model import parse_registry  # noqa: E402

MODELS_DIR = os.environ.get("CACHETUNE_MODEL_DIR", os.path.expanduser("~/.cache/cachetune/models"))
# Default system prompts of the chat templates (what the engine renders for a user-only chat).
SYSTEM = {
    "smollm2-135m": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "qwen2.5-coder-0.5b": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "qwen2.5-coder-1.5b": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
}
TOP = 16
GREEDY = 64


def prompts(name):
    """Prompt texts, from a short phrase to a ~2,000-token document set (examples/ ships them)."""
    docs_dir = os.path.join(ROOT, "examples", "docs")
    docs = [open(os.path.join(docs_dir, f), encoding="utf-8").read()
            for f in sorted(os.listdir(docs_dir)) if f.endswith(".txt")]
    chat = (f"<|im_start|>system\n{SYSTEM[name]}<|im_end|>\n<|im_start|>user\nWhat is the "
            "capital of France? Answer in one sentence.<|im_end|>\n<|im_start|>assistant\n")
    long_text = "\n\n".join(docs)
    return [
        ("short", "The quick brown fox jumps over the lazy dog and then", False),
        ("chat", chat, True),
        ("doc", docs[0], False),
        ("long", long_text, False),
    ]


def Llama_params():
    import inspect
    return inspect.signature(llama_cpp.Llama.__init__).parameters


def positions(n):
    if n <= 600:
        return list(range(n))
    return sorted(set(list(range(0, n, 8)) + list(range(n - 32, n))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m", help="registry name (tools/models.tsv)")
    ap.add_argument("--variant", choices=["file", "f32"], default="file")
    ap.add_argument("--out", default=None)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--cache-type", choices=["f16", "q8_0"], default="f16",
                    help="llama.cpp's K/V cache type (the fixtures in tests/fixtures: f16)")
    args = ap.parse_args()
    reg = {e["name"]: e for e in parse_registry(os.path.join(HERE, "models.tsv"))}
    if args.model not in reg:
        sys.exit(f"unknown model '{args.model}': expected one of {', '.join(reg)}")
    entry = reg[args.model]
    model_path = os.path.join(MODELS_DIR, entry["file"])
    if not os.path.exists(model_path):
        sys.exit(f"{model_path}: not installed (cachetune pull {args.model})")
    short = "smollm2" if args.model == "smollm2-135m" else args.model
    variant = "q4_1" if (args.variant == "file" and short == "smollm2") else args.variant
    out_path = args.out or os.path.join(ROOT, "tests", "fixtures",
                                        f"ref_logits_{short}_{variant}.json")
    # The registry's checksum is the file's (fetch_model.py checked it at install).
    sha = entry["sha256"]
    tmp = tempfile.TemporaryDirectory()
    run_model = model_path
    if args.variant == "f32":
        run_model = os.path.join(tmp.name, "f32.gguf")
        subprocess.run([sys.executable, os.path.join(HERE, "dequantize_gguf.py"), model_path,
                        run_model], check=True)
    # use_extra_bufts=False: llama.cpp's AMX matmul crashes on the AMX Xeons this runs on.
    kw = {"use_extra_bufts": False} if "use_extra_bufts" in Llama_params() else {}
    if args.cache_type == "q8_0":
        kw.update(type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q8_0, flash_attn=True)
    llm = llama_cpp.Llama(model_path=run_model, n_ctx=4096, n_batch=512, n_threads=args.threads,
                          logits_all=True, verbose=False, **kw)
    cases = []
    for name, text, special in prompts(args.model):
        toks = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)[: args.max_tokens]
        llm.reset()
        llm.eval(toks)
        scores = np.array(llm.scores[: len(toks)], dtype=np.float32)
        pos = positions(len(toks))
        top_ids, top_vals = [], []
        for p in pos:
            row = scores[p]
            idx = np.argsort(-row, kind="stable")[:TOP]
            top_ids.append([int(i) for i in idx])
            top_vals.append([round(float(row[i]), 4) for i in idx])
        # Greedy continuation, stopping early on end-of-generation like the engine does.
        gen = []
        nxt = int(np.argmax(scores[len(toks) - 1]))
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        for _ in range(GREEDY):
            if llama_cpp.llama_vocab_is_eog(vocab, nxt):
                break
            gen.append(nxt)
            llm.eval([nxt])
            nxt = int(np.argmax(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)))
        cases.append({"name": name, "tokens": [int(t) for t in toks], "positions": pos,
                      "top_ids": top_ids, "top_logits": top_vals, "greedy": gen})
        print(f"{name}: {len(toks)} tokens, {len(pos)} positions, greedy {len(gen)} tokens",
              file=sys.stderr)
    out = {"version": 1, "model": args.model, "model_sha256": sha, "variant": variant,
           "cache_type": args.cache_type,
           "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
           "top": TOP, "cases": cases}
    with open(out_path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {out_path} ({os.path.getsize(out_path)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
