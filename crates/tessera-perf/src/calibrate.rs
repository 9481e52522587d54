//! Calibration kernels: this machine's peak FMA, bf16-dot, int8-dot and DRAM read
//! rates, and the thread pool's dispatch overhead, measured now.
//!
//! Peak compute: independent register-resident FMA chains (12 of them, enough to cover
//! latency × pipes), nothing loaded. DRAM: a vectorized sum over a buffer 8× the L3,
//! split across threads. Compute peaks are the best of several repetitions (the ceiling);
//! DRAM is the median, because single passes on a shared host swing ±30%.

use std::time::Instant;
use tessera_core::{CpuFeatures, Isa};
use tessera_kernels::pool;
use tessera_kernels::registry::ComputeUnit;

/// This machine's measured ceilings.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct Ceilings {
    /// Threads the ceilings were measured on.
    pub threads: usize,
    /// f32 FMA, GFLOP/s.
    pub fma_gflops: f64,
    /// bf16 pair-dot (`vdpbf16ps`), GFLOP/s; equals `fma_gflops` where absent.
    pub bf16_gflops: f64,
    /// 8-bit integer dots, GOP/s (a multiply-add is 2 ops): `vpdpbusd` with
    /// AVX512_VNNI, else AVX2's `vpmaddubsw` + `vpaddw` step; equals `fma_gflops` elsewhere.
    #[serde(default)]
    pub int8_gops: f64,
    /// DRAM read bandwidth, GB/s.
    pub dram_gbps: f64,
    /// The last-level cache a cold benchmark's rotation set must exceed, in bytes: a
    /// device's own (a GPU's L2); None on the CPU, whose is [`crate::bench::llc_bytes`].
    #[serde(default)]
    pub cache_bytes: Option<usize>,
}

impl Ceilings {
    /// The compute peak of a unit (GFLOP/s, or GOP/s for integer dots).
    pub fn peak_gflops(&self, unit: ComputeUnit) -> f64 {
        match unit {
            ComputeUnit::Fma => self.fma_gflops,
            ComputeUnit::Bf16Dot => self.bf16_gflops,
            // A ceilings file from before the int8 probe: no integer peak known.
            ComputeUnit::Int8Dot if self.int8_gops > 0.0 => self.int8_gops,
            ComputeUnit::Int8Dot => self.fma_gflops,
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

/// `vpdpbusd` chains: 64 u8×i8 products summed into 16 lanes per instruction.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
fn int8_dot_avx512(iters: usize) -> i32 {
    use std::arch::x86_64::*;
    let a = std::hint::black_box(_mm512_set1_epi8(1));
    let b = std::hint::black_box(_mm512_set1_epi8(-1));
    let mut acc = [_mm512_setzero_si512(); 12];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_dpbusd_epi32(*x, a, b);
        }
    }
    acc.iter().map(|&x| _mm512_reduce_add_epi32(x)).sum()
}

/// Chains in the AVX2 probe: each has its own weight register (12 registers in all with
/// the accumulators), so no two steps are the same computation.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AVX2_CHAINS: usize = 6;

/// AVX2's 8-bit dot step, as the interleaved kernel (`rows8`) runs it: `vpmaddubsw`
/// (32 u8×i8 products into 16 i16 pair sums) added into an i16 running sum with
/// `vpaddw`; that kernel widens with `vpmaddwd` once per 8 steps, so a probe that
/// widened every step (as this one did until 2026-12-05) ran at half its rate: on
/// Zen 3 `vpmaddwd` shares `vpmaddubsw`'s two pipes, and the 16-stream step's
/// matmuls measured 109–122% of that ceiling. The signed operand changes every
/// iteration (one add shared by all chains), or the compiler would hoist the
/// loop-invariant products out of the loop; the sums wrap, a checksum only.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn int8_dot_avx2(iters: usize) -> i32 {
    use std::arch::x86_64::*;
    let mut a = [_mm256_setzero_si256(); AVX2_CHAINS];
    for (j, v) in a.iter_mut().enumerate() {
        *v = std::hint::black_box(_mm256_set1_epi8(j as i8 + 1));
    }
    let step = std::hint::black_box(_mm256_set1_epi8(3));
    let mut b = std::hint::black_box(_mm256_set1_epi8(-1));
    let mut acc = [_mm256_setzero_si256(); AVX2_CHAINS];
    for _ in 0..iters {
        b = _mm256_add_epi8(b, step);
        for (x, &w) in acc.iter_mut().zip(&a) {
            *x = _mm256_add_epi16(*x, _mm256_maddubs_epi16(w, b));
        }
    }
    let mut sum = _mm256_setzero_si256();
    for x in acc {
        sum = _mm256_add_epi16(sum, x);
    }
    _mm256_extract_epi16::<0>(sum)
}

