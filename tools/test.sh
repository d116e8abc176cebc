#!/usr/bin/env bash
# Set up (packages, model, build with warnings as errors), then run the whole test suite:
# unit, reference and model-labelled integration tests.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CT_WERROR="${CT_WERROR:-ON}" "$ROOT/tools/setup.sh"
cd "$ROOT" && cd "${CT_BUILD_DIR:-build}"  # CT_BUILD_DIR may be relative or absolute
# One test process at a time: each already uses every core through OpenMP, and oversubscribed
# OpenMP teams spin at their barriers.
ctest --output-on-failure -j1 "$@"
