//! Small-M dot products for weights stored one byte per weight (FP8 codes, INT8) with
//! f32 activations: the explicit AVX2+FMA kernel both formats share, generic over how a
//! byte becomes an f32 ([`ByteCode`]).
//!
//! Each step widens U units of 16 bytes to 2·U ymm of f32 once and FMAs them into every
//! activation row (up to M_CHUNK), with 2·U independent accumulators per row: 1–2 rows
//! take U = 2, four FMA chains against the FMA latency (FP8 1×49152×576: 2.7–3.4 ms,
//! from 3.1–5.4 with the compiler's two-chain loop), 3–4 rows U = 1 so R·2U
//! accumulators + 2U weights fit the 16 ymm registers.
//! AVX-512 machines run it too: the op is bound by memory, not by vector width. The
//! compiler's own vectorization of the same loops proved fragile (one more unrolled
//! chunk turned it back into scalar code), hence the intrinsics.

use tessera_core::Isa;

/// How a weight byte becomes its f32 value (before the row's scale).
pub(super) trait ByteCode: Copy {
    fn value(self, c: u8) -> f32;
    /// The low 8 bytes of `c` widened to 8 f32 values.
    ///
    /// # Safety
    /// AVX2 must be available.
    #[cfg(target_arch = "x86_64")]
    unsafe fn widen8(self, c: std::arch::x86_64::__m128i) -> std::arch::x86_64::__m256;
}

/// Runs the AVX2 kernel when `isa` allows it (AVX2 or AVX-512, available); false when it
/// did not run and the caller's portable kernel must.
pub(super) fn dots<B: ByteCode>(
    isa: Isa,
    codes: &[u8],
    b: B,
    x: &[&[f32]],
    out: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && isa.is_available() {
        assert!(x.len() == out.len() && x.iter().all(|r| r.len() >= codes.len()));
        // SAFETY: AVX2 and FMA are available (both ISAs imply them); the lengths were
        // checked just above.
        unsafe {
            match x.len() {
                1 => avx2::<B, 1, 2>(codes, b, x, out),
                2 => avx2::<B, 2, 2>(codes, b, x, out),
                3 => avx2::<B, 3, 1>(codes, b, x, out),
                _ => avx2::<B, { super::M_CHUNK }, 1>(codes, b, x, out),
            }
        }
        return true;
    }
    let _ = (isa, codes, b, x, out);
    false
}

/// Σ over the codes from `from` on, in scalar code.
#[inline(always)]
pub(super) fn tail<B: ByteCode>(codes: &[u8], from: usize, b: B, xr: &[f32]) -> f32 {
    codes[from..]
        .iter()
        .zip(&xr[from..])
        .map(|(&c, &v)| b.value(c) * v)
        .sum()
}

/// # Safety
/// AVX2 and FMA must be available; `x.len() == R == out.len()` and every x row holds at
/// least `codes.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<B: ByteCode, const R: usize, const U: usize>(
    codes: &[u8],
    b: B,
    x: &[&[f32]],
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let step = 16 * U;
    let full = codes.len() / step * step;
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    let mut k = 0;
    while k < full {
        let mut w = [_mm256_setzero_ps(); 4];
        for u in 0..U {
            // SAFETY: k + 16u + 16 ≤ full ≤ codes.len(); AVX2 per the contract.
            unsafe {
                let c = _mm_loadu_si128(codes.as_ptr().add(k + 16 * u).cast());
                w[2 * u] = b.widen8(c);
                w[2 * u + 1] = b.widen8(_mm_srli_si128::<8>(c));
            }
        }
        for (a, xr) in acc.iter_mut().zip(x) {
            for j in 0..2 * U {
                // SAFETY: k + 8j + 8 ≤ full ≤ codes.len() ≤ xr.len().
                let xv = unsafe { _mm256_loadu_ps(xr.as_ptr().add(k + 8 * j)) };
                a[j] = _mm256_fmadd_ps(w[j], xv, a[j]);
            }
        }
        k += step;
    }
    for ((o, a), xr) in out.iter_mut().zip(&acc).zip(x) {
        let mut v = a[0];
        for part in &a[1..2 * U] {
            v = _mm256_add_ps(v, *part);
        }
        let mut lanes = [0f32; 8];
        // SAFETY: lanes holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        *o = lanes.iter().sum::<f32>() + tail(codes, full, b, xr);
    }
}
