//! Matmuls with per-channel INT8 weights ([`Int8Matrix`]):
//! - [`qmatmul_i8`]: f32 activations (W8A16). Small M: each row's codes are widened in
//!   registers and dotted with up to [`M_CHUNK`] activation rows, the row scale applied
//!   once per output (Σ q·x then × scale); large M: panels dequantized into the GEMM, as
//!   for the block formats.
//! - [`qmatmul_w8a8`]: activations quantized per row to int8, integer dot products
//!   (`vpdpbusd` with AVX512_VNNI) on weights packed by [`PackedWeights::from_int8`].

use super::{check_shapes, contiguous_rows, for_weight_rows, prefill, M_CHUNK, SMALL_M};
use super::{int8_path, ActScales, PackedWeights};
use crate::multiversion;
use crate::quant::Int8Matrix;
use tessera_core::{Error, Isa, Result, TensorView, TensorViewMut};

/// `y = x·Wᵀ` for INT8 weights and f32 activations.
pub fn qmatmul_i8(
    isa: Isa,
    threads: usize,
    w: &Int8Matrix,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    let (m, n) = check_shapes(x, y, w.rows(), w.cols())?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if m > SMALL_M {
        let dequant = |r: usize, out: &mut [f32]| {
            let s = w.scales()[r];
            for (o, &q) in out.iter_mut().zip(w.row(r)) {
                *o = q as f32 * s;
            }
        };
        return prefill(isa, threads, (n, w.cols()), dequant, x, y);
    }
    let k = w.cols();
    let (xs, ld) = contiguous_rows(x);
    for_weight_rows(threads, n, m, y, |r, m0, mc, out| {
        let xr: [&[f32]; M_CHUNK] = std::array::from_fn(|i| &xs[(m0 + i.min(mc - 1)) * ld..][..k]);
        row_dots_i8(isa, w.row(r), &xr[..mc], out);
        for o in out.iter_mut() {
            *o *= w.scales()[r];
        }
    });
    Ok(())
}

/// `y = x·Wᵀ` in W8A8: each activation row quantized to int8 with one scale, integer
/// dot products, `d_x·scale` per output. Error: see `TOL_INT8`.
pub fn qmatmul_w8a8(
    isa: Isa,
    threads: usize,
    w: &PackedWeights,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    int8_path(isa, threads, w, x, y, ActScales::PerRow)
}

multiversion! {
    /// `out[i] = Σ_k q[k]·x_i[k]` in f32: 16 lanes per row, which the compiler widens
    /// (i8 → i32 → f32) and fuses per ISA.
    fn row_dots_i8(q: &[i8], x: &[&[f32]], out: &mut [f32]) {
        for (o, xr) in out.iter_mut().zip(x) {
            let mut acc = [0f32; 16];
            for (qc, xc) in q.chunks_exact(16).zip(xr.chunks_exact(16)) {
                for j in 0..16 {
                    acc[j] += qc[j] as f32 * xc[j];
                }
            }
            *o = crate::simd::hsum(acc);
        }
    }
}
