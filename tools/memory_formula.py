#!/usr/bin/env python3
"""Peak memory of `cachetune generate` from a model's hyper-parameters (docs/PERFORMANCE.md, "Memory").

The CPU engine keeps the weights in their file encoding, memory-mapped, and allocates:
  weights   the file's tensor bytes (mapped; every page is touched once per forward pass)
  scratch   one dequantised weight matrix at a time, the largest being gate and up stacked:
            2 * n_ff * n_embd * 4 bytes (the output head is dequantised in slices of that size)
  rows      the activations of the prompt's rows, all prefilled in one pass:
            n_prompt * 4 * (3 * n_embd + q_dim + 2 * kv_dim + q_dim + 3 * n_ff)
            (x, its norm and the projection out; Q/K/V; attention out; gate|up and their product)
  logits    n_vocab * 4 per row whose logits are taken (one for generate)
  kv        keys and values: (n_prompt + max_tokens + 1) * n_layer * 2 * kv_dim * b, where b is
            2 for the default F16 cache (--cache-type f16), 4 for --cache-type f32 and 34/32 for
            --cache-type q8_0 (blocks of 32 elements with one F16 scale)
and a fixed runtime of tens of MiB (code, OpenBLAS/OpenMP buffers, tokenizer tables).

Usage:
  python3 tools/memory_formula.py NAME|PATH [--prompt N] [--max-tokens M] [--cache-type T]
  python3 tools/memory_formula.py --hparams n_layer,n_embd,n_ff,n_head,n_head_kv,head_dim,n_vocab \
      --file-bytes B [--prompt N] [--max-tokens M] [--cache-type T]
NAME is a registry name (tools/models.tsv). Prints each term in MiB and the total.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fetch_model import parse_registry  # noqa: E402

MIB = 1 << 20
RUNTIME = 40 * MIB  # measured: SmolLM2's RSS less its file, scratch, rows and KV at a short prompt


def hparams_from_gguf(path):
    from gguf import GGUFReader
    r = GGUFReader(path)
    arch = r.fields["general.architecture"].contents()

    def get(key, default=None):
        f = r.fields.get(f"{arch}.{key}")
        return f.contents() if f is not None else default

    n_embd, n_head = get("embedding_length"), get("attention.head_count")
    head_dim = get("attention.key_length", n_embd // n_head)
    return {"n_layer": get("block_count"), "n_embd": n_embd, "n_ff": get("feed_forward_length"),
            "n_head": n_head, "n_head_kv": get("attention.head_count_kv", n_head),
            "head_dim": head_dim, "n_vocab": len(r.fields["tokenizer.ggml.tokens"].data)}


# bytes of one cached key or value element, by --cache-type (q8_0: 34-byte blocks of 32)
KV_BYTES = {"f16": 2, "f32": 4, "q8_0": 34 / 32}


def terms(h, file_bytes, n_prompt, max_tokens, cache_type="f16"):
    q_dim, kv_dim = h["n_head"] * h["head_dim"], h["n_head_kv"] * h["head_dim"]
    return [
        ("weights (mapped file)", file_bytes),
        ("scratch (gate|up in F32)", 2 * h["n_ff"] * h["n_embd"] * 4),
        ("rows (prompt activations)",
         n_prompt * 4 * (3 * h["n_embd"] + 2 * q_dim + 2 * kv_dim + 3 * h["n_ff"])),
        ("logits", h["n_vocab"] * 4),
        (f"kv ({cache_type.upper()})",
         int((n_prompt + max_tokens + 1) * h["n_layer"] * 2 * kv_dim * KV_BYTES[cache_type])),
        ("runtime", RUNTIME),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--hparams")
    ap.add_argument("--file-bytes", type=int)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--cache-type", choices=sorted(KV_BYTES), default="f16",
                    help="the live K/V cache's type, as `cachetune generate --cache-type`")
    args = ap.parse_args()
    if args.hparams:
        keys = ["n_layer", "n_embd", "n_ff", "n_head", "n_head_kv", "head_dim", "n_vocab"]
        vals = [int(v) for v in args.hparams.split(",")]
        if len(vals) != len(keys) or args.file_bytes is None:
            sys.exit(f"--hparams takes {','.join(keys)}, and --file-bytes is required")
        h, file_bytes, label = dict(zip(keys, vals)), args.file_bytes, "given hyper-parameters"
    else:
        if not args.model:
            sys.exit("give a registry name or a GGUF path, or --hparams")
        path = args.model
        if not os.path.exists(path):
            reg = {e["name"]: e for e in parse_registry(os.path.join(HERE, "models.tsv"))}
            if path not in reg:
                sys.exit(f"{path}: no such file, and not a model name ({', '.join(reg)})")
            path = os.path.join(os.environ.get("CACHETUNE_MODEL_DIR",
                                               os.path.expanduser("~/.cache/cachetune/models")),
                                reg[path]["file"])
        h, file_bytes, label = hparams_from_gguf(path), os.path.getsize(path), path
    ts = terms(h, file_bytes, args.prompt, args.max_tokens, args.cache_type)
    print(f"{label}: {h}, prompt {args.prompt}, max_tokens {args.max_tokens}, "
          f"cache {args.cache_type}")
    for name, b in ts:
        print(f"  {name:28s} {b / MIB:10.1f} MiB")
    total = sum(b for _, b in ts)
    print(f"  {'total':28s} {total / MIB:10.1f} MiB  ({total / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
