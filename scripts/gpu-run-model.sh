#!/usr/bin/env bash
# `tessera run --device cuda` on a GGUF model, on a GPU machine, in one call: the greedy
# tokens against the CPU engine's on the same machine, then prefill and decode rates
# (median of 3 runs each). Needs gpu-bin/tessera (scripts/gpu-check.sh build).
#
#   scripts/gpu-run-model.sh MODEL.gguf    # results to $OUT (or gpu-out/)
set -euo pipefail
cd "$(dirname "$0")/.."
model="$1"
source scripts/gpu-env.sh
t=./gpu-bin/tessera
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  lscpu | grep -E "Model name|^CPU\(s\)" || true
} | tee "$out/host.txt"

# Greedy text: the device against the CPU engine with the same exact settings.
q="Name three colors."
$t run --model "$model" "$q" -n 32 --device cuda --json > "$out/greedy-cuda.json" 2>> "$out/stderr.txt"
$t run --model "$model" "$q" -n 32 --acts f32 --kv-cache f32 --json > "$out/greedy-cpu.json" 2>> "$out/stderr.txt"
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, sys
out = sys.argv[1]
d = json.load(open(f"{out}/greedy-cuda.json"))
c = json.load(open(f"{out}/greedy-cpu.json"))
print("cuda:", repr(d["text"]))
print("cpu: ", repr(c["text"]))
print("same greedy ids:", d["generated_ids"] == c["generated_ids"])
PY

# Rates: a ~512-token raw prompt, 256 generated tokens (past end-of-sequence).
prompt=$(python3 -c 'print(" ".join(["The quick brown fox jumps over the lazy dog."] * 50))')
for dev in cuda cpu; do
  for i in 1 2 3; do
    $t run --model "$model" --raw "$prompt" -n 256 --ignore-eos --device "$dev" \
      $([[ $dev == cpu ]] && echo "--kv-cache f32") --json 2>> "$out/stderr.txt" \
      | python3 -c 'import json,sys; j=json.load(sys.stdin); print(sys.argv[1], j["prompt_tokens"], round(j["prefill_tok_s"],1), round(j["decode_tok_s"],1))' "$dev"
  done
done | tee "$out/rates.txt"
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import statistics, sys
rows = [l.split() for l in open(f"{sys.argv[1]}/rates.txt")]
for dev in ("cuda", "cpu"):
    r = [x for x in rows if x[0] == dev]
    print(f"{dev}: prompt {r[0][1]} tokens; prefill median {statistics.median(float(x[2]) for x in r)} tok/s, "
          f"decode median {statistics.median(float(x[3]) for x in r)} tok/s (3 runs)")
PY
