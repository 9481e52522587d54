//! The AVX2 integer kernel for Q3_K and Q6_K interleaved eight rows at a time
//! ([`PackedWeights::interleaved`], with [`SplitI8`] scales).
//!
//! Why its own kernel: the row layout stores Q6_K one byte per weight plus an f32 per
//! 16 weights, 40 bytes per 32 against the file's 26.25, which capped decode at ~66 %
//! of the file-size roofline. Here the codes keep the file's 6 bits (a nibble plane as
//! in `rows8`, plus a 2-bit plane whose crumbs OR into bits 4–5) and the scales its
//! i8 per 16 weights and f16 per 256, so the bytes streamed are the file's.
//!
//! Arithmetic per chunk, row and activation row: codes u < 64 and |q_x| ≤ 127 make each
//! `vpmaddubsw` pair sum at most 2·63·127 = 16002 (no saturation), so two add in i16
//! (32004 < 2¹⁵); `vpmaddwd` against the half's i8 scale, repeated in both i16 of the
//! row's lane, then both finishes the sum in i32 and applies the scale exactly. The
//! offset term −o·Σ_h sc_h·Σq_x,h is one more `vpmaddwd` of the rows' (sc₀, sc₁) pairs
//! against the activation's two half sums ([`QuantActs`]'s `half_sums`). So the chunk's
//! sub-scale-weighted sum is exact in i32 (|·| < 2²⁶), and one conversion and one FMA
//! by d·d_x finish it.

use super::packed::{CodeLayout, Meta, PackedWeights, QuantActs, SplitI8, GROUP_PAIR_BYTES, ROWS8};
use super::rows8::{prefetch_pair, store_group};
use super::M_CHUNK;
use crate::quant::QK;
use half::f16;
use std::arch::x86_64::*;

/// `out[8i + g] = Σ_k W[r0 + g, k]·x̂_i[k]` for the group of 8 rows starting at r0
/// (rows past `w.rows` are zero padding) and up to M_CHUNK activation rows.
///
/// # Safety
/// AVX2, FMA and F16C; `w.layout.interleaved()` with `meta` its [`SplitI8`] metadata; r0 a multiple
/// of 8 below `w.rows`; 1 ≤ acts.len() ≤ M_CHUNK, each built for `w.cols` columns and
/// `w`'s offset; out.len() ≥ 8·acts.len().
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dots(
    w: &PackedWeights,
    meta: &SplitI8,
    r0: usize,
    acts: &[&QuantActs],
    out: &mut [f32],
) {
    // SAFETY: forwarded contract; each arm gets exactly its count of rows.
    unsafe {
        match (w.layout == CodeLayout::Planes8, acts.len()) {
            (_, 0) => {}
            (false, 1) => dots_m::<false, 1>(w, meta, r0, acts, out),
            (false, 2) => dots_m::<false, 2>(w, meta, r0, acts, out),
            (false, 3) => dots_m::<false, 3>(w, meta, r0, acts, out),
            (false, _) => dots_m::<false, M_CHUNK>(w, meta, r0, acts, out),
            (true, 1) => dots_m::<true, 1>(w, meta, r0, acts, out),
            (true, 2) => dots_m::<true, 2>(w, meta, r0, acts, out),
            (true, 3) => dots_m::<true, 3>(w, meta, r0, acts, out),
            (true, _) => dots_m::<true, M_CHUNK>(w, meta, r0, acts, out),
        }
    }
}

/// [`dots`] with the metadata taken from `w`.
///
/// # Safety
/// As [`dots`]; `w`'s metadata is [`SplitI8`] (`IntKernel::reading` picks this kernel
/// only then).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dots_any(w: &PackedWeights, r0: usize, acts: &[&QuantActs], out: &mut [f32]) {
    match &w.meta {
        // SAFETY: forwarded contract.
        Meta::SplitI8(s) => unsafe { dots(w, s, r0, acts, out) },
        _ => unreachable!("avx2_planes8 reads split scales only"),
    }
}

/// The group's codes and metadata, and the loop constants.
struct Group {
    codes: *const u8,
    pair_bytes: usize,
    /// Per chunk, 8 rows' (half 0, half 1) i8 scales.
    sc: *const i8,
    /// Per super-block, 8 rows' f16 d.
    d: *const f16,
    offset: __m256i,
    nib: __m256i,
    top: __m256i,
    /// `vpshufb` masks repeating each lane's i16 0 (half 0) or 1 (half 1) in both i16.
    repeat: [__m256i; 2],
}

