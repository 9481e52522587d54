//! Registry entry for `qmatmul`: problems, float64 reference, cost model.

use super::{qmatmul, ActScales, PackedWeights, QuantActs, Tiles};
use crate::ops::common::{bytes, poison};
use crate::pool;
use crate::quant::{BlockFormat, QuantMatrix, BLOCK_DTYPES, QK};
use crate::registry::on_device::OnDevice;
use crate::registry::{
    device_variants, parse_dims, BenchProblem, ComputeUnit, Cost, Instance, OpSpec, ProblemCase,
    Rng, Tolerance, TuneConfig, TuneParam, TuneSpace, Variant,
};
use rand::Rng as _;
use std::fmt;
use tessera_core::device::{Device, DeviceBuffer, DeviceCall, DeviceMatrix};
use tessera_core::{CpuFeatures, DType, Error, Isa, Result, TensorView, TensorViewMut};

/// Measured against Σ|w·x| (see `Instance::magnitude`). Weights dequantize to exactly the
/// format's f32 values (the reference uses the same ones), so only f32 accumulation over
/// K remains: ~√K·2⁻²⁴ of the magnitude on random data.
pub const TOL: Tolerance = Tolerance {
    rel: 1e-6,
    reason: "f32 accumulation over K, relative to Σ|w·x|",
};

/// The int8 path first rounds each activation to 8 bits per 32-block (|error| ≤ ½·amax/127,
/// ~4e-3 RMS relative: a property of the method, not of the kernel), so it is verified
/// against float64 from those same 8-bit activations and the exact weight values
/// (u − o)·d + m. What remains: exact integer sums per 4-element lane, then two or three
/// f32 roundings per lane (scale FMA, × d_x, accumulate), relative to Σ|w·x|.
pub const TOL_INT8: Tolerance = Tolerance {
    rel: 1e-6,
    reason: "exact int lane sums + f32 scaling and accumulation, relative to Σ|w·x|",
};

/// Labels of one op's integer-activation variants, one per integer kernel.
pub(super) struct Int8Labels {
    /// `vpdpbusd` (AVX-512 with AVX512_VNNI).
    pub vnni: &'static str,
    /// `vpmaddubsw` (AVX2).
    pub avx2: &'static str,
    /// `sdot` (NEON with DotProd), where the path has a kernel for it.
    pub neon: Option<&'static str>,
    /// The portable integer loop, the baseline the others are checked against.
    pub scalar: &'static str,
}

impl Int8Labels {
    pub fn contains(&self, v: &Variant) -> bool {
        [self.vnni, self.avx2, self.scalar].contains(&v.label.as_str())
            || self.neon == Some(v.label.as_str())
    }

    /// [`TOL_INT8`] for these integer-activation variants, [`TOL`] otherwise.
    pub fn tolerance(&self, v: &Variant) -> Tolerance {
        if self.contains(v) {
            TOL_INT8
        } else {
            TOL
        }
    }

    /// The f32-activation kernels per ISA, then the integer path per kernel this CPU
    /// runs, its portable baseline last.
    pub fn variants(&self) -> Vec<Variant> {
        let mut v: Vec<Variant> = Isa::available().into_iter().map(Variant::cpu).collect();
        let int8 = Variant::labelled;
        if CpuFeatures::get().avx512_vnni {
            v.push(int8(Isa::Avx512, self.vnni));
        }
        if Isa::Avx2.is_available() {
            v.push(int8(Isa::Avx2, self.avx2));
        }
        if let Some(neon) = self.neon.filter(|_| CpuFeatures::get().neon_dotprod) {
            v.push(int8(Isa::Neon, neon));
        }
        v.push(int8(Isa::Scalar, self.scalar));
        v
    }
}

const INT8: Int8Labels = Int8Labels {
    vnni: "avx512-vnni",
    avx2: "avx2-int8",
    neon: None,
    scalar: "int8-scalar",
};

/// The AVX2 integer kernel over weights interleaved 8 rows at a time
/// ([`PackedWeights::interleaved`]; "avx2-int8" runs the row-major layout).
const INTERLEAVED: &str = "avx2-int8-r8";
/// The same loop with `vpdpbusd` (AVX512_VNNI on ymm registers).
const INTERLEAVED_VNNI: &str = "avx512-vnni-r8";
/// The same loop with `sdot` (NEON with DotProd).
const INTERLEAVED_NEON: &str = "neon-sdot-r8";
/// The same weights on AMX tiles (`tdpbsud`, `rows8::amx`) at every M; the `-vnni-`
/// variants never take the tiles, and the engine takes them from `AMX_MIN_M` rows.
const INTERLEAVED_AMX: &str = "avx512-amx-r16";
/// [`A16`] on AMX tiles at every M.
const A16_AMX: &str = "avx512-amx-a16";

