//! Registry entry for `qmatmul_fp8`: FP8 weights (the dtype names the format) with
//! per-tensor or per-channel scales, f32 activations, one variant per ISA. Shapes as
//! `qmatmul`'s plus K that is no multiple of anything (FP8 has no blocks).

use super::spec::{bench_shapes, test_shapes, Operands, QMatmulProblem};
use super::{qmatmul_fp8, TOL};
use crate::pool;
use crate::quant::fp8::Fp8;
use crate::quant::{Fp8Matrix, Fp8Scaling};
use crate::registry::{
    parse_dims, BenchProblem, Cost, Instance, OpSpec, ProblemCase, Rng, Tolerance, TuneConfig,
    TuneSpace, Variant,
};
use rand::Rng as _;
use std::fmt;
use tessera_core::{DType, Error, Result};

/// The registry entry.
#[derive(Debug)]
pub struct QMatmulFp8Op;

/// A `qmatmul` problem for FP8 weights with the given scaling.
#[derive(Clone, Debug)]
pub struct Fp8Problem {
    /// The matmul's shape.
    pub p: QMatmulProblem,
    /// One scale per tensor or per output channel.
    pub scaling: Fp8Scaling,
}

impl fmt::Display for Fp8Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self.scaling {
            Fp8Scaling::PerTensor => "per-tensor",
            Fp8Scaling::PerChannel => "per-channel",
        };
        write!(f, "{} {s}", self.p)
    }
}

fn format_of(dtype: DType) -> Result<Fp8> {
    Fp8::of(dtype).ok_or_else(|| Error::DType {
        op: "qmatmul_fp8",
        dtype: dtype.to_string(),
    })
}

fn problem(p: QMatmulProblem, scaling: Fp8Scaling) -> Box<dyn ProblemCase> {
    Box::new(Fp8Problem { p, scaling })
}

impl OpSpec for QMatmulFp8Op {
    fn name(&self) -> &'static str {
        "qmatmul_fp8"
    }
    fn summary(&self) -> &'static str {
        "x·Wᵀ with FP8 (e4m3/e5m2) weights, per-tensor or per-channel scales"
    }
    fn dtypes(&self) -> &'static [DType] {
        &[DType::F8E4M3, DType::F8E5M2]
    }
    fn tolerance(&self, _: DType) -> Tolerance {
        TOL
    }
    fn test_problems(&self, rng: &mut Rng) -> Vec<Box<dyn ProblemCase>> {
        let ragged = [(1, 3, 7, false), (2, 9, 33, true), (18, 11, 47, false)];
        let shapes = test_shapes(rng).into_iter().chain(
            ragged
                .into_iter()
                .map(|(m, n, k, strided)| QMatmulProblem { m, n, k, strided }),
        );
        shapes
            .enumerate()
            .map(|(i, p)| {
                let scaling = if i % 3 == 0 {
                    Fp8Scaling::PerTensor
                } else {
                    Fp8Scaling::PerChannel
                };
                problem(p, scaling)
            })
            .collect()
    }
    fn bench_problems(&self) -> Vec<BenchProblem> {
        bench_shapes()
            .into_iter()
            .filter(|(name, _)| !name.contains("k512"))
            .map(|(name, p)| (name, problem(p, Fp8Scaling::PerChannel)))
            .collect()
    }
    fn parse_problem(&self, s: &str) -> Result<Box<dyn ProblemCase>> {
        let d = parse_dims("qmatmul_fp8", s, 3, "MxNxK")?;
        let p = QMatmulProblem {
            m: d[0],
            n: d[1],
            k: d[2],
            strided: false,
        };
        Ok(problem(p, Fp8Scaling::PerChannel))
    }
}

impl ProblemCase for Fp8Problem {
    fn cost(&self, _: DType) -> Cost {
        let p = &self.p;
        Cost {
            flops: 2.0 * (p.m * p.n * p.k) as f64,
            bytes: (p.n * p.k + 4 * p.n) as f64 + 4.0 * (p.m * p.k + p.m * p.n) as f64,
        }
    }
    fn tune_space(&self) -> TuneSpace {
        self.p.tune_space()
    }
    fn instantiate(&self, dtype: DType, rng: &mut Rng) -> Result<Box<dyn Instance>> {
        let (format, p) = (format_of(dtype)?, self.p.clone());
        // Rows of different magnitudes, so per-channel and per-tensor scales differ.
        let wf: Vec<f32> = (0..p.n * p.k)
            .map(|i| rng.random_range(-1.0f32..1.0) * (1 + (i / p.k) % 5) as f32)
            .collect();
        let w = Fp8Matrix::quantize(format, self.scaling, p.n, p.k, &wf)?;
        Ok(Box::new(Fp8Instance {
            w,
            ops: Operands::new(p, rng),
        }))
    }
}

struct Fp8Instance {
    w: Fp8Matrix,
    ops: Operands,
}

impl Fp8Instance {
    /// decode(code)·scale in f64, the values the weights stand for. Built per call,
    /// not held: benchmarks rotate many instances.
    fn exact_weights(&self) -> Vec<f64> {
        let (w, table) = (&self.w, self.w.format().table());
        (0..w.rows())
            .flat_map(|r| {
                let s = w.scales()[r] as f64;
                w.row(r).iter().map(move |&c| table[c as usize] as f64 * s)
            })
            .collect()
    }
}

impl Instance for Fp8Instance {
    fn duplicate(&self) -> Option<Box<dyn Instance>> {
        Some(Box::new(Fp8Instance {
            w: self.w.clone(),
            ops: self.ops.clone(),
        }))
    }
    fn reference(&self) -> Vec<f64> {
        self.ops
            .product(&self.exact_weights(), &self.ops.acts(None), |t| t)
    }
    fn magnitude(&self, _: &Variant) -> Option<Vec<f64>> {
        Some(
            self.ops
                .product(&self.exact_weights(), &self.ops.acts(None), f64::abs),
        )
    }
    fn poison(&mut self) {
        self.ops.poison();
    }
    fn run(&mut self, v: &Variant, cfg: &TuneConfig) -> Result<()> {
        let threads = cfg.get("threads").unwrap_or(pool::global().threads());
        let w = &self.w;
        self.ops
            .call(|x, y| qmatmul_fp8(v.isa()?, threads, w, x, y))
    }
    fn output(&self) -> Vec<f64> {
        self.ops.output()
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
