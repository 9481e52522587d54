//! The AVX2 W8A8 kernel for one scale per weight row and one per activation row (per-
//! channel INT8 weights against per-row activations, [`super::qmatmul_w8a8`]).
//!
//! The block-format kernel ([`super::avx2_int8`]) converts and scales every 32-weight
//! chunk because each chunk has its own scales: per (weight row, activation row, chunk)
//! that is a start-value add, an int→float convert, a scale multiply and the d_x
//! multiply-accumulate on top of the three-instruction integer dot. With a single scale
//! on each side, the whole row's dot stays in i32 lanes and is scaled once per output, so
//! the inner loop is the integer dot alone: `vpsignb`, `vpmaddubsw`, `vpmaddwd`, `vpaddd`.
//!
//! Codes are signed weights s = u − 128 multiplied as |s| × sign(q_x, s) (see
//! `avx2_int8`: pair sums ≤ 2·128·127 stay inside `vpmaddubsw`'s i16). A whole row's dot
//! is at most K·128·127 in magnitude, so below [`MAX_COLS`] neither a lane nor the
//! row's sum across lanes overflows i32, and each four accumulators' lanes are reduced
//! together with `vphaddd`.
//!
//! A call is a tile of R weight rows × M activation rows, R·M ≤ 8 accumulators ([`run`]
//! picks the tile from the number of activation rows). One weight row per call cost
//! about as long at decode with the row in L2 as DRAM takes to deliver it (the
//! reduction, the call and the output store paid per row), so compute did not hide
//! under memory. Four rows per call share the activation load, one reduction and one
//! call; each weight chunk's load, sign split and `|s|` serve the tile's M rows.

use super::for_weight_rows;
use super::packed::{PackedWeights, QuantActs};
use crate::quant::QK;
use std::arch::x86_64::*;
use tessera_core::TensorViewMut;

/// Columns below which a row's whole dot fits i32: K·128·127 ≤ 2³¹ − 1 (K < 132 104,
/// beyond any LLM's hidden size; wider rows take the block kernel).
pub(super) const MAX_COLS: usize = (i32::MAX as usize) / (128 * 127);

/// Accumulators a tile holds at most: with the activation chunks, the sign-split weight
/// chunk and two constants, that fills AVX2's 16 ymm registers.
const TILE_ACCUMULATORS: usize = 8;

/// `y = x̂·Wᵀ` over `acts`, the tile chosen by their count: decode takes four weight
/// rows per call, prefill one weight row against eight activation rows.
///
/// # Safety
/// The CPU must support AVX2; `w` has offset-128 codes and one scale per row
/// ([`PackedWeights::one_scale_per_row`]); `w.cols < MAX_COLS`; every `acts[i]` was
/// quantized with one scale per row for `w.cols` columns; y is `[acts.len(), w.rows]`.
pub(super) unsafe fn run(
    threads: usize,
    w: &PackedWeights,
    acts: &[QuantActs],
    act_block: usize,
    y: &mut TensorViewMut<'_, f32>,
) {
    // SAFETY: forwarded contract.
    unsafe {
        match acts.len() {
            0 => {}
            1 => tiles::<4, 1>(threads, w, acts, act_block, y),
            2 => tiles::<4, 2>(threads, w, acts, act_block, y),
            3 | 4 => tiles::<2, 4>(threads, w, acts, act_block, y),
            _ => tiles::<1, 8>(threads, w, acts, act_block, y),
        }
    }
}

/// [`run`] in R × M tiles. A last, short activation chunk is padded by repeating its
/// last row, and a last weight group past N reads the last row; the driver drops both.
///
/// # Safety
/// As [`run`].
unsafe fn tiles<const R: usize, const M: usize>(
    threads: usize,
    w: &PackedWeights,
    acts: &[QuantActs],
    act_block: usize,
    y: &mut TensorViewMut<'_, f32>,
) {
    // Whole tiles per activation block: a block of 4 (K = 1536) would run 1×8 tiles
    // half empty.
    let shape = (w.rows(), acts.len(), act_block.next_multiple_of(M));
    for_weight_rows::<M, R>(threads, shape, y, |r, m0, mc, out| {
        let a: [&QuantActs; M] = std::array::from_fn(|i| &acts[m0 + i.min(mc - 1)]);
        // SAFETY: `run`'s contract; the driver starts every group below N.
        unsafe { dots::<R, M>(w, r, &a, out) }
    });
}

