//! AVX-512 small-M kernel: each 32-weight chunk of a block is expanded to two zmm of f32
//! with the format's own arithmetic (so values are bit-identical to `dequantize`), then
//! FMA'd into two accumulators per activation row. A 32-weight format is one chunk; a
//! K-quant super-block is eight, its sub-block scales decoded once per super-block
//! ([`Expand::prepare`], `super::avx512_k`).

use crate::quant::{BlockFormat, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, QK};
use crate::quant::{BlockInt4G128, BlockInt4G32, BlockInt4G64};
use crate::quant::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use std::any::TypeId;
use std::arch::x86_64::*;

/// A block's weights as zmm of 16 consecutive weights, a step of them at a time.
pub(super) trait Expand {
    /// Steps per block.
    const STEPS: usize;
    /// What is decoded once per block (the K-quants' sub-block scales).
    type Prep;
    /// One step's zmm, in element order (2 for a 32-weight format, 4 for a K-quant
    /// chunk pair, which shares its loads).
    type Out: AsRef<[__m512]>;
    /// # Safety
    /// AVX-512F must be available.
    unsafe fn prepare(&self) -> Self::Prep;
    /// # Safety
    /// AVX-512F must be available; s < STEPS.
    unsafe fn step(&self, prep: &Self::Prep, s: usize) -> Self::Out;
}

/// [`Expand`] for a 32-weight format from its one-block `expand`.
macro_rules! one_chunk {
    ($t:ty) => {
        impl Expand for $t {
            const STEPS: usize = 1;
            type Prep = ();
            type Out = [__m512; 2];
            #[inline(always)]
            unsafe fn prepare(&self) {}
            #[inline(always)]
            unsafe fn step(&self, _: &(), _: usize) -> [__m512; 2] {
                // SAFETY: forwarded contract.
                unsafe { self.expand() }
            }
        }
    };
}
one_chunk!(BlockQ4_0);
one_chunk!(BlockQ4_1);
one_chunk!(BlockQ5_0);
one_chunk!(BlockQ5_1);
one_chunk!(BlockQ8_0);

/// [`Expand`] for the 4-bit group formats: one (scale, −zero·scale) per group, each
/// 32-weight chunk 16 nibble bytes as in Q4_1 (`q·d + m`, q·d exact, one rounding).
macro_rules! group_chunks {
    ($($t:ty),*) => {$(
        impl Expand for $t {
            const STEPS: usize = <$t as BlockFormat>::BLOCK / QK;
            type Prep = (__m512, __m512);
            type Out = [__m512; 2];
            #[inline(always)]
            unsafe fn prepare(&self) -> (__m512, __m512) {
                // SAFETY: AVX-512F/F16C per the caller.
                unsafe {
                    let d = splat_f16(self.scale);
                    let z = _mm512_set1_ps(-(self.zero as f32));
                    (d, _mm512_mul_ps(z, d))
                }
            }
            #[inline(always)]
            unsafe fn step(&self, &(d, m): &(__m512, __m512), s: usize) -> [__m512; 2] {
                let qs: &[u8; QK / 2] = self.qs[16 * s..16 * (s + 1)].try_into().expect("16 bytes");
                // SAFETY: AVX-512F per the caller.
                unsafe {
                    let (lo, hi) = nibbles(qs);
                    let f = |q| _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), d, m);
                    [f(lo), f(hi)]
                }
            }
        }
    )*};
}
group_chunks!(BlockInt4G32, BlockInt4G64, BlockInt4G128);

/// Two zmm of a 32-weight block (elements 0..16 and 16..32).
trait ExpandOne {
    /// # Safety
    /// AVX-512F must be available.
    unsafe fn expand(&self) -> [__m512; 2];
}

/// An f16 scale broadcast to 16 f32 lanes: a word broadcast then one F16C conversion
/// (`half`'s `to_f32` re-checks CPU features per call). Building it from a scalar
/// `_mm_cvtsi32_si128` instead let LLVM insert the word into whatever register held
/// "don't care" upper lanes, at times an accumulator: a false dependency that chained
/// every block's scale to the previous block's FMA (1×576×576 Q4_1: 12.3 µs with it,
/// 10.2 µs without; docs/performance.md).
#[inline(always)]
unsafe fn splat_f16(v: half::f16) -> __m512 {
    // SAFETY: F16C and AVX-512F are enabled on the kernels this inlines into.
    unsafe { _mm512_cvtph_ps(_mm256_set1_epi16(v.to_bits() as i16)) }
}

/// The 16 packed nibble bytes as (low nibbles, high nibbles), each 16 × i32.
#[inline(always)]
unsafe fn nibbles(qs: &[u8; QK / 2]) -> (__m512i, __m512i) {
    // SAFETY: qs is 16 readable bytes; AVX-512F per the caller.
    unsafe {
        let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.as_ptr() as *const __m128i));
        let mask = _mm512_set1_epi32(0xF);
        (_mm512_and_si512(bytes, mask), _mm512_srli_epi32::<4>(bytes))
    }
}

impl ExpandOne for BlockQ4_0 {
    #[inline(always)]
    unsafe fn expand(&self) -> [__m512; 2] {
        // SAFETY: AVX-512F per the caller.
        unsafe {
            let (lo, hi) = nibbles(&self.qs);
            let (eight, d) = (_mm512_set1_epi32(8), splat_f16(self.d));
            let f = |q| _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, eight)), d);
            [f(lo), f(hi)]
        }
    }
}

