//! Every block format's weights as f32 vectors, written once over the vector width
//! ([`Lanes`]): the expansion the small-M f32-activation kernel (`super::simd_rows`)
//! FMAs against activations, instantiated for NEON (4 lanes), AVX2 (8) and AVX-512
//! (16).
//!
//! A block is `STEPS` chunks of 32 weights; [`Expand::part`] gives weights
//! `at..at + N` of chunk c. Codes come out of their bit planes with a byte→dword
//! widening load, a shift and a mask (plus a separate plane's top bits where the format
//! has one), and become f32 with the format's own arithmetic: `(u − o)·d`, exact, or
//! `u·d + m` whose product is exact (≤ 17-bit scale × ≤ 6-bit code) so the fused add
//! rounds once. The values are bit-identical to [`BlockFormat::dequantize`] for the
//! ggml formats. Per-block scales are decoded once ([`Expand::prepare`]: the K-quants'
//! sixteen half-sub-block (d, m) pairs, in scalar code).
//!
//! This replaced four files, an AVX2 and an AVX-512 expansion for the 32-weight formats
//! and for the K-quants; the 4-bit group formats, once AVX-512 only, run on AVX2 too,
//! and NEON, once the portable loop, runs it all.

use crate::quant::{BlockFormat, KQuant, QK};
use crate::quant::{BlockInt4G128, BlockInt4G32, BlockInt4G64};
use crate::quant::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::quant::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use crate::simd::lanes::Lanes;

/// A block's weights as f32 vectors of any width.
///
/// # Safety
/// The methods require `L`'s CPU features (see [`Lanes`]); `c < STEPS`, and `at` a
/// multiple of `L::N` below 32.
pub(super) trait Expand: BlockFormat {
    /// 32-weight chunks per block.
    const STEPS: usize;
    /// What is decoded once per block.
    type Prep;
    /// Decodes the block's scales.
    fn prepare(&self) -> Self::Prep;
    /// Weights `at..at + L::N` of chunk c, as f32.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn part<L: Lanes>(&self, prep: &Self::Prep, c: usize, at: usize) -> L::F;
}

/// Weights `at..at + N` of a 32-weight chunk stored as 16 nibble bytes (weight j in the
/// low nibble of byte j, weight j + 16 in the high nibble), as i32 codes.
///
/// # Safety
/// `L`'s features; `qs` is 16 bytes; `at` < 32 a multiple of N.
#[inline(always)]
unsafe fn nibbles<L: Lanes>(qs: &[u8], at: usize) -> L::I {
    debug_assert!(qs.len() >= 16 && at % 16 + L::N <= 16);
    // SAFETY: N bytes from at mod 16 lie inside the 16; features per the contract.
    unsafe {
        L::field(
            L::widen_u8(qs.as_ptr().add(at % 16)),
            4 * (at / 16) as u32,
            0xF,
        )
    }
}

/// [`nibbles`] plus 16 where `qh` holds weight j's fifth bit (bit j).
///
/// # Safety
/// As [`nibbles`].
#[inline(always)]
unsafe fn fives<L: Lanes>(qh: &[u8; 4], qs: &[u8], at: usize) -> L::I {
    // SAFETY: forwarded contract.
    unsafe { L::or_where(nibbles::<L>(qs, at), u32::from_le_bytes(*qh) >> at, 16) }
}

/// `(q − offset)·d`: exact.
///
/// # Safety
/// `L`'s features.
#[inline(always)]
unsafe fn offset_times<L: Lanes>(q: L::I, offset: i32, d: L::F) -> L::F {
    // SAFETY: features per the contract.
    unsafe { L::mul(L::to_f32(L::sub_i(q, L::splat_i(offset))), d) }
}

/// A 32-weight format with one chunk per block, no per-block preparation.
macro_rules! one_chunk {
    ($t:ty, |$b:ident, $at:ident, $l:ident| $body:expr) => {
        impl Expand for $t {
            const STEPS: usize = 1;
            type Prep = ();
            #[inline(always)]
            fn prepare(&self) {}
            #[inline(always)]
            unsafe fn part<$l: Lanes>(&self, _: &(), _: usize, $at: usize) -> $l::F {
                let $b = self;
                // SAFETY: forwarded contract.
                unsafe { $body }
            }
        }
    };
}

