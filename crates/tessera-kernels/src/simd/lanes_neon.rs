//! [`Lanes`] on aarch64: NEON's 128-bit registers, 4 lanes.

use super::lanes::Lanes;
use half::{bf16, f16};
use std::arch::aarch64::*;
use std::arch::asm;

/// `acc + Σ` of each 4-byte group of `w` times the same group of `x`, signed bytes, per
/// i32 lane (`sdot`, wrapping). `vdotq_s32` is not yet a stable intrinsic; the
/// instruction is one line of `asm!`.
///
/// # Safety
/// The CPU has DotProd.
#[inline(always)]
pub(crate) unsafe fn sdot(mut acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    // SAFETY: DotProd per the contract; registers only, no memory, no flags.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {x:v}.16b",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// The 4 halves at `p` as f32 (`fcvtl`, exact). One line of `asm!`: the conversion is
/// base AdvSIMD, but its Rust intrinsics take the f16 vector types, not yet stable
/// (converting through `half`, one scalar at a time, was the fallback).
///
/// # Safety
/// 8 bytes readable at `p`.
#[inline(always)]
pub(crate) unsafe fn widen_f16x4(p: *const f16) -> float32x4_t {
    // SAFETY: per the contract; `fcvtl` touches registers only.
    unsafe {
        let h = vld1_u16(p.cast());
        let wide: float32x4_t;
        asm!(
            "fcvtl {wide:v}.4s, {h:v}.4h",
            h = in(vreg) h,
            wide = lateout(vreg) wide,
            options(pure, nomem, nostack, preserves_flags)
        );
        wide
    }
}

/// NEON: 4 lanes in q registers.
pub(crate) struct Neon;

impl Lanes for Neon {
    const N: usize = 4;
    type I = int32x4_t;
    type F = float32x4_t;
    #[inline(always)]
    unsafe fn widen_u8(p: *const u8) -> int32x4_t {
        // SAFETY: 4 bytes at p, per the contract; NEON is baseline on aarch64.
        unsafe {
            let four = vreinterpret_u8_u32(vdup_n_u32(p.cast::<u32>().read_unaligned()));
            vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(four))))
        }
    }
    #[inline(always)]
    unsafe fn widen_i8(p: *const u8) -> int32x4_t {
        // SAFETY: as widen_u8.
        unsafe {
            let four = vreinterpret_s8_u32(vdup_n_u32(p.cast::<u32>().read_unaligned()));
            vmovl_s16(vget_low_s16(vmovl_s8(four)))
        }
    }
    #[inline(always)]
    unsafe fn splat_i(v: i32) -> int32x4_t {
        // SAFETY: NEON.
        unsafe { vdupq_n_s32(v) }
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> float32x4_t {
        // SAFETY: NEON.
        unsafe { vdupq_n_f32(v) }
    }
    #[inline(always)]
    unsafe fn splat_f16(v: f16) -> float32x4_t {
        // SAFETY: NEON.
        unsafe { vdupq_n_f32(v.to_f32()) }
    }
    #[inline(always)]
    unsafe fn field(v: int32x4_t, shift: u32, mask: i32) -> int32x4_t {
        // A logical right shift is a left shift by a negative count (`ushl`).
        // SAFETY: NEON.
        unsafe {
            let s = vshlq_u32(vreinterpretq_u32_s32(v), vdupq_n_s32(-(shift as i32)));
            vandq_s32(vreinterpretq_s32_u32(s), vdupq_n_s32(mask))
        }
    }
    #[inline(always)]
    unsafe fn or_shifted(v: int32x4_t, top: int32x4_t, shift: u32) -> int32x4_t {
        // SAFETY: NEON.
        unsafe { vorrq_s32(v, vshlq_s32(top, vdupq_n_s32(shift as i32))) }
    }
    #[inline(always)]
    unsafe fn or_where(v: int32x4_t, bits: u32, val: i32) -> int32x4_t {
        // SAFETY: NEON; the array holds 4 lanes.
        unsafe {
            let lane_bits = vld1q_u32([1u32, 2, 4, 8].as_ptr());
            let set = vtstq_u32(vdupq_n_u32(bits & 0xF), lane_bits);
            let add = vandq_s32(vreinterpretq_s32_u32(set), vdupq_n_s32(val));
            vorrq_s32(v, add)
        }
    }
    #[inline(always)]
    unsafe fn add_i(a: int32x4_t, b: int32x4_t) -> int32x4_t {
        // SAFETY: NEON.
        unsafe { vaddq_s32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub_i(a: int32x4_t, b: int32x4_t) -> int32x4_t {
        // SAFETY: NEON.
        unsafe { vsubq_s32(a, b) }
    }
    #[inline(always)]
    unsafe fn to_f32(v: int32x4_t) -> float32x4_t {
        // SAFETY: NEON.
        unsafe { vcvtq_f32_s32(v) }
    }
    #[inline(always)]
    unsafe fn div(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON.
        unsafe { vdivq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON.
        unsafe { vmulq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (`fmla`, one rounding).
        unsafe { vfmaq_f32(c, a, b) }
    }
    #[inline(always)]
    unsafe fn clamp(v: float32x4_t, lo: float32x4_t, hi: float32x4_t) -> float32x4_t {
        // fmax/fmin (not fmaxnm) return NaN when either operand is NaN.
        // SAFETY: NEON.
        unsafe { vminq_f32(vmaxq_f32(v, lo), hi) }
    }
    #[inline(always)]
    unsafe fn round(v: float32x4_t) -> float32x4_t {
        // SAFETY: NEON (`frintn`, ties to even).
        unsafe { vrndnq_f32(v) }
    }
    #[inline(always)]
    unsafe fn exp2_int(n: float32x4_t) -> float32x4_t {
        // SAFETY: NEON.
        unsafe {
            let e = vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127));
            vreinterpretq_f32_s32(vshlq_n_s32::<23>(e))
        }
    }
    #[inline(always)]
    unsafe fn zero() -> float32x4_t {
        // SAFETY: NEON.
        unsafe { vdupq_n_f32(0.0) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> float32x4_t {
        // SAFETY: 4 floats at p, per the contract.
        unsafe { vld1q_f32(p) }
    }
    #[inline(always)]
    unsafe fn add(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: NEON.
        unsafe { vaddq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn sum(v: float32x4_t) -> f32 {
        // SAFETY: NEON.
        unsafe { vaddvq_f32(v) }
    }
    #[inline(always)]
    unsafe fn max_keep(v: float32x4_t, acc: float32x4_t) -> float32x4_t {
        // fmaxnm returns the number when one operand is a quiet NaN.
        // SAFETY: NEON.
        unsafe { vmaxnmq_f32(v, acc) }
    }
    #[inline(always)]
    unsafe fn hmax(v: float32x4_t) -> f32 {
        // SAFETY: NEON.
        unsafe { vmaxnmvq_f32(v) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: float32x4_t) {
        // SAFETY: 4 floats at p, per the contract.
        unsafe { vst1q_f32(p, v) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> float32x4_t {
        // SAFETY: 4 halves at p, per the contract.
        unsafe { widen_f16x4(p) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const bf16) -> float32x4_t {
        // bf16 → f32 is a 16-bit left shift of the zero-extended bits.
        // SAFETY: 4 values (8 bytes) at p, per the contract.
        unsafe { vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p.cast()))) }
    }
    #[inline(always)]
    unsafe fn transpose_sums(p: *const f32) -> float32x4_t {
        // SAFETY: 16 floats at p, per the contract.
        unsafe {
            let (a, b) = (vld1q_f32(p), vld1q_f32(p.add(4)));
            let (c, d) = (vld1q_f32(p.add(8)), vld1q_f32(p.add(12)));
            vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d))
        }
    }
    #[inline(always)]
    unsafe fn prefetch_l1(p: *const u8) {
        // SAFETY: PRFM never faults and touches no register but its address operand.
        unsafe {
            std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
        }
    }
    #[inline(always)]
    unsafe fn prefetch_l2(p: *const u8) {
        // SAFETY: as prefetch_l1.
        unsafe {
            std::arch::asm!("prfm pldl2keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
        }
    }
}
