//! Calibration kernels: this machine's peak FMA, bf16-dot and DRAM read rates, and the
//! thread pool's dispatch overhead, measured now.
//!
//! Peak compute: independent register-resident FMA chains (12 of them, enough to cover
//! latency × pipes), nothing loaded. DRAM: a vectorized sum over a buffer 8× the L3,
//! split across threads. Compute peaks are the best of several repetitions (the ceiling);
//! DRAM is the median, because single passes on a shared host swing ±30%.

use std::time::Instant;
use tessera_core::{CpuFeatures, Isa};
use tessera_kernels::pool;

/// This machine's measured ceilings.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct Ceilings {
    /// Threads the ceilings were measured on.
    pub threads: usize,
    /// f32 FMA, GFLOP/s.
    pub fma_gflops: f64,
    /// bf16 pair-dot (`vdpbf16ps`), GFLOP/s; equals `fma_gflops` where absent.
    pub bf16_gflops: f64,
    /// DRAM read bandwidth, GB/s.
    pub dram_gbps: f64,
}

impl Ceilings {
    /// The compute peak an op of `dtype` on `variant` can reach.
    pub fn peak_gflops(&self, bf16_dot: bool) -> f64 {
        if bf16_dot {
            self.bf16_gflops
        } else {
            self.fma_gflops
        }
    }
}

/// Independent accumulators: 4-cycle FMA latency × 2 pipes needs 8; 12 leaves margin and
/// stays in registers (24 made LLVM spill).
const CHAINS: usize = 12;

/// Portable peak loop (mul then add: `mul_add` would be a libm call without FMA).
fn fma_portable(iters: usize) -> f32 {
    let mut acc = [[1.0f32; 8]; CHAINS];
    let (x, y) = (
        std::hint::black_box(0.999_999f32),
        std::hint::black_box(1e-7f32),
    );
    for _ in 0..iters {
        for a in acc.iter_mut() {
            for v in a.iter_mut() {
                *v = *v * x + y;
            }
        }
    }
    acc.iter().flatten().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn fma_avx512(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let x = std::hint::black_box(_mm512_set1_ps(0.999_999));
    let y = std::hint::black_box(_mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, x, y);
        }
    }
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_avx2(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let x = std::hint::black_box(_mm256_set1_ps(0.999_999));
    let y = std::hint::black_box(_mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, x, y);
        }
    }
    let mut out = [0f32; 8];
    let sum = acc
        .iter()
        .fold(_mm256_setzero_ps(), |s, &a| _mm256_add_ps(s, a));
    // SAFETY: out holds 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sum) };
    out.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
fn bf16_dot_avx512(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let b = std::hint::black_box(_mm512_set1_epi32(0x3f80_3f80)); // pairs of 1.0
    let b: __m512bh = unsafe_cast(b);
    let mut acc = [_mm512_setzero_ps(); CHAINS];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm512_dpbf16_ps(*a, b, b);
        }
    }
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}

#[cfg(target_arch = "x86_64")]
fn unsafe_cast(v: std::arch::x86_64::__m512i) -> std::arch::x86_64::__m512bh {
    // SAFETY: both are 64-byte plain SIMD types; every bit pattern is valid.
    unsafe { std::mem::transmute(v) }
}

/// One calibration kernel run: (its checksum, FLOPs it did per iteration).
fn compute_kernel(iters: usize, bf16: bool) -> (f32, f64) {
    let per_chain = |lanes: usize, ops: usize| (CHAINS * lanes * ops) as f64;
    #[cfg(target_arch = "x86_64")]
    match Isa::best() {
        // SAFETY: callers ask for bf16 only when AVX512_BF16 was detected.
        Isa::Avx512 if bf16 => return (unsafe { bf16_dot_avx512(iters) }, per_chain(16, 4)),
        // SAFETY: Isa::best() is Avx512 only when the CPU has it.
        Isa::Avx512 => return (unsafe { fma_avx512(iters) }, per_chain(16, 2)),
        // SAFETY: Isa::best() is Avx2 only when the CPU has AVX2 and FMA.
        Isa::Avx2 => return (unsafe { fma_avx2(iters) }, per_chain(8, 2)),
        _ => {}
    }
    let _ = bf16; // no pair-dot path off x86: the FMA peak stands in
    (fma_portable(iters), per_chain(8, 2))
}

