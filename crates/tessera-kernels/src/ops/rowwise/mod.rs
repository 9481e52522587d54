//! Row-wise ops (softmax, norms, activations, RoPE, argmax) share one driver and one
//! registry entry shape.
//!
//! Each op is a [`RowKernel`] (how to compute one output row from its input rows, on a
//! given ISA) plus a [`RowOpDesc`] (its float64 reference, parameters, tolerances and
//! problems). [`run_rows`] validates views of any strides, widens bf16 rows to f32 when
//! needed, and spreads rows over threads; [`RowOpSpec`] turns a descriptor into a
//! registry entry, so adding an op is its math and nothing else.

mod spec;

pub use spec::{RowOpSpec, RowProblem};

use crate::pool::{self, SharedMut};
use crate::registry::{Rng, Tolerance};
use tessera_core::{DType, Element, Error, Isa, Layout, Result, TensorView, TensorViewMut};

/// One output row from `inputs()` input rows of length n.
pub trait RowKernel: Sync {
    /// Writes `out` (length `out_len(n)`) for row `row` (flat index over leading dims).
    fn row(&self, isa: Isa, row: usize, x: &[&[f32]], out: &mut [f32]);
}

/// Most input row streams an op reads (SwiGLU and the residual norm read two).
pub const MAX_INPUTS: usize = 4;

/// Flat row count and row length of a rank-2/3 view (rows = product of leading dims).
fn rows_of(l: &Layout) -> (usize, usize) {
    let d = l.dims();
    (d[..d.len() - 1].iter().product(), d[d.len() - 1])
}

/// Buffer offset of the first element of flat row `r`, and the element stride.
fn row_start(l: &Layout, r: usize) -> usize {
    let d = l.dims();
    let mut rem = r;
    let mut off = l.offset();
    for i in (0..d.len() - 1).rev() {
        off += (rem % d[i]) * l.stride(i);
        rem /= d[i];
    }
    off
}

