//! [`Lanes`] on x86-64: AVX2 (8 lanes) and AVX-512 (16).

use super::lanes::Lanes;
use half::{bf16, f16};
use std::arch::x86_64::*;

/// AVX2: 8 lanes in ymm registers.
pub(crate) struct Ymm;

/// All-ones in lanes 0..count of 8 (count < 8), zero above: the mask of `vmaskmovps`.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn ymm_first_lanes(count: usize) -> __m256i {
    // SAFETY: AVX2 per the caller.
    unsafe {
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(count as i32), lane)
    }
}

impl Lanes for Ymm {
    const N: usize = 8;
    type I = __m256i;
    type F = __m256;
    #[inline(always)]
    unsafe fn widen_u8(p: *const u8) -> __m256i {
        // SAFETY: 8 bytes at p and AVX2, per the contract.
        unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())) }
    }
    #[inline(always)]
    unsafe fn widen_i8(p: *const u8) -> __m256i {
        // SAFETY: as widen_u8.
        unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast())) }
    }
    #[inline(always)]
    unsafe fn splat_i(v: i32) -> __m256i {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m256 {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn splat_f16(v: f16) -> __m256 {
        // SAFETY: F16C per the contract.
        unsafe { _mm256_cvtph_ps(_mm_set1_epi16(v.to_bits() as i16)) }
    }
    #[inline(always)]
    unsafe fn field(v: __m256i, shift: u32, mask: i32) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe {
            let s = _mm256_srl_epi32(v, _mm_cvtsi32_si128(shift as i32));
            _mm256_and_si256(s, _mm256_set1_epi32(mask))
        }
    }
    #[inline(always)]
    unsafe fn or_shifted(v: __m256i, top: __m256i, shift: u32) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe { _mm256_or_si256(v, _mm256_sll_epi32(top, _mm_cvtsi32_si128(shift as i32))) }
    }
    #[inline(always)]
    unsafe fn or_where(v: __m256i, bits: u32, val: i32) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe {
            let lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
            let b = _mm256_set1_epi32((bits & 0xFF) as i32);
            let set = _mm256_cmpeq_epi32(_mm256_and_si256(b, lane_bits), lane_bits);
            _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi32(val)))
        }
    }
    #[inline(always)]
    unsafe fn add_i(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub_i(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe { _mm256_sub_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn to_f32(v: __m256i) -> __m256 {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_cvtepi32_ps(v) }
    }
    #[inline(always)]
    unsafe fn div(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: FMA per the contract.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn clamp(v: __m256, lo: __m256, hi: __m256) -> __m256 {
        // vmaxps/vminps return their second operand when either is NaN: v, then NaN.
        // SAFETY: AVX per the contract.
        unsafe { _mm256_min_ps(hi, _mm256_max_ps(lo, v)) }
    }
    #[inline(always)]
    unsafe fn round(v: __m256) -> __m256 {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v) }
    }
    #[inline(always)]
    unsafe fn exp2_int(n: __m256) -> __m256 {
        // SAFETY: AVX2 per the contract.
        unsafe {
            let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e))
        }
    }
    #[inline(always)]
    unsafe fn load_first(p: *const f32, count: usize, pad: f32) -> __m256 {
        // SAFETY: AVX2; `vmaskmovps` reads only the lanes under the mask, the `count`
        // readable floats (the contract).
        unsafe {
            let m = ymm_first_lanes(count);
            _mm256_blendv_ps(
                _mm256_set1_ps(pad),
                _mm256_maskload_ps(p, m),
                _mm256_castsi256_ps(m),
            )
        }
    }
    #[inline(always)]
    unsafe fn store_first(p: *mut f32, v: __m256, count: usize) {
        // SAFETY: as load_first, for writing.
        unsafe { _mm256_maskstore_ps(p, ymm_first_lanes(count), v) }
    }
    #[inline(always)]
    unsafe fn keep_first(v: __m256, count: usize) -> __m256 {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_and_ps(v, _mm256_castsi256_ps(ymm_first_lanes(count))) }
    }
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: 8 floats at p and AVX, per the contract.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sum(v: __m256) -> f32 {
        let mut lanes = [0f32; 8];
        // SAFETY: lanes holds 8 floats; AVX per the contract.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        lanes.iter().sum()
    }
    #[inline(always)]
    unsafe fn max_keep(v: __m256, acc: __m256) -> __m256 {
        // vmaxps returns its second operand when either is NaN.
        // SAFETY: AVX per the contract.
        unsafe { _mm256_max_ps(v, acc) }
    }
    #[inline(always)]
    unsafe fn hmax(v: __m256) -> f32 {
        // SAFETY: AVX per the contract.
        unsafe {
            let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
        }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: 8 floats at p and AVX, per the contract.
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> __m256 {
        // SAFETY: 8 halves at p and F16C, per the contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const bf16) -> __m256 {
        // bf16 → f32 is a 16-bit left shift of the zero-extended bits.
        // SAFETY: 8 values at p and AVX2, per the contract.
        unsafe {
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
        }
    }
    #[inline(always)]
    unsafe fn transpose_sums(p: *const f32) -> __m256 {
        // SAFETY: 64 floats at p and AVX, per the contract.
        unsafe {
            // Per 128-bit half: pair sums, then [Σ v0, Σ v1, Σ v2, Σ v3] of that half.
            let mut a = [_mm256_setzero_ps(); 4];
            for (i, x) in a.iter_mut().enumerate() {
                *x = _mm256_hadd_ps(
                    _mm256_loadu_ps(p.add(16 * i)),
                    _mm256_loadu_ps(p.add(16 * i + 8)),
                );
            }
            let lo = _mm256_hadd_ps(a[0], a[1]);
            let hi = _mm256_hadd_ps(a[2], a[3]);
            // Lanes 0–3: rows 0–3 (both halves added); lanes 4–7: rows 4–7.
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(lo, hi),
                _mm256_permute2f128_ps::<0x31>(lo, hi),
            )
        }
    }
    #[inline(always)]
    unsafe fn prefetch_l1(p: *const u8) {
        // SAFETY: a prefetch never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[inline(always)]
    unsafe fn prefetch_l2(p: *const u8) {
        // SAFETY: a prefetch never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast()) }
    }
}

