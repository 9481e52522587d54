#!/usr/bin/env bash
# Fails when a kernel calls a SIMD intrinsic out of line.
#
# Why: an intrinsic is inlined only into code compiled with its target features. Code in a
# closure (an `array::from_fn`, a `.map`) or in a helper without `#[target_feature]` is
# not, so LLVM leaves `call core::core_arch::…::_mm512_…` there and every vector goes
# through memory. It compiles, passes every test and silently halves a kernel: the paged
# decode kernel's transpose-add tree did this until 2026-11-27 (attention in a 16-stream
# decode step 404 -> 197 us per layer once inlined). This looks at the release binary.
#
# Usage: scripts/check-inlining.sh [binary]   (default target/release/tessera)
set -euo pipefail
bin=${1:-target/release/tessera}
[ -x "$bin" ] || { echo "check-inlining: $bin not built (cargo build --release)" >&2; exit 2; }
command -v objdump >/dev/null || { echo "check-inlining: objdump (binutils) not found" >&2; exit 2; }
# Every direct call whose target is a core::arch function, with the calling function;
# mangled names (legacy `9core_arch`, v0 `core_arch`) either way.
# Callers inside std are left alone: its CPU-feature detection (std_detect,
# compiler_builtins) calls _xgetbv out of line by design, and core_arch's own Debug
# impls of the vector types call their helpers.
calls=$(objdump -d --no-show-raw-insn "$bin" | awk '
  /^[0-9a-f]+ <.*>:$/ { fn = $2 }
  /\tcall +[0-9a-f]+ </ && $NF ~ /core_arch/ && fn !~ /std_detect|compiler_builtins|core_arch/ {
    print fn " -> " $NF
  }')
if [ -n "$calls" ]; then
  echo "check-inlining: SIMD intrinsics called out of line (write the loop without a closure, or give the helper the caller's #[target_feature]):" >&2
  echo "$calls" | sort | uniq -c | sort -rn >&2
  exit 1
fi
echo "check-inlining: no out-of-line intrinsic calls in $bin"
