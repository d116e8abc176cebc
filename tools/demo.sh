#!/usr/bin/env bash
# The main job on the default model: set up (packages, model, build), then answer a question.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/tools/setup.sh"
cd "$ROOT"
BUILD="${CT_BUILD_DIR:-build}"
"$BUILD/cachetune" generate --chunk examples/docs/*.txt \
  --question "Who directs the institute that discovered the Harrow Reef?" \
  --policy full,cachetune --max-tokens 32
