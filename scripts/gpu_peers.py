"""Peers for scripts/gpu-check.sh, timed in the same session as Tessera's kernels:
cuBLAS bf16 GEMM 4096^3 (torch.matmul), torch SDPA causal attention (seq 4096,
32 heads, d 128, bf16), and a device-to-device copy as the measured HBM bandwidth.
Prints one JSON object per line, like examples/gpu_bench.rs."""
import json
import torch
import torch.nn.functional as F


def median_ms(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda: torch.matmul(a, b.t()))
    print(json.dumps({"kernel": "cublas_gemm_bf16", "shape": "4096x4096x4096", "ms": ms,
                      "tflops": 2 * n**3 / ms / 1e9}))
    seq, heads, d = 4096, 32, 128
    q, k, v = (torch.randn(1, heads, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    print(json.dumps({"kernel": "torch_sdpa_bf16", "shape": "1x4096x32x128 causal", "ms": ms,
                      "tflops": 2 * seq * seq * d * heads / ms / 1e9}))
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    print(json.dumps({"kernel": "hbm_copy", "shape": "1 GiB", "ms": ms, "gbs": 2 * (1 << 30) / ms / 1e6}))


if __name__ == "__main__":
    main()
