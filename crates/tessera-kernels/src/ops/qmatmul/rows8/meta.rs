//! Per-chunk scales and minima as the interleaved loops read them ([`ChunkMeta`]):
//! stored per chunk in f32 or f16 ([`Plain`]) or as Q4_K/Q5_K's factored fields
//! ([`Factored8`]), widened to 8 rows' f32 lanes of whichever width runs ([`Wide8`]).

use super::super::packed::ROWS8;
use half::f16;

/// Eight f32 values in registers, as one width holds a group's 8 rows (a ymm, or a
/// pair of NEON q registers): how [`ChunkMeta`] widens stored metadata.
pub(super) trait Wide8: Copy {
    /// `p[0..8]`.
    ///
    /// # Safety
    /// The width's CPU features; 8 values readable at `p`.
    unsafe fn from_f32(p: *const f32) -> Self;
    /// `p[0..8]`, widened exactly.
    ///
    /// # Safety
    /// As [`Wide8::from_f32`].
    unsafe fn from_f16(p: *const f16) -> Self;
    /// `base[j]·bytes[j]` for j < 8 (exact: an f16 times a byte fits f32's mantissa).
    ///
    /// # Safety
    /// As [`Wide8::from_f32`], for both arrays.
    unsafe fn f16_times_u8(base: *const f16, bytes: *const u8) -> Self;
}

/// A stored scale or minimum (f32, or f16 where exact), widened on load.
pub(super) trait StoredMeta: Copy {
    /// `p[0..8]` as f32.
    ///
    /// # Safety
    /// As [`Wide8::from_f32`].
    unsafe fn load8<V: Wide8>(p: *const Self) -> V;
}

impl StoredMeta for f32 {
    #[inline(always)]
    unsafe fn load8<V: Wide8>(p: *const f32) -> V {
        // SAFETY: forwarded contract.
        unsafe { V::from_f32(p) }
    }
}

impl StoredMeta for f16 {
    #[inline(always)]
    unsafe fn load8<V: Wide8>(p: *const f16) -> V {
        // SAFETY: forwarded contract.
        unsafe { V::from_f16(p) }
    }
}

/// A group's 8 rows' scales and minima for chunk c, in f32.
pub(super) trait ChunkMeta: Copy {
    /// # Safety
    /// `V`'s CPU features; chunk c is in the group.
    unsafe fn scales<V: Wide8>(self, c: usize) -> V;
    /// # Safety
    /// As [`ChunkMeta::scales`], for a format with minima.
    unsafe fn mins<V: Wide8>(self, c: usize) -> V;
}

/// Scales and minima stored per chunk, 8 rows contiguous, in f32 or f16.
#[derive(Clone, Copy)]
pub(super) struct Plain<E> {
    scales: *const E,
    /// `scales` again for formats without a minimum (never read then).
    mins: *const E,
}

impl<E: StoredMeta> Plain<E> {
    /// # Safety
    /// `at` is within `scales` (and `mins`, unless empty).
    pub(super) unsafe fn of(scales: &[E], mins: &[E], at: usize) -> Self {
        // SAFETY: per the contract.
        let scales = unsafe { scales.as_ptr().add(at) };
        let mins = if mins.is_empty() {
            scales
        } else {
            // SAFETY: per the contract.
            unsafe { mins.as_ptr().add(at) }
        };
        Plain { scales, mins }
    }
}

impl<E: StoredMeta> ChunkMeta for Plain<E> {
    #[inline(always)]
    unsafe fn scales<V: Wide8>(self, c: usize) -> V {
        // SAFETY: per the contract.
        unsafe { E::load8(self.scales.add(ROWS8 * c)) }
    }
    #[inline(always)]
    unsafe fn mins<V: Wide8>(self, c: usize) -> V {
        // SAFETY: per the contract.
        unsafe { E::load8(self.mins.add(ROWS8 * c)) }
    }
}

/// Q4_K and Q5_K's own fields ([`super::super::packed::Factored`]): per chunk 8 rows' 6-bit sc and mn
/// bytes, per super-block of 8 chunks their f16 d and −dmin. Widening each and one
/// multiply (exact) cost ~10 more vector instructions per 256 weights than two f32
/// loads (~25 % more), and save 5.5 of every 24 bytes streamed per 32 weights: 0.88×
/// on the LM head, a wash on prefill (docs/performance.md).
#[derive(Clone, Copy)]
pub(super) struct Factored8 {
    pub(super) d: *const f16,
    pub(super) neg_dmin: *const f16,
    pub(super) sc: *const u8,
    pub(super) mn: *const u8,
}

impl Factored8 {
    /// `base[8s..8s+8]` (f16, super-block s = c/8) times `bytes[8c..8c+8]`.
    ///
    /// # Safety
    /// `V`'s CPU features; both ranges are readable.
    #[inline(always)]
    unsafe fn product<V: Wide8>(base: *const f16, bytes: *const u8, c: usize) -> V {
        // SAFETY: per the contract.
        unsafe { V::f16_times_u8(base.add(ROWS8 * (c / 8)), bytes.add(ROWS8 * c)) }
    }
}

impl ChunkMeta for Factored8 {
    #[inline(always)]
    unsafe fn scales<V: Wide8>(self, c: usize) -> V {
        // SAFETY: per the contract.
        unsafe { Self::product(self.d, self.sc, c) }
    }
    #[inline(always)]
    unsafe fn mins<V: Wide8>(self, c: usize) -> V {
        // SAFETY: per the contract.
        unsafe { Self::product(self.neg_dmin, self.mn, c) }
    }
}
