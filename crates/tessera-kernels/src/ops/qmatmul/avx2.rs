//! AVX2 small-M kernel for the ggml formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 here; the
//! K-quants' expansion in `super::avx2_k`): each 32-weight chunk is expanded to four
//! ymm of eight f32 with the format's own arithmetic (so values are bit-identical to
//! `dequantize`) and FMA'd into every activation row.
//!
//! The AVX-512 kernel's structure at half the width. One or two rows keep four
//! accumulators per row (four FMA chains: the four ymm of a block are independent), three
//! or four rows two (R·A accumulators + 4 weights + 1 activation ≤ 16 registers).
//! Plain loops, no `array::map`: like `array::from_fn` it is not inlined into a
//! `#[target_feature]` function, so the intrinsics in its closure became calls (Q4_0 ran
//! 20× slower that way).
//! Before it, AVX2 machines ran the portable loop (dequantize a block to a buffer, then
//! FMA): 1×49152×576 Q4_0 14–18 ms, 5–8 % of DRAM (docs/performance.md).

use crate::quant::{BlockFormat, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, QK};
use crate::quant::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use std::any::TypeId;
use std::arch::x86_64::*;

/// A block as `STEPS` 32-weight chunks, each four ymm (weights 0–7, 8–15, 16–23,
/// 24–31 of the chunk).
pub(super) trait Expand8 {
    /// 32-weight chunks per block (1, or 8 for a K-quant super-block).
    const STEPS: usize;
    /// What is decoded once per block (the K-quants' sub-block scales).
    type Prep;
    /// # Safety
    /// AVX2, FMA and F16C must be available.
    unsafe fn prepare(&self) -> Self::Prep;
    /// # Safety
    /// AVX2, FMA and F16C must be available; c < STEPS.
    unsafe fn expand(&self, prep: &Self::Prep, c: usize) -> [__m256; 4];
}

/// The [`Expand8`] items of a 32-weight format: one chunk, nothing to prepare.
macro_rules! one_chunk {
    () => {
        const STEPS: usize = 1;
        type Prep = ();
        #[inline(always)]
        unsafe fn prepare(&self) {}
    };
}

/// An f16 scale broadcast to 8 f32 lanes.
#[inline(always)]
unsafe fn splat_f16(v: half::f16) -> __m256 {
    // SAFETY: F16C per the caller.
    unsafe { _mm256_cvtph_ps(_mm_set1_epi16(v.to_bits() as i16)) }
}

/// Bytes 0–7 and 8–15 of `v` widened to two 8 × i32.
#[inline(always)]
unsafe fn widen_u8(v: __m128i) -> [__m256i; 2] {
    // SAFETY: AVX2 per the caller.
    unsafe {
        [
            _mm256_cvtepu8_epi32(v),
            _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v)),
        ]
    }
}

/// The 16 packed nibble bytes as the 32 values in element order, four 8 × i32.
#[inline(always)]
unsafe fn nibbles(qs: &[u8; QK / 2]) -> [__m256i; 4] {
    // SAFETY: qs is 16 readable bytes; AVX2 per the caller.
    unsafe {
        let c = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
        let mask = _mm_set1_epi8(0x0F);
        let [a, b] = widen_u8(_mm_and_si128(c, mask));
        let [d, e] = widen_u8(_mm_and_si128(_mm_srli_epi16::<4>(c), mask));
        [a, b, d, e]
    }
}

/// Nibbles plus 16 where `qh` holds weight j's fifth bit (bit j).
#[inline(always)]
unsafe fn fives(qh: &[u8; 4], qs: &[u8; QK / 2]) -> [__m256i; 4] {
    // SAFETY: AVX2 per the caller.
    unsafe {
        let mut q = nibbles(qs);
        let lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        let sixteen = _mm256_set1_epi32(16);
        for (g, v) in q.iter_mut().enumerate() {
            let bits = _mm256_set1_epi32(qh[g] as i32);
            let set = _mm256_cmpeq_epi32(_mm256_and_si256(bits, lane_bits), lane_bits);
            *v = _mm256_or_si256(*v, _mm256_and_si256(set, sixteen));
        }
        q
    }
}

/// `(q − offset)·d` per lane: exact, as the scalar form.
#[inline(always)]
unsafe fn offset_times(q: [__m256i; 4], offset: i32, d: half::f16) -> [__m256; 4] {
    // SAFETY: AVX2/F16C per the caller.
    unsafe {
        let (off, d) = (_mm256_set1_epi32(offset), splat_f16(d));
        let mut out = [_mm256_setzero_ps(); 4];
        for (o, v) in out.iter_mut().zip(q) {
            *o = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(v, off)), d);
        }
        out
    }
}

