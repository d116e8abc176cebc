#!/usr/bin/env python3
"""Writes tests/fixtures/metrics_ref.json: reference QA-F1 and ROUGE-L values for the C++ metrics.

Pairs are built deterministically from /work/shared/data/*.jsonl (answers vs questions, chunk
sentences vs answers, perturbed copies) plus hand-made probes of the Unicode corner cases. ROUGE-L
comes from the PyPI `rouge-score` package (RougeScorer(['rougeL'], use_stemmer=False) fmeasure);
QA-F1 from qa_f1() below, which mirrors LongBench's qa_f1_score definition (SQuAD-style answer
normalisation, then token-level F1 with multiset overlap).

Usage: pip install rouge-score==0.1.2 && python3 tools/make_metrics_fixture.py [DATA_DIR] [OUT]
"""

import collections
import json
import random
import re
import string
import sys
import unicodedata
from importlib import metadata
from pathlib import Path

from rouge_score import rouge_scorer

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/work/shared/data")
OUT = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "tests/fixtures/metrics_ref.json"
TASKS = ["2wikimqa", "cacheblend_wiki", "hotpotqa", "multi_news", "musique"]

# ---- QA-F1: mirrors LongBench's qa_f1_score (and SQuAD's normalize_answer) -------------------
_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize(text):
    """lower-case -> drop ASCII punctuation -> articles to spaces -> collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def qa_f1(prediction, gold):
    pred_tokens = normalize(prediction).split()
    gold_tokens = normalize(gold).split()
    overlap = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    n_same = sum(overlap.values())
    if n_same == 0:
        return 0.0
    precision = 1.0 * n_same / len(pred_tokens)
    recall = 1.0 * n_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


_SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def rouge_l(prediction, reference):
    return _SCORER.score(reference, prediction)["rougeL"].fmeasure


# ---- pair construction -----------------------------------------------------------------------
def load(task):
    with open(DATA_DIR / f"{task}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def sentences(text):
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def clip_words(text, n):
    return " ".join(text.split()[:n])


def perturb(text, rng):
    """A few deterministic edits of one string: drops, shuffles, case and punctuation changes."""
    words = text.split()
    out = []
    if len(words) > 1:
        out.append(" ".join(w for i, w in enumerate(words) if i % 3 != 1))  # word drops
        shuffled = words[:]
        rng.shuffle(shuffled)
        out.append(" ".join(shuffled))
    out.append(text.upper())
    out.append(text.title())
    out.append("The " + text + ".")
    out.append('"' + text.replace(" ", ", ") + '"!')
    out.append("  " + text.replace(" ", "\t\n ") + "  ")
    out.append("an " + text + " (a) the-end")
    return out


def build_pairs():
    pairs = []
    for task in TASKS:
        rows = load(task)
        rng = random.Random(f"metrics-{task}")
        for row in rows[:12]:
            question, answers = row["question"], row["answers"]
            chunk_sents = [s for c in row["chunks"][:2] for s in sentences(c)]
            for ans in answers[:2]:
                ans = clip_words(ans, 120)  # multi_news summaries are long; keep the file small
                pairs.append((ans, question))
                pairs.append((question, ans))
                pairs.append((ans, ans))
                for p in perturb(ans, rng)[: (4 if task == "multi_news" else 8)]:
                    pairs.append((p, ans))
                if chunk_sents:
                    pairs.append((rng.choice(chunk_sents), ans))
            if not answers and chunk_sents:  # cacheblend_wiki has no gold answers
                pairs.append((rng.choice(chunk_sents), question))
    return pairs


def non_ascii_chars():
    chars = set()
    for task in TASKS:
        for row in load(task):
            for s in row["chunks"] + [row["question"]] + row["answers"]:
                chars.update(ch for ch in s if ord(ch) > 127)
    return sorted(chars)


def probe_pairs():
    """Hand-made corner cases plus, for every non-ASCII character of the data, probes of its case
    mapping, whether it separates words (articles next to it) and whether it is whitespace."""
    pairs = [
        ("", ""),
        ("", "an answer"),
        ("an answer", ""),
        ("the", "a"),
        ("The Beatles", "beatles"),
        ("a an the", "the"),
        ("theory of an anthem", "the theory, of an anthem"),
        ("Paris", "paris."),
        ("New York City", "York New City"),
        ("cat cat cat", "cat"),
        ("cat", "cat cat dog"),
        ("snake_case under_score", "snakecase underscore"),
        ("1,000,000 people", "1000000 people"),
        ("it's", "its"),
        ("U.S.A.", "usa"),
        ("rock-n-roll", "rocknroll"),
        ("non\u00a0breaking\u2009thin\u3000ideographic", "non breaking thin ideographic"),
        ("zero\u200bwidth", "zero width"),
        ("x\x1cy\x1dz\x1e\x1fw", "x y z w"),
        ("line\u2028para\u2029next\x85", "line para next"),
        ("\u0130stanbul", "istanbul"),
        ("\u0130stanbul", "i\u0307stanbul"),
        ("\u212aelvin", "kelvin"),
        ("\u039f\u0394\u039f\u03a3", "\u03bf\u03b4\u03bf\u03c2"),
        ("\u03a3\u0391\u03a3. \u03a3", "\u03c3\u03b1\u03c2 \u03c3"),
        ("\u00c9COLE \u00e9t\u00e9", "\u00e9cole \u00c9T\u00c9"),
        ("\u0421\u0410\u041d\u041a\u0422 \u041f\u0435\u0442\u0435\u0440\u0431\u0443\u0440\u0433",
         "\u0441\u0430\u043d\u043a\u0442 \u043f\u0435\u0442\u0435\u0440\u0431\u0443\u0440\u0433"),
        ("\u201cthe\u201d cat", "cat"),
        ("caf\u00e9the a\u00e9", "caf\u00e9the a\u00e9"),
        ("the\u00e9 \u00e9an", "\u00e9"),
        ("e\u0301the", "e"),
        ("\u2460the \u24b6the", "the"),
        ("\u00b2the \u00bdan", "the"),
        ("\U0001f600the \U0001f600", "\U0001f600"),
        ("\u5317\u4eac the \u5927\u5b66", "\u5317\u4eac\u5927\u5b66"),
        ("\u0928\u093e\u0917the \u0905", "\u0928\u093e\u0917"),
        ("Na\u00efve caf\u00e9", "naive cafe"),
        ("\uff21\uff22\uff23 abc", "\uff41\uff42\uff43"),
    ]
    for ch in non_ascii_chars():
        pairs.append((f"the{ch}a {ch}an x{ch.upper()}y", f"{ch} X{ch.lower()}Y"))
        pairs.append((f"A{ch}b {ch}the", f"a b {ch}"))
    return pairs


def main():
    pairs = build_pairs() + probe_pairs()
    cases = [{"pred": p, "ref": r, "qa_f1": qa_f1(p, r), "rouge_l": rouge_l(p, r)} for p, r in pairs]
    # Multi-reference cases for the *_max variants: every QA example's answer list.
    max_cases = []
    for task in ["2wikimqa", "hotpotqa", "musique"]:
        rng = random.Random(f"max-{task}")
        for row in load(task)[:10]:
            golds = row["answers"]
            if not golds:
                continue
            sents = [s for c in row["chunks"][:1] for s in sentences(c)]
            for pred in [golds[-1].upper(), rng.choice(sents) if sents else "", "none"]:
                max_cases.append({
                    "pred": pred,
                    "refs": golds,
                    "qa_f1_max": max([0.0] + [qa_f1(pred, g) for g in golds]),
                    "rouge_l_max": max([0.0] + [rouge_l(pred, g) for g in golds]),
                })
    max_cases.append({"pred": "anything", "refs": [], "qa_f1_max": 0.0, "rouge_l_max": 0.0})
    doc = {
        "generator": "tools/make_metrics_fixture.py",
        "rouge_score_version": metadata.version("rouge-score"),
        "python_unicode_version": unicodedata.unidata_version,
        "cases": cases,
        "max_cases": max_cases,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=True, indent=0)
        f.write("\n")
    print(f"wrote {len(cases)} cases and {len(max_cases)} max cases to {OUT}")


if __name__ == "__main__":
    main()
