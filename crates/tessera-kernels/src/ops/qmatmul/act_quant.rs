//! Activation quantization for the integer kernels ([`QuantActs`]): the algorithm
//! written once ([`quantize_with`], and the 16-bit activations' two-plane split,
//! [`split_with`]), its vector steps per width ([`QuantLanes`]), instantiated for AVX2
//! (ymm, which AVX-512 hosts run too) and NEON.
//!
//! Why by hand: it runs on one thread before every integer matmul, and the portable
//! loop stays mostly scalar when compiled (the saturating `as i8` and the round-away-
//! from-zero keep LLVM from vectorizing it, and the 4-code sums and the maximum fold
//! are byte- and lane-serial): `perf` of the 576→192 k/v projection at decode on AVX2
//! put it at a third of the call. A 32-value block is 4 ymm (8 q registers) of floats,
//! its codes one ymm (two q registers), and its 4-code sums come from one
//! `vpmaddubsw`/`vpmaddwd` pair (two `saddlp` steps on NEON).
//!
//! Why no zmm instance: one was written and tested bit-exact (two zmm of floats a block,
//! codes narrowed by `vpmovsdb`), and in `perf record` of the default 16-bit 16-stream
//! step (host H, Intel AVX-512, 2026-12-04, `tessera bench-serve --requests 32
//! --concurrency 16 --prompt-tokens 128 --gen-tokens 256`, one run each) the split took
//! 3.52% of the samples against the ymm split's 3.91%: the float steps halve, but the
//! sinks' per-block records (scales, sums, start values) and the scale chain stay, so
//! the ~0.4% was not worth a second x86 instance.
//!
//! Bit-exact with the portable loop (tested on every ISA, NEON under qemu): round half
//! away from zero, as trunc(v + copysign(0.49999997, v)) on AVX2 (exact for |v| < 2²³)
//! and `fcvtas` on NEON; NaN products give code 0 (the saturating cast's) and ±∞ give
//! ±127 (the portable loop's clamp).

use super::act16::{PLANE_RATIO, SPLIT_RANGE};
use super::quant_acts::BlockSink;
#[cfg(doc)]
use super::quant_acts::QuantActs;
use super::ActScales;
use crate::quant::QK;

/// Blocks whose scales are computed together. One block at a time, each block's chain
/// (max → horizontal max → two divisions → rounding → sums → stores) ran nearly
/// serially, ~150 cycles a block (`perf` on AVX2: 0.55–0.8 µs of a 5 µs 576→192 decode
/// call); eight blocks' maxima first, then their scales together, leave eight
/// independent blocks for the out-of-order core to overlap.
const GROUP: usize = 8;

/// One width's two vector steps of the quantizer.
trait QuantLanes {
    /// max |v| over `x` (NaN ignored) and whether every value is finite, as the
    /// portable `amax_finite`: over a block, or over the whole row for per-row scales.
    ///
    /// # Safety
    /// The width's CPU features; `x.len()` a multiple of 8.
    unsafe fn amax_finite(x: &[f32]) -> (f32, bool);
    /// Writes the 32 codes round(v·id) of the block at `xb`, in order, to `q`, as the
    /// portable loop's `(v * id).round().clamp(-127.0, 127.0) as i8`, and returns the
    /// sum of each 4 consecutive codes (lane l: codes 4l..4l+4).
    ///
    /// # Safety
    /// The width's CPU features; 32 floats readable at `xb`, 32 bytes writable at `q`.
    unsafe fn block_codes(xb: *const f32, id: f32, q: *mut i8) -> [i32; 8];
    /// Writes the block at `xb`'s two 8-bit planes ([`super::act16`]) to `hi` and `lo`,
    /// as the portable split: q = round_ties_even(v·id) clamped to ±127·255 (NaN → 0),
    /// h = round_ties_even(q·(1/255)), l = q − 255·h; returns each plane's sums of 4
    /// consecutive codes, as [`QuantLanes::block_codes`].
    ///
    /// # Safety
    /// As [`QuantLanes::block_codes`], for both planes.
    unsafe fn block_split(xb: *const f32, id: f32, hi: *mut i8, lo: *mut i8) -> [[i32; 8]; 2];
}

