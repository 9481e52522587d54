//! AVX-512 expansion of the K-quants for the small-M kernel (`super::avx512`).
//!
//! Per super-block, the 16 half-sub-block (d, m) pairs are decoded once in scalar code
//! ([`KQuant::half_scales`]); per 16-weight half, the codes are pulled out of their bit
//! planes with a byte→dword widening load, a variable shift and a mask, and turned into
//! f32 as `(u − o)·d (+ m)`. `d·(u − o)` is exact in f32 (≤ 17-bit scale × ≤ 6-bit code),
//! so the fused `+ m` rounds once, as the scalar dequantizer's separate add does: the
//! values are bit-identical to [`crate::quant::BlockFormat::dequantize`].

use super::avx512::Expand;
use crate::quant::{BlockFormat, KQuant, QK};
use crate::quant::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use std::arch::x86_64::*;

/// 16 bytes at `p` widened to 16 × u32.
#[inline(always)]
unsafe fn widen(p: &[u8]) -> __m512i {
    debug_assert!(p.len() >= 16);
    // SAFETY: p holds ≥ 16 bytes (callers slice 16 at a 16-byte step inside the block);
    // AVX-512F per the caller.
    unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.as_ptr() as *const __m128i)) }
}

/// `(v >> shift) & mask` per lane.
#[inline(always)]
unsafe fn field(v: __m512i, shift: usize, mask: i32) -> __m512i {
    // SAFETY: AVX-512F per the caller.
    unsafe {
        _mm512_and_si512(
            _mm512_srlv_epi32(v, _mm512_set1_epi32(shift as i32)),
            _mm512_set1_epi32(mask),
        )
    }
}

/// The unsigned codes of chunks 2s and 2s+1, half h (16 weights each), as i32 lanes:
/// the two chunks of a pair share their bytes (different nibbles or bit planes), so one
/// widening load feeds both.
trait CodesPair {
    /// # Safety
    /// AVX-512F must be available; s < 4, h < 2.
    unsafe fn codes(&self, s: usize, h: usize) -> [__m512i; 2];
}

impl CodesPair for BlockQ2K {
    #[inline(always)]
    unsafe fn codes(&self, s: usize, h: usize) -> [__m512i; 2] {
        // Chunk c's 2-bit plane: bits 2·(c mod 4) of bytes 32·(c/4) + ...
        let c = 2 * s;
        // SAFETY: bytes 32·(c/4) + 16h.. are inside qs; AVX-512F per the caller.
        unsafe {
            let v = widen(&self.qs[32 * (c / 4) + 16 * h..]);
            [field(v, 2 * (c % 4), 3), field(v, 2 * (c % 4) + 2, 3)]
        }
    }
}

impl CodesPair for BlockQ3K {
    #[inline(always)]
    unsafe fn codes(&self, s: usize, h: usize) -> [__m512i; 2] {
        let c = 2 * s;
        // SAFETY: as Q2_K; hmask bytes 16h.. are inside hmask.
        unsafe {
            let v = widen(&self.qs[32 * (c / 4) + 16 * h..]);
            let hm = widen(&self.hmask[16 * h..]);
            let with_high =
                |low, bit| _mm512_or_si512(low, _mm512_slli_epi32::<2>(field(hm, bit, 1)));
            [
                with_high(field(v, 2 * (c % 4), 3), c),
                with_high(field(v, 2 * (c % 4) + 2, 3), c + 1),
            ]
        }
    }
}

impl CodesPair for BlockQ4K {
    #[inline(always)]
    unsafe fn codes(&self, s: usize, h: usize) -> [__m512i; 2] {
        // SAFETY: bytes 32s + 16h.. are inside qs; AVX-512F per the caller.
        unsafe {
            let v = widen(&self.qs[32 * s + 16 * h..]);
            [
                _mm512_and_si512(v, _mm512_set1_epi32(0xF)),
                _mm512_srli_epi32::<4>(v),
            ]
        }
    }
}