one_chunk!(BlockQ4_0, |b, at, L| offset_times::<L>(
    nibbles::<L>(&b.qs, at),
    8,
    L::splat_f16(b.d)
));
one_chunk!(BlockQ4_1, |b, at, L| L::fmadd(
    L::to_f32(nibbles::<L>(&b.qs, at)),
    L::splat_f16(b.d),
    L::splat_f16(b.m)
));
one_chunk!(BlockQ5_0, |b, at, L| offset_times::<L>(
    fives::<L>(&b.qh, &b.qs, at),
    16,
    L::splat_f16(b.d)
));
one_chunk!(BlockQ5_1, |b, at, L| L::fmadd(
    L::to_f32(fives::<L>(&b.qh, &b.qs, at)),
    L::splat_f16(b.d),
    L::splat_f16(b.m)
));
one_chunk!(BlockQ8_0, |b, at, L| offset_times::<L>(
    L::widen_i8(b.qs[at..].as_ptr().cast()),
    0,
    L::splat_f16(b.d)
));

/// The 4-bit group formats: one (scale, −zero·scale) per group, each chunk 16 nibble
/// bytes as in Q4_1.
macro_rules! group_chunks {
    ($($t:ty),*) => {$(
        impl Expand for $t {
            const STEPS: usize = <$t as BlockFormat>::BLOCK / QK;
            type Prep = (f32, f32);
            #[inline(always)]
            fn prepare(&self) -> (f32, f32) {
                let d = self.scale.to_f32();
                (d, -(self.zero as f32) * d)
            }
            #[inline(always)]
            unsafe fn part<L: Lanes>(&self, &(d, m): &(f32, f32), c: usize, at: usize) -> L::F {
                // SAFETY: chunk c's 16 bytes are inside qs (c < STEPS); features per
                // the contract.
                unsafe {
                    let q = nibbles::<L>(&self.qs[16 * c..16 * (c + 1)], at);
                    L::fmadd(L::to_f32(q), L::splat_f(d), L::splat_f(m))
                }
            }
        }
    )*};
}
group_chunks!(BlockInt4G32, BlockInt4G64, BlockInt4G128);

/// The unsigned codes of weights `at..at + N` of chunk c of a K-quant super-block.
trait KCodes {
    /// # Safety
    /// `L`'s features; c < 8, `at` < 32 a multiple of N.
    unsafe fn codes<L: Lanes>(&self, c: usize, at: usize) -> L::I;
}

/// Chunk c's 2-bit codes (Q2_K, and Q3_K's low bits): plane 2·(c mod 4) of bytes
/// 32·(c/4)..+32 of `qs`.
///
/// # Safety
/// As [`KCodes::codes`]; `qs` is 64 bytes.
#[inline(always)]
unsafe fn crumbs<L: Lanes>(qs: &[u8], c: usize, at: usize) -> L::I {
    // SAFETY: those bytes are inside qs; features per the contract.
    unsafe {
        L::field(
            L::widen_u8(qs[32 * (c / 4) + at..].as_ptr()),
            2 * (c % 4) as u32,
            3,
        )
    }
}

/// Chunk c's 4-bit codes (Q4_K, and Q5_K's low bits): chunks 2s and 2s + 1 are the low
/// and high nibbles of bytes 32s..+32 of `qs`.
///
/// # Safety
/// As [`KCodes::codes`]; `qs` is 128 bytes.
#[inline(always)]
unsafe fn k_nibbles<L: Lanes>(qs: &[u8], c: usize, at: usize) -> L::I {
    // SAFETY: those bytes are inside qs; features per the contract.
    unsafe {
        L::field(
            L::widen_u8(qs[32 * (c / 2) + at..].as_ptr()),
            4 * (c % 2) as u32,
            0xF,
        )
    }
}

/// Bit `bit` of each of 32 bytes (`plane[at..]`), as 0/1 lanes: the top bit of a code
/// stored in its own plane.
///
/// # Safety
/// As [`KCodes::codes`]; `plane` is 32 bytes.
#[inline(always)]
unsafe fn plane_bits<L: Lanes>(plane: &[u8], at: usize, bit: u32, mask: i32) -> L::I {
    // SAFETY: N bytes from at lie inside the 32; features per the contract.
    unsafe { L::field(L::widen_u8(plane[at..].as_ptr()), bit, mask) }
}

