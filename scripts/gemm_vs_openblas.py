#!/usr/bin/env python3
"""f32 GEMM: Tessera vs OpenBLAS (through numpy) in the same run, alternated rounds.

Both run on the best ISA this host has: Tessera's widest variant (avx512, avx2, neon)
and OpenBLAS's kernel family for it (OPENBLAS_CORETYPE SkylakeX on AVX-512, Haswell on
AVX2: numpy's OpenBLAS otherwise takes Zen 5 for Haswell and runs AVX2 kernels at about
half the rate), each with the same number of threads.
Usage: python3 scripts/gemm_vs_openblas.py [--shape MxNxK ...] [--rounds 5] [--threads 2]
(default shape 2048x2048x2048; --size S is SxSxS).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def host_isa():
    """Tessera's variant label and OpenBLAS's core type for this CPU."""
    if platform.machine() in ("aarch64", "arm64"):
        return "neon", None
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    except (OSError, StopIteration):
        flags = []
    if {"avx512f", "avx512bw", "avx512vl"} <= set(flags):
        return "avx512", "SkylakeX"
    if {"avx2", "fma"} <= set(flags):
        return "avx2", "Haswell"
    return "scalar", None


parser = argparse.ArgumentParser()
parser.add_argument("--shape", action="append", help="MxNxK (repeatable)")
parser.add_argument("--size", type=int, help="shorthand for --shape SxSxS")
parser.add_argument("--rounds", type=int, default=5)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--dtype", default="f32")
parser.add_argument("--variant", help="Tessera variant (default: the host's widest)")
parser.add_argument("--coretype", help="OpenBLAS kernel family (default: the host's)")
parser.add_argument("--numpy-only", nargs=3, type=int, help=argparse.SUPPRESS)
args = parser.parse_args()

variant, coretype = host_isa()
variant = args.variant or variant
coretype = args.coretype or coretype
def parse_shape(text):
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        sys.exit(f"--shape {text!r}: expected MxNxK, three positive integers")
    return dims


shapes = [parse_shape(s) for s in (args.shape or [])]
if args.size is not None:
    shapes.append(parse_shape(f"{args.size}x{args.size}x{args.size}"))
shapes = shapes or [(2048, 2048, 2048)]
if args.rounds < 1 or args.threads < 1:
    sys.exit("--rounds and --threads take positive integers")

if coretype:
    os.environ["OPENBLAS_CORETYPE"] = coretype  # override any inherited setting
os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
try:
    import numpy as np  # noqa: E402  (environment must be set before the import)
except ImportError:
    sys.exit("numpy is needed for the OpenBLAS peer: python3 -m pip install numpy")

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tessera = os.path.join(root, "target", "release", "tessera")


def numpy_gflops_here(m, n, k):
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    c = np.empty((m, n), np.float32)
    np.matmul(a, b, out=c)  # warm-up
    times = []
    deadline = time.perf_counter() + 1.5
    while time.perf_counter() < deadline or len(times) < 10:
        t = time.perf_counter()
        np.matmul(a, b, out=c)
        times.append(time.perf_counter() - t)
    return 2.0 * m * n * k / statistics.median(times) / 1e9


if args.numpy_only:
    print(numpy_gflops_here(*args.numpy_only))
    sys.exit(0)


def numpy_gflops(m, n, k):
    """OpenBLAS's rate in a process of its own: its threads spin for a while after a call,
    and would take a core from Tessera's run that follows if they outlived it here."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--numpy-only", str(m), str(n), str(k),
                          "--threads", str(args.threads)], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def tessera_gflops(m, n, k):
    out = subprocess.run(
        [tessera, "bench", "gemm", "--shape", f"{m}x{n}x{k}", "--dtype", args.dtype,
         "--variant", variant, "--set", f"threads={args.threads}", "--json"],
        check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    if not doc["results"]:
        sys.exit(f"tessera ran no {variant} gemm on this host")
    return doc["results"][0]["gflops"], doc["ceilings"]["fma_gflops"]


subprocess.run(["cargo", "build", "--release", "-q"], cwd=root, check=True)
def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


cpu = cpu_name()
print(f"f32 GEMM on {cpu}: Tessera {variant}, OpenBLAS "
      f"{os.environ.get('OPENBLAS_CORETYPE', 'its own choice')}, {args.threads} threads, "
      f"numpy {np.__version__}")
for m, n, k in shapes:
    print(f"\n{m}x{n}x{k}")
    print(f"{'round':>5}  {'OpenBLAS':>9}  {'Tessera':>9}  {'ratio':>6}  {'FMA peak':>9}")
    ours, theirs, ratios = [], [], []
    for r in range(args.rounds):
        if r % 2 == 0:
            t = numpy_gflops(m, n, k)
            o, peak = tessera_gflops(m, n, k)
        else:
            o, peak = tessera_gflops(m, n, k)
            t = numpy_gflops(m, n, k)
        ours.append(o)
        theirs.append(t)
        ratios.append(o / t)
        print(f"{r:>5}  {t:>9.1f}  {o:>9.1f}  {o / t:>6.2f}  {peak:>9.1f}")
    mo, mt = statistics.median(ours), statistics.median(theirs)
    print(f"median  OpenBLAS {mt:.1f} GFLOP/s, Tessera {mo:.1f} GFLOP/s, "
          f"ratio {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
