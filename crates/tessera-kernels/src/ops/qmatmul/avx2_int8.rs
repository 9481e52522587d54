//! The row-major integer kernel (see [`super::packed`] for the algebra and layout), one
//! 32-weight chunk per ymm: one loop, instantiated for AVX2's `vpmaddubsw` +
//! `vpmaddwd` and for AVX512_VNNI's `vpdpbusd` on ymm (through [`Dot`]). A separate
//! zmm VNNI kernel (two chunks per `vpdpbusd`, f32 metadata only) was its mirror and
//! went when this loop took both instruction sets.
//!
//! `vpmaddubsw` multiplies unsigned by signed bytes and adds adjacent pairs into i16
//! **with saturation**, so the codes must keep every pair sum below 2¹⁵:
//! - codes below 129 (every format but the 8-bit ones, whose codes are ≤ 63) go in as
//!   they are: |2·u·q| ≤ 2·128·127 = 32512. The lane then starts from −offset·Σq as
//!   with VNNI.
//! - full 8-bit codes (offset 128: Q8_0, Q8_K, INT8) would reach 2·255·127. They are
//!   turned back into signed weights s = u − 128 and multiplied as |s| × (q with s's
//!   sign), the usual trick: |s| ≤ 128, so pairs stay ≤ 32512, and Σ s·q is the lane's
//!   whole sum (−offset·Σq included), so no start value is added.
//!
//! `vpmaddwd` against ones then sums pairs of i16 into the same 4-element i32 lanes
//! `vpdpbusd` gives, so scales, minima and activation metadata are one layout.
//! `vpdpbusd` sums in i32 without saturating, so the VNNI instance takes full 8-bit
//! codes as they are, with the start value −128·Σq.

use super::packed::{CodeLayout, Meta, PackedWeights};
use super::quant_acts::QuantActs;
use super::M_CHUNK;
use crate::quant::QK;
use half::f16;
use std::arch::x86_64::*;

/// Weight rows per call at decode (one activation row): they share the activation
/// loads, the call and one reduction. One row at a time ran ~10 GB/s of Q8_0 per
/// thread with the weights in L2, no faster than DRAM delivers them.
pub(super) const DECODE_ROWS: usize = 4;

/// `out[g·M + i] = Σ_k W[row + g, k]·x̂_i[k]` for R weight rows (rows past the last are
/// read as the last, for a ragged final group) and M activation rows: up to M_CHUNK of
/// them when R = 1, exactly one otherwise.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `row < w.rows`; every `acts[i]` was built for
/// `w.cols` columns and `w`'s offset; codes other than offset-128 ones are below 129
/// ([`PackedWeights::signed_bytes`]); `out` holds R·M outputs.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dots<const R: usize>(
    w: &PackedWeights,
    row: usize,
    acts: &[&QuantActs],
    out: &mut [f32],
) {
    // SAFETY: forwarded contract.
    unsafe { dots_with::<Maddubs, R>(w, row, acts, out) }
}

/// [`dots`] with `vpdpbusd` on ymm registers.
///
/// # Safety
/// As [`dots`] (any codes), and the CPU has AVX-512F/VL and AVX512_VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn dots_vnni<const R: usize>(
    w: &PackedWeights,
    row: usize,
    acts: &[&QuantActs],
    out: &mut [f32],
) {
    // SAFETY: forwarded contract.
    unsafe { dots_with::<Vnni, R>(w, row, acts, out) }
}

/// The 4-byte dot step of a chunk against activation bytes, per instruction set.
trait Dot {
    /// Takes full 8-bit codes unsigned (else they go through the signed trick).
    const FULL_BYTES: bool;
    /// Per i32 lane: `init + Σ u·q` over its 4 bytes.
    ///
    /// # Safety
    /// The implementation's CPU features; codes below 129 unless `FULL_BYTES`.
    unsafe fn dot(u: __m256i, xq: __m256i, init: __m256i, ones: __m256i) -> __m256i;
}

/// AVX2: `vpmaddubsw` pairs into i16, `vpmaddwd` against ones into i32.
struct Maddubs;

impl Dot for Maddubs {
    const FULL_BYTES: bool = false;
    #[inline(always)]
    unsafe fn dot(u: __m256i, xq: __m256i, init: __m256i, ones: __m256i) -> __m256i {
        // SAFETY: AVX2 per the contract; codes < 129 keep the pairs from saturating.
        unsafe { _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, xq), ones), init) }
    }
}

