//! The kernel registry: every op described once.
//!
//! An [`OpSpec`] names an op, its dtypes, its variants (one per ISA / backend), its
//! per-dtype [`Tolerance`], and produces problems: random ragged ones for tests and named
//! ones for benchmarks. A problem ([`ProblemCase`]) knows its [`Cost`] and [`TuneSpace`]
//! and builds an [`Instance`]: real inputs and outputs that can compute the float64
//! reference, run any variant under any tuning config, and inject NaN/Inf.
//!
//! Verification ([`verify`]), `tessera bench` and (later) autotuning and the regression
//! gate are all drivers over these same descriptions, as in ggml's test-backend-ops but
//! checked against float64.

pub mod on_device;
pub mod verify;

use rand::SeedableRng;
use std::fmt;
use std::sync::Arc;
use tessera_core::device::{self, Device, DeviceKind};
use tessera_core::{DType, Isa, Result};

/// The random generator every problem generator and instance uses (seeded: reproducible).
pub type Rng = rand::rngs::StdRng;

/// A generator from a seed.
pub fn rng(seed: u64) -> Rng {
    Rng::seed_from_u64(seed)
}

/// Work and traffic of one call: the roofline inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    /// Floating-point operations (a fused multiply-add counts 2).
    pub flops: f64,
    /// The minimum bytes that must cross the memory bus: every input read once, every
    /// output written once.
    pub bytes: f64,
}

impl Cost {
    /// FLOPs per byte.
    pub fn intensity(&self) -> f64 {
        self.flops / self.bytes.max(1.0)
    }
}

/// An accepted relative error ‖out−ref‖₂/‖ref‖₂, with why that much is expected.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Largest accepted ‖out−ref‖₂/‖ref‖₂.
    pub rel: f64,
    /// Why that much error is expected (printed with every verify result).
    pub reason: &'static str,
}

/// The arithmetic a compute-bound variant is bounded by: which measured peak its
/// GFLOP/s (or GOP/s) are a percentage of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ComputeUnit {
    /// f32 fused multiply-adds (the default: every op without a dot-product path).
    #[default]
    Fma,
    /// bf16 pair dots (`vdpbf16ps`); on a CUDA device, its tensor cores' bf16 `mma.sync`.
    Bf16Dot,
    /// 8-bit integer dots (`vpdpbusd`, or AVX2's `vpmaddubsw` step).
    Int8Dot,
}

/// Where a variant runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// On the CPU, with this instruction set.
    Cpu(Isa),
    /// On the installed `wgpu` device (Vulkan, Metal, DX12; WGSL kernels).
    Wgpu,
    /// On the installed CUDA device (kernels compiled by NVRTC).
    Cuda,
}

impl Backend {
    /// The accelerator a device backend runs on; None for the CPU.
    pub fn device_kind(self) -> Option<DeviceKind> {
        match self {
            Backend::Cpu(_) => None,
            Backend::Wgpu => Some(DeviceKind::Wgpu),
            Backend::Cuda => Some(DeviceKind::Cuda),
        }
    }
    /// The backend of a device kind.
    pub fn of_device(kind: DeviceKind) -> Self {
        match kind {
            DeviceKind::Wgpu => Backend::Wgpu,
            DeviceKind::Cuda => Backend::Cuda,
        }
    }
    /// `cpu`, `wgpu` or `cuda`: how `--backend` names it.
    pub fn family(self) -> &'static str {
        match self {
            Backend::Cpu(_) => "cpu",
            Backend::Wgpu => "wgpu",
            Backend::Cuda => "cuda",
        }
    }
}

/// One implementation of an op: a backend and a label for reports (`avx512`, `avx512-bf16`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// Where it runs.
    pub backend: Backend,
    /// Its label in reports and `--variant`.
    pub label: String,
}

impl Variant {
    /// The plain CPU variant for `isa`, labelled with its name.
    pub fn cpu(isa: Isa) -> Self {
        Variant {
            backend: Backend::Cpu(isa),
            label: isa.name().to_string(),
        }
    }

    /// A CPU variant with its own label (one of several kernels for one ISA).
    pub fn labelled(isa: Isa, label: &str) -> Self {
        Variant {
            backend: Backend::Cpu(isa),
            label: label.into(),
        }
    }

    /// The variant running on an installed device, labelled with its kind (`wgpu`).
    pub fn device(kind: DeviceKind) -> Self {
        Variant {
            backend: Backend::of_device(kind),
            label: kind.name().to_string(),
        }
    }

