#!/usr/bin/env bash
# Obtains llama.cpp's tokenizer test data for the vocabulary types cachetune tokenises: the
# vocabulary-only GGUFs models/ggml-vocab-NAME.gguf with their inputs (.inp) and llama.cpp's ids
# (.out), from the sdist of llama-cpp-python==0.3.36 on PyPI (SHA-256 pinned below), into
# CACHETUNE_VOCAB_DIR (default ~/.cache/cachetune/vocab). tests/unit/vocab_ref_test.cc reads them.
# Idempotent: does nothing when every file is present. Files are moved into place only after the
# whole set was extracted from a verified archive, and the stamp last, so an interrupted run leaves
# no half-written file. Exits non-zero on failure (tools/setup.sh only warns).
set -euo pipefail

DIR="${CACHETUNE_VOCAB_DIR:-$HOME/.cache/cachetune/vocab}"
PKG="llama-cpp-python==0.3.36"
SDIST="llama_cpp_python-0.3.36.tar.gz"
WANT="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# Byte-level BPE (gpt2) and SentencePiece (llama) vocabularies whose pre type we support.
NAMES=(qwen2 qwen35 llama-bpe llama-spm phi-3 gpt-2 starcoder refact command-r mpt)
STAMP="$DIR/.fetched-$SDIST"

files() {
  for n in "${NAMES[@]}"; do
    for ext in gguf gguf.inp gguf.out; do echo "ggml-vocab-$n.$ext"; done
  done
}

missing=0
for f in $(files); do [[ -f "$DIR/$f" ]] || missing=1; done
if [[ $missing == 0 && -f "$STAMP" ]]; then
  echo "fetch_vocab_tests: $DIR complete"
  exit 0
fi

mkdir -p "$DIR"
# The temporary directory sits beside DIR so that the final mv is a rename on one filesystem.
TMP="$(mktemp -d "$DIR/.tmp.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
# --no-binary for this package only: its build dependencies (needed to read the sdist's metadata)
# may come as wheels.
python3 -m pip download --no-deps --no-binary llama-cpp-python --quiet --dest "$TMP" "$PKG"
GOT="$(sha256sum "$TMP/$SDIST" | cut -d' ' -f1)"
if [[ "$GOT" != "$WANT" ]]; then
  echo "fetch_vocab_tests: $SDIST has sha256 $GOT, expected $WANT" >&2
  exit 1
fi
members=()
for f in $(files); do members+=("${SDIST%.tar.gz}/vendor/llama.cpp/models/$f"); done
tar -xzf "$TMP/$SDIST" -C "$TMP" "${members[@]}"
for f in $(files); do
  mv -f "$TMP/${SDIST%.tar.gz}/vendor/llama.cpp/models/$f" "$DIR/$f"
done
touch "$STAMP"
echo "fetch_vocab_tests: ${#NAMES[@]} vocabularies in $DIR"