impl KCodes for BlockQ2K {
    #[inline(always)]
    unsafe fn codes<L: Lanes>(&self, c: usize, at: usize) -> L::I {
        // SAFETY: forwarded contract.
        unsafe { crumbs::<L>(&self.qs, c, at) }
    }
}

impl KCodes for BlockQ3K {
    #[inline(always)]
    unsafe fn codes<L: Lanes>(&self, c: usize, at: usize) -> L::I {
        // Bit c of hmask[i] is the third bit.
        // SAFETY: forwarded contract.
        unsafe {
            let top = plane_bits::<L>(&self.hmask, at, c as u32, 1);
            L::or_shifted(crumbs::<L>(&self.qs, c, at), top, 2)
        }
    }
}

impl KCodes for BlockQ4K {
    #[inline(always)]
    unsafe fn codes<L: Lanes>(&self, c: usize, at: usize) -> L::I {
        // SAFETY: forwarded contract.
        unsafe { k_nibbles::<L>(&self.qs, c, at) }
    }
}

impl KCodes for BlockQ5K {
    #[inline(always)]
    unsafe fn codes<L: Lanes>(&self, c: usize, at: usize) -> L::I {
        // Bit c of qh[i] is the fifth bit.
        // SAFETY: forwarded contract.
        unsafe {
            let top = plane_bits::<L>(&self.qh, at, c as u32, 1);
            L::or_shifted(k_nibbles::<L>(&self.qs, c, at), top, 4)
        }
    }
}

impl KCodes for BlockQ6K {
    #[inline(always)]
    unsafe fn codes<L: Lanes>(&self, c: usize, at: usize) -> L::I {
        // Chunk 4g + k: low nibbles of ql[64g..] (k = 0) or ql[64g + 32..] (k = 1), the
        // high nibbles of the same for k = 2, 3; the top two bits are bits 2k of
        // qh[32g..].
        let (g, k) = (c / 4, c % 4);
        // SAFETY: ql bytes 64g + 32·(k mod 2) + at.. and qh bytes 32g + at.. are inside
        // their arrays; features per the contract.
        unsafe {
            let ql = L::widen_u8(self.ql[64 * g + 32 * (k % 2) + at..].as_ptr());
            let low = L::field(ql, 4 * (k / 2) as u32, 0xF);
            let top = plane_bits::<L>(&self.qh[32 * g..], at, 2 * k as u32, 3);
            L::or_shifted(low, top, 4)
        }
    }
}

impl KCodes for BlockQ8K {
    #[inline(always)]
    unsafe fn codes<L: Lanes>(&self, c: usize, at: usize) -> L::I {
        // Signed bytes; u = q + 128 (the format's offset).
        // SAFETY: N bytes of qs; features per the contract.
        unsafe {
            L::add_i(
                L::widen_i8(self.qs[QK * c + at..].as_ptr().cast()),
                L::splat_i(128),
            )
        }
    }
}

