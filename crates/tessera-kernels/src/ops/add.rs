//! Elementwise `a + b`: the residual stream's add. On the CPU the engine fuses it into
//! the next RMSNorm (`rms_norm_residual`); a device forward runs it alone, because a
//! device kernel may not read and write one buffer in the same call.

use super::rowwise::{run_rows, RowKernel, RowOpDesc};
use crate::multiversion;
use crate::registry::{Rng, Tolerance};
use tessera_core::device::RowOp;
use tessera_core::{DType, Element, Isa, Result, TensorView, TensorViewMut};

/// One f32 rounding of the exact sum of two f32 values: half an ulp of the result.
pub const TOL: Tolerance = Tolerance {
    rel: 1e-7,
    reason: "one f32 rounding of the sum",
};

multiversion! {
    fn sum_into(out: &mut [f32], a: &[f32], b: &[f32]) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = x + y;
        }
    }
}

/// The kernel: inputs (a, b).
#[derive(Debug)]
pub struct Add;

impl RowKernel for Add {
    fn row(&self, isa: Isa, _row: usize, x: &[&[f32]], out: &mut [f32]) {
        sum_into(isa, out, x[0], x[1]);
    }
}

/// `out = a + b` elementwise; a and b share dims.
pub fn add<T: Element>(
    isa: Isa,
    a: &TensorView<'_, T>,
    b: &TensorView<'_, T>,
    out: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let n = a.dims().last().copied().unwrap_or(0);
    run_rows(
        "add",
        isa,
        crate::pool::global().threads(),
        &Add,
        &[*a, *b],
        out,
        n,
    )
}

impl RowOpDesc for Add {
    type Kernel = Add;
    const NAME: &'static str = "add";
    const SUMMARY: &'static str = "elementwise a + b (the residual add)";
    const INPUTS: usize = 2;
    const FLOPS_PER_ELEM: f64 = 1.0;
    fn tolerance(_: DType) -> Tolerance {
        TOL
    }
    fn input_range() -> (f64, f64) {
        (-100.0, 100.0)
    }
    fn kernel(_: usize, _: usize, _: &mut Rng) -> Add {
        Add
    }
    fn reference(_: &Add, _: usize, x: &[Vec<f64>]) -> Vec<f64> {
        x[0].iter().zip(&x[1]).map(|(&a, &b)| a + b).collect()
    }
    fn device_op(_: &Add) -> Option<(RowOp, Option<&[f32]>)> {
        Some((RowOp::Add, None))
    }
    fn nan_reach(_: usize, col: usize) -> Option<Vec<usize>> {
        Some(vec![col])
    }
}
