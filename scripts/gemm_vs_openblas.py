#!/usr/bin/env python3
"""f32 GEMM: Tessera vs OpenBLAS (through numpy) in the same run, interleaved rounds.

Gives the peer its best: 2 threads and OPENBLAS_CORETYPE=SkylakeX (numpy's OpenBLAS
otherwise takes Zen 5 for Haswell and runs AVX2 kernels at about half the rate).
Usage: python3 scripts/gemm_vs_openblas.py [--size 2048] [--rounds 5] [--threads 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--size", type=int, default=2048)
parser.add_argument("--rounds", type=int, default=5)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--dtype", default="f32")
parser.add_argument("--coretype", default="SkylakeX", help="OpenBLAS kernel family (SkylakeX = AVX-512)")
args = parser.parse_args()

os.environ["OPENBLAS_CORETYPE"] = args.coretype  # override any inherited Haswell setting
os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
try:
    import numpy as np  # noqa: E402  (environment must be set before the import)
except ImportError:
    sys.exit("numpy is needed for the OpenBLAS peer: python3 -m pip install numpy")

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
subprocess.run(["cargo", "build", "--release", "-q"], cwd=root, check=True)
tessera = os.path.join(root, "target", "release", "tessera")
n = args.size
flops = 2.0 * n ** 3


def numpy_gflops():
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    c = np.empty((n, n), np.float32)
    np.matmul(a, b, out=c)  # warm-up
    times = []
    deadline = time.perf_counter() + 1.5
    while time.perf_counter() < deadline or len(times) < 10:
        t = time.perf_counter()
        np.matmul(a, b, out=c)
        times.append(time.perf_counter() - t)
    return flops / statistics.median(times) / 1e9


def tessera_gflops():
    env = dict(os.environ, TESSERA_THREADS=str(args.threads))
    out = subprocess.run(
        [tessera, "bench", "gemm", "--shape", f"{n}x{n}x{n}", "--dtype", args.dtype, "--variant", "avx512", "--json"],
        env=env, check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    return doc["results"][0]["gflops"], doc["ceilings"]["fma_gflops"]


print(f"f32 GEMM {n}^3, {args.threads} threads, OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']}, numpy {np.__version__}")
print(f"{'round':>5}  {'OpenBLAS':>9}  {'Tessera':>9}  {'ratio':>6}  {'FMA peak':>9}")
ours, theirs = [], []
for r in range(args.rounds):
    if r % 2 == 0:
        t = numpy_gflops()
        o, peak = tessera_gflops()
    else:
        o, peak = tessera_gflops()
        t = numpy_gflops()
    ours.append(o)
    theirs.append(t)
    print(f"{r:>5}  {t:>9.1f}  {o:>9.1f}  {o / t:>6.2f}  {peak:>9.1f}")
mo, mt = statistics.median(ours), statistics.median(theirs)
print(f"median  OpenBLAS {mt:.1f} GFLOP/s, Tessera {mo:.1f} GFLOP/s, ratio {mo / mt:.2f}")
