//! Quantized matmul `y = x·Wᵀ`: f32 activations `x [M, K]`, weights `W [N, K]` kept in a
//! ggml block format, `y [M, N]` in f32.
//!
//! Two regimes, split at [`SMALL_M`]:
//! - **decode / small batch** (M ≤ 16): memory-bound on the weights. Each block is read
//!   once from memory, dequantized once into registers, and multiplied into up to
//!   [`M_CHUNK`] activation rows; threads split N. An explicit AVX-512 kernel expands the
//!   nibbles/bytes with `vpmovzxbd`/`vpmovsxbd` and FMA-accumulates per block.
//! - **prefill** (M > 16): compute-bound. Panels of [`PANEL_ROWS`] weight rows are
//!   dequantized to f32 and handed to the f32 GEMM, so the dequantization cost is
//!   amortised over M rows and the GEMM's register tiling does the work.
//!
//! Dequantization here is exactly the format's definition (the same f32 values
//! [`QuantMatrix::dequantize`] gives), so the only error is f32 accumulation.

mod spec;

pub use spec::{QMatmulOp, QMatmulProblem, TOL};

use super::gemm::{default_blocking, gemm_with, GemmParams};
use crate::multiversion;
use crate::pool::{self, SharedMut};
use crate::quant::{BlockFormat, QuantMatrix, QK};
use tessera_core::{Error, Isa, Layout, Result, TensorView, TensorViewMut};

/// Largest M that takes the per-block (GEMV-like) path.
pub const SMALL_M: usize = 16;
/// Activation rows sharing one dequantized block (2 zmm accumulators each).
const M_CHUNK: usize = 4;
/// Fewest weight rows per task on the small-M path (~5 KiB of Q4_0 blocks at K = 576).
const ROWS_PER_TASK: usize = 16;
/// Weight rows dequantized per GEMM call on the prefill path (≤ 1.5 MiB f32 at K = 1536).
const PANEL_ROWS: usize = 256;