/// Whether a variant reads the interleaved weights.
fn is_interleaved(v: &Variant) -> bool {
    [
        INTERLEAVED,
        INTERLEAVED_VNNI,
        INTERLEAVED_NEON,
        INTERLEAVED_AMX,
    ]
    .contains(&v.label.as_str())
}

/// How a variant may use the tile kernel: always for the `-amx-` labels, never for the
/// others (so each label measures one kernel).
fn tiles(v: &Variant) -> Tiles {
    if [INTERLEAVED_AMX, A16_AMX].contains(&v.label.as_str()) {
        Tiles::Always
    } else {
        Tiles::Off
    }
}

/// Whether a variant takes 16-bit activations.
fn is_a16(v: &Variant) -> bool {
    A16.contains(v) || v.label == A16_AMX
}

/// 16-bit activations as two 8-bit planes ([`super::qmatmul_a16`]) over the weights as
/// the engine packs them (interleaved where the format and CPU allow).
const A16: Int8Labels = Int8Labels {
    vnni: "avx512-vnni-a16",
    avx2: "avx2-a16",
    neon: Some("neon-sdot-a16"),
    scalar: "a16-scalar",
};

/// Whether a variant takes activations quantized to integers (8-bit, or 16-bit as two
/// 8-bit planes).
fn is_int8(v: &Variant) -> bool {
    INT8.contains(v) || is_interleaved(v) || is_a16(v)
}

/// Whether `dtype`'s weights can be interleaved (every interleaved integer kernel then
/// reads them).
fn interleaves(dtype: DType) -> bool {
    crate::with_block_format!(dtype, B => PackedWeights::can_interleave::<B>(), _ => false)
}

/// `y[M, N] = x[M, K] · W[N, K]ᵀ`, W quantized (the format is the dtype).
#[derive(Clone, Debug, PartialEq)]
pub struct QMatmulProblem {
    /// Activation rows.
    pub m: usize,
    /// Output features (rows of W).
    pub n: usize,
    /// Input features (columns of W).
    pub k: usize,
    /// x viewed with a padded row stride and y column-major (exercises the strided
    /// paths).
    pub strided: bool,
}

impl fmt::Display for QMatmulProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}x{}", self.m, self.n, self.k)?;
        if self.strided {
            f.write_str(" strided")?;
        }
        Ok(())
    }
}

/// The registry entry.
#[derive(Debug)]
pub struct QMatmulOp;

impl OpSpec for QMatmulOp {
    fn name(&self) -> &'static str {
        "qmatmul"
    }
    fn summary(&self) -> &'static str {
        "x·Wᵀ with W in a ggml block format, dequantized in registers"
    }
    fn dtypes(&self) -> &'static [DType] {
        &BLOCK_DTYPES
    }
    fn variants(&self, dtype: DType) -> Vec<Variant> {
        let mut v = INT8.variants();
        let interleaved = interleaves(dtype);
        if Isa::Avx2.is_available() && interleaved {
            v.insert(v.len() - 1, Variant::labelled(Isa::Avx2, INTERLEAVED));
        }
        if CpuFeatures::get().avx512_vnni && interleaved {
            v.insert(
                v.len() - 1,
                Variant::labelled(Isa::Avx512, INTERLEAVED_VNNI),
            );
        }
        if CpuFeatures::get().neon_dotprod && interleaved {
            v.insert(v.len() - 1, Variant::labelled(Isa::Neon, INTERLEAVED_NEON));
        }
        for a16 in A16.variants().into_iter().skip(Isa::available().len()) {
            v.insert(v.len() - 1, a16);
        }
        if CpuFeatures::get().amx_int8 && interleaved {
            for label in [INTERLEAVED_AMX, A16_AMX] {
                v.insert(v.len() - 1, Variant::labelled(Isa::Avx512, label));
            }
        }
        v.extend(device_variants("qmatmul", dtype));
        v
    }
    fn tolerance(&self, _: DType) -> Tolerance {
        TOL
    }
    fn compute_unit(&self, _: DType, v: &Variant) -> ComputeUnit {
        if is_int8(v) {
            ComputeUnit::Int8Dot
        } else {
            ComputeUnit::Fma
        }
    }
    fn variant_tolerance(&self, _: DType, v: &Variant) -> Tolerance {
        if is_int8(v) {
            TOL_INT8
        } else {
            TOL
        }
    }
    fn test_problems(&self, rng: &mut Rng) -> Vec<Box<dyn ProblemCase>> {
        test_shapes(rng)
            .into_iter()
            .map(|p| Box::new(p) as Box<dyn ProblemCase>)
            .collect()
    }
    fn bench_problems(&self) -> Vec<BenchProblem> {
        bench_shapes()
            .into_iter()
            .map(|(name, p)| (name, Box::new(p) as Box<dyn ProblemCase>))
            .collect()
    }
    fn parse_problem(&self, s: &str) -> Result<Box<dyn ProblemCase>> {
        Ok(Box::new(parse_shape("qmatmul", s)?))
    }
}

