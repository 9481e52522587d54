//! The integer kernel for Q2_K, Q3_K and Q6_K interleaved eight rows at a time
//! ([`PackedWeights::interleaved`], with [`SplitI8`] scales): one chunk loop
//! ([`chunk`]) over [`PlaneLanes`], instantiated for AVX2 (`vpmaddubsw`, on AVX2 and
//! VNNI CPUs alike) and NEON (`sdot`), the per-width primitives beside the parent's
//! in `x86.rs` and `neon.rs`.
//!
//! Why its own kernel: the row layout stores Q6_K one byte per weight plus an f32 per
//! 16 weights, 40 bytes per 32 against the file's 26.25, which capped decode at ~66 %
//! of the file-size roofline. Here the codes keep the file's 6 bits (a nibble plane as
//! in the parent's loop, plus a 2-bit plane whose crumbs OR into bits 4–5) and the
//! scales its i8 per 16 weights and f16 per 256, so the bytes streamed are the file's.
//!
//! Arithmetic per chunk, row and activation row: each 16-weight half's Σu·q_x (u < 64,
//! |q_x| ≤ 127, so |Σ| ≤ 16·63·127) is multiplied by the half's i8 scale and the two
//! added, exactly in i32. On AVX2 the half's sum runs in i16: each `vpmaddubsw` pair is
//! at most 2·63·127 = 16002 (no saturation), two add in i16 (32004 < 2¹⁵), and
//! `vpmaddwd` against the half's scale, repeated in both i16 of the row's lane, both
//! finishes the sum and applies the scale. `sdot` sums in i32 and a multiply-add applies
//! the scale. The offset term −o·Σ_h sc_h·Σq_x,h comes from the activation's two half
//! sums ([`QuantActs`]'s `half_sums`). The chunk's sub-scale-weighted sum is exact in
//! i32 (|·| < 2²⁶), and one conversion and one FMA by d·d_x finish it. Q2_K's minima
//! (m = (−dmin)·mn per half, mn < 16) add (−dmin)·d_x·Σ_h mn_h·s_h: the same
//! half-sum product as the offset term, with mn for sc, exact in i32, and one more
//! conversion and FMA; its offset is 0, so it skips the offset term.

use super::super::packed::{CodeLayout, PackedWeights, SplitI8, GROUP_PAIR_BYTES};
use super::super::quant_acts::QuantActs;
use super::{prefetch_pair, Fetch, RowLanes, ROWS8};
use crate::quant::QK;
use half::f16;

/// [`RowLanes`] plus what split scales need: the 2-bit plane, per-half sums scaled by
/// i8 sub-scales, and the offset term.
pub(super) trait PlaneLanes: RowLanes {
    /// One activation row's running sum over a 16-weight half.
    type Half: Copy;
    /// A chunk's 8 rows' (half 0, half 1) sub-scales, as this width applies them.
    type Scales: Copy;
    /// Bits 2k..2k+2 of every byte of `v`, moved to bits 4–5.
    ///
    /// # Safety
    /// The implementation's CPU features (so for every method below).
    unsafe fn crumb<const K: u32>(v: Self::I) -> Self::I;
    /// `a | b`.
    ///
    /// # Safety
    /// As [`PlaneLanes::crumb`].
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    /// All-zero i32 lanes.
    ///
    /// # Safety
    /// As [`PlaneLanes::crumb`].
    unsafe fn zero_i() -> Self::I;
    /// An empty half sum.
    ///
    /// # Safety
    /// As [`PlaneLanes::crumb`].
    unsafe fn half_zero() -> Self::Half;
    /// Adds step `t4` (0..4) of a half: the 4-byte dots of codes `u` (< 64) and the
    /// activation bytes `x`.
    ///
    /// # Safety
    /// As [`PlaneLanes::crumb`].
    unsafe fn half_add(h: Self::Half, u: Self::I, x: i32, t4: usize) -> Self::Half;
    /// The 8 rows' (sc₀, sc₁) pairs at `p` (16 bytes).
    ///
    /// # Safety
    /// As [`PlaneLanes::crumb`]; 16 bytes readable at `p`.
    unsafe fn scales(p: *const i8) -> Self::Scales;
    /// `total + sc_half·Σh` per row.
    ///
    /// # Safety
    /// As [`PlaneLanes::crumb`].
    unsafe fn half_total(total: Self::I, h: Self::Half, sc: Self::Scales, half: usize) -> Self::I;
    /// `total − offset·(sc₀·s₀ + sc₁·s₁)` per row, s₀ and s₁ the activation's half sums
    /// (the low and high i16 of `half_sums`).
    ///
    /// # Safety
    /// As [`PlaneLanes::crumb`].
    unsafe fn minus_offset(
        total: Self::I,
        sc: Self::Scales,
        half_sums: i32,
        offset: i32,
    ) -> Self::I;
    /// The 8 rows' f16 values at `p`, widened.
    ///
    /// # Safety
    /// As [`PlaneLanes::crumb`]; 8 values readable at `p`.
    unsafe fn d8(p: *const f16) -> Self::F;
}

