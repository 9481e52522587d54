//! Fused SwiGLU `silu(gate)·up`: the Llama MLP's activation in one pass over both halves
//! instead of a SiLU pass and a multiply pass.

use super::rowwise::{run_rows, RowKernel, RowOpDesc};
use super::silu::{silu_f64, SILU};
use crate::registry::{Rng, Tolerance};
use crate::simd::x_sigmoid_on;
use tessera_core::device::RowOp;
use tessera_core::{DType, Element, Isa, Result, TensorView, TensorViewMut};

/// As SiLU, plus one exact-ish multiply.
pub const TOL: Tolerance = Tolerance {
    rel: 1e-6,
    reason: "SiLU's exp polynomial + division",
};

/// The kernel: inputs (gate, up).
#[derive(Debug)]
pub struct SwiGlu;

impl RowKernel for SwiGlu {
    fn row(&self, isa: Isa, _row: usize, x: &[&[f32]], out: &mut [f32]) {
        // One pass on AVX2 and NEON; AVX-512 and the scalar path multiply in a second
        // pass over the L1-resident row.
        x_sigmoid_on(isa, x[0], SILU, Some(x[1]), out);
    }
}

/// `out = silu(gate)·up` elementwise; gate and up share dims.
pub fn swiglu<T: Element>(
    isa: Isa,
    gate: &TensorView<'_, T>,
    up: &TensorView<'_, T>,
    out: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let n = gate.dims().last().copied().unwrap_or(0);
    run_rows(
        "swiglu",
        isa,
        crate::pool::global().threads(),
        &SwiGlu,
        &[*gate, *up],
        out,
        n,
    )
}

impl RowOpDesc for SwiGlu {
    type Kernel = SwiGlu;
    const NAME: &'static str = "swiglu";
    const SUMMARY: &'static str = "fused silu(gate)·up";
    const INPUTS: usize = 2;
    const FLOPS_PER_ELEM: f64 = 5.0;
    fn tolerance(_: DType) -> Tolerance {
        TOL
    }
    fn input_range() -> (f64, f64) {
        (-10.0, 10.0)
    }
    fn kernel(_: usize, _: usize, _: &mut Rng) -> SwiGlu {
        SwiGlu
    }
    fn reference(_: &SwiGlu, _: usize, x: &[Vec<f64>]) -> Vec<f64> {
        x[0].iter()
            .zip(&x[1])
            .map(|(&g, &u)| silu_f64(g) * u)
            .collect()
    }
    fn device_op(_: &SwiGlu) -> Option<(RowOp, Option<&[f32]>)> {
        Some((RowOp::SwiGlu, None))
    }
    fn nan_reach(_: usize, col: usize) -> Option<Vec<usize>> {
        Some(vec![col])
    }
}