/// Each 32-block's scale d = amax/`range` (NaN for a non-finite block, or all of them
/// from `row`, one maximum for the row), the portable loops' `id = if d > 0 { 1 / d }
/// else { 0 }`, passed with the block index to `block(b, id, d)`: the grouping both
/// quantizers share. One block at a time, each block's chain ran nearly serially
/// ([`GROUP`]); IEEE division is correctly rounded however it is issued, so the scales
/// are the portable loops' bits.
///
/// # Safety
/// `Q`'s CPU features; `x.len()` a multiple of 32.
#[inline(always)]
unsafe fn for_block_scales<Q: QuantLanes>(
    x: &[f32],
    range: f32,
    row: Option<(f32, bool)>,
    mut block: impl FnMut(usize, f32, f32),
) {
    let nb = x.len() / QK;
    for g0 in (0..nb).step_by(GROUP) {
        let n = GROUP.min(nb - g0);
        // Lanes past n keep amax 0 (scale 0) and are not used.
        let (mut amax, mut finite) = ([0f32; GROUP], [true; GROUP]);
        for j in 0..n {
            (amax[j], finite[j]) = match row {
                Some(r) => r,
                // SAFETY: Q's features per the contract; a block is 32 floats.
                None => unsafe { Q::amax_finite(&x[(g0 + j) * QK..][..QK]) },
            };
        }
        let d = amax.map(|m| m / range);
        let id = d.map(|d| if d > 0.0 { 1.0 / d } else { 0.0 });
        for j in 0..n {
            block(g0 + j, id[j], if finite[j] { d[j] } else { f32::NAN });
        }
    }
}

/// Fills the sink `a` (sized for `x`, as `QuantActs::refill` does) with `x` quantized per
/// 32-block, or with one scale for the row: the body of every instance.
///
/// # Safety
/// `Q`'s CPU features; `x.len()` a multiple of 32. (The sink checks its own bounds.)
#[inline(always)]
unsafe fn quantize_with<Q: QuantLanes, S: BlockSink>(
    x: &[f32],
    offset: i32,
    act: ActScales,
    a: &mut S,
) {
    debug_assert!(x.len().is_multiple_of(QK) && a.holds(x.len()));
    let row = match act {
        ActScales::PerBlock => None,
        // SAFETY: Q's features per the contract; the row is whole blocks.
        ActScales::PerRow => Some(unsafe { Q::amax_finite(x) }),
    };
    // SAFETY: forwarded contract; block b < x.len()/32 lies inside x, and its 32 codes
    // are the sink's (`codes` gives them as an array).
    unsafe {
        for_block_scales::<Q>(x, 127.0, row, |b, id, d| {
            let sums = Q::block_codes(x.as_ptr().add(b * QK), id, a.codes(b).as_mut_ptr());
            a.finish(b, d, sums, offset);
        })
    }
}

/// [`quantize_with`] on ymm.
///
/// # Safety
/// AVX2 and FMA; as for [`quantize_with`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_ymm<S: BlockSink>(x: &[f32], offset: i32, act: ActScales, a: &mut S) {
    // SAFETY: forwarded contract.
    unsafe { quantize_with::<x86::Ymm, S>(x, offset, act, a) }
}

/// [`quantize_with`] on NEON (baseline on aarch64).
///
/// # Safety
/// As for [`quantize_with`].
#[cfg(target_arch = "aarch64")]
pub(super) unsafe fn quantize_neon<S: BlockSink>(
    x: &[f32],
    offset: i32,
    act: ActScales,
    a: &mut S,
) {
    // SAFETY: forwarded contract.
    unsafe { quantize_with::<neon::Neon, S>(x, offset, act, a) }
}

