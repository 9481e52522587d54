//! The benchmark runner every registered op goes through.
//!
//! Method: build enough instances that their buffers together exceed the last-level cache
//! several times over when the op is memory-bound (so each call reads cold data, as in a
//! real model), run each once to warm up, then time single calls round-robin until both a
//! minimum sample count and a time budget are reached (or the spread is already tight).
//! Report the median.

use crate::calibrate::Ceilings;
use crate::stats;
use std::time::{Duration, Instant};
use tessera_core::{CacheSizes, DType, Result};
use tessera_kernels::registry::{
    self, ComputeUnit, Cost, Instance, ProblemCase, TuneConfig, Variant,
};

/// Last-level cache size when the OS does not say (32 MiB, the reference machine's).
pub const DEFAULT_LLC_BYTES: usize = 32 << 20;

/// The last-level cache the rotation sets and the DRAM probe must exceed:
/// `TESSERA_LLC_MB` if set, else the largest cache Linux reports for CPU 0, else
/// [`DEFAULT_LLC_BYTES`]. Read once.
///
/// Why detected: a fixed 32 MiB let "cold" timings on a host with a 300 MiB L3 (shared
/// server parts) rotate through instances that all stayed in L3, and the 256 MiB probe
/// buffer fit in it too, so both the kernels' bytes and the "DRAM" ceiling were partly
/// L3 (decode matmuls read above 100% of the probe).
pub fn llc_bytes() -> usize {
    static LLC: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LLC.get_or_init(|| {
        let env = std::env::var("TESSERA_LLC_MB").ok();
        match env.as_deref().map(str::parse::<usize>) {
            Some(Ok(mb)) if mb > 0 => mb << 20,
            _ => CacheSizes::get().largest.unwrap_or(DEFAULT_LLC_BYTES),
        }
    })
}

/// The most instances one benchmark rotates. Small decode matmuls need many: 1 536
/// copies of a 576×192 Q4_0 matrix (62 KB) make 3× a 32 MiB L3, and with 256 (the
/// old cap) the k/v projection was timed out of L3 while reported against DRAM.
const MAX_ROTATION: usize = 8192;

/// Time spent on a cold-read peer: a few thousand samples of a decode-size read.
const COLD_READ_BUDGET: Duration = Duration::from_millis(30);

/// The time origin of [`BenchResult::sample_starts_s`].
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// How long and how often to sample.
#[derive(Clone, Copy, Debug)]
pub struct BenchOptions {
    /// Samples taken at least.
    pub min_samples: usize,
    /// Samples taken at most.
    pub max_samples: usize,
    /// Time budget for one benchmark (the minimum sample count is still taken).
    pub budget: Duration,
    /// Stop early once the interquartile spread is below this (relative to the median).
    pub target_spread: f64,
    /// Also time a cold read of a memory-bound op's bytes right after its samples
    /// ([`crate::peers::cold_read_s`], ~30 ms), into [`BenchResult::cold_read_s`].
    pub cold_read: bool,
    /// Time memory-bound ops on one instance, without rotation: the weights stay in
    /// cache, so the result is the kernel's compute rate rather than DRAM's.
    pub in_cache: bool,
    /// Rotate instances for compute-bound ops too, so every call reads its operands
    /// from DRAM as a model's layers do one after another (a compute-bound op is
    /// otherwise timed on one instance, in cache). Ignored with `in_cache`.
    pub cold: bool,
    /// The ceilings of the installed device, measured by its own probes: device
    /// variants are judged against these, without the CPU's bracketing probes.
    pub device_ceilings: Option<Ceilings>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            min_samples: 10,
            max_samples: 10_000,
            budget: Duration::from_millis(1500),
            target_spread: 0.02,
            cold_read: false,
            in_cache: false,
            cold: false,
            device_ceilings: None,
        }
    }
}