/// One activation row's per-block arrays as raw pointers.
#[derive(Clone, Copy)]
struct ActRow {
    q: *const i8,
    /// d_x at `8b` (the first of the 8 lanes `QuantActs::d8` repeats it in).
    dx: *const f32,
    half_sums: *const i32,
}

/// The group's codes and metadata.
struct Group {
    codes: *const u8,
    pair_bytes: usize,
    /// Per chunk, 8 rows' (half 0, half 1) i8 scales.
    sc: *const i8,
    /// Per super-block, 8 rows' f16 d.
    d: *const f16,
    /// Per chunk, 8 rows' (half 0, half 1) minimum integers, as `sc` (formats with
    /// minima only).
    mn: *const i8,
    /// Per super-block, 8 rows' f16 −dmin, as `d` (formats with minima only).
    neg_dmin: *const f16,
    offset: i32,
}

/// `out[8i + g] = Σ_k W[r0 + g, k]·x̂_i[k]` for the group of 8 rows starting at r0
/// (rows past `w.rows` are zero padding) and up to MC activation rows. Inlined into each
/// width's entry point, so it compiles with that function's features.
///
/// # Safety
/// `L`'s CPU features; `w.layout.interleaved()` with `meta` its [`SplitI8`] metadata; r0 a
/// multiple of 8 below `w.rows`; 1 ≤ acts.len() ≤ MC, each built for `w.cols` columns
/// and `w`'s offset; out.len() ≥ 8·acts.len().
#[inline(always)]
pub(super) unsafe fn dots<L: PlaneLanes, const MC: usize>(
    w: &PackedWeights,
    meta: &SplitI8,
    r0: usize,
    acts: &[&QuantActs],
    out: &mut [f32],
) {
    // SAFETY: forwarded contract; each arm gets exactly its count of rows.
    unsafe {
        let mins = !meta.mn.is_empty();
        match (w.layout == CodeLayout::Planes8, mins, acts.len()) {
            (_, _, 0) => {}
            (false, false, 1) => dots_m::<L, false, false, 1>(w, meta, r0, acts, out),
            (false, false, 2) => dots_m::<L, false, false, 2>(w, meta, r0, acts, out),
            (false, false, 3) => dots_m::<L, false, false, 3>(w, meta, r0, acts, out),
            (false, false, _) => dots_m::<L, false, false, MC>(w, meta, r0, acts, out),
            (false, true, 1) => dots_m::<L, false, true, 1>(w, meta, r0, acts, out),
            (false, true, 2) => dots_m::<L, false, true, 2>(w, meta, r0, acts, out),
            (false, true, 3) => dots_m::<L, false, true, 3>(w, meta, r0, acts, out),
            (false, true, _) => dots_m::<L, false, true, MC>(w, meta, r0, acts, out),
            (true, _, 1) => dots_m::<L, true, false, 1>(w, meta, r0, acts, out),
            (true, _, 2) => dots_m::<L, true, false, 2>(w, meta, r0, acts, out),
            (true, _, 3) => dots_m::<L, true, false, 3>(w, meta, r0, acts, out),
            (true, _, _) => dots_m::<L, true, false, MC>(w, meta, r0, acts, out),
        }
    }
}