/// Random test shapes, ragged ones included (shared with `qmatmul_i8`).
pub(super) fn test_shapes(rng: &mut Rng) -> Vec<QMatmulProblem> {
    let mut v: Vec<(usize, usize, usize, bool)> = vec![
        (1, 1, 32, false),
        (1, 7, 64, false),
        (3, 33, 96, true),
        (5, 127, 32, false),
        (16, 9, 160, false),
        (17, 13, 64, true), // past the decode sizes: a batching step
        (49, 13, 64, true), // first f32 prefill-path size (F32_BATCH_M + 1)
        (40, 300, 96, false),
        // K a multiple of 256 (the K-quants' super-block) too.
        (1, 5, 256, false),
        (2, 33, 768, true),
        (7, 17, 512, false),
        (19, 40, 256, false),
        // One row over a tall matrix: the CUDA kernel gives each warp four weight rows
        // from 8192 rows up (fewer per warp below), ragged at the end.
        (1, 8195, 64, false),
        (1, 8194, 96, true),
    ];
    v.push((
        rng.random_range(1..24),
        rng.random_range(1..200),
        32 * rng.random_range(1..9),
        false,
    ));
    v.into_iter()
        .map(|(m, n, k, strided)| QMatmulProblem { m, n, k, strided })
        .collect()
}

/// Named benchmark shapes (shared with `qmatmul_i8`).
pub(super) fn bench_shapes() -> Vec<(&'static str, QMatmulProblem)> {
    // SmolLM2-135M's decode projections (q/o 576², k/v 576→192, MLP 576↔1536, LM head)
    // and a 512-token prefill of the MLP up-projection.
    let p = |m, n, k| QMatmulProblem {
        m,
        n,
        k,
        strided: false,
    };
    vec![
        ("decode q/o", p(1, 576, 576)),
        ("decode k/v", p(1, 192, 576)),
        ("decode up", p(1, 1536, 576)),
        ("decode down", p(1, 576, 1536)),
        ("decode lm head", p(1, 49152, 576)),
        ("batch8 up", p(8, 1536, 576)),
        ("prefill up", p(512, 1536, 576)),
        // What an engine runs once q/k/v and gate/up are stacked at load
        // (`PackedWeights::stack`).
        ("decode qkv", p(1, 960, 576)),
        ("decode gate+up", p(1, 3072, 576)),
        // The K-quants need K a multiple of 256: the same layers with K = 512
        // (SmolLM2's 576 is not; its down projection, K = 1536, is), and a 7B-class
        // 4096² projection.
        ("decode q/o k512", p(1, 576, 512)),
        ("decode k/v k512", p(1, 192, 512)),
        ("decode up k512", p(1, 1536, 512)),
        ("decode lm head k512", p(1, 49152, 512)),
        ("decode 4096²", p(1, 4096, 4096)),
        ("batch8 up k512", p(8, 1536, 512)),
        ("prefill up k512", p(512, 1536, 512)),
        ("decode qkv k512", p(1, 960, 512)),
    ]
}

/// `MxNxK` with K a multiple of 32.
pub(super) fn parse_shape(op: &'static str, s: &str) -> Result<QMatmulProblem> {
    let d = parse_dims(op, s, 3, "MxNxK (K a multiple of 32)")?;
    if d[2] % QK != 0 {
        return Err(Error::invalid(
            op,
            format!("K = {} is not a multiple of {QK}", d[2]),
        ));
    }
    Ok(QMatmulProblem {
        m: d[0],
        n: d[1],
        k: d[2],
        strided: false,
    })
}