macro_rules! k_quants {
    ($($t:ty),*) => {$(
        impl Expand for $t {
            const STEPS: usize = <$t as BlockFormat>::BLOCK / QK;
            type Prep = [(f32, f32); 16];
            #[inline(always)]
            fn prepare(&self) -> Self::Prep {
                self.half_scales()
            }
            #[inline(always)]
            unsafe fn part<L: Lanes>(&self, sc: &Self::Prep, c: usize, at: usize) -> L::F {
                // Weights at.. belong to half-sub-block 2c + at/16.
                let (d, m) = sc[2 * c + at / 16];
                // SAFETY: forwarded contract.
                unsafe {
                    let u = KCodes::codes::<L>(self, c, at);
                    let v = L::to_f32(L::sub_i(u, L::splat_i(<$t as BlockFormat>::OFFSET)));
                    if <$t as BlockFormat>::HAS_MIN {
                        L::fmadd(v, L::splat_f(d), L::splat_f(m))
                    } else {
                        L::mul(v, L::splat_f(d))
                    }
                }
            }
        }
    )*};
}
k_quants!(BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QuantMatrix;
    use rand::{Rng, SeedableRng};
    use tessera_core::Isa;

    /// Every weight of `b` through `L`'s expansion.
    ///
    /// # Safety
    /// `L`'s CPU features.
    #[inline(always)]
    unsafe fn expand_all<L: Lanes, B: Expand>(b: &B) -> Vec<f32> {
        let mut out = vec![f32::NAN; B::BLOCK];
        let prep = b.prepare();
        for c in 0..B::STEPS {
            for at in (0..QK).step_by(L::N) {
                // SAFETY: c < STEPS, at < 32 a multiple of N; out holds BLOCK floats.
                unsafe { L::store(out.as_mut_ptr().add(c * QK + at), b.part::<L>(&prep, c, at)) };
            }
        }
        out
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn expand_avx2<B: Expand>(b: &B) -> Vec<f32> {
        // SAFETY: the features are enabled on this function.
        unsafe { expand_all::<crate::simd::lanes::Ymm, B>(b) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
    fn expand_avx512<B: Expand>(b: &B) -> Vec<f32> {
        // SAFETY: the features are enabled on this function.
        unsafe { expand_all::<crate::simd::lanes::Zmm, B>(b) }
    }

    #[cfg(target_arch = "aarch64")]
    #[target_feature(enable = "neon")]
    fn expand_neon<B: Expand>(b: &B) -> Vec<f32> {
        // SAFETY: the features are enabled on this function.
        unsafe { expand_all::<crate::simd::lanes::Neon, B>(b) }
    }

    /// Each width this CPU has, expanding `blk`, then AVX-512's width in software lanes
    /// (`Soft<16>`, which every host runs).
    fn widths<B: Expand>(blk: &B) -> Vec<(&'static str, Vec<f32>)> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::Avx2.is_available() {
                // SAFETY: AVX2, FMA and F16C detected.
                v.push((Isa::Avx2.name(), unsafe { expand_avx2(blk) }));
            }
            if Isa::Avx512.is_available() {
                // SAFETY: AVX-512F/BW/VL/DQ detected.
                v.push((Isa::Avx512.name(), unsafe { expand_avx512(blk) }));
            }
        }
        #[cfg(target_arch = "aarch64")]
        if Isa::Neon.is_available() {
            // SAFETY: NEON detected.
            v.push((Isa::Neon.name(), unsafe { expand_neon(blk) }));
        }
        // SAFETY: Soft needs no CPU feature.
        v.push(("Soft<16>", unsafe {
            expand_all::<crate::simd::lanes::Soft<16>, B>(blk)
        }));
        v
    }

    /// Each width's expansion of random blocks equals `dequantize` bit for bit (the ggml
    /// formats), or to within one rounding of the fused `q·d − z·d` (the group formats).
    fn check<B: Expand>(exact: bool) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(B::BLOCK as u64 ^ 0x5eed);
        for _ in 0..20 {
            let x: Vec<f32> = (0..4 * B::BLOCK)
                .map(|_| rng.random_range(-2.0..2.0))
                .collect();
            let w = QuantMatrix::<B>::quantize(4, B::BLOCK, &x).expect("quantize");
            for r in 0..4 {
                let blk = &w.row(r)[0];
                let mut want = vec![0f32; B::BLOCK];
                blk.dequantize(&mut want);
                for (isa, got) in widths(blk) {
                    for (j, (g, e)) in got.iter().zip(&want).enumerate() {
                        let ok = if exact {
                            g.to_bits() == e.to_bits()
                        } else {
                            (g - e).abs() <= 2.0 * f32::EPSILON * e.abs().max(1e-3)
                        };
                        assert!(ok, "{} {isa} weight {j}: {g} vs {e}", B::DTYPE);
                    }
                }
            }
        }
    }

    #[test]
    fn every_width_expands_blocks_as_dequantize_does() {
        let probe = widths(&BlockQ4_0::quantize(&[0.5; QK]));
        let names: Vec<&str> = probe.iter().map(|(name, _)| *name).collect();
        eprintln!("widths checked: {names:?}");
        check::<BlockQ4_0>(true);
        check::<BlockQ4_1>(true);
        check::<BlockQ5_0>(true);
        check::<BlockQ5_1>(true);
        check::<BlockQ8_0>(true);
        check::<BlockQ2K>(true);
        check::<BlockQ3K>(true);
        check::<BlockQ4K>(true);
        check::<BlockQ5K>(true);
        check::<BlockQ6K>(true);
        check::<BlockQ8K>(true);
        check::<BlockInt4G32>(false);
        check::<BlockInt4G64>(false);
        check::<BlockInt4G128>(false);
    }
}
