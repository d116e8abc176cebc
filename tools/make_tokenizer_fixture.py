#!/usr/bin/env python3
# Writes tests/fixtures/tokenizer_<name>.json: llama.cpp's token ids (through llama-cpp-python)
# for text drawn deterministically from /work/shared/data plus hand-written edge cases, so the C++
# tokenizer can be checked against llama.cpp without llama.cpp at test time.
# Usage: python3 tools/make_tokenizer_fixture.py [--model NAME ...] [--data DIR] [--out PATH]
#   NAME: registry names (tools/models.tsv); default smollm2-135m -> tokenizer_smollm2.json.
#   Several names (files sharing one vocabulary, e.g. the two Qwen2.5 files) must give llama.cpp
#   the same ids for every case (the script stops otherwise) and are written as one fixture whose
#   "models" lists each with its SHA-256; e.g. --model qwen2.5-coder-0.5b qwen2.5-coder-1.5b
#   --out tests/fixtures/tokenizer_qwen2.5.json.
import argparse
import glob
import json
import os
import random
import sys

import llama_cpp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
from fetch_model import parse_registry  # noqa: E402

MODELS_DIR = os.environ.get("CACHETUNE_MODEL_DIR", os.path.expanduser("~/.cache/cachetune/models"))

EDGE_CASES = [
    "12345", "3.14159", "1,000,000", "a1b2c3", "x = 42;", "version 2.0.1-rc3", "  12  ",
    "don't I'll WE'RE", "it's they're we've I'm he'd she'll", "DON'T 'S 'T", "''s''", "rock 'n' roll",
    "a  b", "a   b", "a\tb", "a\t\tb", "a\nb", "a\n\nb", "a \n b", "a\r\nb", "\n\n", "\n", " ", "  ",
    "\t", " \t \n ", "trailing space ", "trailing spaces   ", "   leading spaces", "\n\nleading",
    "end\n", "end\n\n\n", "multiple     spaces     here", "tab\tseparated\tvalues\n1\t2\t3",
    "emoji 😀🎉👍🏽 and 👨‍👩‍👧", "🤗", "CJK 中文字符测试，日本語のテキスト、한국어 텍스트", "漢字かなカナ",
    "Arabic: مرحبا بالعالم ١٢٣", "Hebrew: שלום עולם", "Accents: café naïve résumé Ångström Øre",
    "Ελληνικά κείμενα", "Русский текст, ёжик!", "हिन्दी पाठ", "ไทย ภาษา", "Ünïcödé ÀÉÎÕÜ",
    "fullwidth ＡＢＣ１２３", "superscript x² ½ ⅓ Ⅻ", "nbsp\u00a0here", "ideographic\u3000space",
    "zero\u200bwidth", "line\u2028separator", "combining e\u0301 a\u0308", "mixed 中English123文",
    "<html><body class=\"x\">Hi &amp; bye</body></html>", "def f(x):\n    return x**2\n",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}", "https://example.com/path?q=1&r=2#frag",
    "email@example.com", "C++ and C# and F#", "$100.00 €50 £20 ¥1000", "... --- !!! ???",
    "«quotes» „German“ “curly” ‘single’", "— en – em dashes —", "I<|im_start|>not special",
    "<|im_end|>", "<|endoftext|> text", "", "a", "A", "'", "''", "'s", "Hello, World!",
    # Letters of Unicode 15.0 (U+1E030) and 15.1 (U+2EBF0), and of 16.0 (U+0558), which llama.cpp's
    # tables do not classify yet; "'s" after each shows whether it counted as a letter.
    "\U0001E030's \U0002EBF0's \u0558's",
]

SPECIAL_CASES = [
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n",
    "<|endoftext|>", "text<|endoftext|>more text", "<|im_start|><|im_end|>", "<|im_end|><|im_end|>",
    "x<|im_start|>y", "<|im_start|> spaced <|im_end|> ", "<repo_name>cachetune<file_sep>main.cc",
    "<|im_start|assistant", "<|im_start|>\n\n<|im_end|>", "<filename>a.py\n<jupyter_code>print(1)",
    "no special tokens here at all", "<|im_start|>user\n数字 12345 don't<|im_end|>",
    # Qwen2.5's fill-in-the-middle and repository markers.
    "<|fim_prefix|>def f(<|fim_suffix|>)\n<|fim_middle|>", "<|repo_name|>x<|file_sep|>a.py\n",
    "<|fim_pad|><|endoftext|>", "<tool_call>{}</tool_call>", "<|vision_start|>",
]


# Byte strings that are not valid UTF-8, or hold bytes SmolLM2 has no token for (0x04, 0x06, 0x13,
# 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5..0xFF). Stored as "hex" instead of "text". Sequences
# that decode above U+10FFFF (F4 90 80 80, F5..F7 + 3 continuation bytes) are left out: llama.cpp
# aborts on them.
BYTE_CASES = [
    b"a\xff\xfeb", b"\x80", b"\xe2\x82", b"\xe2\x82a", b"x\xf0\x9f\x98", b"\xc0\x80", b"\xc1\xbf",
    b"a\xed\xa0\x80b", b"\xe0\x80\x80", b"\xf8\x88\x80\x80\x80", b"hi\x00there", b"a\x04b", b"\x04",
    b"x\x04\x04y", b"\xc3\x83\x04", b"\x1d\x1c", b"\x13\x14\x16 z", b"caf\xc3 \xa9", b" \xff",
    b"\xff\xff don't 12", b"\xf1\x80\x80\x80", b"\xf2\x90\x80\x80 ok", b"'\x80s", b"\t\xfe\n\n",
]


