#!/usr/bin/env bash
# Same-run comparison of `tessera bench-serve` with llama.cpp's llama-batched-bench: B
# sequences, each a PP-token prompt and TG generated tokens, at B = 1, 4, 16, 32.
#   [BATCHES="1 4 16 32"] scripts/batched_vs_llamacpp.sh LLAMA_BATCHED_BENCH MODEL.gguf [ROUNDS] [extra tessera flags]
# LLAMA_BATCHED_BENCH: the binary of a llama.cpp build made for measurement (e.g. from the
# llama.cpp vendored in the llama-cpp-python source package; never part of this
# repository). Both use 2 threads; rounds alternate the two so drift hits both.
# Columns: S_TG = generated tokens / time of pure-decode steps (tessera: decode_only_tok_s),
# S = all tokens / wall time (tessera: total_tok_s).
set -euo pipefail
peer=$(realpath "$1") model=$(realpath "$2") rounds=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
tessera=$(realpath "${TESSERA:-target/release/tessera}")
pp=${PP:-128} tg=${TG:-128}
[ -x "$peer" ] || { echo "no llama-batched-bench at $peer" >&2; exit 2; }
[ -x "$tessera" ] || { echo "no tessera binary at $tessera (cargo build --release)" >&2; exit 2; }
for r in $(seq "$rounds"); do
  echo "== round $r"
  for b in ${BATCHES:-1 4 16 32}; do
    line=$("$peer" -m "$model" -c $(( (pp + tg) * b + 64 )) -b 2048 -ub 512 -npp "$pp" -ntg "$tg" \
      -npl "$b" -t 2 2>/dev/null | grep -E "^\|\s+$pp " | tail -1)
    [ -n "$line" ] || { echo "llama-batched-bench printed no result for B=$b" >&2; exit 1; }
    s_tg=$(echo "$line" | awk -F'|' '{gsub(/ /,"",$9); print $9}')
    s=$(echo "$line" | awk -F'|' '{gsub(/ /,"",$11); print $11}')
    j=$("$tessera" bench-serve --requests "$b" --concurrency "$b" --prompt-tokens "$pp" \
      --gen-tokens "$tg" --json "$@" 2>/dev/null)
    python3 - "$b" "$s_tg" "$s" "$j" <<'EOF'
import json, sys
b, s_tg, s, j = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
tg, tot = j["decode_only_tok_s"], j["total_tok_s"]
print(f"B={b:<3} decode: tessera {tg:7.1f} llama.cpp {s_tg:7.1f} ({tg / s_tg:4.2f}x)   "
      f"all tokens: tessera {tot:7.1f} llama.cpp {s:7.1f} ({tot / s:4.2f}x)")
EOF
  done
done
