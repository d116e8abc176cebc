#!/usr/bin/env python3
"""Writes the llama.cpp reference fixtures for the logits test (tests/fixtures/ref_logits_smollm2_*.json).

llama.cpp (through llama-cpp-python built from its sdist) is the independent implementation: for a
handful of prompts of 8 to ~2,000 tokens it records, at sampled positions, the 16 largest logits
(id and value) and the 64-token greedy continuation. The prompts' token ids come from llama.cpp's
own tokenizer, so the logits test does not depend on ours.

Two variants: `q4_1` runs llama.cpp on the GGUF itself (llama.cpp then quantises activations to 8
bits inside its Q4_1 dot products, so agreement is loose); `f32` runs it on an exactly dequantised
F32 copy (tools/dequantize_gguf.py), which isolates implementation differences (tight agreement).

Usage: python3 tools/make_ref_logits.py [--model PATH] [--variant q4_1|f32] [--out FILE]
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
DEFAULT_MODEL = os.path.join(
    os.environ.get("CACHETUNE_MODEL_DIR", os.path.expanduser("~/.cache/cachetune/models")),
    "SmolLM2-135M-Instruct.Q4_1.gguf")
TOP = 16
GREEDY = 64


def prompts():
    """Prompt texts, from a short phrase to a ~2,000-token document set (examples/ ships them)."""
    docs_dir = os.path.join(ROOT, "examples", "docs")
    docs = [open(os.path.join(docs_dir, f), encoding="utf-8").read()
            for f in sorted(os.listdir(docs_dir)) if f.endswith(".txt")]
    chat = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France? Answer in one "
            "sentence.<|im_end|>\n<|im_start|>assistant\n")
    long_text = "\n\n".join(docs)
    return [
        ("short", "The quick brown fox jumps over the lazy dog and then", False),
        ("chat", chat, True),
        ("doc", docs[0], False),
        ("long", long_text, False),
    ]


def positions(n):
    if n <= 600:
        return list(range(n))
    return sorted(set(list(range(0, n, 8)) + list(range(n - 32, n))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--variant", choices=["q4_1", "f32"], default="q4_1")
    ap.add_argument("--out", default=None)
    ap.add_argument("--max-tokens", type=int, default=2048)
    args = ap.parse_args()
    out_path = args.out or os.path.join(ROOT, "tests", "fixtures",
                                        f"ref_logits_smollm2_{args.variant}.json")
    sha = hashlib.sha256(open(args.model, "rb").read()).hexdigest()
    tmp = tempfile.TemporaryDirectory()
    run_model = args.model
    if args.variant == "f32":
        run_model = os.path.join(tmp.name, "f32.gguf")
        subprocess.run([sys.executable, os.path.join(HERE, "dequantize_gguf.py"), args.model,
                        run_model], check=True)
    llm = llama_cpp.Llama(model_path=run_model, n_ctx=4096, n_batch=512, n_threads=2,
                          logits_all=True, verbose=False)
    cases = []
    for name, text, special in prompts():
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
        eog = {llm.token_eos(), 2}
        for _ in range(GREEDY):
            if nxt in eog:
                break
            gen.append(nxt)
            llm.eval([nxt])
            nxt = int(np.argmax(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)))
        cases.append({"name": name, "tokens": [int(t) for t in toks], "positions": pos,
                      "top_ids": top_ids, "top_logits": top_vals, "greedy": gen})
        print(f"{name}: {len(toks)} tokens, {len(pos)} positions, greedy {len(gen)} tokens",
              file=sys.stderr)
    out = {"version": 1, "model_sha256": sha, "variant": args.variant,
           "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
           "top": TOP, "cases": cases}
    with open(out_path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {out_path} ({os.path.getsize(out_path)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
