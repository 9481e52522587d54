//! The NEON instances of the interleaved kernels ([`super::chunk`], and [`super::planes`]
//! for split scales): Arm's DotProd `sdot` on a pair of q registers per 8 rows (rows
//! 0–3, rows 4–7), with the width's [`RowLanes`], [`PlaneLanes`] and [`Wide8`]
//! primitives. The algorithms are in the parent module and `planes`.
//!
//! `sdot` multiplies signed by signed bytes: nibble and 5-bit codes (< 32) are already
//! non-negative i8, and full-byte codes (offset 128: Q8_0, Q8_K) go in as u − 128,
//! whose sums then include the −128·Σq_x that `vpdpbusd` takes from the start value
//! ([`RowLanes::SIGNED_BYTES`]). Sums are i32 and exact.
//!
//! `sdot` (the DotProd extension) and f16 → f32 have no stable Rust intrinsics yet:
//! each is one line of `asm!` in `simd::lanes_neon`.

use super::super::act_panel::PanelRows;
use super::super::packed::{Meta, PackedWeights, ROWS8};
use super::super::quant_acts::QuantActs;
use super::super::M_CHUNK;
use super::planes::{self, PlaneLanes};
use super::{dots_with, ChunkMeta, RowLanes, Wide8};
use crate::simd::lanes_neon::{self, widen_f16x4};
use half::f16;
use std::arch::aarch64::*;

/// `out[8i + g] = Σ_k W[r0 + g, k]·x̂_i[k]` for the group of 8 rows starting at r0
/// (rows past `w.rows` are zero padding) and up to M_CHUNK activation rows, with `sdot`.
///
/// # Safety
/// NEON with DotProd; `w.layout.interleaved()` (full bytes included) but not
/// `Meta::SplitI8` metadata; r0 a multiple of 8 below `w.rows`; 1 ≤ acts.live() ≤
/// M_CHUNK, the rows quantized for `w.cols` columns and `w`'s offset, starting at a slot
/// that leaves M_CHUNK slots in the panel; out.len() ≥ 8·acts.live().
#[target_feature(enable = "neon,dotprod")]
pub(in super::super) unsafe fn dots_sdot(
    w: &PackedWeights,
    r0: usize,
    acts: PanelRows<'_>,
    out: &mut [f32],
) {
    // SAFETY: forwarded contract.
    unsafe { dots_with::<Sdot8, M_CHUNK>(w, r0, acts, (out, ROWS8)) }
}

/// 8 rows' i32 lanes: rows 0–3, rows 4–7.
#[derive(Clone, Copy)]
pub(super) struct I8Rows(int32x4_t, int32x4_t);

/// 8 rows' f32 lanes: rows 0–3, rows 4–7.
#[derive(Clone, Copy)]
pub(super) struct F8Rows(float32x4_t, float32x4_t);

/// One group's 8 rows on two q registers with `sdot`.
pub(super) struct Sdot8;

/// `sdot` on i32-typed registers (the lanes' type here).
///
/// # Safety
/// DotProd.
#[inline(always)]
unsafe fn sdot(acc: int32x4_t, w: int32x4_t, x: int32x4_t) -> int32x4_t {
    // SAFETY: DotProd per the contract; the casts only retype the registers.
    unsafe { lanes_neon::sdot(acc, vreinterpretq_s8_s32(w), vreinterpretq_s8_s32(x)) }
}

/// Both halves of `v` through `f`.
#[inline(always)]
fn each(v: I8Rows, f: impl Fn(uint8x16_t) -> uint8x16_t) -> I8Rows {
    // SAFETY: reinterpretations between 128-bit vector types (NEON is baseline).
    unsafe {
        I8Rows(
            vreinterpretq_s32_u8(f(vreinterpretq_u8_s32(v.0))),
            vreinterpretq_s32_u8(f(vreinterpretq_u8_s32(v.1))),
        )
    }
}

