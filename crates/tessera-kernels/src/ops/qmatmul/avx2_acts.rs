//! Activation quantization for the integer kernels ([`QuantActs`]), in AVX2.
//!
//! Why by hand: it runs on one thread before every integer matmul, and the portable
//! loop compiled for AVX2 stays scalar (the saturating `as i8` and the round-away-from-
//! zero keep LLVM from vectorizing it): `perf` of the 576→192 k/v projection at decode
//! put it at a third of the call. Here a 32-value block is 4 ymm of floats, 1 of
//! codes, and its lane sums come from the same `vpmaddubsw`/`vpmaddwd` pair the
//! kernels use.
//!
//! Bit-exact with the portable loop (tested on every ISA): round half away from zero as
//! trunc(v + copysign(0.49999997, v)), which is exact for |v| < 2²³; NaN products give
//! code 0 (the saturating cast's) and ±∞ give ±127 (the portable loop's clamp).

use super::packed::QuantActs;
use super::ActScales;
use crate::quant::QK;
use std::arch::x86_64::*;

/// Blocks whose scales are computed together. One block at a time, each block's chain
/// (max → horizontal max → two divisions → rounding → sums → stores) ran nearly
/// serially, ~150 cycles a block (`perf`: 0.55–0.8 µs of a 5 µs 576→192 decode call);
/// eight blocks' maxima first, then one `vdivps` pair for their scales, leave eight
/// independent blocks for the out-of-order core to overlap.
const GROUP: usize = 8;

/// Fills `a` (sized for `x`, as `QuantActs::refill` does) with `x` quantized per
/// 32-block, or with one scale for the row.
///
/// # Safety
/// AVX2 and FMA; `x.len()` a multiple of 32; `a`'s arrays hold at least `x.len() / 32`
/// blocks.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_into(x: &[f32], offset: i32, act: ActScales, a: &mut QuantActs) {
    let nb = x.len() / QK;
    debug_assert!(x.len().is_multiple_of(QK) && a.q.len() >= x.len());
    debug_assert!([a.d8.len(), a.init.len(), a.lane_sums.len()]
        .iter()
        .all(|&l| l >= nb));
    debug_assert!([a.block_init.len(), a.block_sums.len(), a.half_sums.len()]
        .iter()
        .all(|&l| l >= nb));
    let row = match act {
        ActScales::PerBlock => None,
        // SAFETY: AVX2 per the contract; the row is whole blocks.
        ActScales::PerRow => Some(unsafe { amax_finite(x) }),
    };
    for g0 in (0..nb).step_by(GROUP) {
        let n = GROUP.min(nb - g0);
        // Lanes past n keep amax 0 (scale 0) and are not used.
        let (mut amax, mut finite) = ([0f32; GROUP], [true; GROUP]);
        for j in 0..n {
            (amax[j], finite[j]) = match row {
                Some(r) => r,
                // SAFETY: AVX2 per the contract; a block is 4 × 8 floats.
                None => unsafe { amax_finite(&x[(g0 + j) * QK..][..QK]) },
            };
        }
        let (d, id) = scales(&amax);
        for j in 0..n {
            let d = if finite[j] { d[j] } else { f32::NAN };
            // SAFETY: block g0 + j < nb lies inside x and (per the contract) a.
            unsafe { quantize_block(x, g0 + j, (d, id[j]), offset, a) };
        }
    }
}

/// Per lane, the portable loop's `d = amax / 127` and `id = if d > 0 { 1 / d } else
/// { 0 }`: IEEE division is correctly rounded in either form, so the results are the
/// same bits.
#[target_feature(enable = "avx2,fma")]
fn scales(amax: &[f32; GROUP]) -> ([f32; GROUP], [f32; GROUP]) {
    // SAFETY: 8 floats.
    let am = unsafe { _mm256_loadu_ps(amax.as_ptr()) };
    let d = _mm256_div_ps(am, _mm256_set1_ps(127.0));
    let positive = _mm256_cmp_ps::<_CMP_GT_OQ>(d, _mm256_setzero_ps());
    let id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0), d), positive);
    let (mut ds, mut ids) = ([0f32; GROUP], [0f32; GROUP]);
    // SAFETY: 8 floats each.
    unsafe {
        _mm256_storeu_ps(ds.as_mut_ptr(), d);
        _mm256_storeu_ps(ids.as_mut_ptr(), id);
    }
    (ds, ids)
}

