//! AVX2 expansion of the K-quants for the small-M f32-activation kernel (`super::avx2`).
//!
//! Before it, AVX2 hosts ran K-quant weights through the portable loop at 3–7 % of
//! DRAM (`tessera bench qmatmul --dtype q4_k --variant avx2`), so a Q4_K_M model
//! decoded an order of magnitude slower than a Q4_0 one unless `--int8-acts` was on.
//!
//! The AVX-512 expansion (`super::avx512_k`) at half the width: per super-block the 16
//! half-sub-block (d, m) pairs are decoded once in scalar code
//! ([`KQuant::half_scales`]); per 8 weights, the codes come out of their bit planes
//! with a byte→dword widening load, a shift and a mask, and become f32 as
//! `(u − o)·d (+ m)`. `d·(u − o)` is exact in f32 (≤ 17-bit scale × ≤ 6-bit code), so
//! the fused `+ m` rounds once, as the scalar dequantizer's separate add does: the
//! values are bit-identical to [`crate::quant::BlockFormat::dequantize`].

use super::avx2::Expand8;
use crate::quant::{BlockFormat, KQuant, QK};
use crate::quant::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use std::arch::x86_64::*;

/// Bytes `p[8j..8j + 8]` widened to 8 × u32.
///
/// # Safety
/// AVX2; `p` holds 8j + 8 bytes.
#[inline(always)]
unsafe fn widen(p: &[u8], j: usize) -> __m256i {
    debug_assert!(p.len() >= 8 * j + 8);
    // SAFETY: 8 bytes at 8j per the contract.
    unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.as_ptr().add(8 * j).cast())) }
}

/// `(v >> shift) & mask` per lane.
#[inline(always)]
unsafe fn field(v: __m256i, shift: u32, mask: i32) -> __m256i {
    // SAFETY: AVX2 per the caller.
    unsafe {
        _mm256_and_si256(
            _mm256_srl_epi32(v, _mm_cvtsi32_si128(shift as i32)),
            _mm256_set1_epi32(mask),
        )
    }
}

/// `low | ((hi >> bit) & mask) << to`: a code's top bit (or bits) from a separate
/// plane.
#[inline(always)]
unsafe fn with_top(low: __m256i, hi: __m256i, bit: u32, mask: i32, to: i32) -> __m256i {
    // SAFETY: AVX2 per the caller.
    unsafe {
        let top = field(hi, bit, mask);
        _mm256_or_si256(low, _mm256_sll_epi32(top, _mm_cvtsi32_si128(to)))
    }
}

/// The unsigned codes of weights 8j..8j + 8 of chunk c (32 weights), as i32 lanes.
trait Codes8 {
    /// # Safety
    /// AVX2; c < 8, j < 4.
    unsafe fn codes8(&self, c: usize, j: usize) -> __m256i;
}

/// Chunk c's 2-bit codes (Q2_K, and Q3_K's low bits): plane 2·(c mod 4) of bytes
/// 32·(c/4)..+32 of `qs`.
///
/// # Safety
/// AVX2; `qs` is a K-quant's 64 code bytes; c < 8, j < 4.
#[inline(always)]
unsafe fn crumbs(qs: &[u8], c: usize, j: usize) -> __m256i {
    // SAFETY: those bytes are inside qs; AVX2 per the contract.
    unsafe { field(widen(&qs[32 * (c / 4)..], j), 2 * (c % 4) as u32, 3) }
}

/// Chunk c's 4-bit codes (Q4_K, and Q5_K's low bits): chunks 2s and 2s + 1 are the low
/// and high nibbles of bytes 32s..+32 of `qs`.
///
/// # Safety
/// AVX2; `qs` is a K-quant's 128 code bytes; c < 8, j < 4.
#[inline(always)]
unsafe fn nibbles(qs: &[u8], c: usize, j: usize) -> __m256i {
    // SAFETY: those bytes are inside qs; AVX2 per the contract.
    unsafe { field(widen(&qs[32 * (c / 2)..], j), 4 * (c % 2) as u32, 0xF) }
}

impl Codes8 for BlockQ2K {
    #[inline(always)]
    unsafe fn codes8(&self, c: usize, j: usize) -> __m256i {
        // SAFETY: forwarded contract.
        unsafe { crumbs(&self.qs, c, j) }
    }
}