impl ExpandOne for BlockQ4_1 {
    #[inline(always)]
    unsafe fn expand(&self) -> [__m512; 2] {
        // SAFETY: AVX-512F per the caller.
        unsafe {
            let (lo, hi) = nibbles(&self.qs);
            let (d, m) = (splat_f16(self.d), splat_f16(self.m));
            // q·d is exact (4-bit × 11-bit significands), so the fused add rounds once,
            // exactly as the scalar `q·d + m`.
            let f = |q| _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), d, m);
            [f(lo), f(hi)]
        }
    }
}

/// The 32 five-bit values as two 16 × i32 halves: nibbles plus 16 where `qh` has the bit
/// (one masked OR per half: bit j of the mask is weight j's fifth bit).
#[inline(always)]
unsafe fn fives(qh: &[u8; 4], qs: &[u8; QK / 2]) -> (__m512i, __m512i) {
    // SAFETY: AVX-512F per the caller.
    unsafe {
        let (lo, hi) = nibbles(qs);
        let bits = u32::from_le_bytes(*qh);
        let sixteen = _mm512_set1_epi32(16);
        (
            _mm512_mask_or_epi32(lo, bits as __mmask16, lo, sixteen),
            _mm512_mask_or_epi32(hi, (bits >> 16) as __mmask16, hi, sixteen),
        )
    }
}

impl ExpandOne for BlockQ5_0 {
    #[inline(always)]
    unsafe fn expand(&self) -> [__m512; 2] {
        // SAFETY: AVX-512F per the caller.
        unsafe {
            let (lo, hi) = fives(&self.qh, &self.qs);
            let (off, d) = (_mm512_set1_epi32(16), splat_f16(self.d));
            let f = |q| _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, off)), d);
            [f(lo), f(hi)]
        }
    }
}

impl ExpandOne for BlockQ5_1 {
    #[inline(always)]
    unsafe fn expand(&self) -> [__m512; 2] {
        // SAFETY: AVX-512F per the caller.
        unsafe {
            let (lo, hi) = fives(&self.qh, &self.qs);
            let (d, m) = (splat_f16(self.d), splat_f16(self.m));
            // q·d exact (5-bit × 11-bit significands): one rounding, as the scalar form.
            let f = |q| _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), d, m);
            [f(lo), f(hi)]
        }
    }
}

impl ExpandOne for BlockQ8_0 {
    #[inline(always)]
    unsafe fn expand(&self) -> [__m512; 2] {
        // SAFETY: qs is 32 readable bytes; AVX-512F per the caller.
        unsafe {
            let p = self.qs.as_ptr() as *const __m128i;
            let d = splat_f16(self.d);
            let f = |v| _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)), d);
            [f(_mm_loadu_si128(p)), f(_mm_loadu_si128(p.add(1)))]
        }
    }
}

/// Runs the explicit kernel for the formats it knows; false otherwise.
///
/// # Safety
/// AVX-512F must be available. `x` holds 1..=M_CHUNK rows of `w.len()·32` floats and
/// `out` as many elements.
pub(super) unsafe fn row_dots<B: BlockFormat>(w: &[B], x: &[&[f32]], out: &mut [f32]) -> bool {
    macro_rules! cast_run {
        ($($t:ty),*) => {$(
            if TypeId::of::<B>() == TypeId::of::<$t>() {
                // SAFETY: B is $t (same TypeId), so the slice cast is an identity.
                let w = unsafe { std::slice::from_raw_parts(w.as_ptr() as *const $t, w.len()) };
                // SAFETY: forwarded contract.
                unsafe { dots::<$t>(w, x, out) };
                return true;
            }
        )*};
    }
    cast_run!(BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0);
    cast_run!(BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K);
    cast_run!(BlockInt4G32, BlockInt4G64, BlockInt4G128);
    false
}

/// Dispatches on the number of activation rows so each count gets a kernel with its
/// loops fully unrolled and no per-block bounds checks.
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe fn dots<B: Expand + BlockFormat>(w: &[B], x: &[&[f32]], out: &mut [f32]) {
    // SAFETY: forwarded contract (every arm); the slice patterns fix the row count.
    unsafe {
        match x {
            [a] => dots_m::<B, 1>(w, [a], out),
            [a, b] => dots_m::<B, 2>(w, [a, b], out),
            [a, b, c] => dots_m::<B, 3>(w, [a, b, c], out),
            [a, b, c, d] => dots_m::<B, 4>(w, [a, b, c, d], out),
            _ => unreachable!("1..=M_CHUNK activation rows"),
        }
    }
}

#[target_feature(enable = "avx512f,fma,f16c")]
unsafe fn dots_m<B: Expand + BlockFormat, const M: usize>(
    w: &[B],
    x: [&[f32]; M],
    out: &mut [f32],
) {
    let k = w.len() * B::BLOCK;
    assert!(x.iter().all(|r| r.len() >= k) && out.len() >= M);
    let xp = x.map(|r| r.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); 2]; M];
    let mut at = 0;
    for blk in w {
        // SAFETY: AVX-512F enabled on this function.
        let prep = unsafe { blk.prepare() };
        for s in 0..B::STEPS {
            // SAFETY: AVX-512F enabled on this function; s < STEPS.
            let wv = unsafe { blk.step(&prep, s) };
            for (j, wv) in wv.as_ref().iter().enumerate() {
                for i in 0..M {
                    // SAFETY: the steps of all blocks cover exactly k = BLOCK·blocks
                    // floats of each x row (asserted above), 16 at a time.
                    unsafe {
                        let v = _mm512_loadu_ps(xp[i].add(at));
                        acc[i][j % 2] = _mm512_fmadd_ps(*wv, v, acc[i][j % 2]);
                    }
                }
                at += 16;
            }
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
    }
}
