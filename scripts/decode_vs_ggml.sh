#!/usr/bin/env bash
# Same-run comparison of Tessera's decode matmuls with ggml's on the shapes.
#   scripts/decode_vs_ggml.sh GGML_PEER [ROUNDS] [FORMATS]
# GGML_PEER: scripts/ggml_matvec_peer.c built against a llama.cpp tree (see that file).
# Both use 2 threads and rotate weight copies past the L3; rounds alternate the two so
# drift hits both. One line per cell: Tessera's median, % of the DRAM probe its run
# measured, ggml's median, and ggml ÷ Tessera time (above 1: Tessera is faster).
# Q4_0 and Q4_K run ggml's repacked 8×8 layout, as llama.cpp does on AVX2. ggml runs 8
# matmuls per graph (PER_GRAPH), as llama.cpp runs a token's ops in one graph, so its
# per-op figure carries a barrier, not a whole graph launch.
set -euo pipefail
[[ $# -ge 1 && -x $1 ]] || { echo "usage: $0 GGML_PEER [ROUNDS] [FORMATS] (GGML_PEER: the built ggml_matvec_peer)" >&2; exit 2; }
peer=$(realpath "$1") rounds=${2:-3} formats=${3:-"q4_0 q4_1 q8_0 q4_K q6_K"}
tessera=${TESSERA:-$(pwd)/target/release/tessera}
[[ -x $tessera ]] || { echo "no $tessera: run from the repository root after cargo build --release, or set TESSERA" >&2; exit 2; }
export RUST_BACKTRACE=0
cd /tmp # tessera bench writes its run log to the working directory

median_us() { # tessera bench's median column, in µs
  awk '/^qmatmul/ {v=$5; if ($6=="ms") v*=1000; m=v; p=$(NF-2)} END {print m, p}'
}

for r in $(seq "$rounds"); do
  for f in $formats; do
    case $f in
      q8_0) variant=avx2-int8 ;;
      *) variant=avx2-int8-r8 ;;
    esac
    case $f in
      q4_0 | q4_K) repack=1 ;;
      *) repack=0 ;;
    esac
    case $f in
      q4_K | q6_K) k=512 ;;
      *) k=576 ;;
    esac
    for shape in "q/o 576 $k" "k/v 192 $k" "up 1536 $k" "down 576 1536" "lm-head 49152 $k"; do
      set -- $shape
      name=$1 n=$2 kk=$3
      calls=$((20000 * 576 * 576 / (n * kk) + 200))
      calls=$((calls > 20000 ? 20000 : calls))
      read -r ours pct < <("$tessera" bench qmatmul --dtype "${f,,}" --variant "$variant" \
        --shape "1x${n}x${kk}" --budget-ms 300 2>/dev/null | median_us)
      theirs=$(PER_GRAPH=8 REPACK=$repack "$peer" "$f" "$n" "$kk" 2 "$calls" 2>/dev/null |
        sed 's/.*median \([0-9.]*\) us.*/\1/')
      if [[ -z ${ours:-} || -z ${theirs:-} || $theirs == *ggml* ]]; then
        echo "no time for $f $name (tessera: '${ours:-}', ggml: '${theirs:-}'); rerun that cell by hand" >&2
        exit 1
      fi
      python3 -c "print('round $r  $f  %-8s tessera %8.2f us (%s)  ggml %8.2f us  ggml/tessera %.2f' % ('$name', $ours, '$pct', $theirs, $theirs / $ours))"
    done
  done
done