    /// A second kernel of an op on a device, with its own label (`cuda-flash`).
    pub fn device_labelled(kind: DeviceKind, label: &str) -> Self {
        Variant {
            backend: Backend::of_device(kind),
            label: label.into(),
        }
    }

    /// The CPU ISA of a CPU variant; an error for a device variant (an instance that
    /// reaches here for one has no kernel for that backend).
    pub fn isa(&self) -> Result<Isa> {
        match self.backend {
            Backend::Cpu(isa) => Ok(isa),
            other => Err(tessera_core::Error::Unsupported(format!(
                "variant {} runs on {}, not on the CPU",
                self.label,
                other.family()
            ))),
        }
    }

    /// The installed device a device variant runs on.
    pub fn device_handle(&self) -> Option<Arc<dyn Device>> {
        self.backend.device_kind().and_then(device::get)
    }
}

/// An op's usual variants: one per ISA this CPU runs, then [`device_variants`] (what
/// [`OpSpec::variants`] lists unless an op adds kernels of its own).
pub fn standard_variants(op: &str, dtype: DType) -> Vec<Variant> {
    let mut v: Vec<Variant> = Isa::available().into_iter().map(Variant::cpu).collect();
    v.extend(device_variants(op, dtype));
    v
}

/// The device variants of `op` on `dtype`: one per installed device with a kernel for it.
pub fn device_variants(op: &str, dtype: DType) -> Vec<Variant> {
    device::installed()
        .into_iter()
        .filter(|d| d.supports(op, dtype))
        .map(|d| Variant::device(d.kind()))
        .collect()
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

/// One tunable parameter: its default and the values a search may try.
#[derive(Clone, Debug, PartialEq)]
pub struct TuneParam {
    /// Parameter name, as `--set NAME=V` spells it.
    pub name: &'static str,
    /// The value used when nothing is tuned.
    pub default: usize,
    /// Values the search tries.
    pub choices: Vec<usize>,
}

/// The tunable parameters of an op on one problem.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TuneSpace(pub Vec<TuneParam>);

impl TuneSpace {
    /// The default configuration.
    pub fn defaults(&self) -> TuneConfig {
        TuneConfig(self.0.iter().map(|p| (p.name, p.default)).collect())
    }

    /// Number of points in the full space.
    pub fn size(&self) -> usize {
        self.0.iter().map(|p| p.choices.len().max(1)).product()
    }
}

/// Values chosen for tunable parameters; parameters not named take their defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TuneConfig(pub Vec<(&'static str, usize)>);

impl TuneConfig {
    /// The value of parameter `name`, if set.
    pub fn get(&self, name: &str) -> Option<usize> {
        self.0.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }

    /// Sets (or adds) one parameter.
    pub fn set(&mut self, name: &'static str, value: usize) {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.0.push((name, value)),
        }
    }
}

impl fmt::Display for TuneConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(n, v)| format!("{n}={v}")).collect();
        f.write_str(&parts.join(","))
    }
}

/// Real buffers for one problem: inputs, outputs, and the means to check them.
pub trait Instance: Send {
    /// The output computed in float64 from the very same (already rounded) inputs.
    fn reference(&self) -> Vec<f64>;
    /// The reference for one variant: [`Instance::reference`], unless the variant rounds
    /// its inputs further (8-bit activations); then from those rounded values.
    fn reference_for(&self, _variant: &Variant) -> Vec<f64> {
        self.reference()
    }
    /// For sums that can cancel (dot products): per output, Σ|term| of the exact sum.
    /// The error is then measured as ‖out−ref‖/‖magnitude‖, the scale rounding actually
    /// works at, so a single output that cancels to nearly 0 cannot fail a correct
    /// kernel. None (the default): ‖out−ref‖/‖ref‖.
    fn magnitude(&self, _variant: &Variant) -> Option<Vec<f64>> {
        None
    }
    /// Overwrite every output element with NaN so an unwritten element is caught.
    fn poison(&mut self);
    /// Run one variant with one tuning config.
    fn run(&mut self, variant: &Variant, cfg: &TuneConfig) -> Result<()>;
    /// The outputs, widened to f64, in the reference's order.
    fn output(&self) -> Vec<f64>;
    /// Plant a NaN or Inf in an input; returns the output indices that must then be
    /// non-finite (None when the op has no such guarantee).
    fn inject_nonfinite(&mut self, rng: &mut Rng) -> Option<Vec<usize>>;
    /// Bytes of input and output buffers one call reads and writes (to size rotation
    /// sets in benchmarks).
    fn footprint(&self) -> usize;
    /// Bytes the instance holds: more than [`Instance::footprint`] where a call reads
    /// only part of a buffer (a gather's table). A rotation set never holds more than it
    /// must exceed the cache by, counted in these, so a 113 MB table is not copied
    /// hundreds of times (it was: 24 GB of a 24 GiB host).
    fn resident_bytes(&self) -> usize {
        self.footprint()
    }
    /// Readies the next benchmark sample, untimed, as a model's previous op would have:
    /// reads the activations it just produced into cache, leaving the rest (weights)
    /// cold, or gives a gather the next tokens' ids, rows no recent call read. Memory-bound
    /// benchmarks rotate instances so the weights come from DRAM and call this before
    /// each sample. Default: nothing (every buffer stays cold).
    fn warm_activations(&mut self) {}
    /// A copy in fresh memory, with nothing on a device yet, for a benchmark's cold
    /// rotation set: cheaper than instantiating anew where building the inputs
    /// (quantizing, repacking) costs far more than copying them. None (the default):
    /// the benchmark instantiates each member.
    fn duplicate(&self) -> Option<Box<dyn Instance>> {
        None
    }
}

