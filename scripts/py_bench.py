#!/usr/bin/env python3
"""Python-side benchmarks of the tessera package (issue: Python call overhead, gemm
against the CLI bench, and a same-run table against numpy/OpenBLAS and torch CPU).

    python scripts/py_bench.py [--tessera-bin target/release/tessera] [--json]

Medians of repeated calls; every figure comes from this run on this host (CPU, ISA and
threads are printed first)."""

import argparse
import json
import platform
import statistics
import subprocess
import time

import numpy as np

import tessera


def median_time(f, reps, inner=1):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(inner):
            f()
        times.append((time.perf_counter() - t) / inner)
    return statistics.median(times)


def race(contenders, rounds=3, per_round=4):
    """Median seconds per call of each named function. The contenders take turns, a block
    of calls each per round, so a noisy neighbour slows every one alike; each block's
    first call is dropped: OpenBLAS's, torch's (OpenMP) and Tessera's pool threads spin a
    while after a call, and the first call after a switch shared the cores with the last
    library's spinners (torch's gemm measured 1.3-1.7x slower in single-call turns)."""
    times = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, f in contenders.items():
            for i in range(per_round):
                t = time.perf_counter()
                f()
                if i > 0:
                    times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def cli_median(bin_, args):
    out = subprocess.run([bin_, "bench", *args, "--json"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["results"][0]["median_s"]


def numpy_attention(q, k, v, causal):
    lq, h, d = q.shape
    g = h // k.shape[1]
    kk = np.repeat(k, g, axis=1).transpose(1, 2, 0)
    vv = np.repeat(v, g, axis=1).transpose(1, 0, 2)
    s = np.matmul(q.transpose(1, 0, 2), kk) / np.sqrt(d)
    if causal:
        s = s + np.triu(np.full((lq, k.shape[0]), -np.inf, np.float32), 1 + k.shape[0] - lq)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return np.matmul(s, vv).transpose(1, 0, 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera-bin", default="target/release/tessera")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    res = {"host": cpu, "isa": tessera.isa(), "threads": tessera.threads(), "numpy": np.__version__}

    # Call overhead: 1×576 rms_norm into a preallocated out, against the CLI's own bench of
    # the same kernel and shape.
    x, w, out = np.random.rand(1, 576).astype(np.float32), np.ones(576, np.float32), np.empty((1, 576), np.float32)
    py = median_time(lambda: tessera.rms_norm(x, w, 1e-5, out), 50, 2000)
    rust = cli_median(a.tessera_bin, ["rms_norm", "--shape", "1x576", "--variant", tessera.isa()])
    res["rms_norm_1x576"] = {"python_s": py, "cli_s": rust, "overhead_s": py - rust}

    # gemm 2048³ from Python against the CLI bench, and against numpy (OpenBLAS) and torch.
    n = 2048
    A, B, C = (np.random.rand(n, n).astype(np.float32) for _ in range(3))
    try:
        import torch
    except ImportError:
        torch = None
    res["torch"] = torch.__version__ if torch else None
    gemms = {"python_s": lambda: tessera.gemm(A, B, C), "numpy_s": lambda: np.matmul(A, B, out=C)}
    q, k, v = (np.random.rand(1024, h, 64).astype(np.float32) for h in (9, 3, 3))
    atts = {"tessera_s": lambda: tessera.attention(q, k, v, causal=True),
            "numpy_s": lambda: numpy_attention(q, k, v, True)}
    if torch:
        tA, tB = torch.from_numpy(A), torch.from_numpy(B)
        gemms["torch_s"] = lambda: torch.matmul(tA, tB)
        tq, tk, tv = (torch.from_numpy(t).transpose(0, 1) for t in (q, k, v))
        tk, tv = tk.repeat_interleave(3, 0), tv.repeat_interleave(3, 0)
        f = torch.nn.functional.scaled_dot_product_attention
        atts["torch_s"] = lambda: f(tq, tk, tv, is_causal=True)
    g = race(gemms)
    g["cli_s"] = cli_median(a.tessera_bin, ["gemm", "--shape", f"{n}x{n}x{n}"])
    g["gflops_python"] = 2 * n**3 / g["python_s"] / 1e9
    att = race(atts)
    res["gemm_2048"] = g
    res["attention_1024x9x3x64_causal"] = att
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print(f"host: {cpu} | {res['isa']} | {res['threads']} threads | numpy {np.__version__} | torch {res['torch']}")
    r = res["rms_norm_1x576"]
    print(f"rms_norm 1x576: Python {r['python_s']*1e6:.2f} µs, CLI bench {r['cli_s']*1e6:.2f} µs, overhead {r['overhead_s']*1e6:.2f} µs")
    print(f"gemm 2048³: Python {g['python_s']*1e3:.1f} ms ({g['gflops_python']:.0f} GFLOP/s), CLI {g['cli_s']*1e3:.1f} ms "
          f"(Python/CLI {g['python_s']/g['cli_s']:.3f}), numpy {g['numpy_s']*1e3:.1f} ms (Tessera {g['numpy_s']/g['python_s']:.2f}× faster)"
          + (f", torch {g['torch_s']*1e3:.1f} ms ({g['torch_s']/g['python_s']:.2f}×)" if "torch_s" in g else ""))
    print(f"attention 1024×9/3×64 causal: Tessera {att['tessera_s']*1e3:.2f} ms, numpy {att['numpy_s']*1e3:.2f} ms "
          f"({att['numpy_s']/att['tessera_s']:.2f}×)" + (f", torch {att['torch_s']*1e3:.2f} ms ({att['torch_s']/att['tessera_s']:.2f}×)" if "torch_s" in att else ""))


if __name__ == "__main__":
    main()
