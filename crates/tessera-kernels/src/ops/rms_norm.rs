//! RMSNorm `x/√(mean(x²) + eps)·γ`, and its fused form with the residual add that
//! precedes it in every Llama block (`h = x + residual; y = rmsnorm(h)`), which saves a
//! full read and write of the hidden state per layer.

use super::rowwise::{run_rows, RowKernel, RowOpDesc};
use crate::multiversion;
use crate::ops::common::random_in;
use crate::pool::{self, SharedMut};
use crate::registry::{Rng, Tolerance};
use crate::simd::{fold_lanes, lane_sum};
use tessera_core::device::RowOp;
use tessera_core::{DType, Element, Error, Isa, Result, TensorView, TensorViewMut};

/// An f32 sum of n squares.
pub const TOL: Tolerance = Tolerance {
    rel: 2e-6,
    reason: "f32 sum of squares",
};

multiversion! {
    fn rms_norm_row(x: &[f32], gamma: &[f32], eps: f32, out: &mut [f32]) {
        let ms = lane_sum(x, |v| v * v) / x.len() as f32;
        scale_row(x, gamma, 1.0 / (ms + eps).sqrt(), out);
    }
}

multiversion! {
    /// `h += x`, then `out = rmsnorm(h)·γ`: the sum of squares rides on the add's pass,
    /// and nothing is copied (a per-row `copy_from_slice` of 2,304 bytes went to glibc's
    /// `rep movsb`: 58% of this op's `perf` samples under `tessera bench-model
    /// --prompt-tokens 512 --gen-tokens 1` on an AMD Zen 3 host, 2026-11-28).
    fn add_norm_row(x: &[f32], h: &mut [f32], gamma: &[f32], eps: f32, out: &mut [f32]) {
        let ms = add_sum_squares(h, x) / h.len() as f32;
        scale_row(h, gamma, 1.0 / (ms + eps).sqrt(), out);
    }
}

/// `out = x·r·γ`.
#[inline(always)]
fn scale_row(x: &[f32], gamma: &[f32], r: f32, out: &mut [f32]) {
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(gamma) {
        *o = v * r * g;
    }
}

/// `h += x`, returning Σh² over the updated h in [`lane_sum`]'s lanes and order (so the
/// fused norm equals the unfused one bit for bit).
#[inline(always)]
fn add_sum_squares(h: &mut [f32], x: &[f32]) -> f32 {
    let mut lanes = [0f32; 64];
    let mut hc = h.chunks_exact_mut(64);
    let mut xc = x.chunks_exact(64);
    for (hv, xv) in (&mut hc).zip(&mut xc) {
        for ((l, a), &b) in lanes.iter_mut().zip(hv.iter_mut()).zip(xv) {
            *a += b;
            *l += *a * *a;
        }
    }
    let mut tail = 0f32;
    for (a, &b) in hc.into_remainder().iter_mut().zip(xc.remainder()) {
        *a += b;
        tail += *a * *a;
    }
    fold_lanes(lanes) + tail
}

/// RMSNorm parameters.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// Per-column scale.
    pub gamma: Vec<f32>,
    /// Added to the mean square before the square root.
    pub eps: f32,
}

impl RowKernel for RmsNorm {
    fn row(&self, isa: Isa, _row: usize, x: &[&[f32]], out: &mut [f32]) {
        rms_norm_row(isa, x[0], &self.gamma, self.eps, out);
    }
}

fn check_gamma(op: &'static str, n: usize, gamma: &[f32]) -> Result<()> {
    if gamma.len() != n {
        return Err(Error::shape(
            op,
            format!("γ has {} elements for rows of {n}", gamma.len()),
        ));
    }
    Ok(())
}

/// RMSNorm over the last dim.
pub fn rms_norm<T: Element>(
    isa: Isa,
    x: &TensorView<'_, T>,
    p: &RmsNorm,
    out: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let n = x.dims().last().copied().unwrap_or(0);
    check_gamma("rms_norm", n, &p.gamma)?;
    run_rows("rms_norm", isa, pool::global().threads(), p, &[*x], out, n)
}