/// A problem: shapes and flags of one call.
pub trait ProblemCase: fmt::Display + Send + Sync {
    /// FLOPs and minimum bytes of one call with elements of `dtype`.
    fn cost(&self, dtype: DType) -> Cost;
    /// The parameters `tessera tune` searches for this problem.
    fn tune_space(&self) -> TuneSpace;
    /// The dims a tuned configuration is keyed by (bucketed), for ops whose kernels look
    /// tuned values up at run time; None: not tunable at run time.
    fn tune_dims(&self) -> Option<Vec<usize>> {
        None
    }
    /// Random inputs and output buffers for one call.
    fn instantiate(&self, dtype: DType, rng: &mut Rng) -> Result<Box<dyn Instance>>;
    /// Whether the problem exists for `dtype` (a block format needs K to be a whole
    /// number of its blocks) and `variant` has a kernel for it (a specialised kernel
    /// may take only some head widths); harnesses skip the triples that do not.
    fn supports(&self, _dtype: DType, _variant: &Variant) -> bool {
        true
    }
}

impl fmt::Debug for dyn ProblemCase + '_ {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// A named benchmark problem.
pub type BenchProblem = (&'static str, Box<dyn ProblemCase>);

/// Everything the registry knows about one op.
pub trait OpSpec: Send + Sync {
    /// The registry name (`tessera verify --op NAME`).
    fn name(&self) -> &'static str;
    /// One line for `tessera ops`.
    fn summary(&self) -> &'static str;
    /// Element types the op takes.
    fn dtypes(&self) -> &'static [DType];
    /// Implementations runnable on this machine for `dtype`.
    fn variants(&self, dtype: DType) -> Vec<Variant> {
        standard_variants(self.name(), dtype)
    }
    /// Accepted error against the float64 reference, per dtype.
    fn tolerance(&self, dtype: DType) -> Tolerance;
    /// The tolerance of one variant: the dtype's, unless the variant rounds its inputs
    /// further (8-bit activations) and documents its own.
    fn variant_tolerance(&self, dtype: DType, _variant: &Variant) -> Tolerance {
        self.tolerance(dtype)
    }
    /// The unit whose peak bounds a variant when it is compute-bound: bf16 dots for the
    /// `dpbf16` variants, f32 FMA otherwise, unless the op says (integer kernels).
    fn compute_unit(&self, _dtype: DType, variant: &Variant) -> ComputeUnit {
        if variant.label.contains("dpbf16") {
            ComputeUnit::Bf16Dot
        } else {
            ComputeUnit::Fma
        }
    }
    /// Random problems for verification, ragged shapes included.
    fn test_problems(&self, rng: &mut Rng) -> Vec<Box<dyn ProblemCase>>;
    /// Named problems for benchmarks.
    fn bench_problems(&self) -> Vec<BenchProblem>;
    /// A problem from a `--shape` string (op-specific syntax, described in the error).
    fn parse_problem(&self, s: &str) -> Result<Box<dyn ProblemCase>>;
}

/// Parses `AxBxC` into numbers, for `parse_problem` implementations.
pub fn parse_dims(op: &'static str, s: &str, n: usize, syntax: &str) -> Result<Vec<usize>> {
    let dims: Option<Vec<usize>> = s.split(['x', ',']).map(|t| t.trim().parse().ok()).collect();
    match dims {
        Some(d) if d.len() == n && d.iter().all(|&v| v > 0) => Ok(d),
        _ => Err(tessera_core::Error::invalid(
            op,
            format!("shape '{s}': expected {syntax}"),
        )),
    }
}
