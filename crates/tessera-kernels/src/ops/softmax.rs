//! Row-wise softmax, stabilised by subtracting the row max.
//!
//! Three passes over an L1-resident row (max, exp-and-sum, scale), so DRAM sees one read
//! and one write per element. NaN anywhere in a row makes the whole row NaN.

use super::rowwise::{run_rows, RowKernel, RowOpDesc};
use crate::multiversion;
use crate::registry::{Rng, Tolerance};
use crate::simd::{exp_shifted_sum_on, max_on};
use tessera_core::device::RowOp;
use tessera_core::{DType, Element, Isa, Result, TensorView, TensorViewMut};

/// exp polynomial (≤ 3e-7) plus an f32 sum of n terms.
pub const TOL: Tolerance = Tolerance {
    rel: 2e-6,
    reason: "exp polynomial ≤3e-7 + f32 row sum",
};

multiversion! {
    fn scale(out: &mut [f32], by: f32) {
        for o in out.iter_mut() {
            *o *= by;
        }
    }
}

/// The kernel (no parameters).
#[derive(Debug)]
pub struct Softmax;

impl RowKernel for Softmax {
    fn row(&self, isa: Isa, _row: usize, x: &[&[f32]], out: &mut [f32]) {
        let sum = exp_shifted_sum_on(isa, x[0], max_on(isa, x[0]), out);
        scale(isa, out, 1.0 / sum);
    }
}

/// Softmax over the last dim of a rank-2/3 view.
pub fn softmax<T: Element>(
    isa: Isa,
    x: &TensorView<'_, T>,
    out: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let n = x.dims().last().copied().unwrap_or(0);
    run_rows(
        "softmax",
        isa,
        crate::pool::global().threads(),
        &Softmax,
        &[*x],
        out,
        n,
    )
}

impl RowOpDesc for Softmax {
    type Kernel = Softmax;
    const NAME: &'static str = "softmax";
    const SUMMARY: &'static str = "row-wise stable softmax";
    const FLOPS_PER_ELEM: f64 = 4.0;
    fn tolerance(_: DType) -> Tolerance {
        TOL
    }
    fn input_range() -> (f64, f64) {
        (-12.0, 12.0)
    }
    fn kernel(_: usize, _: usize, _: &mut Rng) -> Softmax {
        Softmax
    }
    fn reference(_: &Softmax, _: usize, x: &[Vec<f64>]) -> Vec<f64> {
        let m = x[0].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = x[0].iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }
    fn device_op(_: &Softmax) -> Option<(RowOp, Option<&[f32]>)> {
        Some((RowOp::Softmax, None))
    }
    fn nan_reach(n: usize, _: usize) -> Option<Vec<usize>> {
        Some((0..n).collect())
    }
}
