//! SiLU `x·σ(x)` = `x/(1 + e^{−x})`, and the formula shared with SwiGLU.

use super::rowwise::{run_rows, RowKernel, RowOpDesc};
use crate::registry::{Rng, Tolerance};
use crate::simd::{x_sigmoid_on, SigmoidArg};
use tessera_core::{DType, Element, Isa, Result, TensorView, TensorViewMut};

/// exp polynomial (≤ 3e-7) and one division.
pub const TOL: Tolerance = Tolerance {
    rel: 1e-6,
    reason: "exp polynomial + division",
};

pub(crate) fn silu_f64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// SiLU as `x·σ(a·x + b·x³)`.
pub(crate) const SILU: SigmoidArg = SigmoidArg { a: 1.0, b: 0.0 };

/// The kernel.
#[derive(Debug)]
pub struct Silu;

impl RowKernel for Silu {
    fn row(&self, isa: Isa, _row: usize, x: &[&[f32]], out: &mut [f32]) {
        x_sigmoid_on(isa, x[0], SILU, None, out);
    }
}

/// SiLU elementwise over a rank-2/3 view.
pub fn silu<T: Element>(
    isa: Isa,
    x: &TensorView<'_, T>,
    out: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let n = x.dims().last().copied().unwrap_or(0);
    run_rows(
        "silu",
        isa,
        crate::pool::global().threads(),
        &Silu,
        &[*x],
        out,
        n,
    )
}

impl RowOpDesc for Silu {
    type Kernel = Silu;
    const NAME: &'static str = "silu";
    const SUMMARY: &'static str = "SiLU x·σ(x)";
    const FLOPS_PER_ELEM: f64 = 4.0;
    fn tolerance(_: DType) -> Tolerance {
        TOL
    }
    fn input_range() -> (f64, f64) {
        (-20.0, 20.0)
    }
    fn kernel(_: usize, _: usize, _: &mut Rng) -> Silu {
        Silu
    }
    fn reference(_: &Silu, _: usize, x: &[Vec<f64>]) -> Vec<f64> {
        x[0].iter().map(|&v| silu_f64(v)).collect()
    }
    fn nan_reach(_: usize, col: usize) -> Option<Vec<usize>> {
        Some(vec![col])
    }
}