impl CodesPair for BlockQ5K {
    #[inline(always)]
    unsafe fn codes(&self, s: usize, h: usize) -> [__m512i; 2] {
        // SAFETY: as Q4_K; qh bytes 16h.. are inside qh.
        unsafe {
            let v = widen(&self.qs[32 * s + 16 * h..]);
            let hb = widen(&self.qh[16 * h..]);
            let five = |low, bit| _mm512_or_si512(low, _mm512_slli_epi32::<4>(field(hb, bit, 1)));
            [
                five(_mm512_and_si512(v, _mm512_set1_epi32(0xF)), 2 * s),
                five(_mm512_srli_epi32::<4>(v), 2 * s + 1),
            ]
        }
    }
}

impl CodesPair for BlockQ6K {
    #[inline(always)]
    unsafe fn codes(&self, s: usize, h: usize) -> [__m512i; 2] {
        // Chunks 4g + k and 4g + k + 1 (k even): low nibbles of ql[64g + 16h..] and
        // ql[64g + 32 + 16h..] (high nibbles when k = 2), top bits from one qh load.
        let (g, k) = (s / 2, 2 * (s % 2));
        // SAFETY: ql bytes 64g + 16h.. (+32) and qh bytes 32g + 16h.. are inside their
        // arrays; AVX-512F per the caller.
        unsafe {
            let qh = widen(&self.qh[32 * g + 16 * h..]);
            let six = |ql: &[u8], kk: usize| {
                let low = field(widen(ql), 4 * (kk / 2), 0xF);
                _mm512_or_si512(low, _mm512_slli_epi32::<4>(field(qh, 2 * kk, 3)))
            };
            [
                six(&self.ql[64 * g + 16 * h..], k),
                six(&self.ql[64 * g + 32 + 16 * h..], k + 1),
            ]
        }
    }
}

impl CodesPair for BlockQ8K {
    #[inline(always)]
    unsafe fn codes(&self, s: usize, h: usize) -> [__m512i; 2] {
        let q = |c: usize| {
            let q = &self.qs[QK * c + 16 * h..][..16];
            // SAFETY: 16 bytes of qs; AVX-512F per the caller.
            unsafe {
                let v = _mm512_cvtepi8_epi32(_mm_loadu_si128(q.as_ptr() as *const __m128i));
                _mm512_add_epi32(v, _mm512_set1_epi32(128))
            }
        };
        [q(2 * s), q(2 * s + 1)]
    }
}

/// Codes u of sub-block half `half` as f32: `(u − o)·d (+ m)`.
#[inline(always)]
unsafe fn scaled<B: KQuant>(u: __m512i, (d, m): (f32, f32)) -> __m512 {
    // SAFETY: AVX-512F per the caller.
    unsafe {
        let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(u, _mm512_set1_epi32(B::OFFSET)));
        if B::HAS_MIN {
            _mm512_fmadd_ps(v, _mm512_set1_ps(d), _mm512_set1_ps(m))
        } else {
            _mm512_mul_ps(v, _mm512_set1_ps(d))
        }
    }
}

macro_rules! expand_k {
    ($($t:ty),*) => {$(
        impl Expand for $t {
            const STEPS: usize = <$t as BlockFormat>::BLOCK / (2 * QK);
            type Prep = [(f32, f32); 16];
            type Out = [__m512; 4];
            #[inline(always)]
            unsafe fn prepare(&self) -> Self::Prep {
                self.half_scales()
            }
            #[inline(always)]
            unsafe fn step(&self, sc: &Self::Prep, s: usize) -> [__m512; 4] {
                // SAFETY: forwarded contract (s < STEPS = 4).
                unsafe {
                    let [a0, b0] = CodesPair::codes(self, s, 0);
                    let [a1, b1] = CodesPair::codes(self, s, 1);
                    let c = 2 * s;
                    // Element order: chunk c halves 0, 1, then chunk c + 1.
                    [
                        scaled::<$t>(a0, sc[2 * c]),
                        scaled::<$t>(a1, sc[2 * c + 1]),
                        scaled::<$t>(b0, sc[2 * c + 2]),
                        scaled::<$t>(b1, sc[2 * c + 3]),
                    ]
                }
            }
        }
    )*};
}
expand_k!(BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K);