/// `residual += x; out = rmsnorm(residual)·γ` on contiguous `[rows, n]` f32 buffers (the
/// engine's hidden state), in one pass over each row.
pub fn rms_norm_residual(
    isa: Isa,
    x: &[f32],
    residual: &mut [f32],
    p: &RmsNorm,
    out: &mut [f32],
) -> Result<()> {
    let n = p.gamma.len();
    if n == 0 || x.len() != residual.len() || x.len() != out.len() || !x.len().is_multiple_of(n) {
        return Err(Error::shape(
            "rms_norm_residual",
            format!(
                "x {}, residual {}, out {} elements for γ of {n}",
                x.len(),
                residual.len(),
                out.len()
            ),
        ));
    }
    let rows = x.len() / n;
    let (rp, op) = (
        SharedMut(residual.as_mut_ptr()),
        SharedMut(out.as_mut_ptr()),
    );
    let threads = pool::global().threads();
    let (tasks, per) = pool::row_runs(rows, n, threads);
    pool::global().run(tasks, threads, |t| {
        let (r0, r1) = (t * per, ((t + 1) * per).min(rows));
        // SAFETY: rows r0..r1 of two distinct buffers of rows·n elements; the tasks'
        // runs partition 0..rows, so each task owns its rows.
        let (h, o) = unsafe {
            (
                std::slice::from_raw_parts_mut(rp.get().add(r0 * n), (r1 - r0) * n),
                std::slice::from_raw_parts_mut(op.get().add(r0 * n), (r1 - r0) * n),
            )
        };
        for ((xr, hr), or) in x[r0 * n..r1 * n]
            .chunks_exact(n)
            .zip(h.chunks_exact_mut(n))
            .zip(o.chunks_exact_mut(n))
        {
            add_norm_row(isa, xr, hr, &p.gamma, p.eps, or);
        }
    });
    Ok(())
}

impl RowOpDesc for RmsNorm {
    type Kernel = RmsNorm;
    const NAME: &'static str = "rms_norm";
    const SUMMARY: &'static str = "RMSNorm with γ";
    const FLOPS_PER_ELEM: f64 = 4.0;
    fn tolerance(_: DType) -> Tolerance {
        TOL
    }
    fn kernel(_: usize, n: usize, rng: &mut Rng) -> RmsNorm {
        RmsNorm {
            gamma: random_in(rng, n, 0.5, 1.5).expect("small").to_vec(),
            eps: 1e-6,
        }
    }
    fn reference(k: &RmsNorm, _: usize, x: &[Vec<f64>]) -> Vec<f64> {
        let ms = x[0].iter().map(|v| v * v).sum::<f64>() / x[0].len() as f64;
        let r = 1.0 / (ms + k.eps as f64).sqrt();
        x[0].iter()
            .zip(&k.gamma)
            .map(|(v, &g)| v * r * g as f64)
            .collect()
    }
    fn device_op(k: &RmsNorm) -> Option<(RowOp, Option<&[f32]>)> {
        Some((RowOp::RmsNorm { eps: k.eps }, Some(&k.gamma)))
    }
    fn nan_reach(n: usize, _: usize) -> Option<Vec<usize>> {
        Some((0..n).collect())
    }
}

/// The fused residual form as a registry op: inputs (x, residual), output row
/// `[rmsnorm(x + residual) | x + residual]`.
#[derive(Debug, Clone)]
pub struct RmsNormResidual(pub RmsNorm);

impl RowKernel for RmsNormResidual {
    fn row(&self, isa: Isa, _row: usize, x: &[&[f32]], out: &mut [f32]) {
        let n = x[0].len();
        let (o, h) = out.split_at_mut(n);
        h.copy_from_slice(x[1]);
        add_norm_row(isa, x[0], h, &self.0.gamma, self.0.eps, o);
    }
}