/// AVX512_VNNI on ymm: `vpdpbusd` accumulates the 4-byte dots in i32.
struct Vnni;

impl Dot for Vnni {
    const FULL_BYTES: bool = true;
    #[inline(always)]
    unsafe fn dot(u: __m256i, xq: __m256i, init: __m256i, _: __m256i) -> __m256i {
        // SAFETY: AVX512_VNNI + AVX512VL per the contract.
        unsafe { _mm256_dpbusd_epi32(init, u, xq) }
    }
}

/// The body of [`dots`] and [`dots_vnni`], inlined into each so it compiles with its
/// caller's features.
///
/// # Safety
/// As [`dots`], plus `D`'s features.
#[inline(always)]
unsafe fn dots_with<D: Dot, const R: usize>(
    w: &PackedWeights,
    row: usize,
    acts: &[&QuantActs],
    out: &mut [f32],
) {
    // One monomorphized loop per layout and metadata width, so no format test runs per
    // chunk.
    macro_rules! by_layout {
        ($(($f:literal, $s:literal, $m:literal, $h:literal)),*) => {
            match (w.layout == CodeLayout::Nibbles, w.signed_bytes() && !D::FULL_BYTES, w.meta.has_min(), w.split16) {
                $(($f, $s, $m, $h) => match &w.meta {
                    // SAFETY: forwarded contract.
                    Meta::F32 { scales, mins } => unsafe {
                        dots_for::<D, $f, $s, $m, $h, f32, R>(w, (scales, mins), row, acts, out)
                    },
                    // SAFETY: forwarded contract.
                    Meta::F16 { scales, mins } => unsafe {
                        dots_for::<D, $f, $s, $m, $h, f16, R>(w, (scales, mins), row, acts, out)
                    },
                    Meta::Factored(_) | Meta::SplitI8(_) => unreachable!("factored \
                        metadata is only built interleaved, which `reading` sends to \
                        `rows8`"),
                },)*
            }
        };
    }
    by_layout!(
        (false, false, false, false),
        (false, false, false, true),
        (false, false, true, false),
        (false, false, true, true),
        (false, true, false, false),
        (false, true, false, true),
        (false, true, true, false),
        (false, true, true, true),
        (true, false, false, false),
        (true, false, false, true),
        (true, false, true, false),
        (true, false, true, true),
        (true, true, false, false),
        (true, true, false, true),
        (true, true, true, false),
        (true, true, true, true)
    )
}

/// `w`'s scales and minima, in their stored width.
type MetaArrays<'a, E> = (&'a [E], &'a [E]);

/// [`dots`] for one layout: 4-bit pairs or bytes, signed-byte multiply, a minimum,
/// per-half scales, f32 or f16 metadata; then one loop per activation-row count (R
/// weight rows take one activation row).
#[inline(always)]
unsafe fn dots_for<
    D: Dot,
    const FOUR: bool,
    const SIGNED: bool,
    const MIN: bool,
    const SPLIT: bool,
    E: MetaElem,
    const R: usize,
>(
    w: &PackedWeights,
    meta: MetaArrays<'_, E>,
    row: usize,
    acts: &[&QuantActs],
    out: &mut [f32],
) {
    // SAFETY: forwarded contract; each arm gets exactly its count of rows.
    unsafe {
        if R > 1 {
            return dots_m::<D, FOUR, SIGNED, MIN, SPLIT, E, R, 1>(w, meta, row, acts, out);
        }
        match acts.len() {
            0 => {}
            1 => dots_m::<D, FOUR, SIGNED, MIN, SPLIT, E, 1, 1>(w, meta, row, acts, out),
            2 => dots_m::<D, FOUR, SIGNED, MIN, SPLIT, E, 1, 2>(w, meta, row, acts, out),
            3 => dots_m::<D, FOUR, SIGNED, MIN, SPLIT, E, 1, 3>(w, meta, row, acts, out),
            _ => dots_m::<D, FOUR, SIGNED, MIN, SPLIT, E, 1, M_CHUNK>(w, meta, row, acts, out),
        }
    }
}