impl Codes8 for BlockQ3K {
    #[inline(always)]
    unsafe fn codes8(&self, c: usize, j: usize) -> __m256i {
        // Bit c of hmask[i] is the third bit.
        // SAFETY: hmask is 32 bytes; AVX2 per the contract.
        unsafe {
            let low = crumbs(&self.qs, c, j);
            with_top(low, widen(&self.hmask, j), c as u32, 1, 2)
        }
    }
}

impl Codes8 for BlockQ4K {
    #[inline(always)]
    unsafe fn codes8(&self, c: usize, j: usize) -> __m256i {
        // SAFETY: forwarded contract.
        unsafe { nibbles(&self.qs, c, j) }
    }
}

impl Codes8 for BlockQ5K {
    #[inline(always)]
    unsafe fn codes8(&self, c: usize, j: usize) -> __m256i {
        // Bit c of qh[i] is the fifth bit.
        // SAFETY: qh is 32 bytes; AVX2 per the contract.
        unsafe { with_top(nibbles(&self.qs, c, j), widen(&self.qh, j), c as u32, 1, 4) }
    }
}

impl Codes8 for BlockQ6K {
    #[inline(always)]
    unsafe fn codes8(&self, c: usize, j: usize) -> __m256i {
        // Chunk 4g + k: low nibbles of ql[64g..] (k = 0) or ql[64g + 32..] (k = 1), the
        // high nibbles of the same for k = 2, 3; the top two bits are bits 2k of
        // qh[32g..].
        let (g, k) = (c / 4, c % 4);
        // SAFETY: ql bytes 64g + 32·(k mod 2)..+32 and qh bytes 32g..+32 are inside
        // their arrays; AVX2 per the contract.
        unsafe {
            let ql = widen(&self.ql[64 * g + 32 * (k % 2)..], j);
            let low = field(ql, 4 * (k / 2) as u32, 0xF);
            with_top(low, widen(&self.qh[32 * g..], j), 2 * k as u32, 3, 4)
        }
    }
}

impl Codes8 for BlockQ8K {
    #[inline(always)]
    unsafe fn codes8(&self, c: usize, j: usize) -> __m256i {
        // Signed bytes; u = q + 128 (the format's offset).
        let q = &self.qs[QK * c + 8 * j..][..8];
        // SAFETY: 8 bytes of qs; AVX2 per the contract.
        unsafe {
            let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().cast()));
            _mm256_add_epi32(v, _mm256_set1_epi32(128))
        }
    }
}

/// Codes u as f32: `(u − o)·d (+ m)`.
#[inline(always)]
unsafe fn scaled<B: KQuant>(u: __m256i, (d, m): (f32, f32)) -> __m256 {
    // SAFETY: AVX2/FMA per the caller.
    unsafe {
        let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(u, _mm256_set1_epi32(B::OFFSET)));
        if B::HAS_MIN {
            _mm256_fmadd_ps(v, _mm256_set1_ps(d), _mm256_set1_ps(m))
        } else {
            _mm256_mul_ps(v, _mm256_set1_ps(d))
        }
    }
}

macro_rules! expand_k {
    ($($t:ty),*) => {$(
        impl Expand8 for $t {
            const STEPS: usize = <$t as BlockFormat>::BLOCK / QK;
            type Prep = [(f32, f32); 16];
            #[inline(always)]
            unsafe fn prepare(&self) -> Self::Prep {
                self.half_scales()
            }
            #[inline(always)]
            unsafe fn expand(&self, sc: &Self::Prep, c: usize) -> [__m256; 4] {
                // SAFETY: forwarded contract (c < STEPS = 8, j < 4); weights 8j..8j + 8
                // belong to half j / 2 of the chunk.
                unsafe {
                    [
                        scaled::<$t>(self.codes8(c, 0), sc[2 * c]),
                        scaled::<$t>(self.codes8(c, 1), sc[2 * c]),
                        scaled::<$t>(self.codes8(c, 2), sc[2 * c + 1]),
                        scaled::<$t>(self.codes8(c, 3), sc[2 * c + 1]),
                    ]
                }
            }
        }
    )*};
}
expand_k!(BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K);
