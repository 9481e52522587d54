//! Explicit AVX-512 vector math: e^x and slice maps built on it.
//!
//! The portable [`super::exp`] compiles to mul+add pairs (Rust never contracts them into
//! FMA) and a 25-deep dependency chain per vector; in softmax that, not DRAM, set the pace
//! (~50 cycles per 16 elements). Here the reduction and polynomial are FMAs, 2ⁿ is one
//! `vscalefps` (which also produces exact overflow to +∞ and gradual underflow, so no
//! range fix-ups), and the maps interleave independent vectors so the chains overlap.

use std::arch::x86_64::*;

/// Taylor coefficients 1/k! for e^r, k = 2..6, |r| ≤ ln2/2: the truncation error
/// r⁷/7! ≤ 1.2e-7 is below one f32 ulp at 1, so degree 6 suffices (portable: 7).
const C: [f32; 5] = [1.0 / 2.0, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0];

/// e^x on 16 lanes, ≤ 3e-7 relative wherever the result is a normal f32; NaN stays NaN.
///
/// # Safety
/// The CPU must support AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
pub unsafe fn exp16(x: __m512) -> __m512 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Clamp so that n stays within vscalefps' useful range and r stays finite (−∞ − −∞
    // would be NaN); max/min return their second operand when either is NaN, so NaN
    // passes through. −104 is below the smallest subnormal's log; 89 is above ln(MAX).
    let x = _mm512_min_ps(
        _mm512_set1_ps(89.0),
        _mm512_max_ps(_mm512_set1_ps(-104.0), x),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    // Cody–Waite: r = x − n·ln2 in two steps, so r keeps its low bits for |n| up to 150.
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(C[4]);
    for &c in C[..4].iter().rev() {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let one = _mm512_set1_ps(1.0);
    p = _mm512_fmadd_ps(p, r, one);
    p = _mm512_fmadd_ps(p, r, one);
    _mm512_scalef_ps(p, n)
}

/// Mask of the first `len` (< 16) lanes.
#[inline(always)]
fn tail_mask(len: usize) -> __mmask16 {
    ((1u32 << len) - 1) as __mmask16
}

/// Vectors per interleaved group: four 25-cycle chains in flight per loop iteration.
const GROUP: usize = 4;

/// `dst[i] = f(src[i])` (and the sum of the results) for slices of equal length.
///
/// # Safety
/// The CPU must support AVX-512F; `src` and `dst` must be valid for `len` elements
/// (they may be the same buffer).
#[inline(always)]
unsafe fn map_sum<F: Fn(__m512) -> __m512>(
    src: *const f32,
    dst: *mut f32,
    len: usize,
    f: F,
) -> f32 {
    // SAFETY: the caller guarantees AVX-512F and `len` valid elements at both pointers;
    // every access below is at an offset < len (full vectors) or masked to it.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); GROUP];
        let mut i = 0;
        while i + 16 * GROUP <= len {
            let mut y = [_mm512_setzero_ps(); GROUP];
            for g in 0..GROUP {
                y[g] = f(_mm512_loadu_ps(src.add(i + 16 * g)));
            }
            for g in 0..GROUP {
                _mm512_storeu_ps(dst.add(i + 16 * g), y[g]);
                acc[g] = _mm512_add_ps(acc[g], y[g]);
            }
            i += 16 * GROUP;
        }
        while i + 16 <= len {
            let y = f(_mm512_loadu_ps(src.add(i)));
            _mm512_storeu_ps(dst.add(i), y);
            acc[0] = _mm512_add_ps(acc[0], y);
            i += 16;
        }
        if i < len {
            let m = tail_mask(len - i);
            let y = f(_mm512_maskz_loadu_ps(m, src.add(i)));
            _mm512_mask_storeu_ps(dst.add(i), m, y);
            acc[1] = _mm512_add_ps(acc[1], _mm512_maskz_mov_ps(m, y));
        }
        let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        _mm512_reduce_add_ps(s)
    }
}

/// Max of a slice, skipping NaN (−∞ when empty or all NaN), as [`super::max`].
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn max(x: &[f32]) -> f32 {
    let (p, len) = (x.as_ptr(), x.len());
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut acc = [ninf; GROUP];
    let mut i = 0;
    // vmaxps returns its second operand when either is NaN: max(v, acc) keeps acc.
    // SAFETY: all loads are below len (full vectors) or masked to it.
    unsafe {
        while i + 16 * GROUP <= len {
            for (g, a) in acc.iter_mut().enumerate() {
                *a = _mm512_max_ps(_mm512_loadu_ps(p.add(i + 16 * g)), *a);
            }
            i += 16 * GROUP;
        }
        while i + 16 <= len {
            acc[0] = _mm512_max_ps(_mm512_loadu_ps(p.add(i)), acc[0]);
            i += 16;
        }
        if i < len {
            let v = _mm512_mask_loadu_ps(ninf, tail_mask(len - i), p.add(i));
            acc[1] = _mm512_max_ps(v, acc[1]);
        }
    }
    let m = _mm512_max_ps(_mm512_max_ps(acc[0], acc[1]), _mm512_max_ps(acc[2], acc[3]));
    _mm512_reduce_max_ps(m)
}

/// `v[i] = e^(v[i] − shift)`, returning Σv.
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn exp_shifted_sum(v: &mut [f32], shift: f32) -> f32 {
    let s = _mm512_set1_ps(shift);
    let p = v.as_mut_ptr();
    // SAFETY: AVX-512F per the caller; p is valid for v.len() elements.
    unsafe { map_sum(p, p, v.len(), |x| exp16(_mm512_sub_ps(x, s))) }
}

/// `dst[i] = e^(src[i] − shift)`, returning Σdst; the slices must have equal length.
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn exp_shifted_sum_into(src: &[f32], shift: f32, dst: &mut [f32]) -> f32 {
    assert_eq!(src.len(), dst.len(), "exp_shifted_sum_into: lengths differ");
    let s = _mm512_set1_ps(shift);
    // SAFETY: AVX-512F per the caller; both slices hold src.len() elements.
    unsafe {
        map_sum(src.as_ptr(), dst.as_mut_ptr(), src.len(), |x| {
            exp16(_mm512_sub_ps(x, s))
        })
    }
}
