#!/usr/bin/env bash
# Prefill and decode tok/s of two tessera builds (or the same one twice) with 0, 1 and 2
# busy processes beside them, the builds alternated in each round (docs/performance.md,
# "Under contention"). Prints: busy-count build round prefill decode.
#   scripts/contention.sh OLD_TESSERA NEW_TESSERA [ROUNDS]    (BUSY_LEVELS="0 1 2" by default)
set -euo pipefail
old=$1; new=$2; rounds=${3:-3}
for busy in ${BUSY_LEVELS:-0 1 2}; do
  pids=()
  for ((b=0; b<busy; b++)); do python3 -c "while True: pass" & pids+=($!); done
  sleep 1
  for ((r=0; r<rounds; r++)); do
    for which in old new; do
      bin=$old; [ $which = new ] && bin=$new
      out=$(timeout 300 $bin bench-model --prompt-tokens 128 --gen-tokens 64 --runs 1 --json 2>/dev/null || true)
      python3 -c "
import json,sys; d=json.loads(sys.argv[1]); print('$busy', '$which', $r, round(d['prefill_tok_s'],1), round(d['decode_tok_s'],1))" "$out" 2>/dev/null || echo "$busy $which $r PARSE: ${out:0:300}"
    done
  done
  for p in "${pids[@]}"; do kill $p; done
  wait 2>/dev/null || true
done