impl ProblemCase for QMatmulProblem {
    fn cost(&self, dtype: DType) -> Cost {
        let w = dtype.storage_bytes(self.n * self.k).unwrap_or(usize::MAX) as f64;
        Cost {
            flops: 2.0 * (self.m * self.n * self.k) as f64,
            bytes: w + 4.0 * (self.m * self.k + self.m * self.n) as f64,
        }
    }
    fn tune_space(&self) -> TuneSpace {
        let t = pool::global().threads();
        TuneSpace(vec![TuneParam {
            name: "threads",
            default: t,
            choices: (1..=t).collect(),
        }])
    }
    fn instantiate(&self, dtype: DType, rng: &mut Rng) -> Result<Box<dyn Instance>> {
        crate::with_block_format!(dtype,
            B => Ok(Box::new(QInstance::<B>::new(self.clone(), rng)?)),
            _ => Err(Error::DType {
                op: "qmatmul",
                dtype: dtype.to_string(),
            })
        )
    }
    fn supports(&self, dtype: DType, _: &Variant) -> bool {
        self.k.is_multiple_of(dtype.block_size())
    }
}

/// The activations and output of one instance, and its float64 products: shared by
/// `qmatmul` and `qmatmul_i8`, whose instances differ only in their weights.
#[derive(Clone)]
pub(super) struct Operands {
    pub p: QMatmulProblem,
    x: Vec<f32>,
    ldx: usize,
    y: Vec<f32>,
}

impl Operands {
    /// Random activations in (−1, 1), rows padded when the problem is strided.
    pub fn new(p: QMatmulProblem, rng: &mut Rng) -> Self {
        let ldx = p.k + if p.strided { 5 } else { 0 };
        let x = (0..p.m * ldx)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        Operands {
            y: vec![0.0; p.m * p.n],
            x,
            ldx,
            p,
        }
    }

    /// The activation rows a variant multiplies: exactly the f32 values, or their 8-bit
    /// quantization for weights with this offset (`int8`).
    /// Each row as [`super::qmatmul_a16`] rounds it: its two planes' values summed, exactly.
    pub fn acts_a16(&self, offset: i32) -> Vec<Vec<f64>> {
        (0..self.p.m)
            .map(|i| {
                let row = &self.x[i * self.ldx..][..self.p.k];
                let (mut hi, mut lo) = (QuantActs::default(), QuantActs::default());
                QuantActs::refill_split(&mut hi, &mut lo, row, offset);
                let (h, l) = (hi.dequantized(self.p.k), lo.dequantized(self.p.k));
                h.iter().zip(&l).map(|(a, b)| a + b).collect()
            })
            .collect()
    }

    pub fn acts(&self, int8: Option<(i32, ActScales)>) -> Vec<Vec<f64>> {
        (0..self.p.m)
            .map(|i| {
                let row = &self.x[i * self.ldx..][..self.p.k];
                match int8 {
                    Some((offset, act)) => {
                        QuantActs::with_scales(row, offset, act).dequantized(self.p.k)
                    }
                    None => row.iter().map(|&v| v as f64).collect(),
                }
            })
            .collect()
    }

    /// `f(x·w)` summed per output in float64 for row-major weights `w [N, K]` (f =
    /// identity for the product, |·| for the magnitude of its terms).
    pub fn product(&self, w: &[f64], acts: &[Vec<f64>], f: fn(f64) -> f64) -> Vec<f64> {
        let (n, k) = (self.p.n, self.p.k);
        acts.iter()
            .flat_map(|xr| {
                (0..n).map(move |j| {
                    let w = &w[j * k..(j + 1) * k];
                    w.iter().zip(xr).map(|(&a, &b)| f(a * b)).sum::<f64>()
                })
            })
            .collect()
    }

    /// Runs `f` on the (possibly strided) activation view and the output view.
    pub fn call(
        &mut self,
        f: impl FnOnce(&TensorView<'_, f32>, &mut TensorViewMut<'_, f32>) -> Result<()>,
    ) -> Result<()> {
        let l = tessera_core::Layout::strided(&[self.p.m, self.p.k], &[self.ldx, 1], 0)?;
        let x = TensorView::new(&self.x, l)?;
        let yl = self.y_layout()?;
        let mut y = TensorViewMut::new(&mut self.y, yl)?;
        f(&x, &mut y)
    }