fn run_compute(threads: usize, bf16: bool) -> f64 {
    let iters = 2_000_000;
    // Warm-up: wake the pool's workers and let clocks ramp before anything is timed.
    pool::global().run(threads, threads, |_| {
        std::hint::black_box(compute_kernel(4 * iters, bf16));
    });
    best_rate(7, || {
        let t = Instant::now();
        let per_iter = std::sync::atomic::AtomicU64::new(0);
        pool::global().run(threads, threads, |_| {
            let (sum, flops) = compute_kernel(iters, bf16);
            std::hint::black_box(sum);
            per_iter.store(flops as u64, std::sync::atomic::Ordering::Relaxed);
        });
        let flops = per_iter.load(std::sync::atomic::Ordering::Relaxed) as f64;
        threads as f64 * iters as f64 * flops / t.elapsed().as_secs_f64() / 1e9
    })
}

/// The FMA (or bf16-dot) peak now, ~40 ms: benchmarks bracket compute-bound timings with
/// it, as memory-bound ones are bracketed by [`dram_read_now`], because a shared host's
/// available compute also drifts (the peak read 289–497 GFLOP/s across one day).
pub fn compute_now(threads: usize, bf16: bool) -> f64 {
    run_compute(threads.clamp(1, pool::global().threads()), bf16)
}

fn median_rate(reps: usize, mut f: impl FnMut() -> f64) -> f64 {
    let v: Vec<f64> = (0..reps).map(|_| f()).collect();
    crate::stats::median(&v)
}

fn best_rate(reps: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..reps).map(|_| f()).fold(0.0, f64::max)
}

/// The 256 MiB (8× a 32 MiB L3) probe buffer, built once per process.
pub(crate) fn probe_buffer() -> &'static [f32] {
    static BUF: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    BUF.get_or_init(|| (0..64usize << 20).map(|i| (i % 251) as f32).collect())
}

/// DRAM read GB/s now: the median of `reps` passes over the probe buffer. On a shared
/// host single passes swing by ±30% and the available bandwidth drifts between 35 and
/// 70 GB/s over minutes, so benchmarks call this right next to each memory-bound
/// measurement ([`crate::bench::run`]) rather than trusting one figure per run.
pub fn dram_read_now(threads: usize, reps: usize) -> f64 {
    let buf = probe_buffer();
    let threads = threads.clamp(1, pool::global().threads());
    let chunk = buf.len() / threads;
    median_rate(reps.max(1), || {
        let t = Instant::now();
        pool::global().run(threads, threads, |i| {
            std::hint::black_box(sum(Isa::best(), &buf[i * chunk..(i + 1) * chunk]));
        });
        (chunk * threads * 4) as f64 / t.elapsed().as_secs_f64() / 1e9
    })
}

fn dram_read(threads: usize) -> f64 {
    dram_read_now(threads, 7)
}

/// A vectorised sum (the bandwidth probes' read loop), public for the cache probes.
pub fn sum_slice(v: &[f32]) -> f32 {
    sum(Isa::best(), v)
}

tessera_kernels::multiversion! {
    /// Compiled for the widest vectors the CPU has: built for baseline x86-64 (SSE2)
    /// the loop read 10–18 % less from DRAM on an AVX2-only host than the same loop
    /// built for AVX2 (paired passes over 256 MiB), and kernels that read at the AVX2
    /// rate showed up as >100 % of DRAM.
    fn sum(v: &[f32]) -> f32 {
        let mut acc = [0f32; 64];
        for c in v.chunks_exact(64) {
            for (a, x) in acc.iter_mut().zip(c) {
                *a += x;
            }
        }
        acc.iter().sum()
    }
}

/// Measures every ceiling on `threads` threads (≈1–2 s).
pub fn measure(threads: usize) -> Ceilings {
    let threads = threads.clamp(1, pool::global().threads());
    let fma = run_compute(threads, false);
    let bf16 = if CpuFeatures::get().avx512_bf16 && Isa::best() == Isa::Avx512 {
        run_compute(threads, true)
    } else {
        fma
    };
    Ceilings {
        threads,
        fma_gflops: fma,
        bf16_gflops: bf16,
        dram_gbps: dram_read(threads),
    }
}

/// Dispatch overhead of an empty parallel job (one no-op task per thread), in µs:
/// (Tessera's pool, rayon's `broadcast`), medians over many calls.
pub fn dispatch_overhead_us(threads: usize) -> (f64, f64) {
    let reps = 20_000;
    let time = |f: &dyn Fn()| {
        for _ in 0..1000 {
            f();
        }
        let samples: Vec<f64> = (0..20)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..reps / 20 {
                    f();
                }
                t.elapsed().as_secs_f64() * 1e6 / (reps / 20) as f64
            })
            .collect();
        crate::stats::median(&samples)
    };
    let ours = time(&|| {
        pool::global().run(threads, threads, |i| {
            std::hint::black_box(i);
        })
    });
    let rayon_pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("rayon pool");
    let theirs = time(&|| {
        rayon_pool.broadcast(|c| {
            std::hint::black_box(c.index());
        });
    });
    (ours, theirs)
}