/// Fills `hi` and `lo` (sized for `x`) with `x`'s two planes per 32-block, as act16's
/// portable `split_portable`: the body of every instance.
///
/// # Safety
/// `Q`'s CPU features; `x.len()` a multiple of 32. (The sinks check their own bounds.)
#[inline(always)]
unsafe fn split_with<Q: QuantLanes, S: BlockSink>(x: &[f32], offset: i32, hi: &mut S, lo: &mut S) {
    debug_assert!(x.len().is_multiple_of(QK) && hi.holds(x.len()) && lo.holds(x.len()));
    // SAFETY: forwarded contract; block b < x.len()/32 lies inside x, and its codes in
    // each plane are that sink's.
    unsafe {
        for_block_scales::<Q>(x, SPLIT_RANGE, None, |b, id, d| {
            let (h, l) = (hi.codes(b).as_mut_ptr(), lo.codes(b).as_mut_ptr());
            let [sh, sl] = Q::block_split(x.as_ptr().add(b * QK), id, h, l);
            hi.finish(b, PLANE_RATIO * d, sh, offset);
            lo.finish(b, d, sl, offset);
        })
    }
}

/// [`split_with`] on ymm.
///
/// # Safety
/// AVX2 and FMA; as for [`split_with`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn split_ymm<S: BlockSink>(x: &[f32], offset: i32, hi: &mut S, lo: &mut S) {
    // SAFETY: forwarded contract.
    unsafe { split_with::<x86::Ymm, S>(x, offset, hi, lo) }
}