/// One benchmark result.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchResult {
    /// The op's registry name.
    pub op: String,
    /// The problem, as it displays.
    pub problem: String,
    /// The element type.
    pub dtype: String,
    /// The variant's label.
    pub variant: String,
    /// The tuning configuration it ran with.
    pub config: String,
    /// Every timed call, seconds, in time order.
    pub samples_s: Vec<f64>,
    /// When each sample started, seconds since the process's first benchmark (for
    /// traces: `tessera bench --profile`).
    pub sample_starts_s: Vec<f64>,
    /// Median of the samples, seconds.
    pub median_s: f64,
    /// Interquartile range over the median.
    pub spread: f64,
    /// FLOPs of one call (the op's cost model).
    pub flops: f64,
    /// Minimum bytes of one call (the op's cost model).
    pub bytes: f64,
    /// Achieved GFLOP/s at the median.
    pub gflops: f64,
    /// Achieved GB/s at the median (minimum bytes over time).
    pub gbps: f64,
    /// Achieved rate over the roofline's attainable rate at this intensity.
    pub roofline_pct: f64,
    /// The DRAM bandwidth the roofline used: for memory-bound runs, measured just before
    /// and after this benchmark (mean of the two); else the run's calibration.
    pub dram_gbps: f64,
    /// The compute peak the roofline used: for compute-bound runs, measured just before
    /// and after this benchmark (mean of the two); else the run's calibration.
    pub peak_gflops: f64,
    /// The arithmetic that peak belongs to (the variant's).
    #[serde(skip)]
    pub unit: ComputeUnit,
    /// `"memory"` or `"compute"`: which roofline leg bounds this intensity.
    pub bound: &'static str,
    /// Instances rotated (1 when compute-bound).
    pub rotation: usize,
    /// A cold read of the same bytes on the same threads, timed right after the samples
    /// (memory-bound runs with [`BenchOptions::cold_read`]).
    pub cold_read_s: Option<f64>,
    /// A device variant's transfers, which the timed calls leave out: the upload of a
    /// fresh instance's inputs and the download of its output.
    pub transfer: Option<Transfer>,
}

/// Host↔device copies of one instance, timed apart from its calls.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Transfer {
    /// The first run of a fresh instance (its inputs' upload and one call) less one
    /// later call: the upload, seconds.
    pub upload_s: f64,
    /// Reading the output back (and widening it), seconds.
    pub download_s: f64,
}

/// Times a device variant's upload and download on a fresh instance, after a throwaway
/// one has paid the first-use costs (pipeline and NVRTC compiles).
fn time_transfer(spec: &BenchSpec<'_>, rng: &mut registry::Rng) -> Result<Transfer> {
    spec.problem
        .instantiate(spec.dtype, rng)?
        .run(spec.variant, spec.config)?;
    let mut inst = spec.problem.instantiate(spec.dtype, rng)?;
    let t = Instant::now();
    inst.run(spec.variant, spec.config)?;
    let first = t.elapsed().as_secs_f64();
    let t = Instant::now();
    inst.run(spec.variant, spec.config)?;
    let call = t.elapsed().as_secs_f64();
    let t = Instant::now();
    std::hint::black_box(inst.output());
    Ok(Transfer {
        upload_s: (first - call).max(0.0),
        download_s: t.elapsed().as_secs_f64(),
    })
}

/// Whether a cost is below the ridge point (memory-bound) for these ceilings.
pub fn memory_bound(cost: &Cost, peak_gflops: f64, c: &Ceilings) -> bool {
    cost.intensity() < peak_gflops / c.dram_gbps
}

/// What `run` needs to know about one benchmark.
#[derive(Debug)]
pub struct BenchSpec<'a> {
    /// The op's registry name.
    pub op: &'a str,
    /// The problem to run.
    pub problem: &'a dyn ProblemCase,
    /// The element type.
    pub dtype: DType,
    /// The variant.
    pub variant: &'a Variant,
    /// Tuning parameters for the call.
    pub config: &'a TuneConfig,
    /// The unit whose peak bounds the variant when compute-bound
    /// ([`tessera_kernels::registry::OpSpec::compute_unit`]).
    pub unit: ComputeUnit,
}

