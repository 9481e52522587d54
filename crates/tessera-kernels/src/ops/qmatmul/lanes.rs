//! The vector width the f32-activation block kernels are written against: one trait,
//! [`Lanes`], with an 8-lane (AVX2 ymm) and a 16-lane (AVX-512 zmm) implementation.
//!
//! Why: the expansion of every block format (`super::expand`) and the small-M kernel
//! (`super::simd_rows`) were once written twice, an AVX2 file and an AVX-512 file per
//! algorithm, and tuning done on one width's host did not reach the other. Each is now
//! written once over `L: Lanes` and instantiated per width inside a function carrying
//! that width's `#[target_feature]`s (every method here is `#[inline(always)]`, so the
//! intrinsics compile with the caller's features).
//!
//! # Safety
//! Every method requires the CPU features of its implementation: AVX2, FMA and F16C for
//! [`Ymm`]; AVX-512F/BW/VL/DQ with those for [`Zmm`].

use half::f16;
use std::arch::x86_64::*;

/// One SIMD width's integer and f32 vectors, N lanes each.
pub(super) trait Lanes {
    /// 32-bit lanes per vector (divides 16, so a half sub-block is whole vectors).
    const N: usize;
    /// N × i32.
    type I: Copy;
    /// N × f32.
    type F: Copy;
    /// N bytes at `p`, zero-extended. # Safety: N bytes readable at `p`.
    unsafe fn widen_u8(p: *const u8) -> Self::I;
    /// N bytes at `p`, sign-extended. # Safety: N bytes readable at `p`.
    unsafe fn widen_i8(p: *const u8) -> Self::I;
    /// Every lane `v`.
    unsafe fn splat_i(v: i32) -> Self::I;
    /// Every lane `v`.
    unsafe fn splat_f(v: f32) -> Self::F;
    /// Every lane `v` as f32 (a word broadcast and one F16C conversion: building it
    /// from a scalar insert once gave LLVM a false dependency on an accumulator).
    unsafe fn splat_f16(v: f16) -> Self::F;
    /// `(v >> shift) & mask` per lane (logical shift).
    unsafe fn field(v: Self::I, shift: u32, mask: i32) -> Self::I;
    /// `v | (top << shift)` per lane.
    unsafe fn or_shifted(v: Self::I, top: Self::I, shift: u32) -> Self::I;
    /// `v | val` in the lanes j whose bit j of `bits` is set.
    unsafe fn or_where(v: Self::I, bits: u32, val: i32) -> Self::I;
    /// `a + b` per lane.
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I;
    /// `a − b` per lane.
    unsafe fn sub_i(a: Self::I, b: Self::I) -> Self::I;
    /// Lanes converted to f32.
    unsafe fn to_f32(v: Self::I) -> Self::F;
    /// `a·b` per lane.
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// `a·b + c` per lane, one rounding.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// All zero.
    unsafe fn zero() -> Self::F;
    /// N floats at `p`. # Safety: N floats readable at `p`.
    unsafe fn load(p: *const f32) -> Self::F;
    /// `a + b` per lane.
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
    /// The sum of the lanes.
    unsafe fn sum(v: Self::F) -> f32;
    /// Writes the N lanes to `p`. # Safety: N floats writable at `p`.
    #[cfg_attr(not(test), allow(dead_code))]
    unsafe fn store(p: *mut f32, v: Self::F);
}

/// AVX2: 8 lanes in ymm registers.
pub(super) struct Ymm;

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
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: 8 floats at p and AVX, per the contract.
        unsafe { _mm256_storeu_ps(p, v) }
    }
}

/// AVX-512: 16 lanes in zmm registers.
pub(super) struct Zmm;

impl Lanes for Zmm {
    const N: usize = 16;
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
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: 16 floats at p and AVX-512F, per the contract.
        unsafe { _mm512_storeu_ps(p, v) }
    }
}
