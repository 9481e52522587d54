//! [`Lanes`] on x86-64: AVX2 (8 lanes) and AVX-512 (16).

use super::lanes::Lanes;
use half::f16;
use std::arch::x86_64::*;

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
