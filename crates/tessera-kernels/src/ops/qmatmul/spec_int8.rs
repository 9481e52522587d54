//! Registry entry for `qmatmul_i8`: per-channel INT8 weights, with f32 activations (one
//! variant per ISA) or per-row int8 activations (W8A8: VNNI, AVX2 and the portable
//! integer kernel). Shapes and tolerances as `qmatmul`'s.

use super::spec::{bench_shapes, parse_shape, test_shapes, Int8Labels};
use super::spec::{Operands, QMatmulProblem};
use super::{qmatmul_i8, qmatmul_w8a8, ActScales, PackedWeights, TOL};
use crate::pool;
use crate::quant::Int8Matrix;
use crate::registry::on_device::OnDevice;
use crate::registry::{
    device_variants, BenchProblem, ComputeUnit, Cost, Instance, OpSpec, ProblemCase, Rng,
    Tolerance, TuneConfig, TuneSpace, Variant,
};
use rand::Rng as _;
use std::fmt;
use tessera_core::{DType, Error, Isa, Result};

const W8A8: Int8Labels = Int8Labels {
    vnni: "avx512-vnni-w8a8",
    avx2: "avx2-w8a8",
    neon: Some("neon-sdot-w8a8"),
    scalar: "int8-scalar-w8a8",
};

/// The registry entry.
#[derive(Debug)]
pub struct QMatmulI8Op;

/// A `qmatmul` problem for INT8 weights.
#[derive(Clone, Debug)]
pub struct I8Problem(pub QMatmulProblem);

impl fmt::Display for I8Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl OpSpec for QMatmulI8Op {
    fn name(&self) -> &'static str {
        "qmatmul_i8"
    }
    fn summary(&self) -> &'static str {
        "x·Wᵀ with per-channel INT8 weights: f32 activations, or W8A8 integer dots"
    }
    fn dtypes(&self) -> &'static [DType] {
        &[DType::I8]
    }
    fn variants(&self, dtype: DType) -> Vec<Variant> {
        let mut v = W8A8.variants();
        v.extend(device_variants("qmatmul_i8", dtype));
        v
    }
    fn tolerance(&self, _: DType) -> Tolerance {
        TOL
    }
    fn variant_tolerance(&self, _: DType, v: &Variant) -> Tolerance {
        W8A8.tolerance(v)
    }
    fn compute_unit(&self, _: DType, v: &Variant) -> ComputeUnit {
        if W8A8.contains(v) {
            ComputeUnit::Int8Dot
        } else {
            ComputeUnit::Fma
        }
    }
    fn test_problems(&self, rng: &mut Rng) -> Vec<Box<dyn ProblemCase>> {
        test_shapes(rng)
            .into_iter()
            .map(|p| Box::new(I8Problem(p)) as Box<dyn ProblemCase>)
            .collect()
    }
    fn bench_problems(&self) -> Vec<BenchProblem> {
        // SmolLM2's own shapes (K = 576 suits INT8) and the 4096² projection.
        bench_shapes()
            .into_iter()
            .filter(|(name, _)| !name.contains("k512"))
            .map(|(name, p)| (name, Box::new(I8Problem(p)) as Box<dyn ProblemCase>))
            .collect()
    }
    fn parse_problem(&self, s: &str) -> Result<Box<dyn ProblemCase>> {
        Ok(Box::new(I8Problem(parse_shape("qmatmul_i8", s)?)))
    }
}

impl ProblemCase for I8Problem {
    fn cost(&self, _: DType) -> Cost {
        let p = &self.0;
        Cost {
            flops: 2.0 * (p.m * p.n * p.k) as f64,
            bytes: (p.n * p.k + 4 * p.n) as f64 + 4.0 * (p.m * p.k + p.m * p.n) as f64,
        }
    }
    fn tune_space(&self) -> TuneSpace {
        self.0.tune_space()
    }
    fn instantiate(&self, dtype: DType, rng: &mut Rng) -> Result<Box<dyn Instance>> {
        if dtype != DType::I8 {
            return Err(Error::DType {
                op: "qmatmul_i8",
                dtype: dtype.to_string(),
            });
        }
        let p = self.0.clone();
        let wf: Vec<f32> = (0..p.n * p.k)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let w = Int8Matrix::quantize(p.n, p.k, &wf)?;
        Ok(Box::new(I8Instance {
            packed: PackedWeights::from_int8(&w),
            w,
            ops: Operands::new(p, rng),
            dev: None,
        }))
    }
}

struct I8Instance {
    w: Int8Matrix,
    packed: PackedWeights,
    ops: Operands,
    /// The weights and operands on a device variant's device.
    dev: Option<OnDevice>,
}

/// `w` in the device upload layout (`device::blocks::split_int8`): codes, then each
/// row's f32 scale.
fn device_bytes(w: &Int8Matrix) -> Vec<u8> {
    let codes = (0..w.rows()).flat_map(|r| w.row(r).iter().map(|&q| q as u8));
    codes
        .chain(w.scales().iter().flat_map(|s| s.to_le_bytes()))
        .collect()
}

impl I8Instance {
    /// q·scale in f64: what both paths multiply by (the f32 path scales Σq·x once).
    /// Built per call, not held: benchmarks rotate many instances.
    fn exact_weights(&self) -> Vec<f64> {
        let w = &self.w;
        (0..w.rows())
            .flat_map(|r| {
                let s = w.scales()[r] as f64;
                w.row(r).iter().map(move |&q| q as f64 * s)
            })
            .collect()
    }

    fn product(&self, v: &Variant, f: fn(f64) -> f64) -> Vec<f64> {
        let int8 = W8A8
            .contains(v)
            .then_some((self.packed.offset(), ActScales::PerRow));
        self.ops
            .product(&self.exact_weights(), &self.ops.acts(int8), f)
    }
}

impl Instance for I8Instance {
    fn reference(&self) -> Vec<f64> {
        self.reference_for(&Variant::cpu(Isa::Scalar))
    }
    fn duplicate(&self) -> Option<Box<dyn Instance>> {
        Some(Box::new(I8Instance {
            w: self.w.clone(),
            packed: self.packed.clone(),
            ops: self.ops.clone(),
            dev: None,
        }))
    }
    fn reference_for(&self, v: &Variant) -> Vec<f64> {
        self.product(v, |t| t)
    }
    fn magnitude(&self, v: &Variant) -> Option<Vec<f64>> {
        Some(self.product(v, f64::abs))
    }
    fn poison(&mut self) {
        self.ops.poison();
        OnDevice::reset_output(&mut self.dev, |n| vec![f32::NAN; n]);
    }
    fn run(&mut self, v: &Variant, cfg: &TuneConfig) -> Result<()> {
        if v.backend.device_kind().is_some() {
            let w = &self.w;
            return self.ops.run_on_device(&mut self.dev, v, |dev| {
                dev.upload_blocks(DType::I8, w.rows(), w.cols(), &device_bytes(w))
            });
        }
        OnDevice::host_ran(&mut self.dev);
        let threads = cfg.get("threads").unwrap_or(pool::global().threads());
        let (w, packed) = (&self.w, &self.packed);
        self.ops.call(|x, y| {
            if W8A8.contains(v) {
                qmatmul_w8a8(v.isa()?, threads, packed, x, y)
            } else {
                qmatmul_i8(v.isa()?, threads, w, x, y)
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