/// The loop for R weight rows × M activation rows. Chunks go two at a time (one 4-bit
/// load feeds both), and each pair adds to the accumulator once (`acc += l₀·dx₀ +
/// l₁·dx₁`), which halves the loop-carried FMA chain that bounds a single activation
/// row. The rows' pointers are taken out of their `QuantActs` once (a constant M unrolls
/// the row loop, so they are not re-read through two indirections per chunk).
#[inline(always)]
unsafe fn dots_m<
    D: Dot,
    const FOUR: bool,
    const SIGNED: bool,
    const MIN: bool,
    const SPLIT: bool,
    E: MetaElem,
    const R: usize,
    const M: usize,
>(
    w: &PackedWeights,
    (all_scales, all_mins): MetaArrays<'_, E>,
    row: usize,
    acts: &[&QuantActs],
    out: &mut [f32],
) {
    let nb = w.cols / QK;
    let per_row = nb * w.halves();
    let rb = w.row_bytes();
    debug_assert!(row < w.rows && acts.len() == M && out.len() == R * M);
    debug_assert!(acts
        .iter()
        .all(|a| a.q.len() >= nb * QK && a.d8.len() >= nb));
    debug_assert!(all_scales.len() == w.rows * per_row);
    let mut quants = [std::ptr::null::<u8>(); R];
    let mut scales = [std::ptr::null::<E>(); R];
    let mut mins = [std::ptr::null::<E>(); R];
    for g in 0..R {
        let r = (row + g).min(w.rows - 1);
        // SAFETY: r < rows, so the row's rb quant bytes and per_row scales start here
        // (and as many minima, for a format with a minimum).
        unsafe {
            quants[g] = w.quants.as_ptr().add(r * rb);
            scales[g] = all_scales.as_ptr().add(r * per_row);
            mins[g] = if MIN {
                all_mins.as_ptr().add(r * per_row)
            } else {
                scales[g]
            };
        }
    }
    // Past one row, the next R rows (contiguous) are fetched over this call's chunk
    // pairs: the prefetches run one tile ahead of the loads.
    let next = w.quants.as_ptr().wrapping_add((row + R) * rb);
    let pair_bytes = if FOUR { QK } else { 2 * QK };
    // Plain loops: `array::from_fn` would not be inlined here (see `super::simd_rows`).
    let mut rows = [ActRow::default(); M];
    for i in 0..M {
        rows[i] = ActRow::of(acts[i]);
    }
    // SAFETY: AVX per the contract.
    let ctx = unsafe {
        Ctx {
            nib: _mm256_set1_epi8(0x0F),
            ones: _mm256_set1_epi16(1),
            flip: _mm256_set1_epi8(-128),
        }
    };
    // SAFETY: as above.
    let mut acc = [[unsafe { _mm256_setzero_ps() }; M]; R];
    let mut b = 0;
    while b + 1 < nb {
        // SAFETY: chunks b and b + 1 exist (b + 1 < nb); prefetching never faults.
        unsafe {
            let ahead = if FOUR { QK * (b / 2) } else { QK * b };
            if R == 1 {
                _mm_prefetch::<_MM_HINT_T0>(quants[0].wrapping_add(ahead + PREFETCH) as _);
            } else {
                for line in (0..R * pair_bytes).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(R * ahead + line) as _);
                }
            }
            for g in 0..R {
                let (u0, u1) = if FOUR {
                    let v = _mm256_loadu_si256(quants[g].add(ahead) as *const __m256i);
                    (
                        _mm256_and_si256(v, ctx.nib),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v), ctx.nib),
                    )
                } else {
                    (
                        _mm256_loadu_si256(quants[g].add(ahead) as *const __m256i),
                        _mm256_loadu_si256(quants[g].add(ahead + QK) as *const __m256i),
                    )
                };
                let w0 = ChunkW::<SPLIT>::new::<E>(&ctx, u0, scales[g], mins[g], b);
                let w1 = ChunkW::<SPLIT>::new::<E>(&ctx, u1, scales[g], mins[g], b + 1);
                for i in 0..M {
                    let a = &rows[i];
                    let l0 = w0.lane::<D, SIGNED, MIN>(&ctx, a, b);
                    let l1 = w1.lane::<D, SIGNED, MIN>(&ctx, a, b + 1);
                    let pair = _mm256_fmadd_ps(l1, a.dx(b + 1), _mm256_mul_ps(l0, a.dx(b)));
                    acc[g][i] = _mm256_add_ps(acc[g][i], pair);
                }
            }
        }
        b += 2;
    }
    if b < nb {
        // SAFETY: chunk b exists; a 4-bit odd last chunk is the low nibbles of its pair.
        unsafe {
            for g in 0..R {
                let u = if FOUR {
                    let v = _mm256_loadu_si256(quants[g].add(QK * (b / 2)) as *const __m256i);
                    _mm256_and_si256(v, ctx.nib)
                } else {
                    _mm256_loadu_si256(quants[g].add(QK * b) as *const __m256i)
                };
                let wc = ChunkW::<SPLIT>::new::<E>(&ctx, u, scales[g], mins[g], b);
                for i in 0..M {
                    let l = wc.lane::<D, SIGNED, MIN>(&ctx, &rows[i], b);
                    acc[g][i] = _mm256_fmadd_ps(l, rows[i].dx(b), acc[g][i]);
                }
            }
        }
    }
    // SAFETY: AVX per the contract.
    let sums = unsafe { hsums(acc.as_flattened()) };
    out.copy_from_slice(&sums[..R * M]);
}