    /// y [M, N]: row-major, or column-major (a transposed view, every output strided)
    /// when the problem is strided.
    fn y_layout(&self) -> Result<tessera_core::Layout> {
        let (m, n) = (self.p.m, self.p.n);
        if self.p.strided {
            tessera_core::Layout::strided(&[m, n], &[1, m], 0)
        } else {
            tessera_core::Layout::contiguous(&[m, n])
        }
    }

    pub fn poison(&mut self) {
        poison(&mut self.y);
    }
    /// y in row-major order, whatever its layout.
    pub fn output(&self) -> Vec<f64> {
        self.output_from(&None)
    }
    /// y in row-major order, from the device when the latest run was there.
    pub fn output_from(&self, dev: &Option<OnDevice>) -> Vec<f64> {
        let (m, n) = (self.p.m, self.p.n);
        let device_y = OnDevice::output(dev);
        let y: &[f32] = device_y.as_deref().unwrap_or(&self.y);
        let l = self.y_layout().expect("validated in call");
        (0..m * n)
            .map(|j| y[l.index_of(&[j / n, j % n])] as f64)
            .collect()
    }

    /// Runs the matmul on a device: x and y uploaded with their (strided) layouts and
    /// the weights by `weights`, once per instance and device.
    pub fn run_on_device(
        &self,
        slot: &mut Option<OnDevice>,
        v: &Variant,
        weights: impl FnOnce(&dyn Device) -> Result<DeviceBuffer>,
    ) -> Result<()> {
        let state = OnDevice::ensure(slot, v, |dev| {
            let bufs = vec![
                weights(dev)?,
                dev.upload(&self.x)?,
                dev.upload(&vec![f32::NAN; self.y.len()])?,
            ];
            Ok((bufs, 2))
        })?;
        let yl = self.y_layout()?;
        state.device.run(&DeviceCall::QMatmul {
            w: &state.bufs[0],
            x: DeviceMatrix {
                buf: &state.bufs[1],
                offset: 0,
                strides: [0, self.ldx, 1],
            },
            y: DeviceMatrix {
                buf: &state.bufs[2],
                offset: 0,
                strides: [0, yl.stride(0), yl.stride(1)],
            },
            m: self.p.m,
        })?;
        state.ran = true;
        Ok(())
    }
    /// A NaN activation reaches every output of its row (NaN·0 is NaN too).
    pub fn inject_nonfinite(&mut self, rng: &mut Rng) -> Option<Vec<usize>> {
        let (i, p) = (rng.random_range(0..self.p.m), rng.random_range(0..self.p.k));
        self.x[i * self.ldx + p] = f32::NAN;
        Some((0..self.p.n).map(|j| i * self.p.n + j).collect())
    }
    pub fn bytes(&self) -> usize {
        bytes(&self.x) + bytes(&self.y)
    }
    /// Reads x and y into cache ([`crate::registry::Instance::warm_activations`]).
    pub fn warm(&self) {
        let sum = |v: &[f32]| v.iter().fold(0.0f32, |a, &b| a + b);
        std::hint::black_box(sum(&self.x) + sum(&self.y));
    }
}

struct QInstance<B> {
    w: QuantMatrix<B>,
    /// The same weights repacked for the int8 path (at "load time", outside the timing):
    /// row-major, and interleaved where the format allows.
    packed: PackedWeights,
    interleaved: Option<PackedWeights>,
    ops: Operands,
    dev: Option<OnDevice>,
}

impl<B: BlockFormat> QInstance<B> {
    fn new(p: QMatmulProblem, rng: &mut Rng) -> Result<Self> {
        if !p.k.is_multiple_of(B::BLOCK) {
            return Err(Error::invalid(
                "qmatmul",
                format!(
                    "K = {} is not a multiple of {} ({})",
                    p.k,
                    B::BLOCK,
                    B::DTYPE
                ),
            ));
        }
        let wf: Vec<f32> = (0..p.n * p.k)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let w = QuantMatrix::<B>::quantize(p.n, p.k, &wf)?;
        Ok(QInstance {
            packed: PackedWeights::row_major(&w),
            interleaved: PackedWeights::interleaved(&w),
            w,
            ops: Operands::new(p, rng),
            dev: None,
        })
    }

