//! GELU, tanh approximation (GPT-2, ggml's `gelu`):
//! `0.5·x·(1 + tanh(y))`, y = √(2/π)·(x + 0.044715·x³).
//!
//! Computed as the identical `x·σ(2y) = x/(1 + e^{−2y})`: the textbook form cancels
//! catastrophically for negative x (1 + tanh(y) rounds to 0 in f32 below x ≈ −5, where
//! the true value is ~1e-7·x), and this form needs only the vectorized exp.

use super::rowwise::{run_rows, RowKernel, RowOpDesc};
use crate::registry::{Rng, Tolerance};
use crate::simd::{x_sigmoid_on, SigmoidArg};
use tessera_core::{DType, Element, Isa, Result, TensorView, TensorViewMut};

/// The tail is ill-conditioned in any f32 evaluation: rounding y (relative 2⁻²⁴) moves
/// e^{−2y} by |2y|·2⁻²⁴, up to ~5e-6 at x = −8 (the tests' range), on top of the exp
/// polynomial's 3e-7. The σ form adds no cancellation.
pub const TOL: Tolerance = Tolerance {
    rel: 1e-5,
    reason: "f32 rounding of y amplified by |2y| in the tail",
};

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const COEF: f64 = 0.044_715;

/// `x·σ(2y)` with 2y = 2c·x + 2c·0.044715·x³.
const GELU: SigmoidArg = SigmoidArg {
    a: (2.0 * SQRT_2_OVER_PI) as f32,
    b: (2.0 * SQRT_2_OVER_PI * COEF) as f32,
};

/// The kernel.
#[derive(Debug)]
pub struct Gelu;

impl RowKernel for Gelu {
    fn row(&self, isa: Isa, _row: usize, x: &[&[f32]], out: &mut [f32]) {
        x_sigmoid_on(isa, x[0], GELU, None, out);
    }
}

/// GELU (tanh form) elementwise.
pub fn gelu<T: Element>(
    isa: Isa,
    x: &TensorView<'_, T>,
    out: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let n = x.dims().last().copied().unwrap_or(0);
    run_rows(
        "gelu",
        isa,
        crate::pool::global().threads(),
        &Gelu,
        &[*x],
        out,
        n,
    )
}

impl RowOpDesc for Gelu {
    type Kernel = Gelu;
    const NAME: &'static str = "gelu";
    const SUMMARY: &'static str = "GELU (tanh approximation)";
    const FLOPS_PER_ELEM: f64 = 10.0;
    fn tolerance(_: DType) -> Tolerance {
        TOL
    }
    fn input_range() -> (f64, f64) {
        (-8.0, 8.0)
    }
    fn kernel(_: usize, _: usize, _: &mut Rng) -> Gelu {
        Gelu
    }
    fn reference(_: &Gelu, _: usize, x: &[Vec<f64>]) -> Vec<f64> {
        // The σ form here too: in f64, 1 + tanh(y) itself cancels below y ≈ −18.
        x[0].iter()
            .map(|&v| v / (1.0 + (-2.0 * SQRT_2_OVER_PI * (v + COEF * v * v * v)).exp()))
            .collect()
    }
    fn nan_reach(_: usize, col: usize) -> Option<Vec<usize>> {
        Some(vec![col])
    }
}
