//! GEMM with one or two rows of A (decode): no packing, weights streamed once.
//!
//! At M ≤ 2 the product is a matrix–vector product bound by reading B, and packing B
//! (what the blocked driver does) would read it twice and write it once. With B viewed as
//! Wᵀ (column j of B contiguous: a linear layer's weight rows) each output is a dot
//! product; with B row-major each A element scales a contiguous row of B (axpy).

use super::GemmInput;
use crate::multiversion;
use crate::pool::{self, SharedMut};
use tessera_core::{Element, Isa};

/// Largest M routed here.
pub const MAX_M: usize = 2;
/// Columns per task on the dot path: 576 outputs make 18 tasks (balances over 2 threads),
/// each streaming ≥ 64 KiB of contiguous weight rows at K = 576.
const DOT_COLS: usize = 32;
/// Widest column slab on the axpy path: slabs are as wide as possible (one per thread) so
/// each B row is read as a long contiguous run, not 128-byte pieces.
const MAX_AXPY_COLS: usize = 512;

/// One row of the product: `out[j] = alpha·(x · col_j) + beta·out[j]`.
#[derive(Debug)]
pub(super) struct GemvRow<'a, T> {
    /// The row of A, widened to f32 (K).
    pub x: &'a [f32],
    /// B's buffer and strides (element (p, j) at `b[p·rs + j·cs]`).
    pub b: &'a [T],
    pub b_off: usize,
    pub rs: usize,
    pub cs: usize,
    pub n: usize,
}

multiversion! {
    /// Columns `j0..j1` for B with contiguous columns (rs == 1).
    fn dot_cols<T: GemmInput>(row: &GemvRow<'_, T>, j0: usize, j1: usize, out: &mut [f32]) {
        let k = row.x.len();
        for (j, o) in (j0..j1).zip(out.iter_mut()) {
            let col = &row.b[row.b_off + j * row.cs..row.b_off + j * row.cs + k];
            *o = crate::simd::dot(row.x, col);
        }
    }
}

multiversion! {
    /// Columns `j0..j1` for B with contiguous rows (cs == 1): accumulate `x[p]·B[p, j0..j1]`.
    fn axpy_cols<T: GemmInput>(row: &GemvRow<'_, T>, j0: usize, j1: usize, out: &mut [f32]) {
        out.fill(0.0);
        for (p, &xp) in row.x.iter().enumerate() {
            let start = row.b_off + p * row.rs + j0;
            let brow = &row.b[start..start + (j1 - j0)];
            for (o, &bv) in out.iter_mut().zip(brow) {
                *o += xp * bv.to_f32();
            }
        }
    }
}

/// Computes `C[i, :] = alpha·A[i, :]·B + beta·C[i, :]` for one row; `c` points at C[i, 0]
/// with column stride `cs_c`, valid for n elements at that stride.
pub(super) fn row<T: GemmInput>(
    isa: Isa,
    r: &GemvRow<'_, T>,
    c: SharedMut<f32>,
    cs_c: usize,
    alpha: f32,
    beta: f32,
    threads: usize,
) {
    let work = r.n * r.x.len();
    let threads = if work < 32 * 1024 { 1 } else { threads.max(1) };
    let cols = if r.rs == 1 {
        DOT_COLS
    } else {
        r.n.div_ceil(threads)
            .next_multiple_of(16)
            .min(MAX_AXPY_COLS)
    };
    let tasks = r.n.div_ceil(cols);
    pool::global().run(tasks, threads, |t| {
        let (j0, j1) = (t * cols, ((t + 1) * cols).min(r.n));
        let mut buf = [0f32; MAX_AXPY_COLS];
        let out = &mut buf[..j1 - j0];
        if r.rs == 1 {
            dot_cols(isa, r, j0, j1, out);
        } else {
            axpy_cols(isa, r, j0, j1, out);
        }
        for (jj, &v) in out.iter().enumerate() {
            // SAFETY: j0+jj < n and the caller guarantees n elements at stride cs_c; tasks
            // write disjoint column ranges.
            unsafe {
                let p = c.get().add((j0 + jj) * cs_c);
                *p = if beta == 0.0 {
                    alpha * v
                } else {
                    alpha * v + beta * *p
                };
            }
        }
    });
}

/// Widens row `i` of a strided A into `dst` (K elements).
pub(super) fn widen_row<T: Element>(a: &[T], off: usize, cs: usize, dst: &mut [f32]) {
    for (p, d) in dst.iter_mut().enumerate() {
        *d = a[off + p * cs].to_f32();
    }
}
