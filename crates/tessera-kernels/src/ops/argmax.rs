//! Row-wise argmax (greedy sampling over the vocabulary).
//!
//! Two vectorized passes: the row max (and whether any element is NaN), then the first
//! index holding it. Ties go to the lowest index; a NaN counts as the maximum (the first
//! NaN's index is returned), as numpy does, so a broken logit row is visible, not hidden.

use super::rowwise::{run_rows, RowKernel, RowOpDesc};
use crate::multiversion;
use crate::registry::{Rng, Tolerance};
use tessera_core::{DType, Element, Error, Isa, Result, TensorView, TensorViewMut};

/// Indices are exact.
pub const TOL: Tolerance = Tolerance {
    rel: 0.0,
    reason: "an index: exact",
};

multiversion! {
    /// (max skipping NaN, whether the row holds a NaN): Σ(x·0) is NaN exactly when
    /// some element is NaN or ±∞, so the rare rows with ±∞ get an exact scalar check.
    fn max_and_nan(x: &[f32]) -> (f32, bool) {
        let mut lanes = [0f32; 16];
        let chunks = x.chunks_exact(16);
        let mut tail_nan = false;
        for &v in chunks.remainder() {
            tail_nan |= v.is_nan();
        }
        for c in chunks {
            for (l, &v) in lanes.iter_mut().zip(c) {
                *l += v * 0.0; // 0, or NaN for NaN and ±∞
            }
        }
        let maybe = tail_nan || lanes.iter().any(|l| l.is_nan());
        (crate::simd::max(x), maybe && x.iter().any(|v| v.is_nan()))
    }
}

multiversion! {
    /// First index whose value is `target` (or NaN when `target` is NaN), scanning 64-wide
    /// blocks with a branch-free compare and only the hit block element by element.
    fn first_index(x: &[f32], target: f32) -> usize {
        let hit = |v: f32| v == target || (target.is_nan() && v.is_nan());
        let mut base = 0;
        for c in x.chunks(64) {
            if c.iter().fold(false, |a, &v| a | hit(v)) {
                return base + c.iter().position(|&v| hit(v)).unwrap_or(0);
            }
            base += c.len();
        }
        0
    }
}

/// The index of the largest element (first NaN if any; 0 for an empty row).
pub fn argmax_row(isa: Isa, x: &[f32]) -> usize {
    let (m, has_nan) = max_and_nan(isa, x);
    first_index(isa, x, if has_nan { f32::NAN } else { m })
}

/// The kernel: output row of length 1 holding the index (exact in f32 below 2²⁴).
#[derive(Debug)]
pub struct Argmax;

impl RowKernel for Argmax {
    fn row(&self, isa: Isa, _row: usize, x: &[&[f32]], out: &mut [f32]) {
        out[0] = argmax_row(isa, x[0]) as f32;
    }
}

/// Argmax of each row of a `[rows, n]` view.
pub fn argmax<T: Element>(isa: Isa, x: &TensorView<'_, T>) -> Result<Vec<u32>> {
    if x.rank() != 2 || x.dims()[1] == 0 || x.dims()[1] >= 1 << 24 {
        return Err(Error::shape(
            "argmax",
            format!("expected [rows, 1..2²⁴], got {:?}", x.dims()),
        ));
    }
    let mut idx = vec![0f32; x.dims()[0]];
    let mut out = TensorViewMut::contiguous(&mut idx, &[x.dims()[0], 1])?;
    run_rows(
        "argmax",
        isa,
        crate::pool::global().threads(),
        &Argmax,
        &[*x],
        &mut out,
        1,
    )?;
    Ok(idx.into_iter().map(|v| v as u32).collect())
}

impl RowOpDesc for Argmax {
    type Kernel = Argmax;
    const NAME: &'static str = "argmax";
    const SUMMARY: &'static str = "row-wise argmax (first max; NaN wins)";
    const FLOPS_PER_ELEM: f64 = 1.0;
    fn tolerance(_: DType) -> Tolerance {
        TOL
    }
    fn out_len(_: usize) -> usize {
        1
    }
    fn kernel(_: usize, _: usize, _: &mut Rng) -> Argmax {
        Argmax
    }
    fn reference(_: &Argmax, _: usize, x: &[Vec<f64>]) -> Vec<f64> {
        let mut best = 0;
        for (i, &v) in x[0].iter().enumerate() {
            if v > x[0][best] {
                best = i;
            }
        }
        vec![best as f64]
    }
    fn nan_reach(_: usize, _: usize) -> Option<Vec<usize>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_and_nan() {
        for isa in Isa::available() {
            assert_eq!(argmax_row(isa, &[1.0, 3.0, 3.0, 2.0]), 1);
            assert_eq!(argmax_row(isa, &[1.0, 5.0, f32::NAN, 9.0, f32::NAN]), 2);
            assert_eq!(argmax_row(isa, &[f32::NEG_INFINITY; 3]), 0);
            // ±∞ take the NaN-suspect path without being NaN; NaN past the 16-lane body.
            let mut inf = vec![0.5f32; 70];
            inf[40] = f32::INFINITY;
            inf[3] = f32::NEG_INFINITY;
            assert_eq!(argmax_row(isa, &inf), 40);
            inf[66] = f32::NAN;
            assert_eq!(argmax_row(isa, &inf), 66);
            let long: Vec<f32> = (0..1000).map(|i| ((i * 37) % 1000) as f32).collect();
            assert_eq!(
                argmax_row(isa, &long),
                long.iter().position(|&v| v == 999.0).unwrap()
            );
        }
    }

    #[test]
    fn bad_shapes() {
        let x = [1.0f32; 6];
        assert!(argmax(Isa::Scalar, &TensorView::contiguous(&x, &[6]).unwrap()).is_err());
        assert!(argmax(
            Isa::Scalar,
            &TensorView::contiguous(&x, &[6, 0]).unwrap_or_else(|_| TensorView::contiguous(
                &x[..0],
                &[1, 0]
            )
            .unwrap())
        )
        .is_err());
        assert_eq!(
            argmax(Isa::best(), &TensorView::contiguous(&x, &[2, 3]).unwrap()).unwrap(),
            vec![0, 0]
        );
    }
}