/// One calibration kernel run: (its checksum, FLOPs or OPs it did per iteration).
fn compute_kernel(iters: usize, unit: ComputeUnit) -> (f32, f64) {
    let per_chain = |lanes: usize, ops: usize| (CHAINS * lanes * ops) as f64;
    #[cfg(target_arch = "x86_64")]
    match (Isa::best(), unit) {
        (Isa::Avx512, ComputeUnit::Bf16Dot) => {
            // SAFETY: callers ask for bf16 only when AVX512_BF16 was detected.
            return (unsafe { bf16_dot_avx512(iters) }, per_chain(16, 4));
        }
        (Isa::Avx512, ComputeUnit::Int8Dot) if CpuFeatures::get().avx512_vnni => {
            // 64 products (128 ops) per instruction, 12 chains.
            // SAFETY: AVX512_VNNI detected just above (AVX-512F with the ISA).
            let sum = unsafe { int8_dot_avx512(iters) };
            return (sum as f32, (12 * 64 * 2) as f64);
        }
        (Isa::Avx512 | Isa::Avx2, ComputeUnit::Int8Dot) => {
            // SAFETY: both ISAs include AVX2 (Isa::Avx512 requires it).
            let sum = unsafe { int8_dot_avx2(4 * iters) };
            return (sum as f32, (4 * AVX2_CHAINS * 32 * 2) as f64);
        }
        _ => {}
    }
    #[cfg(target_arch = "x86_64")]
    match Isa::best() {
        // SAFETY: Isa::best() is Avx512 only when the CPU has it.
        Isa::Avx512 => return (unsafe { fma_avx512(iters) }, per_chain(16, 2)),
        // SAFETY: Isa::best() is Avx2 only when the CPU has AVX2 and FMA.
        Isa::Avx2 => return (unsafe { fma_avx2(iters) }, per_chain(8, 2)),
        _ => {}
    }
    let _ = unit; // no dot-product paths off x86: the FMA peak stands in
    (fma_portable(iters), per_chain(8, 2))
}

fn run_compute(threads: usize, unit: ComputeUnit) -> f64 {
    let iters = 2_000_000;
    // Warm-up: wake the pool's workers and let clocks ramp before anything is timed.
    pool::global().run(threads, threads, |_| {
        std::hint::black_box(compute_kernel(4 * iters, unit));
    });
    best_rate(7, || {
        let t = Instant::now();
        let per_iter = std::sync::atomic::AtomicU64::new(0);
        pool::global().run(threads, threads, |_| {
            let (sum, flops) = compute_kernel(iters, unit);
            std::hint::black_box(sum);
            per_iter.store(flops as u64, std::sync::atomic::Ordering::Relaxed);
        });
        let flops = per_iter.load(std::sync::atomic::Ordering::Relaxed) as f64;
        threads as f64 * iters as f64 * flops / t.elapsed().as_secs_f64() / 1e9
    })
}

/// A unit's peak now, ~40 ms: benchmarks bracket compute-bound timings with it, as
/// memory-bound ones are bracketed by [`dram_read_now`], because a shared host's
/// available compute also drifts (the peak read 289–497 GFLOP/s across one day).
pub fn compute_now(threads: usize, unit: ComputeUnit) -> f64 {
    run_compute(threads.clamp(1, pool::global().threads()), available(unit))
}

/// The unit itself if this CPU has it, else the f32 FMA that stands in for it.
fn available(unit: ComputeUnit) -> ComputeUnit {
    let x86_int8 = cfg!(target_arch = "x86_64") && Isa::Avx2.is_available();
    match unit {
        ComputeUnit::Bf16Dot if CpuFeatures::get().avx512_bf16 && Isa::best() == Isa::Avx512 => {
            unit
        }
        ComputeUnit::Int8Dot if x86_int8 => unit,
        _ => ComputeUnit::Fma,
    }
}

fn median_rate(reps: usize, mut f: impl FnMut() -> f64) -> f64 {
    let v: Vec<f64> = (0..reps).map(|_| f()).collect();
    crate::stats::median(&v)
}

fn best_rate(reps: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..reps).map(|_| f()).fold(0.0, f64::max)
}

/// The probe buffer, built once per process: 256 MiB (8× a 32 MiB L3), or 4× the
/// last-level cache where that is larger ([`crate::bench::llc_bytes`]), so a pass over
/// it cannot be served from cache.
pub(crate) fn probe_buffer() -> &'static [f32] {
    static BUF: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    BUF.get_or_init(|| {
        let bytes = (256usize << 20).max(4 * crate::bench::llc_bytes());
        (0..bytes / 4).map(|i| (i % 251) as f32).collect()
    })
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
///
/// A compute peak is a maximum and noise only lowers a reading, but one unit's
/// repetitions (~40 ms) can all fall inside one stall of a shared host's core: 1 in 4
/// `--profile` reports read the f32 FMA peak as 102 GFLOP/s against 203–205 (a 2-vCPU
/// AMD Zen 3 guest, 2026-12-05). So each unit is read on both sides of the DRAM probe
/// and the higher reading kept.
pub fn measure(threads: usize) -> Ceilings {
    let threads = threads.clamp(1, pool::global().threads());
    let compute = || {
        let fma = run_compute(threads, ComputeUnit::Fma);
        let peak = |unit| match available(unit) {
            ComputeUnit::Fma => fma,
            u => run_compute(threads, u),
        };
        [fma, peak(ComputeUnit::Bf16Dot), peak(ComputeUnit::Int8Dot)]
    };
    let before = compute();
    let dram_gbps = dram_read(threads);
    let after = compute();
    let [fma_gflops, bf16_gflops, int8_gops] = [0, 1, 2].map(|i| before[i].max(after[i]));
    Ceilings {
        threads,
        fma_gflops,
        bf16_gflops,
        int8_gops,
        dram_gbps,
        cache_bytes: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_has_a_positive_peak() {
        for unit in [ComputeUnit::Fma, ComputeUnit::Bf16Dot, ComputeUnit::Int8Dot] {
            let peak = compute_now(1, unit);
            assert!(peak.is_finite() && peak > 0.0, "{unit:?}: {peak}");
        }
    }

    #[test]
    fn ceilings_without_an_int8_peak_fall_back_to_fma() {
        // A ceilings file written before the int8 probe existed.
        let c: Ceilings = serde_json::from_str(
            r#"{"threads":2,"fma_gflops":200.0,"bf16_gflops":400.0,"dram_gbps":30.0}"#,
        )
        .expect("old ceilings parse");
        assert_eq!(c.peak_gflops(ComputeUnit::Int8Dot), 200.0);
        assert_eq!(c.peak_gflops(ComputeUnit::Bf16Dot), 400.0);
    }
}