impl RowLanes for Sdot8 {
    const GROUPS: usize = 1;
    const SIGNED_BYTES: bool = true;
    /// Two registers per row already give 2·M independent sums.
    const ONE_CHAIN_FROM: usize = 2;
    type I = I8Rows;
    type F = F8Rows;
    /// Signed, u − 128, as `sdot` takes them.
    type Full = I8Rows;
    #[inline(always)]
    unsafe fn codes(p: *const u8, _: usize) -> I8Rows {
        // SAFETY: 32 readable bytes, per the contract.
        unsafe {
            I8Rows(
                vreinterpretq_s32_u8(vld1q_u8(p)),
                vreinterpretq_s32_u8(vld1q_u8(p.add(16))),
            )
        }
    }
    #[inline(always)]
    unsafe fn nibbles<const HI: bool>(v: I8Rows) -> I8Rows {
        // SAFETY: NEON.
        each(v, |b| unsafe {
            if HI {
                vshrq_n_u8::<4>(b)
            } else {
                vandq_u8(b, vdupq_n_u8(0x0F))
            }
        })
    }
    #[inline(always)]
    unsafe fn full_codes(v: I8Rows) -> I8Rows {
        // u ^ 0x80 is u − 128 as a signed byte.
        // SAFETY: NEON.
        each(v, |b| unsafe { veorq_u8(b, vdupq_n_u8(0x80)) })
    }
    #[inline(always)]
    unsafe fn add_full(sum: I8Rows, u: I8Rows, x: i32) -> I8Rows {
        // SAFETY: forwarded contract (`sdot` takes signed bytes whole).
        unsafe { Self::add(sum, u, x) }
    }
    #[inline(always)]
    unsafe fn start(init: i32) -> I8Rows {
        // SAFETY: NEON.
        unsafe { I8Rows(vdupq_n_s32(init), vdupq_n_s32(init)) }
    }
    #[inline(always)]
    unsafe fn add(sum: I8Rows, u: I8Rows, x: i32) -> I8Rows {
        // SAFETY: DotProd per the contract.
        unsafe {
            let x = vdupq_n_s32(x);
            I8Rows(sdot(sum.0, u.0, x), sdot(sum.1, u.1, x))
        }
    }
    #[inline(always)]
    unsafe fn finish<const CODES: u8>([a, b]: [I8Rows; 2], _: i32) -> I8Rows {
        // SAFETY: NEON.
        unsafe { I8Rows(vaddq_s32(a.0, b.0), vaddq_s32(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn meta<C: ChunkMeta, const MINS: bool>(m: &[C; 2], c: usize) -> F8Rows {
        // SAFETY: forwarded contract.
        unsafe {
            if MINS {
                m[0].mins::<F8Rows>(c)
            } else {
                m[0].scales::<F8Rows>(c)
            }
        }
    }
    #[inline(always)]
    unsafe fn zero() -> F8Rows {
        // SAFETY: NEON.
        unsafe { F8Rows(vdupq_n_f32(0.0), vdupq_n_f32(0.0)) }
    }
    #[inline(always)]
    unsafe fn scale_add(s: I8Rows, d: F8Rows, dx: f32, acc: F8Rows) -> F8Rows {
        // SAFETY: NEON (`fmla`, one rounding, as the x86 instances' FMA).
        unsafe {
            F8Rows(
                vfmaq_f32(acc.0, vcvtq_f32_s32(s.0), vmulq_n_f32(d.0, dx)),
                vfmaq_f32(acc.1, vcvtq_f32_s32(s.1), vmulq_n_f32(d.1, dx)),
            )
        }
    }
    #[inline(always)]
    unsafe fn min_add(m: F8Rows, sums: f32, acc: F8Rows) -> F8Rows {
        // SAFETY: NEON.
        unsafe { F8Rows(vfmaq_n_f32(acc.0, m.0, sums), vfmaq_n_f32(acc.1, m.1, sums)) }
    }
    #[inline(always)]
    unsafe fn store(acc: F8Rows, out: &mut [f32]) {
        debug_assert!(out.len() >= 8);
        // SAFETY: out holds 8 floats, per the contract.
        unsafe {
            vst1q_f32(out.as_mut_ptr(), acc.0);
            vst1q_f32(out.as_mut_ptr().add(4), acc.1);
        }
    }
}

impl Wide8 for F8Rows {
    #[inline(always)]
    unsafe fn from_f32(p: *const f32) -> F8Rows {
        // SAFETY: 8 floats at p, per the contract.
        unsafe { F8Rows(vld1q_f32(p), vld1q_f32(p.add(4))) }
    }
    #[inline(always)]
    unsafe fn from_f16(p: *const f16) -> F8Rows {
        // SAFETY: 8 halves (16 bytes) at p, per the contract.
        unsafe { F8Rows(widen_f16x4(p), widen_f16x4(p.add(4))) }
    }
    #[inline(always)]
    unsafe fn f16_times_u8(base: *const f16, bytes: *const u8) -> F8Rows {
        // SAFETY: 8 values at each, per the contract.
        unsafe {
            let wide = vmovl_u8(vld1_u8(bytes));
            let lo = vcvtq_f32_u32(vmovl_u16(vget_low_u16(wide)));
            let hi = vcvtq_f32_u32(vmovl_high_u16(wide));
            let b = Self::from_f16(base);
            F8Rows(vmulq_f32(b.0, lo), vmulq_f32(b.1, hi))
        }
    }
}

/// `out[8i + g] = Σ_k W[r0 + g, k]·x̂_i[k]` over Q2_K/Q3_K/Q6_K's split scales (`planes`)
/// for the group of 8 rows at r0 and up to M_CHUNK activation rows, with `sdot`.
///
/// # Safety
/// NEON with DotProd; `w.layout.interleaved()` with `Meta::SplitI8` metadata; r0 a
/// multiple of 8 below `w.rows`; 1 ≤ acts.len() ≤ M_CHUNK, each built for `w.cols`
/// columns and `w`'s offset; out.len() ≥ 8·acts.len().
#[target_feature(enable = "neon,dotprod")]
pub(in super::super) unsafe fn planes_sdot(
    w: &PackedWeights,
    r0: usize,
    acts: &[&QuantActs],
    out: &mut [f32],
) {
    match &w.meta {
        // SAFETY: forwarded contract.
        Meta::SplitI8(s) => unsafe { planes::dots::<Sdot8, M_CHUNK>(w, s, r0, acts, out) },
        _ => unreachable!("the split-scale kernel reads split scales only"),
    }
}

/// `sdot` sums a half in i32; each half's scale multiplies it in (`mla`), exact in i32.
impl PlaneLanes for Sdot8 {
    type Half = I8Rows;
    /// The 8 rows' sc₀, then their sc₁, as i32.
    type Scales = [I8Rows; 2];
    #[inline(always)]
    unsafe fn crumb<const K: u32>(v: I8Rows) -> I8Rows {
        // SAFETY: NEON.
        each(v, |b| unsafe {
            let at4 = match K {
                0 => vshlq_n_u8::<4>(b),
                1 => vshlq_n_u8::<2>(b),
                2 => b,
                _ => vshrq_n_u8::<2>(b),
            };
            vandq_u8(at4, vdupq_n_u8(0x30))
        })
    }
    #[inline(always)]
    unsafe fn or(a: I8Rows, b: I8Rows) -> I8Rows {
        // SAFETY: NEON.
        unsafe { I8Rows(vorrq_s32(a.0, b.0), vorrq_s32(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn zero_i() -> I8Rows {
        // SAFETY: NEON.
        unsafe { I8Rows(vdupq_n_s32(0), vdupq_n_s32(0)) }
    }
    #[inline(always)]
    unsafe fn half_zero() -> I8Rows {
        // SAFETY: NEON.
        unsafe { Self::zero_i() }
    }
    #[inline(always)]
    unsafe fn half_add(h: I8Rows, u: I8Rows, x: i32, _: usize) -> I8Rows {
        // SAFETY: DotProd per the contract.
        unsafe { <Self as RowLanes>::add(h, u, x) }
    }
    #[inline(always)]
    unsafe fn scales(p: *const i8) -> [I8Rows; 2] {
        // SAFETY: 16 bytes at p, per the contract; `ld2` splits the (sc₀, sc₁) pairs.
        unsafe {
            let pairs = vld2_s8(p);
            [pairs.0, pairs.1].map(|sc| {
                let wide = vmovl_s8(sc);
                I8Rows(vmovl_s16(vget_low_s16(wide)), vmovl_high_s16(wide))
            })
        }
    }
    #[inline(always)]
    unsafe fn half_total(total: I8Rows, h: I8Rows, sc: [I8Rows; 2], half: usize) -> I8Rows {
        let s = sc[half];
        // SAFETY: NEON.
        unsafe { I8Rows(vmlaq_s32(total.0, h.0, s.0), vmlaq_s32(total.1, h.1, s.1)) }
    }
    #[inline(always)]
    unsafe fn minus_offset(total: I8Rows, sc: [I8Rows; 2], half_sums: i32, offset: i32) -> I8Rows {
        let (s0, s1) = (i32::from(half_sums as i16), half_sums >> 16);
        // SAFETY: NEON.
        unsafe {
            let term = |k: usize| {
                let [a, b] = [sc[0], sc[1]].map(|v| if k == 0 { v.0 } else { v.1 });
                vmlaq_n_s32(vmulq_n_s32(a, s0), b, s1)
            };
            I8Rows(
                vmlsq_n_s32(total.0, term(0), offset),
                vmlsq_n_s32(total.1, term(1), offset),
            )
        }
    }
    #[inline(always)]
    unsafe fn d8(p: *const f16) -> F8Rows {
        // SAFETY: forwarded contract.
        unsafe { F8Rows::from_f16(p) }
    }
}
