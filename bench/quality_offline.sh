#!/bin/bash
# Issue 15's measurement (docs/RESULTS.md, "Offline policies"): every policy at r = 0.15 on the
# five tasks of ../shared/data, one results directory per model, resumable (run it again to
# continue; finished units are skipped). Usage:
#   bench/quality_offline.sh [MODEL] [OUT] [task:limit ...]
# e.g. bench/quality_offline.sh smollm2-135m runs/smollm2 hotpotqa:12 multi_news:6 cacheblend_wiki:4 \
#        2wikimqa:3 musique:3 hotpotqa:20
# then: python3 tools/quality_tables.py runs/smollm2
# One thread and nice 10, so that the machine's other users can still build.
set -euo pipefail
B=${B:-build/cachetune}
D=${DATA:-../shared/data}
MODEL=${1:-smollm2-135m}
O=${2:-runs/$MODEL}
shift 2 || true
SPECS=("$@")
[ ${#SPECS[@]} -eq 0 ] && SPECS=(hotpotqa:20 multi_news:20 cacheblend_wiki:7 2wikimqa:20 musique:20)
P=${POLICIES:-full,reuse,freq,head,probe,probe-shared,probe-pos,attn,probe-attn,probe-attn-shared,random,epic,cacheblend,prophetkv,oracle,oracle-shared}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=passive
for spec in "${SPECS[@]}"; do
  t=${spec%%:*}; n=${spec##*:}
  nice -n 10 "$B" eval --model "$MODEL" --data "$D/$t.jsonl" --limit "$n" --policies "$P" \
    --no-attention --max-tokens-qa 16 --max-tokens-summary 48 --out "$O"
done