/// `y = x·Wᵀ` on a chosen ISA and thread count.
pub fn qmatmul<B: BlockFormat>(
    isa: Isa,
    threads: usize,
    w: &QuantMatrix<B>,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    const OP: &str = "qmatmul";
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    if x.rank() != 2 || y.rank() != 2 {
        return Err(Error::Rank {
            op: OP,
            expected: "2 ([M, K] activations and [M, N] output)".into(),
            got: if x.rank() != 2 { x.rank() } else { y.rank() },
        });
    }
    let (m, k, n) = (x.dims()[0], x.dims()[1], w.rows());
    if k != w.cols() || y.dims() != [m, n] {
        return Err(Error::shape(
            OP,
            format!(
                "x {:?} · W[{n}, {}]ᵀ → y {:?} (want [{m}, {n}])",
                x.dims(),
                w.cols(),
                y.dims()
            ),
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if m > SMALL_M {
        return prefill(isa, threads, w, x, y);
    }
    // Rows of x contiguous (copy when strided: M ≤ 16 rows, cheap next to the weights).
    let xl = *x.layout();
    let owned: Vec<f32>;
    let (xs, ld) = if xl.stride(1) == 1 {
        (&x.data()[xl.offset()..], xl.stride(0))
    } else {
        owned = (0..m * k)
            .map(|i| x.get(&[i / k, i % k]).unwrap_or(f32::NAN))
            .collect();
        (&owned[..], k)
    };
    let yl = *y.layout();
    let yptr = SharedMut(y.data_mut().as_mut_ptr());
    // One contiguous run of weight rows per thread: long sequential streams keep the
    // hardware prefetchers ahead (interleaved 16-row tasks left them restarting).
    let per_task = n.div_ceil(threads.max(1)).max(ROWS_PER_TASK);
    pool::global().run(n.div_ceil(per_task), threads.max(1), |t| {
        let rows = t * per_task..((t + 1) * per_task).min(n);
        for r in rows {
            let wr = w.row(r);
            let mut m0 = 0;
            while m0 < m {
                let mc = M_CHUNK.min(m - m0);
                let xr: [&[f32]; M_CHUNK] =
                    std::array::from_fn(|i| &xs[(m0 + i.min(mc - 1)) * ld..][..k]);
                let mut out = [0f32; M_CHUNK];
                row_dots(isa, wr, &xr[..mc], &mut out[..mc]);
                for (i, v) in out[..mc].iter().enumerate() {
                    // SAFETY: (m0+i, r) is inside the validated, non-overlapping y view;
                    // each weight row r belongs to exactly one task.
                    unsafe { *yptr.get().add(yl.index_of(&[m0 + i, r])) = *v };
                }
                m0 += mc;
            }
        }
    });
    Ok(())
}

/// `out[i] = Σ_b block_b · x_i[b·32..]` for one weight row and up to M_CHUNK rows of x.
fn row_dots<B: BlockFormat>(isa: Isa, w: &[B], x: &[&[f32]], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && isa.is_available() {
        // SAFETY: AVX-512F detected; slices as documented on the kernel.
        if unsafe { avx512::row_dots(w, x, out) } {
            return;
        }
    }
    row_dots_portable(isa, w, x, out)
}

multiversion! {
    fn row_dots_portable<B: BlockFormat>(w: &[B], x: &[&[f32]], out: &mut [f32]) {
        let mut acc = [[0f32; QK]; M_CHUNK];
        let mut dq = [0f32; QK];
        for (b, blk) in w.iter().enumerate() {
            blk.dequantize(&mut dq);
            for (a, xr) in acc.iter_mut().zip(x) {
                let xb: &[f32; QK] = xr[b * QK..][..QK].try_into().expect("QK-wide block");
                for j in 0..QK {
                    a[j] += dq[j] * xb[j];
                }
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            let mut l16 = [0f32; 16];
            for j in 0..16 {
                l16[j] = a[j] + a[j + 16];
            }
            *o = crate::simd::hsum(l16);
        }
    }
}

/// M > SMALL_M: dequantize panels of weight rows and run the f32 GEMM on each.
fn prefill<B: BlockFormat>(
    isa: Isa,
    threads: usize,
    w: &QuantMatrix<B>,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let (k, n, m) = (w.cols(), w.rows(), x.dims()[0]);
    let mut blocking = default_blocking(isa);
    blocking.threads = threads.max(1);
    let mut panel = vec![0f32; PANEL_ROWS.min(n) * k];
    let yl = *y.layout();
    let mut n0 = 0;
    while n0 < n {
        let np = PANEL_ROWS.min(n - n0);
        let pw = &mut panel[..np * k];
        let per_row = k / QK;
        let blocks = &w.blocks()[n0 * per_row..(n0 + np) * per_row];
        let dst = SharedMut(pw.as_mut_ptr());
        pool::global().run(np.div_ceil(ROWS_PER_TASK), threads.max(1), |t| {
            let rows = t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(np);
            for (i, blk) in blocks[rows.start * per_row..rows.end * per_row]
                .iter()
                .enumerate()
            {
                // SAFETY: task t writes only its own rows of the panel: block i of them
                // is the 32 floats at (rows.start·per_row + i)·QK < np·k.
                let out = unsafe {
                    &mut *(dst.get().add((rows.start * per_row + i) * QK) as *mut [f32; QK])
                };
                blk.dequantize(out);
            }
        });
        let wt = TensorView::contiguous(&panel[..np * k], &[np, k])?.transposed(0, 1)?;
        let sub = Layout::strided(
            &[m, np],
            &[yl.stride(0), yl.stride(1)],
            yl.index_of(&[0, n0]),
        )?;
        let mut ys = TensorViewMut::new(y.data_mut(), sub)?;
        gemm_with(isa, blocking, x, &wt, &mut ys, GemmParams::default())?;
        n0 += np;
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod avx512;
