#!/usr/bin/env bash
# Same-run comparison of `tessera bench-model` with llama.cpp's llama-bench on one GGUF.
#   scripts/engine_vs_llamacpp.sh LLAMA_BENCH MODEL.gguf [ROUNDS [TESSERA_ARGS...]]
# TESSERA_ARGS go to every `tessera bench-model` (e.g. --int8-acts).
# LLAMA_BENCH: the llama-bench binary of a llama.cpp build (a peer built for measurement,
# e.g. from the llama.cpp vendored in the llama-cpp-python source package; never part of
# this repository). Both use 2 threads; rounds alternate the two so drift hits both.
# ONLY=prefill runs only the 512-token prefill of each (llama-bench -p 512 -n 0 against
# bench-model --gen-tokens 1): short rounds, so many of them fit where the host drifts.
set -euo pipefail
bench=$1 model=$2 rounds=${3:-2}
shift $(($# < 3 ? $# : 3))
tessera=${TESSERA:-target/release/tessera}
peer() {
  "$bench" -m "$model" -t 2 -r 3 -o csv "$@" 2>/dev/null | python3 -c '
import csv, sys
for r in csv.DictReader(sys.stdin):
    if r["n_gen"] == "0":
        kind = "pp" + r["n_prompt"]
    else:
        kind = "tg" + r["n_gen"] + " at depth " + r["n_depth"]
    print("llama.cpp %s: %.1f tok/s" % (kind, float(r["avg_ts"])))'
}
for r in $(seq "$rounds"); do
  echo "== round $r"
  if [ "${ONLY:-}" = prefill ]; then
    peer -p 512 -n 0
    echo -n "tessera: " && "$tessera" bench-model --model "$model" --prompt-tokens 512 --gen-tokens 1 --runs 3 "$@" 2>/dev/null
    continue
  fi
  peer -p 512 -n 128
  peer -p 0 -n 128 -d 512
  echo -n "tessera (decode after 512): " && "$tessera" bench-model --model "$model" --prompt-tokens 512 --gen-tokens 128 --runs 3 "$@" 2>/dev/null
  echo -n "tessera (decode after 8):   " && "$tessera" bench-model --model "$model" --prompt-tokens 8 --gen-tokens 128 --runs 3 "$@" 2>/dev/null
done