/// One activation row's per-block arrays as raw pointers.
#[derive(Clone, Copy)]
struct ActRow {
    q: *const i8,
    /// d_x at `8b` (the first of the 8 lanes `QuantActs::d8` repeats it in).
    dx: *const f32,
    half_sums: *const i32,
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_m<const CRUMBS: bool, const M: usize>(
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
    debug_assert!(acts.iter().all(|a| a.half_sums.len() >= nb));
    let lanes = |h: i8| {
        let l = [0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13].map(|b| b + 2 * h);
        _mm256_setr_epi8(
            l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7], l[8], l[9], l[10], l[11], l[12], l[13],
            l[14], l[15], l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7], l[8], l[9], l[10], l[11],
            l[12], l[13], l[14], l[15],
        )
    };
    // SAFETY: the group's codes and metadata start at these offsets (checked above).
    let g = unsafe {
        Group {
            codes: w.quants.as_ptr().add(group * (nb / 2) * pair_bytes),
            pair_bytes,
            sc: meta.sc.as_ptr().add(group * nb * 2 * ROWS8),
            d: meta.d.as_ptr().add(w.super_index(r0, 0)),
            offset: _mm256_set1_epi32(w.offset),
            nib: _mm256_set1_epi8(0x0F),
            top: _mm256_set1_epi8(0x30),
            repeat: [lanes(0), lanes(1)],
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
    let mut acc = [_mm256_setzero_ps(); M];
    // SAFETY: chunks c and c + 1 < nb exist in the group and in every activation row.
    unsafe {
        for c in (0..nb).step_by(2) {
            prefetch_pair(g.codes, c / 2, pair_bytes);
            chunk::<false, CRUMBS, M>(&g, &rows, c, &mut acc);
            chunk::<true, CRUMBS, M>(&g, &rows, c + 1, &mut acc);
        }
    }
    // SAFETY: this function's target features include AVX.
    unsafe { store_group(&acc, out) };
}

/// Bits 4–5 of the codes in `v`'s 2-bit plane at crumb k (bits 2k..2k+2 of each byte).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn crumb<const K: u32>(v: __m256i, top: __m256i) -> __m256i {
    // SAFETY: per the contract.
    unsafe {
        let at4 = match K {
            0 => _mm256_slli_epi16::<4>(v),
            1 => _mm256_slli_epi16::<2>(v),
            2 => v,
            _ => _mm256_srli_epi16::<2>(v),
        };
        _mm256_and_si256(at4, top)
    }
}

/// Adds chunk c (the second of its pair when HI) of the group's 8 rows, against every
/// activation row, to `acc`.
///
/// # Safety
/// AVX2, FMA and F16C; chunk c exists in the group and in every row of `rows`.
#[inline(always)]
unsafe fn chunk<const HI: bool, const CRUMBS: bool, const M: usize>(
    g: &Group,
    rows: &[ActRow; M],
    c: usize,
    acc: &mut [__m256; M],
) {
    // SAFETY: per the contract.
    unsafe {
        let base = g.codes.add((c / 2) * g.pair_bytes);
        // Lane r: row r's (sc₀, sc₁) as i16.
        let pair = _mm256_cvtepi8_epi16(_mm_loadu_si128(g.sc.add(2 * ROWS8 * c).cast()));
        let mut total = [_mm256_setzero_si256(); M];
        for half in 0..2 {
            let sc = _mm256_shuffle_epi8(pair, g.repeat[half]);
            // Two i16 sums per activation row, of two `vpmaddubsw` each.
            let mut s16 = [[_mm256_setzero_si256(); 2]; M];
            for t4 in 0..4 {
                let t = 4 * half + t4;
                let v = _mm256_loadu_si256(base.add(QK * t).cast());
                let mut u = if HI {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), g.nib)
                } else {
                    _mm256_and_si256(v, g.nib)
                };
                if CRUMBS {
                    let v = _mm256_loadu_si256(base.add(GROUP_PAIR_BYTES + QK * t4).cast());
                    // Crumb 2h + t/4 (t/4 is `half`).
                    let top = match (HI, half) {
                        (false, 0) => crumb::<0>(v, g.top),
                        (false, _) => crumb::<1>(v, g.top),
                        (true, 0) => crumb::<2>(v, g.top),
                        (true, _) => crumb::<3>(v, g.top),
                    };
                    u = _mm256_or_si256(u, top);
                }
                for i in 0..M {
                    let four = rows[i].q.add(QK * c + 4 * t).cast::<i32>().read_unaligned();
                    let p = _mm256_maddubs_epi16(u, _mm256_set1_epi32(four));
                    s16[i][t4 / 2] = _mm256_add_epi16(s16[i][t4 / 2], p);
                }
            }
            for i in 0..M {
                let s = _mm256_add_epi32(
                    _mm256_madd_epi16(s16[i][0], sc),
                    _mm256_madd_epi16(s16[i][1], sc),
                );
                total[i] = _mm256_add_epi32(total[i], s);
            }
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(g.d.add(ROWS8 * (c / 8)).cast()));
        for i in 0..M {
            let r = &rows[i];
            let offset_term = _mm256_mullo_epi32(
                _mm256_madd_epi16(pair, _mm256_set1_epi32(*r.half_sums.add(c))),
                g.offset,
            );
            let s = _mm256_sub_epi32(total[i], offset_term);
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(*r.dx.add(8 * c)));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[i]);
        }
    }
}
