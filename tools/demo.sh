#!/usr/bin/env bash
# The main job: set up (packages, models, build), then answer a question over examples/docs with
# full recompute and with cachetune. It uses qwen2.5-coder-0.5b, the smallest model of
# tools/models.tsv whose full-recompute answer to this question is right (SmolLM2-135M's is not).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CT_MODELS="${CT_MODELS:-qwen2.5-coder-0.5b}" "$ROOT/tools/setup.sh"
cd "$ROOT"
BUILD="${CT_BUILD_DIR:-build}"
"$BUILD/cachetune" generate --model "${CT_DEMO_MODEL:-qwen2.5-coder-0.5b}" --chunk examples/docs/*.txt \
  --question "Who directs the institute that discovered the Harrow Reef?" \
  --policy full,cachetune --max-tokens 32