/// The mask of lanes 0..count (count < 16).
#[inline(always)]
fn first_lanes(count: usize) -> __mmask16 {
    ((1u32 << count) - 1) as __mmask16
}

/// AVX-512: 16 lanes in zmm registers.
pub(crate) struct Zmm;

impl Lanes for Zmm {
    const N: usize = 16;
    const SCALEF_EXP: bool = true;
    type I = __m512i;
    type F = __m512;
    #[inline(always)]
    unsafe fn widen_u8(p: *const u8) -> __m512i {
        // SAFETY: 16 bytes at p and AVX-512F, per the contract.
        unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn widen_i8(p: *const u8) -> __m512i {
        // SAFETY: as widen_u8.
        unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn splat_i(v: i32) -> __m512i {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn splat_f16(v: f16) -> __m512 {
        // SAFETY: AVX-512F (with F16C) per the contract.
        unsafe { _mm512_cvtph_ps(_mm256_set1_epi16(v.to_bits() as i16)) }
    }
    #[inline(always)]
    unsafe fn field(v: __m512i, shift: u32, mask: i32) -> __m512i {
        // SAFETY: AVX-512F per the contract.
        unsafe {
            let s = _mm512_srlv_epi32(v, _mm512_set1_epi32(shift as i32));
            _mm512_and_si512(s, _mm512_set1_epi32(mask))
        }
    }
    #[inline(always)]
    unsafe fn or_shifted(v: __m512i, top: __m512i, shift: u32) -> __m512i {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_or_si512(v, _mm512_sllv_epi32(top, _mm512_set1_epi32(shift as i32))) }
    }
    #[inline(always)]
    unsafe fn or_where(v: __m512i, bits: u32, val: i32) -> __m512i {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_mask_or_epi32(v, bits as __mmask16, v, _mm512_set1_epi32(val)) }
    }
    #[inline(always)]
    unsafe fn add_i(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub_i(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_sub_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn to_f32(v: __m512i) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_cvtepi32_ps(v) }
    }
    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn clamp(v: __m512, lo: __m512, hi: __m512) -> __m512 {
        // vmaxps/vminps return their second operand when either is NaN: v, then NaN.
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_min_ps(hi, _mm512_max_ps(lo, v)) }
    }
    #[inline(always)]
    unsafe fn round(v: __m512) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v) }
    }
    #[inline(always)]
    unsafe fn exp2_int(n: __m512) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe {
            let e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e))
        }
    }
    #[inline(always)]
    unsafe fn mul_exp2(p: __m512, n: __m512) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_scalef_ps(p, n) }
    }
    #[inline(always)]
    unsafe fn load_first(p: *const f32, count: usize, pad: f32) -> __m512 {
        // SAFETY: AVX-512F; the mask covers the `count` readable floats (the contract).
        unsafe { _mm512_mask_loadu_ps(_mm512_set1_ps(pad), first_lanes(count), p) }
    }
    #[inline(always)]
    unsafe fn store_first(p: *mut f32, v: __m512, count: usize) {
        // SAFETY: as load_first, for writing.
        unsafe { _mm512_mask_storeu_ps(p, first_lanes(count), v) }
    }
    #[inline(always)]
    unsafe fn keep_first(v: __m512, count: usize) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_maskz_mov_ps(first_lanes(count), v) }
    }
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: 16 floats at p and AVX-512F, per the contract.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sum(v: __m512) -> f32 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_reduce_add_ps(v) }
    }
    #[inline(always)]
    unsafe fn max_keep(v: __m512, acc: __m512) -> __m512 {
        // vmaxps returns its second operand when either is NaN.
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_max_ps(v, acc) }
    }
    #[inline(always)]
    unsafe fn hmax(v: __m512) -> f32 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_reduce_max_ps(v) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: 16 floats at p and AVX-512F, per the contract.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> __m512 {
        // SAFETY: 16 halves at p and AVX-512F, per the contract.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const bf16) -> __m512 {
        // SAFETY: 16 values at p and AVX-512F, per the contract.
        unsafe {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        }
    }
    #[inline(always)]
    unsafe fn transpose_sums(p: *const f32) -> __m512 {
        // SAFETY: 256 floats at p and AVX-512F, per the contract.
        unsafe { hadd16(p) }
    }
    #[inline(always)]
    unsafe fn prefetch_l1(p: *const u8) {
        // SAFETY: a prefetch never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[inline(always)]
    unsafe fn prefetch_l2(p: *const u8) {
        // SAFETY: a prefetch never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast()) }
    }
}