/// One activation row's arrays as raw pointers, per 32-column block b: 32 code bytes at
/// `q + 32b`, and 8 lanes each of d_x, start values and lane sums at `+ 8b`.
#[derive(Clone, Copy)]
struct ActRow {
    q: *const i8,
    init: *const i32,
    d8: *const f32,
    lane_sums: *const f32,
}

impl Default for ActRow {
    fn default() -> Self {
        ActRow {
            q: std::ptr::null(),
            init: std::ptr::null(),
            d8: std::ptr::null(),
            lane_sums: std::ptr::null(),
        }
    }
}

impl ActRow {
    #[inline(always)]
    fn of(a: &QuantActs) -> Self {
        ActRow {
            q: a.q.as_ptr(),
            init: a.init.as_ptr().cast(),
            d8: a.d8.as_ptr().cast(),
            lane_sums: a.lane_sums.as_ptr().cast(),
        }
    }

    /// Block b's d_x over 8 lanes.
    ///
    /// # Safety
    /// AVX; the row holds block b.
    #[inline(always)]
    unsafe fn dx(&self, b: usize) -> __m256 {
        // SAFETY: per the contract.
        unsafe { _mm256_loadu_ps(self.d8.add(8 * b)) }
    }
}

/// Bytes ahead of the current chunk to prefetch (the next rows: a thread's rows are
/// contiguous). 2.5 KiB, as far as the interleaved kernels reach: against 1 KiB, Q8_0
/// decode LM head 0.90×, up 0.85× (docs/performance.md).
const PREFETCH: usize = 2560;

/// Loop-invariant constants.
struct Ctx {
    nib: __m256i,
    ones: __m256i,
    /// The byte 0x80: u ^ 0x80 = u − 128 as a signed byte.
    flip: __m256i,
}

/// One weight chunk, ready for every activation row: its codes (or signed weights and
/// their magnitudes) and its scale and minimum spread over the 8 lanes.
struct ChunkW<const SPLIT: bool> {
    u: __m256i,
    abs: __m256i,
    d: __m256,
    m: __m256,
}

impl<const SPLIT: bool> ChunkW<SPLIT> {
    /// # Safety
    /// AVX2 and F16C; chunk c's scales (and minima, when `mins` is not `scales`) exist.
    #[inline(always)]
    unsafe fn new<E: MetaElem>(
        ctx: &Ctx,
        u: __m256i,
        scales: *const E,
        mins: *const E,
        c: usize,
    ) -> Self {
        // SAFETY: per the contract.
        unsafe {
            let spread = |v: *const E| {
                if SPLIT {
                    E::spread_pair(v.add(2 * c))
                } else {
                    E::spread(v.add(c))
                }
            };
            let s = _mm256_xor_si256(u, ctx.flip);
            ChunkW {
                u,
                abs: _mm256_abs_epi8(s),
                d: spread(scales),
                m: spread(mins),
            }
        }
    }

