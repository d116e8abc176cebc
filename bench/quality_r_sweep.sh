#!/bin/bash
# Issue 15 item 4 (docs/RESULTS.md, "Quality against r"): the default policy (`cachetune`) at
# r = 0.05 ... 0.5 on the five tasks of ../shared/data, with full and reuse as the references,
# one results directory per model, resumable (run it again to continue). Usage:
#   bench/quality_r_sweep.sh [MODEL] [OUT] [task:limit ...]
# e.g. bench/quality_r_sweep.sh smollm2-135m runs/smollm2-r hotpotqa:8 multi_news:8 \
#        cacheblend_wiki:7 2wikimqa:8 musique:8
# then: python3 tools/quality_tables.py runs/smollm2-r --r-curve
# One thread and nice 10, so that the machine's other users can still build.
set -euo pipefail
B=${B:-build/cachetune}
D=${DATA:-../shared/data}
MODEL=${1:-smollm2-135m}
O=${2:-runs/$MODEL-r}
shift 2 || true
SPECS=("$@")
[ ${#SPECS[@]} -eq 0 ] && SPECS=(hotpotqa:8 multi_news:8 cacheblend_wiki:7 2wikimqa:8 musique:8)
R=${RATIOS:-0.05,0.1,0.15,0.2,0.3,0.4,0.5}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=passive
for spec in "${SPECS[@]}"; do
  t=${spec%%:*}; n=${spec##*:}
  nice -n 10 "$B" eval --model "$MODEL" --data "$D/$t.jsonl" --limit "$n" --policies full,reuse,cachetune \
    --sweep-ratio --sweep-ratios "$R" --sweep-policies cachetune \
    --no-attention --max-tokens-qa 16 --max-tokens-summary 48 --out "$O"
done