/// `[Σ v₀, Σ v₁, …, Σ v₁₅]` of the 16 vectors at `p`: the horizontal sums in 4
/// shuffle+add levels (pairs within 128-bit lanes, then quads, then across lanes), ~45
/// ops for 16 sums where 16 separate reductions take ~130.
///
/// Plain loops, no closures: a closure is compiled without its caller's target features,
/// so intrinsics inside one (here once via `array::from_fn`) become out-of-line calls
/// that pass every vector through memory (9% of a 16-stream decode step, perf).
///
/// # Safety
/// AVX-512F; 256 floats readable at `p`.
#[inline(always)]
unsafe fn hadd16(p: *const f32) -> __m512 {
    // SAFETY: AVX-512F and 256 floats at p, per the caller's contract.
    unsafe {
        // Level 1: per 128-bit lane, [a0+a2, b0+b2, a1+a3, b1+b3] for each pair (a, b).
        let mut pairs = [_mm512_setzero_ps(); 8];
        for (i, x) in pairs.iter_mut().enumerate() {
            let (a, b) = (
                _mm512_loadu_ps(p.add(32 * i)),
                _mm512_loadu_ps(p.add(32 * i + 16)),
            );
            *x = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        }
        // Level 2: per 128-bit lane, the lane-partial sums of four vectors, in order.
        let mut q = [_mm512_setzero_ps(); 4];
        for (i, x) in q.iter_mut().enumerate() {
            let (a, b) = (
                _mm512_castps_pd(pairs[2 * i]),
                _mm512_castps_pd(pairs[2 * i + 1]),
            );
            *x = _mm512_add_ps(
                _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
            );
        }
        // Levels 3–4: add the four 128-bit lanes of each quad together.
        let x = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(q[0], q[1]),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(q[0], q[1]),
        );
        let y = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(q[2], q[3]),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(q[2], q[3]),
        );
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    }
}