    /// The chunk's 8 lane values against activation row `a`'s block b:
    /// `d·Σu·q (+ m·Σq)` per lane, before × d_x.
    ///
    /// # Safety
    /// AVX2, FMA and `D`'s features; `a` holds block b; SIGNED unless the codes are
    /// below 129 or `D` takes full bytes.
    #[inline(always)]
    unsafe fn lane<D: Dot, const SIGNED: bool, const MIN: bool>(
        &self,
        ctx: &Ctx,
        a: &ActRow,
        b: usize,
    ) -> __m256 {
        // SAFETY: per the contract.
        unsafe {
            let xq = _mm256_loadu_si256(a.q.add(QK * b) as *const __m256i);
            let sum = if SIGNED {
                // s = u ^ 0x80 again (cheaper than keeping it live): its sign goes on q.
                let s = _mm256_xor_si256(self.u, ctx.flip);
                let pairs = _mm256_maddubs_epi16(self.abs, _mm256_sign_epi8(xq, s));
                _mm256_madd_epi16(pairs, ctx.ones)
            } else {
                let init = _mm256_loadu_si256(a.init.add(8 * b) as *const __m256i);
                D::dot(self.u, xq, init, ctx.ones)
            };
            let isum = _mm256_cvtepi32_ps(sum);
            if MIN {
                let sl = _mm256_loadu_ps(a.lane_sums.add(8 * b));
                _mm256_fmadd_ps(isum, self.d, _mm256_mul_ps(self.m, sl))
            } else {
                _mm256_mul_ps(isum, self.d)
            }
        }
    }
}

/// A stored scale or minimum (f32, or f16 where exact), widened on load.
pub(super) trait MetaElem: Copy {
    /// `p[0..8]` in the 8 lanes.
    ///
    /// # Safety
    /// AVX and F16C; 8 elements at `p` are readable.
    unsafe fn load8(p: *const Self) -> __m256;
    /// `*p` in all 8 lanes.
    ///
    /// # Safety
    /// AVX and F16C; `p` is readable.
    unsafe fn spread(p: *const Self) -> __m256;
    /// `*p` in lanes 0–3, `*p.add(1)` in lanes 4–7 (a chunk's two half scales).
    ///
    /// # Safety
    /// As [`MetaElem::spread`], for two elements.
    unsafe fn spread_pair(p: *const Self) -> __m256;
}

impl MetaElem for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: per the contract.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn spread(p: *const f32) -> __m256 {
        // SAFETY: per the contract.
        unsafe { _mm256_set1_ps(*p) }
    }
    #[inline(always)]
    unsafe fn spread_pair(p: *const f32) -> __m256 {
        // SAFETY: per the contract.
        unsafe { _mm256_set_m128(_mm_set1_ps(*p.add(1)), _mm_set1_ps(*p)) }
    }
}

impl MetaElem for f16 {
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: per the contract; 8 f16 are 16 bytes, widened exactly.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn spread(p: *const f16) -> __m256 {
        // SAFETY: per the contract; f16 is a transparent u16, widened exactly.
        unsafe { _mm256_cvtph_ps(_mm_set1_epi16((*p).to_bits() as i16)) }
    }
    #[inline(always)]
    unsafe fn spread_pair(p: *const f16) -> __m256 {
        // SAFETY: per the contract.
        unsafe {
            let (lo, hi) = ((*p).to_bits() as i16, (*p.add(1)).to_bits() as i16);
            _mm256_cvtph_ps(_mm_set_epi16(hi, hi, hi, hi, lo, lo, lo, lo))
        }
    }
}

/// The sums of up to 8 vectors' lanes: four at a time (missing ones zero) summed
/// pairwise into [Σ0, Σ1, Σ2, Σ3] per 128-bit half, then the halves added.
#[target_feature(enable = "avx")]
fn hsums(acc: &[__m256]) -> [f32; 8] {
    debug_assert!(acc.len() <= 8);
    let zero = _mm256_setzero_ps();
    let at = |i: usize| acc.get(i).copied().unwrap_or(zero);
    let mut sums = [0f32; 8];
    for (q, four) in sums
        .chunks_exact_mut(4)
        .enumerate()
        .take(acc.len().div_ceil(4))
    {
        let h = _mm256_hadd_ps(
            _mm256_hadd_ps(at(4 * q), at(4 * q + 1)),
            _mm256_hadd_ps(at(4 * q + 2), at(4 * q + 3)),
        );
        let s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
        // SAFETY: 4 f32 lanes into a 4-element slice.
        unsafe { _mm_storeu_ps(four.as_mut_ptr(), s) };
    }
    sums
}