#[inline(always)]
unsafe fn dots_m<L: PlaneLanes, const CRUMBS: bool, const MINS: bool, const M: usize>(
    w: &PackedWeights,
    meta: &SplitI8,
    r0: usize,
    acts: &[&QuantActs],
    out: &mut [f32],
) {
    let nb = w.cols / QK;
    let group = r0 / ROWS8;
    debug_assert!(w.layout.interleaved() && r0.is_multiple_of(ROWS8) && r0 < w.rows);
    // Super-blocks of 256 weights: whole chunk pairs, so no odd last chunk.
    debug_assert!(nb.is_multiple_of(8) && CRUMBS == (w.layout == CodeLayout::Planes8));
    debug_assert!(acts.len() == M && out.len() >= ROWS8 * M);
    let pair_bytes = w.group_pair_bytes();
    debug_assert!(w.quants.len() >= (group + 1) * (nb / 2) * pair_bytes);
    debug_assert!(meta.sc.len() >= (group + 1) * nb * 2 * ROWS8);
    // Only the 2-bit format (no crumb plane) has minima.
    debug_assert!(!MINS || (!CRUMBS && meta.mn.len() == meta.sc.len() && w.offset == 0));
    debug_assert!(acts.iter().all(|a| a.half_sums.len() >= nb));
    // SAFETY: the group's codes and metadata start at these offsets (checked above).
    let g = unsafe {
        Group {
            codes: w.quants.as_ptr().add(group * (nb / 2) * pair_bytes),
            pair_bytes,
            sc: meta.sc.as_ptr().add(group * nb * 2 * ROWS8),
            d: meta.d.as_ptr().add(w.super_index(r0, 0)),
            mn: if MINS {
                meta.mn.as_ptr().add(group * nb * 2 * ROWS8)
            } else {
                std::ptr::null()
            },
            neg_dmin: if MINS {
                meta.neg_dmin.as_ptr().add(w.super_index(r0, 0))
            } else {
                std::ptr::null()
            },
            offset: w.offset,
        }
    };
    let mut rows = [ActRow {
        q: std::ptr::null(),
        dx: std::ptr::null(),
        half_sums: std::ptr::null(),
    }; M];
    for i in 0..M {
        rows[i] = ActRow {
            q: acts[i].q.as_ptr(),
            dx: acts[i].d8.as_ptr().cast(),
            half_sums: acts[i].half_sums.as_ptr(),
        };
    }
    // SAFETY: `L`'s features per the contract.
    let mut acc = [unsafe { L::zero() }; M];
    // SAFETY: chunks c and c + 1 < nb exist in the group and in every activation row.
    unsafe {
        for c in (0..nb).step_by(2) {
            // L1 as tuned for split scales; `Fetch::L2` and `Fetch::Staged` not measured here.
            prefetch_pair(
                g.codes,
                c / 2,
                (pair_bytes, (nb / 2) * pair_bytes),
                1,
                Fetch::L1,
            );
            chunk::<L, false, CRUMBS, MINS, M>(&g, &rows, c, &mut acc);
            chunk::<L, true, CRUMBS, MINS, M>(&g, &rows, c + 1, &mut acc);
        }
        for (a, o) in acc.iter().zip(out.chunks_exact_mut(ROWS8)) {
            L::store(*a, o);
        }
    }
}

/// Adds chunk c (the second of its pair when HI) of the group's 8 rows, against every
/// activation row, to `acc`.
///
/// # Safety
/// `L`'s CPU features; chunk c exists in the group and in every row of `rows`.
#[inline(always)]
unsafe fn chunk<
    L: PlaneLanes,
    const HI: bool,
    const CRUMBS: bool,
    const MINS: bool,
    const M: usize,
>(
    g: &Group,
    rows: &[ActRow; M],
    c: usize,
    acc: &mut [L::F; M],
) {
    // SAFETY: per the contract.
    unsafe {
        let base = g.codes.add((c / 2) * g.pair_bytes);
        let sc = L::scales(g.sc.add(2 * ROWS8 * c));
        let mut total = [L::zero_i(); M];
        for half in 0..2 {
            let mut sums = [L::half_zero(); M];
            for t4 in 0..4 {
                let t = 4 * half + t4;
                let v = L::codes(base.add(QK * t), 0);
                let mut u = L::nibbles::<HI>(v);
                if CRUMBS {
                    let v = L::codes(base.add(GROUP_PAIR_BYTES + QK * t4), 0);
                    // Crumb 2h + t/4 (t/4 is `half`).
                    let top = match (HI, half) {
                        (false, 0) => L::crumb::<0>(v),
                        (false, _) => L::crumb::<1>(v),
                        (true, 0) => L::crumb::<2>(v),
                        (true, _) => L::crumb::<3>(v),
                    };
                    u = L::or(u, top);
                }
                for i in 0..M {
                    let four = rows[i].q.add(QK * c + 4 * t).cast::<i32>().read_unaligned();
                    sums[i] = L::half_add(sums[i], u, four, t4);
                }
            }
            for i in 0..M {
                total[i] = L::half_total(total[i], sums[i], sc, half);
            }
        }
        let d = L::d8(g.d.add(ROWS8 * (c / 8)));
        for i in 0..M {
            let r = &rows[i];
            // A format with minima (Q2_K) has offset 0: no offset term to take.
            let s = if MINS {
                total[i]
            } else {
                L::minus_offset(total[i], sc, *r.half_sums.add(c), g.offset)
            };
            acc[i] = L::scale_add(s, d, *r.dx.add(8 * c), acc[i]);
        }
        if MINS {
            // Σ_h mn_h·s_h: the offset term's product with offset −1.
            let mn = L::scales(g.mn.add(2 * ROWS8 * c));
            let neg_dmin = L::d8(g.neg_dmin.add(ROWS8 * (c / 8)));
            for i in 0..M {
                let r = &rows[i];
                let t = L::minus_offset(L::zero_i(), mn, *r.half_sums.add(c), -1);
                acc[i] = L::scale_add(t, neg_dmin, *r.dx.add(8 * c), acc[i]);
            }
        }
    }
}