/// `out[i·R + g] = scale_w[row + g] · d_x(i) · Σ_k s_k·q_x,i[k]` for as many outputs
/// as `out` holds (≤ R·M). Weight rows past the last are read as the last.
///
/// # Safety
/// As [`run`], and `row < w.rows`.
#[target_feature(enable = "avx2")]
unsafe fn dots<const R: usize, const M: usize>(
    w: &PackedWeights,
    row: usize,
    acts: &[&QuantActs; M],
    out: &mut [f32],
) {
    const { assert!(R * M <= TILE_ACCUMULATORS) };
    let k = w.cols;
    debug_assert!(row < w.rows && out.len() <= R * M && k < MAX_COLS);
    debug_assert!(acts.iter().all(|a| a.q.len() >= k));
    let rows: [usize; R] = std::array::from_fn(|g| (row + g).min(w.rows - 1));
    // SAFETY: every rows[g] < rows, and 8-bit rows are `cols` bytes long.
    let quants: [*const u8; R] =
        std::array::from_fn(|g| unsafe { w.quants.as_ptr().add(rows[g] * k) });
    let xs: [*const i8; M] = std::array::from_fn(|i| acts[i].q.as_ptr());
    // The next tile's R rows are contiguous; R·32 bytes of them are fetched per chunk of
    // this tile, so the prefetches run one tile ahead of the loads.
    let next = w.quants.as_ptr().wrapping_add((row + R) * k);
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_si256(); M]; R];
    for b in 0..k / QK {
        // SAFETY: chunk b's 32 bytes lie inside every weight row and activation row
        // (all k long); prefetching never faults.
        unsafe {
            for line in (0..R * QK).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(R * QK * b + line) as *const i8);
            }
            let x: [__m256i; M] =
                std::array::from_fn(|i| _mm256_loadu_si256(xs[i].add(QK * b) as *const __m256i));
            for g in 0..R {
                let s = _mm256_xor_si256(
                    _mm256_loadu_si256(quants[g].add(QK * b) as *const __m256i),
                    flip,
                );
                let abs = _mm256_abs_epi8(s);
                for i in 0..M {
                    let pairs = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(x[i], s));
                    acc[g][i] = _mm256_add_epi32(acc[g][i], _mm256_madd_epi16(pairs, ones));
                }
            }
        }
    }
    let sums = reduce(acc.as_flattened());
    for (j, o) in out.iter_mut().enumerate() {
        let (i, g) = (j / R, j % R);
        let dx = acts[i].d8.first().map_or(0.0, |d| d[0]);
        *o = sums[g * M + i] * w.row_scale(rows[g]) * dx;
    }
}

/// Each accumulator's lanes summed, as f32: four at a time (missing ones zero) summed
/// pairwise into [Σ0, Σ1, Σ2, Σ3] per 128-bit half, then the halves added.
#[target_feature(enable = "avx2")]
fn reduce(acc: &[__m256i]) -> [f32; TILE_ACCUMULATORS] {
    let zero = _mm256_setzero_si256();
    let at = |i: usize| acc.get(i).copied().unwrap_or(zero);
    let mut sums = [0f32; TILE_ACCUMULATORS];
    for (q, four) in sums
        .chunks_exact_mut(4)
        .enumerate()
        .take(acc.len().div_ceil(4))
    {
        let h = _mm256_hadd_epi32(
            _mm256_hadd_epi32(at(4 * q), at(4 * q + 1)),
            _mm256_hadd_epi32(at(4 * q + 2), at(4 * q + 3)),
        );
        let dots = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        // SAFETY: 4 f32 lanes into a 4-element slice.
        unsafe { _mm_storeu_ps(four.as_mut_ptr(), _mm_cvtepi32_ps(dots)) };
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::qmatmul::qmatmul_w8a8;
    use crate::quant::Int8Matrix;
    use tessera_core::{Isa, TensorView, TensorViewMut};

    /// Rows of the largest magnitude (codes −127 against −127) sum to K·127² in i32: just
    /// below [`MAX_COLS`] that is within 1% of 2³¹ and must not wrap; at and above it the
    /// block kernel takes over. Both must give K (the dot of ±1 rows).
    #[test]
    fn whole_row_sums_do_not_overflow_near_the_bound() {
        if !Isa::Avx2.is_available() {
            eprintln!("skipped: no AVX2");
            return;
        }
        let below = MAX_COLS / QK * QK;
        for k in [below, below + QK] {
            let w = PackedWeights::from_int8(&Int8Matrix::quantize(1, k, &vec![-1.0; k]).unwrap());
            let x = vec![-1.0f32; k];
            let xv = TensorView::contiguous(&x, &[1, k]).unwrap();
            let mut y = [f32::NAN];
            let mut yv = TensorViewMut::contiguous(&mut y, &[1, 1]).unwrap();
            qmatmul_w8a8(Isa::Avx2, 1, &w, &xv, &mut yv).unwrap();
            assert!((y[0] / k as f32 - 1.0).abs() < 1e-5, "K = {k}: {}", y[0]);
        }
    }
}