    /// The weights' values before f32 rounding, (u − o)·d + m exactly: the integer
    /// kernels combine d·Σu·q and m·Σq in one fused step, so they see these.
    fn exact_weights(&self) -> Vec<f64> {
        let mut exact = Vec::with_capacity(self.w.rows() * self.w.cols());
        let mut u = [0u8; QK];
        for b in self.w.blocks() {
            for c in 0..B::BLOCK / QK {
                let halves = b.unsigned(c, &mut u);
                exact.extend(u.iter().enumerate().map(|(j, &u)| {
                    let (d, m) = halves[j / 16];
                    (u as i32 - B::OFFSET) as f64 * d as f64 + m as f64
                }));
            }
        }
        exact
    }

    /// The weights and activations a variant effectively multiplies.
    /// Built per call rather than held: the benchmark rotates enough instances to
    /// exceed the last-level cache several times, and float64 copies would multiply
    /// their memory by 16 per weight.
    fn operands(&self, v: &Variant) -> (Vec<f64>, Vec<Vec<f64>>) {
        if is_a16(v) {
            (
                self.exact_weights(),
                self.ops.acts_a16(self.packed.offset()),
            )
        } else if is_int8(v) {
            let acts = self
                .ops
                .acts(Some((self.packed.offset(), ActScales::PerBlock)));
            (self.exact_weights(), acts)
        } else {
            let defined = self.w.dequantize().into_iter().map(f64::from).collect();
            (defined, self.ops.acts(None))
        }
    }
}

impl<B: BlockFormat> Instance for QInstance<B> {
    fn reference(&self) -> Vec<f64> {
        self.reference_for(&Variant::cpu(Isa::Scalar))
    }
    fn duplicate(&self) -> Option<Box<dyn Instance>> {
        Some(Box::new(QInstance {
            w: self.w.clone(),
            packed: self.packed.clone(),
            interleaved: self.interleaved.clone(),
            ops: self.ops.clone(),
            dev: None,
        }))
    }
    fn reference_for(&self, v: &Variant) -> Vec<f64> {
        let (w, x) = self.operands(v);
        self.ops.product(&w, &x, |t| t)
    }
    fn magnitude(&self, v: &Variant) -> Option<Vec<f64>> {
        let (w, x) = self.operands(v);
        Some(self.ops.product(&w, &x, f64::abs))
    }
    fn poison(&mut self) {
        self.ops.poison();
        OnDevice::reset_output(&mut self.dev, |n| vec![f32::NAN; n]);
    }
    fn run(&mut self, v: &Variant, cfg: &TuneConfig) -> Result<()> {
        if v.backend.device_kind().is_some() {
            return self.ops.run_on_device(&mut self.dev, v, |dev| {
                dev.upload_blocks(B::DTYPE, self.w.rows(), self.w.cols(), self.w.as_bytes())
            });
        }
        OnDevice::host_ran(&mut self.dev);
        let threads = cfg.get("threads").unwrap_or(pool::global().threads());
        let (w, packed) = (&self.w, &self.packed);
        let interleaved = self.interleaved.as_ref();
        let engine_packing = match interleaved {
            Some(w) if PackedWeights::packs_interleaved::<B>() => w,
            _ => packed,
        };
        self.ops.call(|x, y| {
            if is_interleaved(v) {
                let w = interleaved
                    .ok_or_else(|| Error::Unsupported(format!("{} for {}", v.label, B::DTYPE)))?;
                super::qmatmul_int8_tiles(v.isa()?, tiles(v), threads, w, x, y)
            } else if is_a16(v) {
                super::act16::qmatmul_a16_tiles(v.isa()?, tiles(v), threads, engine_packing, x, y)
            } else if INT8.contains(v) {
                super::qmatmul_int8(v.isa()?, threads, packed, x, y)
            } else {
                qmatmul(v.isa()?, threads, w, x, y)
            }
        })
    }
    fn output(&self) -> Vec<f64> {
        self.ops.output_from(&self.dev)
    }
    fn inject_nonfinite(&mut self, rng: &mut Rng) -> Option<Vec<usize>> {
        self.ops.inject_nonfinite(rng)
    }
    fn footprint(&self) -> usize {
        self.w.size_bytes() + self.ops.bytes()
    }
    fn warm_activations(&mut self) {
        self.ops.warm();
    }
}
