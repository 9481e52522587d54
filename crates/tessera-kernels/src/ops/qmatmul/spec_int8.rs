//! Registry entry for `qmatmul_i8`: per-channel INT8 weights, with f32 activations (one
//! variant per ISA) or per-row int8 activations (W8A8: VNNI and the portable integer
//! kernel). Shapes and tolerances as `qmatmul`'s.

use super::spec::{bench_shapes, parse_shape, test_shapes, QMatmulProblem};
use super::{qmatmul_i8, qmatmul_w8a8, ActScales, PackedWeights, QuantActs, TOL, TOL_INT8};
use crate::ops::common::{bytes, poison};
use crate::pool;
use crate::quant::Int8Matrix;
use crate::registry::{
    BenchProblem, Cost, Instance, OpSpec, ProblemCase, Rng, Tolerance, TuneConfig, TuneSpace,
    Variant,
};
use rand::Rng as _;
use std::fmt;
use tessera_core::{CpuFeatures, DType, Error, Isa, Result, TensorView, TensorViewMut};

const VNNI: &str = "avx512-vnni-w8a8";
const INT8_SCALAR: &str = "int8-scalar-w8a8";

fn is_w8a8(v: &Variant) -> bool {
    v.label == VNNI || v.label == INT8_SCALAR
}

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
    fn variants(&self, _: DType) -> Vec<Variant> {
        let mut v: Vec<Variant> = Isa::available().into_iter().map(Variant::cpu).collect();
        if CpuFeatures::get().avx512_vnni {
            v.push(Variant {
                backend: crate::registry::Backend::Cpu(Isa::Avx512),
                label: VNNI.into(),
            });
        }
        v.push(Variant {
            backend: crate::registry::Backend::Cpu(Isa::Scalar),
            label: INT8_SCALAR.into(),
        });
        v
    }
    fn tolerance(&self, _: DType) -> Tolerance {
        TOL
    }
    fn variant_tolerance(&self, _: DType, v: &Variant) -> Tolerance {
        if is_w8a8(v) {
            TOL_INT8
        } else {
            TOL
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
        let ldx = p.k + if p.strided { 5 } else { 0 };
        let x = (0..p.m * ldx)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let exact: Vec<f64> = (0..p.n)
            .flat_map(|r| {
                let s = w.scales()[r] as f64;
                w.row(r)
                    .iter()
                    .map(move |&q| q as f64 * s)
                    .collect::<Vec<_>>()
            })
            .collect();
        Ok(Box::new(I8Instance {
            packed: PackedWeights::from_int8(&w),
            w,
            exact,
            x,
            ldx,
            y: vec![0.0; p.m * p.n],
            p,
        }))
    }
}

struct I8Instance {
    p: QMatmulProblem,
    w: Int8Matrix,
    packed: PackedWeights,
    /// q·scale in f64: what both paths multiply by (the f32 path scales Σq·x once).
    exact: Vec<f64>,
    x: Vec<f32>,
    ldx: usize,
    y: Vec<f32>,
}

impl I8Instance {
    fn acts(&self, v: &Variant) -> Vec<Vec<f64>> {
        (0..self.p.m)
            .map(|i| {
                let row = &self.x[i * self.ldx..][..self.p.k];
                if is_w8a8(v) {
                    QuantActs::with_scales(row, 128, ActScales::PerRow).dequantized(self.p.k)
                } else {
                    row.iter().map(|&v| v as f64).collect()
                }
            })
            .collect()
    }
    fn product(&self, v: &Variant, f: fn(f64) -> f64) -> Vec<f64> {
        let k = self.p.k;
        self.acts(v)
            .iter()
            .flat_map(|xr| {
                (0..self.p.n).map(move |j| {
                    let w = &self.exact[j * k..(j + 1) * k];
                    w.iter().zip(xr).map(|(&a, &b)| f(a * b)).sum::<f64>()
                })
            })
            .collect()
    }
}

impl Instance for I8Instance {
    fn reference(&self) -> Vec<f64> {
        self.reference_for(&Variant::cpu(Isa::Scalar))
    }
    fn reference_for(&self, v: &Variant) -> Vec<f64> {
        self.product(v, |t| t)
    }
    fn magnitude(&self, v: &Variant) -> Option<Vec<f64>> {
        Some(self.product(v, f64::abs))
    }
    fn poison(&mut self) {
        poison(&mut self.y);
    }
    fn run(&mut self, v: &Variant, cfg: &TuneConfig) -> Result<()> {
        let threads = cfg.get("threads").unwrap_or(pool::global().threads());
        let (m, n) = (self.p.m, self.p.n);
        let l = tessera_core::Layout::strided(&[m, self.p.k], &[self.ldx, 1], 0)?;
        let x = TensorView::new(&self.x, l)?;
        let mut y = TensorViewMut::contiguous(&mut self.y, &[m, n])?;
        if is_w8a8(v) {
            qmatmul_w8a8(v.isa(), threads, &self.packed, &x, &mut y)
        } else {
            qmatmul_i8(v.isa(), threads, &self.w, &x, &mut y)
        }
    }
    fn output(&self) -> Vec<f64> {
        self.y.iter().map(|&v| v as f64).collect()
    }
    fn inject_nonfinite(&mut self, rng: &mut Rng) -> Option<Vec<usize>> {
        let (i, p) = (rng.random_range(0..self.p.m), rng.random_range(0..self.p.k));
        self.x[i * self.ldx + p] = f32::NAN;
        Some((0..self.p.n).map(|j| i * self.p.n + j).collect())
    }
    fn footprint(&self) -> usize {
        self.w.size_bytes() + bytes(&self.x) + bytes(&self.y)
    }
}
