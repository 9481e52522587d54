//! The vector width explicit kernels are written against: one trait, [`Lanes`], with
//! 4-lane (NEON), 8-lane (AVX2 ymm) and 16-lane (AVX-512 zmm) implementations.
//!
//! Why: the expansion of every block format (`ops::qmatmul::expand`), the small-M
//! kernel (`ops::qmatmul::simd_rows`) and the paged decode-attention kernel were once
//! written per ISA, an AVX2 file and an AVX-512 file per algorithm, and tuning done on
//! one width's host did not reach the other. Each is now written once over `L: Lanes`
//! and instantiated per width inside a function carrying that width's
//! `#[target_feature]`s (every method here is `#[inline(always)]`, so the intrinsics
//! compile with the caller's features).
//!
//! Implementations: `Ymm` and `Zmm` on x86-64 (`lanes_x86`), `Neon` (4 lanes) on
//! aarch64 (`lanes_neon`); in tests, `Soft<N>` (`lanes_soft`: plain Rust at any width,
//! so the 16-lane instances run on a host without AVX-512).
//!
//! # Safety
//! Every method requires the CPU features of its implementation: AVX2, FMA and F16C for
//! `Ymm`; AVX-512F/BW/VL/DQ with those for `Zmm`; NEON (baseline on aarch64).

use half::{bf16, f16};

#[cfg(target_arch = "aarch64")]
pub(crate) use super::lanes_neon::Neon;
#[cfg(test)]
pub(crate) use super::lanes_soft::Soft;
#[cfg(target_arch = "x86_64")]
pub(crate) use super::lanes_x86::{Ymm, Zmm};

