//! Peers measured in the same run as our kernels, so ratios survive host drift:
//!
//! - **naive**: the op's own float64 reference (plain loops), timed once on the same
//!   problem, for every op (skipped above a few GFLOP, where it would take minutes);
//! - **cold read**: a plain read of the op's bytes, cold, split across the threads as
//!   the kernels split their weights and dispatched on the same pool ([`cold_read_s`]):
//!   the least time anything reading those bytes once takes on this host now. The DRAM
//!   probe streams 256 MiB; a decode matmul reads 60–600 KB, and a stream that short
//!   spends a visible part of its time on its first misses, so "% of DRAM" alone
//!   cannot tell a slow kernel from a short read;
//! - **numpy**: OpenBLAS through numpy for f32 GEMM, given its best (AVX-512 kernels via
//!   `OPENBLAS_CORETYPE=SkylakeX` where the CPU has them, the same thread count), when
//!   python3 with numpy is installed. numpy multiplies row-major A and B whatever
//!   transposes our problem names: the same FLOPs and bytes, not the same layout.

use std::process::Command;
use std::time::{Duration, Instant};
use tessera_core::{CpuFeatures, DType};
use tessera_kernels::pool;
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

/// Floats the probe's read loop takes at a time (its `chunks_exact(64)`).
const READ_STEP: usize = 64;

/// Median seconds to read `bytes` bytes (rounded up to whole 256-byte steps per thread)
/// that no cache holds: each sample sums the next slice of the 256 MiB DRAM-probe buffer
/// (a page past the last one, so no prefetch of the previous slice reached it), in
/// `threads` contiguous parts through the pool, until `budget` has passed and at least
/// 10 samples are in. None when the slices would not rotate through 3 times the L3.
pub fn cold_read_s(bytes: f64, threads: usize, budget: Duration) -> Option<f64> {
    let buf = crate::calibrate::probe_buffer();
    // Also refuses NaN and sizes past the buffer before any size arithmetic.
    if !(bytes > 0.0 && bytes < (4 * buf.len()) as f64) {
        return None;
    }
    let threads = threads.clamp(1, pool::global().threads());
    let part = ((bytes / 4.0).ceil() as usize)
        .div_ceil(threads)
        .next_multiple_of(READ_STEP)
        .max(READ_STEP);
    let len = part * threads;
    let stride = len + 1024; // one 4 KiB page of floats between slices
    let slices = buf.len() / stride;
    if slices < 2 || 4 * stride * slices < 3 * crate::bench::llc_bytes() {
        return None;
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 10 || (start.elapsed() < budget && samples.len() < 10_000) {
        let slice = &buf[(samples.len() % slices) * stride..][..len];
        let t = Instant::now();
        pool::global().run(threads, threads, |i| {
            std::hint::black_box(crate::calibrate::sum_slice(&slice[i * part..][..part]));
        });
        samples.push(t.elapsed().as_secs_f64());
    }
    Some(crate::stats::median(&samples))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A decode-size read gives a time; no bytes, or a read too large to rotate through
    /// three L3s of the probe buffer, gives none rather than a warm-cache figure.
    #[test]
    fn cold_read_times_only_reads_it_can_keep_cold() {
        let budget = Duration::from_millis(5);
        for threads in [1, 2] {
            let s = cold_read_s(62_208.0, threads, budget).unwrap();
            // One timed read of 62 KB: a real duration, shorter than the whole budget.
            assert!(
                s > 0.0 && s < budget.as_secs_f64(),
                "{threads} threads: {s}"
            );
        }
        // More than half the probe buffer (sized from this host's LLC): one slice.
        let too_big = 0.6 * (4 * crate::calibrate::probe_buffer().len()) as f64;
        for bytes in [0.0, -1.0, f64::NAN, too_big, 1e30, f64::INFINITY] {
            assert_eq!(cold_read_s(bytes, 2, budget), None, "{bytes} bytes");
        }
    }
}