/// Runs `k` over every row of `xs` into `out`; all inputs share dims, `out` has the same
/// leading dims and rows of `out_len`.
pub fn run_rows<T: Element, K: RowKernel>(
    op: &'static str,
    isa: Isa,
    threads: usize,
    k: &K,
    xs: &[TensorView<'_, T>],
    out: &mut TensorViewMut<'_, f32>,
    out_len: usize,
) -> Result<()> {
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    if xs.len() > MAX_INPUTS {
        return Err(Error::invalid(
            op,
            format!(
                "{} input rows per output row; at most {MAX_INPUTS}",
                xs.len()
            ),
        ));
    }
    let first = xs.first().map(|x| *x.layout()).unwrap_or(*out.layout());
    if !(2..=3).contains(&first.rank()) || out.rank() != first.rank() {
        return Err(Error::Rank {
            op,
            expected: "2 or 3 ([.., rows, n]) for inputs and output".into(),
            got: out.rank(),
        });
    }
    if let Some(x) = xs.iter().find(|x| x.dims() != first.dims()) {
        return Err(Error::shape(
            op,
            format!("inputs {:?} and {:?} differ", first.dims(), x.dims()),
        ));
    }
    let (rows, n) = rows_of(&first);
    let lead = &first.dims()[..first.rank() - 1];
    if &out.dims()[..out.rank() - 1] != lead || out.dims()[out.rank() - 1] != out_len {
        return Err(Error::shape(
            op,
            format!("output {:?}, expected {:?} + [{out_len}]", out.dims(), lead),
        ));
    }
    if rows == 0 || out_len == 0 {
        return Ok(());
    }
    let ol = *out.layout();
    let o_cs = ol.stride(ol.rank() - 1);
    let optr = SharedMut(out.data_mut().as_mut_ptr());
    let (tasks, per_task) = pool::row_runs(rows, n, threads);
    pool::global().run(tasks, threads, |t| {
        let mut widened: [Vec<f32>; MAX_INPUTS] = Default::default();
        let mut obuf = vec![0f32; if o_cs == 1 { 0 } else { out_len }];
        for r in t * per_task..((t + 1) * per_task).min(rows) {
            // An array, not a Vec: rope's 144 rows a batching step were 144 allocations.
            let mut ins: [&[f32]; MAX_INPUTS] = [&[]; MAX_INPUTS];
            for ((x, w), slot) in xs.iter().zip(widened.iter_mut()).zip(ins.iter_mut()) {
                let l = x.layout();
                let (start, cs) = (row_start(l, r), l.stride(l.rank() - 1));
                *slot = if let (1, Some(s)) = (cs, T::as_f32_slice(&x.data()[start..start + n])) {
                    s
                } else if cs == 1 {
                    w.resize(n, 0.0);
                    crate::simd::widen(isa, &x.data()[start..start + n], w);
                    &w[..]
                } else {
                    w.clear();
                    w.extend((0..n).map(|i| x.data()[start + i * cs].to_f32()));
                    &w[..]
                };
            }
            let ins = &ins[..xs.len()];
            let start = row_start(&ol, r);
            if o_cs == 1 {
                // SAFETY: row r of the validated, non-overlapping output view spans
                // start..start+out_len; each task writes distinct rows.
                let o = unsafe { std::slice::from_raw_parts_mut(optr.get().add(start), out_len) };
                k.row(isa, r, ins, o);
            } else {
                k.row(isa, r, ins, &mut obuf);
                for (i, v) in obuf.iter().enumerate() {
                    // SAFETY: as above, element i of row r at stride o_cs.
                    unsafe { *optr.get().add(start + i * o_cs) = *v };
                }
            }
        }
    });
    Ok(())
}

/// What the generic registry entry needs to know about a row-wise op.
pub trait RowOpDesc: Send + Sync + 'static {
    /// The per-row kernel.
    type Kernel: RowKernel + Send + Sync;
    /// The registry name.
    const NAME: &'static str;
    /// One line for `tessera ops`.
    const SUMMARY: &'static str;
    /// Input row streams (2 for SwiGLU and the residual norm).
    const INPUTS: usize = 1;
    /// FLOPs per input element, for the cost model.
    const FLOPS_PER_ELEM: f64;
    /// Element types the op takes (f32 and bf16 by default).
    fn dtypes() -> &'static [DType] {
        &[DType::F32, DType::BF16]
    }
    /// Accepted error against the float64 reference.
    fn tolerance(dtype: DType) -> Tolerance;
    /// Output row length for input rows of `n` (`n` by default).
    fn out_len(n: usize) -> usize {
        n
    }
    /// Range of the random inputs (wide enough to exercise the op's interesting region).
    fn input_range() -> (f64, f64) {
        (-1.0, 1.0)
    }
    /// A kernel with random parameters (weights, positions) for `rows` rows of `n`.
    fn kernel(rows: usize, n: usize, rng: &mut Rng) -> Self::Kernel;
    /// Accepts only some row lengths (RoPE needs even n).
    fn valid_n(n: usize) -> bool {
        n > 0
    }
    /// The float64 output row.
    fn reference(k: &Self::Kernel, row: usize, x: &[Vec<f64>]) -> Vec<f64>;
    /// The device form of the op and its parameter row (RMSNorm's γ), for the backends
    /// that run it; None: CPU only.
    fn device_op(_k: &Self::Kernel) -> Option<(tessera_core::device::RowOp, Option<&[f32]>)> {
        None
    }
    /// Output indices (within the row) that must be NaN when input column `col` is NaN;
    /// None when the op promises nothing (argmax returns an index).
    fn nan_reach(n: usize, col: usize) -> Option<Vec<usize>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel that must never run: the calls below are all rejected first.
    struct Unreachable;
    impl RowKernel for Unreachable {
        fn row(&self, _: Isa, _: usize, _: &[&[f32]], _: &mut [f32]) {
            panic!("ran a row of a rejected call");
        }
    }

    /// More input streams than [`MAX_INPUTS`] is an error naming the limit, and the
    /// output stays as it was.
    #[test]
    fn too_many_inputs_is_an_error() {
        let x = vec![1.0f32; 8];
        let view = TensorView::contiguous(&x, &[2, 4]).unwrap();
        let inputs = vec![view; MAX_INPUTS + 1];
        let mut y = vec![f32::NAN; 8];
        let mut out = TensorViewMut::contiguous(&mut y, &[2, 4]).unwrap();
        let e = run_rows("test", Isa::Scalar, 2, &Unreachable, &inputs, &mut out, 4).unwrap_err();
        assert!(e.to_string().contains(&MAX_INPUTS.to_string()), "{e}");
        assert!(y.iter().all(|v| v.is_nan()));
    }
}