/// One SIMD width's integer and f32 vectors, N lanes each.
pub(crate) trait Lanes {
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
    /// `a / b` per lane (correctly rounded).
    unsafe fn div(a: Self::F, b: Self::F) -> Self::F;
    /// `a·b + c` per lane, one rounding.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// Lanes limited to `[lo, hi]`; a NaN lane stays NaN.
    unsafe fn clamp(v: Self::F, lo: Self::F, hi: Self::F) -> Self::F;
    /// Lanes rounded to the nearest integer (ties to even).
    unsafe fn round(v: Self::F) -> Self::F;
    /// 2ⁿ for lanes holding integers n in [−127, 127], built in the exponent bits
    /// (n = −127 gives +0).
    unsafe fn exp2_int(n: Self::F) -> Self::F;
    /// Whether [`Lanes::mul_exp2`] is AVX-512's `vscalefps`, which takes any n (it
    /// overflows to ∞ and underflows gradually): the exp then clamps x to [−104, 89]
    /// and not n, so |r| ≤ ln2/2 and a degree-6 polynomial suffices — the zmm-only exp
    /// this replaced, operation for operation. Otherwise n is clamped to [−127, 127]
    /// for [`Lanes::exp2_int`] and x to [−88, 89].
    const SCALEF_EXP: bool = false;
    /// `p·2ⁿ` for lanes holding integers n (in [−127, 127] unless
    /// [`Lanes::SCALEF_EXP`]): by default a multiply by 2ⁿ built in the exponent bits;
    /// one `vscalefps` on AVX-512.
    #[inline(always)]
    unsafe fn mul_exp2(p: Self::F, n: Self::F) -> Self::F {
        // SAFETY: the implementation's features, per the caller.
        unsafe { Self::mul(p, Self::exp2_int(n)) }
    }
    /// The first `count` (< N) floats at `p` and `pad` in the other lanes: a row's last
    /// partial vector. By default (NEON, the tests' `Soft`) through a padded copy;
    /// AVX-512 and AVX2 load under a mask.
    /// # Safety: `count` floats readable at `p`; the implementation's features.
    #[inline(always)]
    unsafe fn load_first(p: *const f32, count: usize, pad: f32) -> Self::F
    where
        Self: Sized,
    {
        debug_assert!(count < Self::N && Self::N <= 16);
        let mut lanes = [pad; 16];
        // SAFETY: count < N ≤ 16 floats readable at p and writable in `lanes`.
        unsafe {
            std::ptr::copy_nonoverlapping(p, lanes.as_mut_ptr(), count);
            Self::load(lanes.as_ptr())
        }
    }
    /// Stores the first `count` (< N) lanes of `v` at `p` (the rest untouched).
    /// # Safety: `count` floats writable at `p`; the implementation's features.
    #[inline(always)]
    unsafe fn store_first(p: *mut f32, v: Self::F, count: usize)
    where
        Self: Sized,
    {
        debug_assert!(count < Self::N && Self::N <= 16);
        let mut lanes = [0f32; 16];
        // SAFETY: as for `load_first`.
        unsafe {
            Self::store(lanes.as_mut_ptr(), v);
            std::ptr::copy_nonoverlapping(lanes.as_ptr(), p, count);
        }
    }
    /// `v` with the lanes from `count` (< N) on zeroed (a tail's padding out of a sum).
    /// # Safety: the implementation's features.
    #[inline(always)]
    unsafe fn keep_first(v: Self::F, count: usize) -> Self::F
    where
        Self: Sized,
    {
        let mut lanes = [0f32; 16];
        // SAFETY: `store_first`'s count lanes and `load`'s N ≤ 16 lie in `lanes`.
        unsafe {
            Self::store_first(lanes.as_mut_ptr(), v, count);
            Self::load(lanes.as_ptr())
        }
    }
    /// All zero.
    unsafe fn zero() -> Self::F;
    /// N floats at `p`. # Safety: N floats readable at `p`.
    unsafe fn load(p: *const f32) -> Self::F;
    /// `a + b` per lane.
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
    /// The sum of the lanes.
    unsafe fn sum(v: Self::F) -> f32;
    /// Lane-wise max of `v` and `acc` that keeps `acc`'s lane where `v`'s is NaN (`acc`
    /// itself never NaN): softmax row maxima skip NaN scores, as `f32::max` does.
    unsafe fn max_keep(v: Self::F, acc: Self::F) -> Self::F;
    /// The largest lane (of a vector with no NaN lane).
    unsafe fn hmax(v: Self::F) -> f32;
    /// Writes the N lanes to `p`. # Safety: N floats writable at `p`.
    unsafe fn store(p: *mut f32, v: Self::F);
    /// N halves at `p`, widened. # Safety: N halves readable at `p`.
    unsafe fn load_f16(p: *const f16) -> Self::F;
    /// N bfloat16s at `p`, widened. # Safety: N values readable at `p`.
    unsafe fn load_bf16(p: *const bf16) -> Self::F;
    /// Lane j = the sum of row j of the N×N floats at `p` (row-major): N horizontal sums
    /// in one shuffle-and-add tree. # Safety: N·N floats readable at `p`.
    unsafe fn transpose_sums(p: *const f32) -> Self::F;
    /// Asks for the 64-byte line at `p` in L1 (never faults, whatever `p` is).
    unsafe fn prefetch_l1(p: *const u8);
    /// Asks for the 64-byte line at `p` in L2 (never faults, whatever `p` is).
    unsafe fn prefetch_l2(p: *const u8);
    /// `v[i] = e^(v[i] − shift)`, returning Σv: the FMA exp written over this trait
    /// ([`super::lanes_exp`]).
    #[inline(always)]
    unsafe fn exp_shifted_sum(v: &mut [f32], shift: f32) -> f32
    where
        Self: Sized,
    {
        let p = v.as_mut_ptr();
        // SAFETY: the width's features per the contract; v holds v.len() floats.
        unsafe { super::lanes_exp::exp_shifted_sum::<Self>(p, p, v.len(), shift) }
    }
    /// `v[i] = 2^(v[i] − shift)`, returning Σv ([`super::lanes_exp::exp2`]: flash
    /// attention's weights, scores in base 2).
    #[inline(always)]
    unsafe fn exp2_shifted_sum(v: &mut [f32], shift: f32) -> f32
    where
        Self: Sized,
    {
        let p = v.as_mut_ptr();
        // SAFETY: the width's features per the contract; v holds v.len() floats.
        unsafe { super::lanes_exp::exp2_shifted_sum::<Self>(p, p, v.len(), shift) }
    }
    /// Max of `v` skipping NaN (−∞ when empty or all NaN).
    #[inline(always)]
    unsafe fn row_max(v: &[f32]) -> f32
    where
        Self: Sized,
    {
        // SAFETY: the width's features per the contract.
        unsafe { super::lanes_exp::max::<Self>(v) }
    }
}