/// [`split_with`] on NEON (baseline on aarch64).
///
/// # Safety
/// As for [`split_with`].
#[cfg(target_arch = "aarch64")]
pub(super) unsafe fn split_neon<S: BlockSink>(x: &[f32], offset: i32, hi: &mut S, lo: &mut S) {
    // SAFETY: forwarded contract.
    unsafe { split_with::<neon::Neon, S>(x, offset, hi, lo) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX2's steps: a ymm of 8 floats, the block's codes in one ymm.

    use super::{QuantLanes, PLANE_RATIO, SPLIT_RANGE};
    use std::arch::x86_64::*;

    pub(super) struct Ymm;

    impl QuantLanes for Ymm {
        #[inline(always)]
        unsafe fn amax_finite(x: &[f32]) -> (f32, bool) {
            // SAFETY: for the whole body, AVX2 per the contract; 8 floats per load.
            unsafe {
                let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
                let inf = _mm256_set1_ps(f32::INFINITY);
                let (mut m, mut finite) = (_mm256_setzero_ps(), _mm256_set1_ps(f32::from_bits(!0)));
                for c in x.chunks_exact(8) {
                    let a = _mm256_and_ps(_mm256_loadu_ps(c.as_ptr()), abs_mask);
                    // vmaxps returns its second operand when either is NaN: m survives.
                    m = _mm256_max_ps(a, m);
                    finite = _mm256_and_ps(finite, _mm256_cmp_ps::<_CMP_LT_OQ>(a, inf));
                }
                // Reduced in registers (m holds no NaN, and the maximum is exact in any
                // order): a store and a scalar fold put ~25 cycles on every block's chain.
                let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
                let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
                let h = _mm_max_ss(h, _mm_shuffle_ps::<1>(h, h));
                (_mm_cvtss_f32(h), _mm256_movemask_ps(finite) == 0xFF)
            }
        }

        #[inline(always)]
        unsafe fn block_codes(xb: *const f32, id: f32, q: *mut i8) -> [i32; 8] {
            // SAFETY: for the whole body, AVX2 per the contract; 32 floats at xb, 32
            // bytes at q.
            unsafe {
                let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
                let sign = _mm256_set1_ps(-0.0);
                let half = _mm256_set1_ps(0.499_999_97);
                let id = _mm256_set1_ps(id);
                let mut ints = [_mm256_setzero_si256(); 4];
                for (i, out) in ints.iter_mut().enumerate() {
                    let p = _mm256_mul_ps(_mm256_loadu_ps(xb.add(8 * i)), id);
                    // NaN (0·∞, or a NaN input) → 0, as the saturating cast does; ±∞ (a
                    // subnormal d's overflowing 1/d) → ±127, as the portable clamp does.
                    let p = _mm256_and_ps(p, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
                    let p = _mm256_min_ps(_mm256_max_ps(p, lo), hi);
                    let away = _mm256_or_ps(_mm256_and_ps(p, sign), half);
                    *out = _mm256_cvttps_epi32(_mm256_add_ps(p, away));
                }
                store_codes(ints, q)
            }
        }

        #[inline(always)]
        unsafe fn block_split(xb: *const f32, id: f32, hi: *mut i8, lo: *mut i8) -> [[i32; 8]; 2] {
            // SAFETY: for the whole body, AVX2 per the contract; 32 floats at xb, 32
            // bytes at hi and at lo.
            unsafe {
                const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
                let (min, max) = (_mm256_set1_ps(-SPLIT_RANGE), _mm256_set1_ps(SPLIT_RANGE));
                let (inv, ratio) = (
                    _mm256_set1_ps(1.0 / PLANE_RATIO),
                    _mm256_set1_ps(PLANE_RATIO),
                );
                let id = _mm256_set1_ps(id);
                let (mut h, mut l) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
                for i in 0..4 {
                    let p = _mm256_mul_ps(_mm256_loadu_ps(xb.add(8 * i)), id);
                    // NaN → 0 in both planes (the portable casts of NaN); ±∞ (a subnormal
                    // d's overflowing 1/d) → the clamp, as the portable loop.
                    let p = _mm256_and_ps(p, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
                    let q = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps::<NEAREST>(p), min), max);
                    let hq = _mm256_round_ps::<NEAREST>(_mm256_mul_ps(q, inv));
                    // Exact: integers below 2²⁴.
                    let lq = _mm256_sub_ps(q, _mm256_mul_ps(ratio, hq));
                    (h[i], l[i]) = (_mm256_cvttps_epi32(hq), _mm256_cvttps_epi32(lq));
                }
                [store_codes(h, hi), store_codes(l, lo)]
            }
        }
    }

    /// Stores 32 codes in [−127, 127] (four ymm of i32, in order) as bytes at `q`, and
    /// returns the sums of each 4 consecutive codes.
    ///
    /// # Safety
    /// AVX2; 32 bytes writable at `q`.
    #[inline(always)]
    unsafe fn store_codes(ints: [__m256i; 4], q: *mut i8) -> [i32; 8] {
        // SAFETY: for the whole body, AVX2 per the contract; 32 bytes at q.
        unsafe {
            // packs interleave the 128-bit halves: dwords come out as 0,2,4,6,1,3,5,7
            // of the wanted order.
            let words = (
                _mm256_packs_epi32(ints[0], ints[1]),
                _mm256_packs_epi32(ints[2], ints[3]),
            );
            let bytes = _mm256_packs_epi16(words.0, words.1);
            let codes =
                _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.cast(), codes);
            let sums = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_set1_epi8(1), codes),
                _mm256_set1_epi16(1),
            );
            let mut out = [0i32; 8];
            _mm256_storeu_si256(out.as_mut_ptr().cast(), sums);
            out
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    //! NEON's steps: q registers of 4 floats, the block's codes in two.

    use super::{QuantLanes, PLANE_RATIO, SPLIT_RANGE};
    use std::arch::aarch64::*;

    pub(super) struct Neon;

    impl QuantLanes for Neon {
        #[inline(always)]
        unsafe fn amax_finite(x: &[f32]) -> (f32, bool) {
            // SAFETY: for the whole body, NEON is baseline; 4 floats per load.
            unsafe {
                let inf = vdupq_n_f32(f32::INFINITY);
                let (mut m, mut finite) = (vdupq_n_f32(0.0), vdupq_n_u32(!0));
                for c in x.chunks_exact(4) {
                    let a = vabsq_f32(vld1q_f32(c.as_ptr()));
                    // fmaxnm returns the number when one operand is NaN: m survives.
                    m = vmaxnmq_f32(m, a);
                    finite = vandq_u32(finite, vcltq_f32(a, inf));
                }
                (vmaxnmvq_f32(m), vminvq_u32(finite) == !0)
            }
        }

        #[inline(always)]
        unsafe fn block_codes(xb: *const f32, id: f32, q: *mut i8) -> [i32; 8] {
            // SAFETY: for the whole body, NEON is baseline; 32 floats at xb, 32 bytes
            // at q.
            unsafe {
                let (lo, hi) = (vdupq_n_f32(-127.0), vdupq_n_f32(127.0));
                let id = vdupq_n_f32(id);
                let mut ints = [vdupq_n_s32(0); 8];
                for (i, out) in ints.iter_mut().enumerate() {
                    let p = vmulq_f32(vld1q_f32(xb.add(4 * i)), id);
                    // NaN → 0 (fcvtas gives 0 too, but fmax/fmin would keep the NaN
                    // first), ±∞ → ±127: the portable loop's saturating cast and clamp.
                    let ordered = vceqq_f32(p, p);
                    let p = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(p), ordered));
                    let p = vminq_f32(vmaxq_f32(p, lo), hi);
                    // Round to nearest, ties away from zero, as `f32::round`.
                    *out = vcvtaq_s32_f32(p);
                }
                store_codes(ints, q)
            }
        }

        #[inline(always)]
        unsafe fn block_split(xb: *const f32, id: f32, hi: *mut i8, lo: *mut i8) -> [[i32; 8]; 2] {
            // SAFETY: for the whole body, NEON is baseline; 32 floats at xb, 32 bytes
            // at hi and at lo.
            unsafe {
                let (min, max) = (vdupq_n_f32(-SPLIT_RANGE), vdupq_n_f32(SPLIT_RANGE));
                let (inv, ratio) = (vdupq_n_f32(1.0 / PLANE_RATIO), vdupq_n_f32(PLANE_RATIO));
                let id = vdupq_n_f32(id);
                let (mut h, mut l) = ([vdupq_n_s32(0); 8], [vdupq_n_s32(0); 8]);
                for i in 0..8 {
                    let p = vmulq_f32(vld1q_f32(xb.add(4 * i)), id);
                    // NaN → 0 in both planes, ±∞ → the clamp, as the portable loop.
                    let ordered = vceqq_f32(p, p);
                    let p = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(p), ordered));
                    // frintn: to nearest, ties to even, as `round_ties_even`.
                    let q = vminq_f32(vmaxq_f32(vrndnq_f32(p), min), max);
                    let hq = vrndnq_f32(vmulq_f32(q, inv));
                    // Exact: integers below 2²⁴.
                    let lq = vsubq_f32(q, vmulq_f32(ratio, hq));
                    (h[i], l[i]) = (vcvtq_s32_f32(hq), vcvtq_s32_f32(lq));
                }
                [store_codes(h, hi), store_codes(l, lo)]
            }
        }
    }

    /// Stores 32 codes in [−127, 127] (eight q registers of i32, in order) as bytes at
    /// `q`, and returns the sums of each 4 consecutive codes.
    ///
    /// # Safety
    /// 32 bytes writable at `q`.
    #[inline(always)]
    unsafe fn store_codes(ints: [int32x4_t; 8], q: *mut i8) -> [i32; 8] {
        // SAFETY: for the whole body, NEON is baseline; 32 bytes at q.
        unsafe {
            let mut sums = [0i32; 8];
            for half in 0..2 {
                let i = &ints[4 * half..4 * half + 4];
                let words = (
                    vcombine_s16(vmovn_s32(i[0]), vmovn_s32(i[1])),
                    vcombine_s16(vmovn_s32(i[2]), vmovn_s32(i[3])),
                );
                let codes = vcombine_s8(vmovn_s16(words.0), vmovn_s16(words.1));
                vst1q_s8(q.add(16 * half), codes);
                // Pairs, then quads: lane l of the 4 is Σ codes 4l..4l+4.
                let quads = vpaddlq_s16(vpaddlq_s8(codes));
                vst1q_s32(sums.as_mut_ptr().add(4 * half), quads);
            }
            sums
        }
    }
}