impl RowOpDesc for RmsNormResidual {
    type Kernel = RmsNormResidual;
    const NAME: &'static str = "rms_norm_residual";
    const SUMMARY: &'static str = "residual add fused with RMSNorm";
    const INPUTS: usize = 2;
    const FLOPS_PER_ELEM: f64 = 5.0;
    fn tolerance(_: DType) -> Tolerance {
        TOL
    }
    fn out_len(n: usize) -> usize {
        2 * n
    }
    fn kernel(rows: usize, n: usize, rng: &mut Rng) -> RmsNormResidual {
        RmsNormResidual(RmsNorm::kernel(rows, n, rng))
    }
    fn reference(k: &RmsNormResidual, row: usize, x: &[Vec<f64>]) -> Vec<f64> {
        let h: Vec<f64> = x[0].iter().zip(&x[1]).map(|(a, b)| a + b).collect();
        let mut out = RmsNorm::reference(&k.0, row, std::slice::from_ref(&h));
        out.extend(h);
        out
    }
    fn nan_reach(n: usize, col: usize) -> Option<Vec<usize>> {
        Some((0..n).chain([n + col]).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::verify::rel_error_finite;
    use rand::Rng;

    /// The engine's fused entry against float64, row by row, at row counts on both sides
    /// of the split into per-thread runs (`pool::row_runs`: 7 × 576 values stay on one
    /// thread, 8 × 576 split) and runs of unequal length (17, 33 rows on two threads),
    /// with the output poisoned: a row skipped, done twice or shifted fails.
    #[test]
    fn residual_entry_matches_float64_on_every_split() {
        let mut rng = rand::rng();
        for n in [64, 576] {
            for rows in [1, 3, 7, 8, 16, 17, 33] {
                let mut draw = |len: usize, s: f32| -> Vec<f32> {
                    (0..len).map(|_| rng.random_range(-s..s)).collect()
                };
                let (x, r0) = (draw(rows * n, 2.0), draw(rows * n, 3.0));
                let p = RmsNorm {
                    gamma: draw(n, 1.5),
                    eps: 1e-6,
                };
                let mut residual = r0.clone();
                let mut out = vec![f32::NAN; rows * n];
                rms_norm_residual(Isa::best(), &x, &mut residual, &p, &mut out).unwrap();
                for i in 0..rows {
                    let row = i * n..(i + 1) * n;
                    let h: Vec<f64> = x[row.clone()]
                        .iter()
                        .zip(&r0[row.clone()])
                        .map(|(&a, &b)| a as f64 + b as f64)
                        .collect();
                    let ms = h.iter().map(|v| v * v).sum::<f64>() / n as f64;
                    let scale = 1.0 / (ms + p.eps as f64).sqrt();
                    let want: Vec<f64> = h
                        .iter()
                        .zip(&p.gamma)
                        .map(|(v, &g)| v * scale * g as f64)
                        .collect();
                    let as_f64 = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
                    let at = format!("{rows} rows of {n}, row {i}");
                    let e_h = rel_error_finite(&as_f64(&residual[row.clone()]), &h);
                    assert!(
                        e_h <= super::super::add::TOL.rel,
                        "{at}: residual error {e_h:.2e}"
                    );
                    let e_o = rel_error_finite(&as_f64(&out[row]), &want);
                    assert!(e_o <= TOL.rel, "{at}: output error {e_o:.2e}");
                }
            }
        }
    }

    /// Mismatched buffers are an error, not a panic or a partial write.
    #[test]
    fn residual_entry_rejects_mismatched_buffers() {
        let p = RmsNorm {
            gamma: vec![1.0; 4],
            eps: 1e-6,
        };
        let (x, mut r, mut o) = (vec![0.5f32; 8], vec![0.0f32; 8], vec![f32::NAN; 12]);
        assert!(rms_norm_residual(Isa::best(), &x, &mut r, &p, &mut o).is_err());
        assert!(r.iter().all(|&v| v == 0.0), "nothing written on error");
        let mut o = vec![0.0f32; 6];
        let (x6, mut r6) = (vec![0.5f32; 6], vec![0.0f32; 6]);
        assert!(rms_norm_residual(Isa::best(), &x6, &mut r6, &p, &mut o).is_err());
    }
}
