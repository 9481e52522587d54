//! Peers measured in the same run as our kernels, so ratios survive host drift:
//!
//! - **naive**: the op's own float64 reference (plain loops), timed once on the same
//!   problem, for every op (skipped above a few GFLOP, where it would take minutes);
//! - **numpy**: OpenBLAS through numpy for f32 GEMM, given its best (AVX-512 kernels via
//!   `OPENBLAS_CORETYPE=SkylakeX` where the CPU has them, the same thread count), when
//!   python3 with numpy is installed. numpy multiplies row-major A and B whatever
//!   transposes our problem names: the same FLOPs and bytes, not the same layout.

use std::process::Command;
use std::time::Instant;
use tessera_core::{CpuFeatures, DType};
use tessera_kernels::registry::{self, ProblemCase};

/// Problems above this many FLOPs skip the naive peer.
const NAIVE_MAX_FLOPS: f64 = 3e9;

/// Seconds for one run of the float64 reference, or None when too large or failing.
pub fn naive_s(problem: &dyn ProblemCase, dtype: DType) -> Option<f64> {
    if problem.cost(dtype).flops > NAIVE_MAX_FLOPS {
        return None;
    }
    let inst = problem.instantiate(dtype, &mut registry::rng(1)).ok()?;
    let t = Instant::now();
    std::hint::black_box(inst.reference());
    Some(t.elapsed().as_secs_f64())
}

const NUMPY_GEMM: &str = r#"
import os, sys, time, statistics
import numpy as np
m, n, k = map(int, sys.argv[1:4])
rng = np.random.default_rng(1)
a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
c = a @ b
reps = max(3, min(50, int(2e10 / (2.0 * m * n * k + 1))))
ts = []
for _ in range(reps):
    t = time.perf_counter(); np.matmul(a, b, out=c); ts.append(time.perf_counter() - t)
print(statistics.median(ts))
"#;

/// Median seconds of numpy's f32 `matmul` for m×k·k×n on `threads` threads, or None
/// when python3/numpy are missing.
pub fn numpy_gemm_s(m: usize, n: usize, k: usize, threads: usize) -> Option<f64> {
    let mut cmd = Command::new("python3");
    cmd.args([
        "-c",
        NUMPY_GEMM,
        &m.to_string(),
        &n.to_string(),
        &k.to_string(),
    ])
    .env("OPENBLAS_NUM_THREADS", threads.to_string())
    .env("OMP_NUM_THREADS", threads.to_string());
    if CpuFeatures::get().avx512 {
        cmd.env("OPENBLAS_CORETYPE", "SkylakeX");
    }
    let out = cmd.output().ok().filter(|o| o.status.success())?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}
