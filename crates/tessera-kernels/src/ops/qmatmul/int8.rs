//! Matmuls with per-channel INT8 weights ([`Int8Matrix`]):
//! - [`qmatmul_i8`]: f32 activations (W8A16). Small M: each row's codes are widened in
//!   registers once and dotted with up to `M_CHUNK` (4) activation rows (the byte-weight
//!   kernel of `byte_rows`, shared with FP8), the row scale applied once per output
//!   (Σ q·x then × scale); large M: panels dequantized into the GEMM, as
//!   for the block formats.
//! - [`qmatmul_w8a8`]: activations quantized per row to int8, integer dot products on
//!   weights packed by [`PackedWeights::from_int8`]: one kernel (`row_scaled`, for
//!   `vpmaddubsw` and `vpdpbusd`) keeps each row's dot in i32 and scales it once, since
//!   both sides have a single scale per row.

use super::byte_rows::{self, ByteCode};
use super::weight_matmul;
use super::{int8_path, ActScales, PackedWeights, Tiles};
use crate::multiversion;
use crate::quant::Int8Matrix;
use tessera_core::{Isa, Result, TensorView, TensorViewMut};

/// `y = x·Wᵀ` for INT8 weights and f32 activations.
pub fn qmatmul_i8(
    isa: Isa,
    threads: usize,
    w: &Int8Matrix,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let dequant = |r: usize, out: &mut [f32]| w.dequantize_row(r, out);
    let dots = |r: usize, xr: &[&[f32]], out: &mut [f32]| {
        let q = w.row(r);
        // SAFETY: i8 and u8 have the same size and alignment; the bytes are only read.
        let bytes = unsafe { std::slice::from_raw_parts(q.as_ptr().cast::<u8>(), q.len()) };
        if !byte_rows::dots(isa, bytes, SignedByte, xr, out) {
            row_dots_i8(isa, q, xr, out);
        }
        for o in out.iter_mut() {
            *o *= w.scales()[r];
        }
    };
    weight_matmul(isa, threads, (w.rows(), w.cols()), x, y, dequant, dots)
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
    int8_path(isa, threads, w, x, y, (ActScales::PerRow, Tiles::Auto))
}

/// INT8 codes as [`ByteCode`]s: the byte is the value.
#[derive(Clone, Copy)]
struct SignedByte;

impl ByteCode for SignedByte {
    #[inline(always)]
    fn value(self, c: u8) -> f32 {
        c as i8 as f32
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn widen8(self, c: std::arch::x86_64::__m128i) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees AVX2 (the trait's contract).
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)) }
    }
}

multiversion! {
    /// The portable kernel: `out[i] = Σ_k q[k]·x_i[k]` in f32: 16 lanes per row, which the compiler widens
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