def load_records(data_dir):
    records = []
    for path in sorted(glob.glob(os.path.join(data_dir, "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    records.append(json.loads(line))
    return records


def slice_lengths(rng, n):
    # Log-uniform over 1..600 characters so that short and long slices are both common.
    return [max(1, min(600, int(round(600 ** rng.random())))) for _ in range(n)]


def data_strings(records, rng):
    out = []
    for r in records:
        # Questions and answers whole, except long summaries, which are cut to 600 characters.
        out.append(r["question"][:600])
        out.extend(a[:600] for a in r["answers"][:2])
    chunks = [c for r in records for c in r["chunks"]]
    # Slices anywhere in the chunks (Python slices by code point, so cuts never split one).
    for length in slice_lengths(rng, 700):
        c = rng.choice(chunks)
        start = rng.randrange(0, max(1, len(c) - length + 1))
        out.append(c[start:start + length])
    # Slices around non-ASCII characters, which random slices rarely hit.
    spots = [(ci, i) for ci, c in enumerate(chunks) for i, ch in enumerate(c) if ord(ch) > 127]
    for length in slice_lengths(rng, min(250, len(spots))):
        ci, i = rng.choice(spots)
        start = max(0, i - rng.randrange(0, length))
        out.append(chunks[ci][start:start + length])
    # Slices around digits and apostrophes (the pre-tokenizer's special cases).
    for ch, count in (("'", 60), ("0123456789", 60)):
        spots = [(ci, i) for ci, c in enumerate(chunks) for i, x in enumerate(c) if x in ch]
        for length in slice_lengths(rng, count):
            ci, i = rng.choice(spots)
            start = max(0, i - rng.randrange(0, length))
            out.append(chunks[ci][start:start + length])
    return [s for s in out if s]


def main():
    ap = argparse.ArgumentParser(description="Writes llama.cpp's token ids for the tokenizer tests.")
    ap.add_argument("--model", nargs="+", default=["smollm2-135m"])
    ap.add_argument("--data", default="/work/shared/data")
    ap.add_argument("--out", default=os.path.join(REPO, "tests/fixtures/tokenizer_smollm2.json"))
    args = ap.parse_args()

    reg = {e["name"]: e for e in parse_registry(os.path.join(REPO, "tools", "models.tsv"))}
    llms = []
    for name in args.model:
        if name not in reg:
            sys.exit(f"unknown model '{name}': expected one of {', '.join(reg)}")
        path = os.path.join(MODELS_DIR, reg[name]["file"])
        if not os.path.exists(path):
            sys.exit(f"{path}: not installed (cachetune pull {name})")
        llms.append(llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False))

    def tokenize(data, special):
        ids = [llm.tokenize(data, add_bos=False, special=special) for llm in llms]
        if any(x != ids[0] for x in ids):
            sys.exit(f"llama.cpp tokenizes {data!r} differently for {', '.join(args.model)}")
        return ids[0]

    rng = random.Random(20240607)
    texts = data_strings(load_records(args.data), rng)
    seen = set()
    cases = []

    def add(text, special):
        if (text, special) in seen:
            return
        seen.add((text, special))
        ids = tokenize(text.encode("utf-8"), special) if text else []
        cases.append({"text": text, "special": special, "ids": ids})

    for t in EDGE_CASES + texts:
        add(t, False)
    for t in SPECIAL_CASES + EDGE_CASES[-12:]:
        add(t, True)
    for b in BYTE_CASES:
        cases.append({"hex": b.hex(), "special": False,
                      "ids": tokenize(b, False)})

    fixture = {
        "version": 1,
        "model": reg[args.model[0]]["file"],
        "model_sha256": reg[args.model[0]]["sha256"],
        "models": [{"name": n, "file": reg[n]["file"], "sha256": reg[n]["sha256"]}
                   for n in args.model],
        "tokenizer": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
        "cases": cases,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        # One case per line keeps diffs of a regenerated fixture readable.
        f.write("{\n")
        for k in ("version", "model", "model_sha256", "models", "tokenizer"):
            f.write(f"  {json.dumps(k)}: {json.dumps(fixture[k])},\n")
        f.write('  "cases": [\n')
        f.write(",\n".join("    " + json.dumps(c, ensure_ascii=False, separators=(",", ":"))
                           for c in cases))
        f.write("\n  ]\n}\n")
    n_special = sum(c["special"] for c in cases)
    n_hex = sum("hex" in c for c in cases)
    print(f"wrote {args.out}: {len(cases)} cases ({n_special} with special=True, {n_hex} as hex), "
          f"{os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main()
