#!/usr/bin/env bash
# The CUDA backend's checks on a GPU machine, in one call.
#
#   scripts/gpu-check.sh build   # here (Rust machine): builds the x86-64 tests, the
#                                # bench example and `tessera --features cuda` into
#                                # gpu-bin/ (carry it to the device)
#   scripts/gpu-check.sh         # on the device: CUDA tests, `tessera verify/bench
#                                # --backend cuda`, our benchmarks and the PyTorch/cuBLAS
#                                # peers in the same run; table to $OUT
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == build ]]; then
  mkdir -p gpu-bin
  cargo build --release -p tessera-cuda --example gpu_bench
  cargo build --release -p tessera-cli --features cuda
  cp target/release/examples/gpu_bench target/release/tessera gpu-bin/
  for t in device registry; do
    bin=$(cargo test --release -p tessera-cuda --test "$t" --no-run --message-format=json \
          | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])')
    cp "$bin" "gpu-bin/$t-tests"
  done
  # Debug info stays here: the binaries travel to the device under its size limit.
  strip gpu-bin/tessera gpu-bin/gpu_bench gpu-bin/*-tests
  ls -l gpu-bin
  exit 0
fi

source scripts/gpu-env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi unavailable"; } | tee "$out/gpu.txt"

status=0
./gpu-bin/device-tests --test-threads=1 --nocapture 2>&1 | tee "$out/tests.txt" || status=1
./gpu-bin/registry-tests --test-threads=1 --nocapture 2>&1 | tee -a "$out/tests.txt" || status=1
# The registry's CUDA problems under compute-sanitizer: out-of-bounds or misaligned
# accesses (memcheck) and shared-memory hazards (racecheck) fail the run.
san="$cuda/bin/compute-sanitizer"
if [[ -x "$san" ]]; then
  for tool in memcheck racecheck; do
    timeout 150 "$san" --tool "$tool" --error-exitcode 9 ./gpu-bin/registry-tests \
      --test-threads=1 every_cuda_kernel 2>&1 | tail -4 | tee -a "$out/tests.txt" || status=1
  done
fi
# Every CUDA variant through the registry's verify, then its benchmarks against the
# card's own probed ceilings.
./gpu-bin/tessera verify --backend cuda 2>&1 | tee "$out/verify.txt" || status=1
# Their stderr (the rows as they finish, the probed ceilings) goes to one file: the
# device tool returns at most 8 files. bench's table reaches stdout only at the end; on
# an H100 --all took over 185 s (each memory-bound row builds a rotation set of 3 L2s).
timeout 300 ./gpu-bin/tessera bench --all --backend cuda --budget-ms 200 > "$out/bench.txt" 2>> "$out/stderr.txt" || status=1
./gpu-bin/gpu_bench > "$out/ours.jsonl" 2>> "$out/stderr.txt" || status=1
python3 scripts/gpu_peers.py > "$out/peers.jsonl" 2>> "$out/stderr.txt" || status=1

python3 - "$out" <<'PY' | tee "$out/table.md"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = []
for f in ("ours.jsonl", "peers.jsonl"):
    p = out / f
    if p.exists():
        rows += [json.loads(line) for line in p.read_text().splitlines()]
by_name = {r["kernel"]: r for r in rows}
print("| kernel | shape | ms | TFLOP/s or GB/s | vs peer |")
print("|---|---|---|---|---|")
peer = {"gemm_bf16": "cublas_gemm_bf16", "flash_attention_bf16": "torch_sdpa_bf16"}
hbm = by_name.get("hbm_copy", {}).get("gbs")
for r in rows:
    name = r["kernel"]
    rate = r.get("tflops", r.get("gbs"))
    vs = ""
    if name in peer and peer[name] in by_name:
        vs = f'{by_name[peer[name]]["ms"] / r["ms"]:.2f}× {peer[name]}'
    elif "gbs" in r and hbm and name != "hbm_copy":
        vs = f'{100 * r["gbs"] / hbm:.0f}% of HBM copy'
    print(f'| {name} | {r["shape"]} | {r["ms"]:.3f} | {rate:.1f} | {vs} |')
PY
exit $status
