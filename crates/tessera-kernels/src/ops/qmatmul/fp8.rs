//! Matmul with FP8 weights ([`Fp8Matrix`]) and f32 activations (W8A16 in FP8).
//!
//! Decoding needs no table: an FP8 code's exponent and mantissa bits, shifted into the
//! top of an f32 (`sign << 24 | rest << shift`), are an f32 whose value is the code's
//! value times 2^-(127−bias) — for subnormal codes too, which land on f32 subnormals
//! with the same mantissa. One multiply by 2^(127−bias) restores the value exactly
//! (before the products, so nothing tiny is ever multiplied into the sums). That is a
//! few integer ops and one multiply per 8 weights: the AVX2 byte-weight kernel shared
//! with INT8 (`byte_rows`) on x86, a portable loop elsewhere. Each row's sum gets its
//! scale once at the end.
//! NaN/∞ codes decode to finite garbage here, but their rows carry a NaN scale.
//!
//! Large M goes through the shared prefill path (rows dequantized into the f32 GEMM).

use super::byte_rows::{self, ByteCode};
use super::{weight_matmul, M_CHUNK};
use crate::multiversion;
use crate::quant::fp8::Fp8;
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
    // (left shift of the 7 magnitude bits, 2^(127 − bias)).
    let (shift, pow) = match w.format() {
        Fp8::E4M3 => (20, 2f32.powi(120)),
        Fp8::E5M2 => (21, 2f32.powi(112)),
    };
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
        let c = c as u32;
        f32::from_bits(((c & 0x80) << 24) | ((c & 0x7F) << self.shift)) * self.pow
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_placement_decodes_every_finite_code_exactly() {
        for (f, shift, pow) in [
            (Fp8::E4M3, 20, 2f32.powi(120)),
            (Fp8::E5M2, 21, 2f32.powi(112)),
        ] {
            for c in 0..=255u8 {
                let v = f.decode(c);
                if v.is_finite() {
                    assert_eq!(
                        Decode { shift, pow }.value(c).to_bits(),
                        v.to_bits(),
                        "{f:?} {c:#x}"
                    );
                }
            }
        }
    }
}