/// `q·d + m` per lane: q·d is exact (≤ 5-bit × 11-bit significands), so the fused add
/// rounds once, exactly as the scalar `q·d + m`.
#[inline(always)]
unsafe fn scale_min(q: [__m256i; 4], d: half::f16, m: half::f16) -> [__m256; 4] {
    // SAFETY: AVX2/FMA/F16C per the caller.
    unsafe {
        let (d, m) = (splat_f16(d), splat_f16(m));
        let mut out = [_mm256_setzero_ps(); 4];
        for (o, v) in out.iter_mut().zip(q) {
            *o = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), d, m);
        }
        out
    }
}

impl Expand8 for BlockQ4_0 {
    one_chunk!();
    #[inline(always)]
    unsafe fn expand(&self, _: &(), _: usize) -> [__m256; 4] {
        // SAFETY: forwarded contract.
        unsafe { offset_times(nibbles(&self.qs), 8, self.d) }
    }
}

impl Expand8 for BlockQ4_1 {
    one_chunk!();
    #[inline(always)]
    unsafe fn expand(&self, _: &(), _: usize) -> [__m256; 4] {
        // SAFETY: forwarded contract.
        unsafe { scale_min(nibbles(&self.qs), self.d, self.m) }
    }
}

impl Expand8 for BlockQ5_0 {
    one_chunk!();
    #[inline(always)]
    unsafe fn expand(&self, _: &(), _: usize) -> [__m256; 4] {
        // SAFETY: forwarded contract.
        unsafe { offset_times(fives(&self.qh, &self.qs), 16, self.d) }
    }
}

impl Expand8 for BlockQ5_1 {
    one_chunk!();
    #[inline(always)]
    unsafe fn expand(&self, _: &(), _: usize) -> [__m256; 4] {
        // SAFETY: forwarded contract.
        unsafe { scale_min(fives(&self.qh, &self.qs), self.d, self.m) }
    }
}

impl Expand8 for BlockQ8_0 {
    one_chunk!();
    #[inline(always)]
    unsafe fn expand(&self, _: &(), _: usize) -> [__m256; 4] {
        // SAFETY: qs is 32 readable bytes; AVX2/F16C per the caller.
        unsafe {
            let p = self.qs.as_ptr() as *const __m128i;
            let (lo, hi) = (_mm_loadu_si128(p), _mm_loadu_si128(p.add(1)));
            let q = [
                _mm256_cvtepi8_epi32(lo),
                _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(lo)),
                _mm256_cvtepi8_epi32(hi),
                _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(hi)),
            ];
            offset_times(q, 0, self.d)
        }
    }
}

/// Runs the AVX2 kernel for the formats it knows; false otherwise.
///
/// # Safety
/// AVX2, FMA and F16C must be available. `x` holds 1..=M_CHUNK rows of at least
/// `w.len()·32` floats and `out` as many elements.
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
    false
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots<B: Expand8 + BlockFormat>(w: &[B], x: &[&[f32]], out: &mut [f32]) {
    // SAFETY: forwarded contract (every arm); the slice patterns fix the row count.
    unsafe {
        match x {
            [a] => dots_m::<B, 1, 4>(w, [a], out),
            [a, b] => dots_m::<B, 2, 4>(w, [a, b], out),
            [a, b, c] => dots_m::<B, 3, 2>(w, [a, b, c], out),
            [a, b, c, d] => dots_m::<B, 4, 2>(w, [a, b, c, d], out),
            _ => unreachable!("1..=M_CHUNK activation rows"),
        }
    }
}

/// M rows, A accumulators per row.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_m<B: Expand8 + BlockFormat, const M: usize, const A: usize>(
    w: &[B],
    x: [&[f32]; M],
    out: &mut [f32],
) {
    let k = w.len() * B::BLOCK;
    assert!(x.iter().all(|r| r.len() >= k) && out.len() >= M);
    const { assert!(B::BLOCK == B::STEPS * QK) };
    let xp = x.map(|r| r.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); A]; M];
    for (b, blk) in w.iter().enumerate() {
        // SAFETY: AVX2/FMA/F16C enabled on this function.
        let prep = unsafe { blk.prepare() };
        for c in 0..B::STEPS {
            // SAFETY: as above; c < STEPS.
            let wv = unsafe { blk.expand(&prep, c) };
            let at = b * B::BLOCK + c * QK;
            for (j, wv) in wv.iter().enumerate() {
                for i in 0..M {
                    // SAFETY: at + 8j + 8 ≤ k ≤ each x row's length (asserted above).
                    unsafe {
                        let v = _mm256_loadu_ps(xp[i].add(at + 8 * j));
                        acc[i][j % A] = _mm256_fmadd_ps(*wv, v, acc[i][j % A]);
                    }
                }
            }
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        let mut v = a[0];
        for part in &a[1..] {
            v = _mm256_add_ps(v, *part);
        }
        let mut lanes = [0f32; 8];
        // SAFETY: lanes holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        *o = lanes.iter().sum();
    }
}