/// Block b's codes (at scale `id`), its d_x (`d`, NaN for a non-finite block) and the
/// sums the kernels preload.
///
/// # Safety
/// AVX2; block b lies inside `x` and inside each of `a`'s arrays.
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_block(x: &[f32], b: usize, (d, id): (f32, f32), offset: i32, a: &mut QuantActs) {
    // SAFETY: per the contract, block b is inside x and a.
    unsafe {
        let xb = x.as_ptr().add(b * QK);
        let v = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(xb.add(i)));
        let q = codes(v, _mm256_set1_ps(id));
        _mm256_storeu_si256(a.q.as_mut_ptr().add(b * QK).cast(), q);
        // Σ over each 4 consecutive codes, lane l holding codes 4l..4l+4.
        let sums = _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
            _mm256_set1_epi16(1),
        );
        let init = _mm256_mullo_epi32(sums, _mm256_set1_epi32(-offset));
        _mm256_storeu_si256(a.init.as_mut_ptr().add(b).cast(), init);
        _mm256_storeu_ps(
            a.lane_sums.as_mut_ptr().add(b).cast(),
            _mm256_cvtepi32_ps(sums),
        );
        _mm256_storeu_ps(a.d8.as_mut_ptr().add(b).cast(), _mm256_set1_ps(d));
        // [Σ lanes 0..4, Σ lanes 4..8] in the low two dwords.
        let pairs = _mm_hadd_epi32(
            _mm256_castsi256_si128(sums),
            _mm256_extracti128_si256::<1>(sums),
        );
        let halves = _mm_hadd_epi32(pairs, pairs);
        let (lo, hi) = (_mm_cvtsi128_si32(halves), _mm_extract_epi32::<1>(halves));
        let total = lo + hi;
        a.block_init[b] = -offset * total;
        a.block_sums[b] = d * total as f32;
        // |Σ| ≤ 16·127 fits an i16.
        a.half_sums[b] = i32::from(lo as i16 as u16) | (i32::from(hi as i16 as u16) << 16);
    }
}

/// max |v| (NaN ignored) and whether every value is finite, as the portable
/// `amax_finite`: over a block, or over the whole row for per-row scales.
///
/// # Safety
/// AVX2; `x.len()` a multiple of 8.
#[target_feature(enable = "avx2,fma")]
unsafe fn amax_finite(x: &[f32]) -> (f32, bool) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let inf = _mm256_set1_ps(f32::INFINITY);
    let (mut m, mut finite) = (_mm256_setzero_ps(), _mm256_set1_ps(f32::from_bits(!0)));
    for c in x.chunks_exact(8) {
        // SAFETY: 8 floats.
        let a = _mm256_and_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }, abs_mask);
        // vmaxps returns its second operand when either is NaN: m survives a NaN.
        m = _mm256_max_ps(a, m);
        finite = _mm256_and_ps(finite, _mm256_cmp_ps::<_CMP_LT_OQ>(a, inf));
    }
    // Reduced in registers (m holds no NaN, and the maximum is exact in any order): a
    // store and a scalar fold here put ~25 cycles on every block's chain.
    let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let h = _mm_max_ss(h, _mm_shuffle_ps::<1>(h, h));
    (_mm_cvtss_f32(h), _mm256_movemask_ps(finite) == 0xFF)
}

/// The 32 codes round(v·id) of one block, in order, as the portable loop's
/// `(v * id).round() as i8`.
#[target_feature(enable = "avx2,fma")]
fn codes(v: [__m256; 4], id: __m256) -> __m256i {
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let sign = _mm256_set1_ps(-0.0);
    let half = _mm256_set1_ps(0.499_999_97);
    let ints = v.map(|v| {
        let p = _mm256_mul_ps(v, id);
        // NaN (0·∞, or a NaN input) → 0, as the saturating cast does; ±∞ (a subnormal
        // d's overflowing 1/d) → ±127, as the portable clamp does. |p| ≤ 127 otherwise.
        let p = _mm256_and_ps(p, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
        let p = _mm256_min_ps(_mm256_max_ps(p, lo), hi);
        let away = _mm256_or_ps(_mm256_and_ps(p, sign), half);
        _mm256_cvttps_epi32(_mm256_add_ps(p, away))
    });
    // packs interleave the 128-bit halves: dwords come out as 0,2,4,6,1,3,5,7 of the
    // wanted order.
    let words = (
        _mm256_packs_epi32(ints[0], ints[1]),
        _mm256_packs_epi32(ints[2], ints[3]),
    );
    let bytes = _mm256_packs_epi16(words.0, words.1);
    _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}
