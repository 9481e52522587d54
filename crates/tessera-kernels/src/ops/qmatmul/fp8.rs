//! Matmul with FP8 weights ([`Fp8Matrix`]) and f32 activations (W8A16 in FP8).
//!
//! Decoding needs no table: [`Fp8::placement`](crate::quant::fp8::Fp8::placement)
//! puts a code's bits into an f32 and one exact multiply restores its value (subnormals
//! included). That is a few integer ops and one multiply per 8 weights: the AVX2
//! byte-weight kernel shared with INT8 (`byte_rows`) on x86, a portable loop elsewhere.
//! Each row's sum gets its scale once at the end. NaN/∞ codes decode to finite values
//! here, but their rows carry a NaN scale.
//!
//! Large M goes through the shared prefill path (rows dequantized into the f32 GEMM).

use super::byte_rows::{self, ByteCode};
use super::{weight_matmul, M_CHUNK};
use crate::multiversion;
use crate::quant::fp8::placed;
use crate::quant::Fp8Matrix;
use tessera_core::{Isa, Result, TensorView, TensorViewMut};

/// `y = x·Wᵀ` for FP8 weights and f32 activations. Error: see `TOL`.
pub fn qmatmul_fp8(
    isa: Isa,
    threads: usize,
    w: &Fp8Matrix,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let (shift, pow) = w.format().placement();
    let dequant = |r: usize, out: &mut [f32]| w.dequantize_row(r, out);
    let dots = |r: usize, xr: &[&[f32]], out: &mut [f32]| {
        row_dots_fp8(isa, w.row(r), Decode { shift, pow }, xr, out);
        for o in out.iter_mut() {
            *o *= w.scales()[r];
        }
    };
    weight_matmul(isa, threads, (w.rows(), w.cols()), x, y, dequant, dots)
}

/// `out[i] = Σ_k value(codes[k])·x_i[k]` for up to M_CHUNK rows of x.
fn row_dots_fp8(isa: Isa, codes: &[u8], d: Decode, x: &[&[f32]], out: &mut [f32]) {
    if !byte_rows::dots(isa, codes, d, x, out) {
        row_dots_portable(isa, codes, d, x, out)
    }
}

/// FP8 codes as [`ByteCode`]s: the bit placement of the module docs.
#[derive(Clone, Copy)]
struct Decode {
    shift: u32,
    pow: f32,
}

impl ByteCode for Decode {
    #[inline(always)]
    fn value(self, c: u8) -> f32 {
        placed(c, self.shift, self.pow)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn widen8(self, c: std::arch::x86_64::__m128i) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees AVX2 (the trait's contract).
        unsafe {
            let v = _mm256_cvtepu8_epi32(c);
            let bits = _mm256_or_si256(
                _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24),
                _mm256_sll_epi32(
                    _mm256_and_si256(v, _mm256_set1_epi32(0x7F)),
                    _mm_cvtsi32_si128(self.shift as i32),
                ),
            );
            _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(self.pow))
        }
    }
}

multiversion! {
    /// The portable kernel: 16 weights decoded per step, shared by the rows.
    fn row_dots_portable(codes: &[u8], d: Decode, x: &[&[f32]], out: &mut [f32]) {
        const L: usize = 16;
        let mut acc = [[0f32; L]; M_CHUNK];
        let full = codes.len() / L * L;
        for (step, chunk) in codes.chunks_exact(L).enumerate() {
            // A plain loop: array::from_fn is not inlined into the target_feature copies.
            let mut w = [0f32; L];
            for j in 0..L {
                w[j] = d.value(chunk[j]);
            }
            for (a, xr) in acc.iter_mut().zip(x) {
                let xc = &xr[step * L..][..L];
                for j in 0..L {
                    a[j] += w[j] * xc[j];
                }
            }
        }
        for ((o, a), xr) in out.iter_mut().zip(&acc).zip(x) {
            *o = crate::simd::hsum(*a) + byte_rows::tail(codes, full, d, xr);
        }
    }
}