/// Benchmarks one (problem, dtype, variant, config).
pub fn run(spec: &BenchSpec<'_>, ceilings: &Ceilings, opts: &BenchOptions) -> Result<BenchResult> {
    epoch();
    let on_device = spec.variant.backend.device_kind().is_some();
    let ceilings = match (on_device, &opts.device_ceilings) {
        (false, _) => ceilings,
        (true, Some(c)) => c,
        (true, None) => {
            return Err(tessera_core::Error::Unsupported(format!(
                "{}: no ceilings measured for this device",
                spec.variant.label
            )))
        }
    };
    let cost = spec.problem.cost(spec.dtype);
    let peak = ceilings.peak_gflops(spec.unit);
    let mem_bound = memory_bound(&cost, peak, ceilings);
    let mut rng = registry::rng(0xbe4c);
    let transfer = match on_device {
        true => Some(time_transfer(spec, &mut rng)?),
        false => None,
    };
    let mut instances: Vec<Box<dyn Instance>> =
        vec![spec.problem.instantiate(spec.dtype, &mut rng)?];
    if (mem_bound || opts.cold) && !opts.in_cache {
        let target = 3 * ceilings.cache_bytes.unwrap_or_else(llc_bytes);
        // Counted in the bytes each instance holds, not only those one call reads: a
        // gather's instances hold whole tables (see `Instance::resident_bytes`).
        let held = instances[0]
            .resident_bytes()
            .max(instances[0].footprint())
            .max(1);
        let count = target.div_ceil(held).clamp(1, MAX_ROTATION);
        for _ in 1..count {
            let copy = match instances[0].duplicate() {
                Some(copy) => copy,
                None => spec.problem.instantiate(spec.dtype, &mut rng)?,
            };
            instances.push(copy);
        }
    }
    for inst in instances.iter_mut() {
        inst.run(spec.variant, spec.config)?;
    }
    // Bandwidth drifts on a shared host: bracket memory-bound timings with probes.
    let probe = || crate::calibrate::dram_read_now(ceilings.threads, 3);
    // A device's ceilings are its own probes' (the CPU probes say nothing about it).
    let bracket = !on_device;
    let dram_before = if mem_bound && bracket {
        probe()
    } else {
        ceilings.dram_gbps
    };
    let peak_probe = || crate::calibrate::compute_now(ceilings.threads, spec.unit);
    let peak_before = if mem_bound || !bracket {
        peak
    } else {
        peak_probe()
    };
    let mut samples = Vec::new();
    let mut starts = Vec::new();
    let start = Instant::now();
    let mut i = 0;
    while samples.len() < opts.max_samples {
        let n = instances.len();
        let inst = &mut instances[i % n];
        if mem_bound {
            inst.warm_activations();
        }
        let t = Instant::now();
        inst.run(spec.variant, spec.config)?;
        samples.push(t.elapsed().as_secs_f64());
        starts.push(t.duration_since(epoch()).as_secs_f64());
        i += 1;
        // The spread check sorts every sample: only every 16th one, or µs-scale ops
        // would spend most of their budget sorting.
        if samples.len() >= opts.min_samples
            && (start.elapsed() >= opts.budget
                || (samples.len() >= 3 * opts.min_samples
                    && samples.len() % 16 == 0
                    && start.elapsed() >= opts.budget / 4
                    && stats::rel_spread(&samples) < opts.target_spread))
        {
            break;
        }
    }
    let cold_read_s = (mem_bound && opts.cold_read)
        .then(|| crate::peers::cold_read_s(cost.bytes, ceilings.threads, COLD_READ_BUDGET))
        .flatten();
    let dram = if mem_bound && bracket {
        0.5 * (dram_before + probe())
    } else {
        ceilings.dram_gbps
    };
    let peak = if mem_bound || !bracket {
        peak
    } else {
        0.5 * (peak_before + peak_probe())
    };
    let median = stats::median(&samples);
    let gflops = cost.flops / median / 1e9;
    let gbps = cost.bytes / median / 1e9;
    let attainable = peak.min(cost.intensity() * dram);
    Ok(BenchResult {
        op: spec.op.to_string(),
        problem: spec.problem.to_string(),
        dtype: spec.dtype.to_string(),
        variant: spec.variant.label.clone(),
        config: spec.config.to_string(),
        spread: stats::rel_spread(&samples),
        samples_s: samples,
        sample_starts_s: starts,
        median_s: median,
        flops: cost.flops,
        bytes: cost.bytes,
        gflops,
        gbps,
        roofline_pct: 100.0
            * if mem_bound {
                gbps / dram
            } else {
                gflops / attainable
            },
        dram_gbps: dram,
        peak_gflops: peak,
        unit: spec.unit,
        bound: if mem_bound { "memory" } else { "compute" },
        rotation: instances.len(),
        cold_read_s,
        transfer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::Ceilings;
    use tessera_core::Isa;

    /// Unless overridden, the LLC is this host's largest reported cache.
    #[test]
    fn llc_is_the_largest_reported_cache() {
        if std::env::var_os("TESSERA_LLC_MB").is_none() {
            let want = CacheSizes::get().largest.unwrap_or(DEFAULT_LLC_BYTES);
            assert_eq!(llc_bytes(), want);
        }
    }

    /// `in_cache` times a memory-bound op on its one instance; without it the same op
    /// rotates enough instances to leave the cache. A compute-bound op rotates only
    /// with `cold`.
    #[test]
    fn rotation_is_one_instance_in_cache_and_three_device_caches_cold() {
        let op = tessera_kernels::ops::find("qmatmul").unwrap();
        let problem = op.parse_problem("1x64x256").unwrap();
        let variant = Variant::cpu(Isa::Scalar);
        let config = TuneConfig::default();
        let spec = BenchSpec {
            op: "qmatmul",
            problem: problem.as_ref(),
            dtype: DType::Q4_0,
            variant: &variant,
            config: &config,
            unit: ComputeUnit::Fma,
        };
        // A compute peak far above what this much DRAM can feed: memory-bound.
        let ceilings = Ceilings {
            threads: 1,
            fma_gflops: 1e6,
            bf16_gflops: 1e6,
            int8_gops: 1e6,
            dram_gbps: 1.0,
            cache_bytes: None,
        };
        let opts = BenchOptions {
            min_samples: 3,
            max_samples: 3,
            in_cache: true,
            ..Default::default()
        };
        let r = run(&spec, &ceilings, &opts).unwrap();
        assert_eq!((r.bound, r.rotation, r.samples_s.len()), ("memory", 1, 3));
        let mut s = r.samples_s.clone();
        s.sort_by(f64::total_cmp);
        assert_eq!(r.median_s, s[1], "the median of the three samples");

        // Cold, against ceilings that name their own cache (a GPU's L2): the rotation set
        // spans three of that cache, not three of this host's LLC.
        let cache = 64 << 10;
        let cold = Ceilings {
            cache_bytes: Some(cache),
            ..ceilings
        };
        let opts = BenchOptions {
            in_cache: false,
            ..opts
        };
        let each = problem
            .instantiate(DType::Q4_0, &mut registry::rng(1))
            .unwrap()
            .footprint();
        let r = run(&spec, &cold, &opts).unwrap();
        assert_eq!(r.rotation, (3 * cache).div_ceil(each), "{each} bytes each");
        assert!(r.rotation > 1 && r.rotation * each < 3 * llc_bytes());

        // A gather reads 8 KiB of a 1 MiB table per call: its rotation is sized by the
        // memory the instances hold, not by the bytes one call reads.
        let op = tessera_kernels::ops::find("embedding").unwrap();
        let gather = op.parse_problem("4096x64x16").unwrap();
        let spec = BenchSpec {
            op: "embedding",
            problem: gather.as_ref(),
            dtype: DType::F32,
            ..spec
        };
        let big = Ceilings {
            cache_bytes: Some(4 << 20),
            ..cold
        };
        let r = run(&spec, &big, &opts).unwrap();
        assert_eq!(
            r.rotation, 12,
            "3 × 4 MiB over tables of 1 MiB (+ ids and output)"
        );
        let r = run(&spec, &cold, &opts).unwrap();
        assert_eq!(r.rotation, 1);

        // A compute-bound op runs on one instance unless `cold` asks for the rotation.
        let spec = BenchSpec {
            op: "qmatmul",
            problem: problem.as_ref(),
            dtype: DType::Q4_0,
            ..spec
        };
        let slow = Ceilings {
            fma_gflops: 1e-3,
            int8_gops: 1e-3,
            dram_gbps: 1e6,
            ..cold
        };
        let r = run(&spec, &slow, &opts).unwrap();
        assert_eq!((r.bound, r.rotation), ("compute", 1));
        let forced = BenchOptions { cold: true, ..opts };
        let r = run(&spec, &slow, &forced).unwrap();
        assert_eq!(
            (r.bound, r.rotation),
            ("compute", (3 * cache).div_ceil(each))
        );
        let both = BenchOptions {
            in_cache: true,
            ..forced
        };
        assert_eq!(
            run(&spec, &slow, &both).unwrap().rotation,
            1,
            "in_cache wins"
        );
    }
}
