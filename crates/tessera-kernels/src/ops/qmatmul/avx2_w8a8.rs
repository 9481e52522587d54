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
//! row's sum across lanes overflows i32, and each four rows' lanes are reduced together
//! with `vphaddd`. A call takes up to eight activation rows (the block kernels take
//! four): the weight chunk's load, sign split and `|s|` and the call's fixed cost are
//! shared by twice the work, and eight accumulators still leave registers spare.

use super::packed::{PackedWeights, QuantActs};
use crate::quant::QK;
use std::arch::x86_64::*;

/// Columns below which a row's whole dot fits i32: K·128·127 ≤ 2³¹ − 1 (K < 132 104,
/// beyond any LLM's hidden size; wider rows take the block kernel).
pub(super) const MAX_COLS: usize = (i32::MAX as usize) / (128 * 127);

/// Activation rows per call at most.
pub(super) const ROWS: usize = 8;

/// `out[i] = scale_w[row] · d_x(i) · Σ_k s_k·q_x,i[k]` for the `out.len()` ≤ [`ROWS`]
/// first activation rows; `acts` holds at least [`ROWS`] rows when `out` has more than 4
/// (5–7 rows run as 8, the extra ones being repeats whose results are dropped).
///
/// # Safety
/// The CPU must support AVX2; `row < w.rows`; `w` has offset-128 codes and one scale per
/// row ([`PackedWeights::one_scale_per_row`]); `w.cols < MAX_COLS`; every `acts[i]` was
/// quantized with one scale per row for `w.cols` columns.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dots(w: &PackedWeights, row: usize, acts: &[&QuantActs], out: &mut [f32]) {
    debug_assert!(out.len() <= ROWS && acts.len() >= out.len());
    debug_assert!(out.len() <= 4 || acts.len() >= ROWS);
    // SAFETY: forwarded contract; each arm has at least its count of rows.
    unsafe {
        match out.len() {
            0 => {}
            1 => dots_m::<1>(w, row, acts, out),
            2 => dots_m::<2>(w, row, acts, out),
            3 => dots_m::<3>(w, row, acts, out),
            4 => dots_m::<4>(w, row, acts, out),
            _ => dots_m::<ROWS>(w, row, acts, out),
        }
    }
}

#[target_feature(enable = "avx2")]
unsafe fn dots_m<const M: usize>(
    w: &PackedWeights,
    row: usize,
    acts: &[&QuantActs],
    out: &mut [f32],
) {
    let k = w.cols;
    debug_assert!(row < w.rows && acts.len() >= M && out.len() <= M && k < MAX_COLS);
    debug_assert!(acts[..M].iter().all(|a| a.q.len() >= k));
    // SAFETY: row < rows and 8-bit rows are `cols` bytes long.
    let quants = unsafe { w.quants.as_ptr().add(row * k) };
    let mut xs = [std::ptr::null::<i8>(); M];
    for i in 0..M {
        xs[i] = acts[i].q.as_ptr();
    }
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_si256(); M];
    for b in 0..k / QK {
        // SAFETY: chunk b's 32 bytes lie inside the weight row and every activation row
        // (both k long); prefetching never faults.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(quants.wrapping_add(QK * b + PREFETCH) as *const i8);
            let s = _mm256_xor_si256(
                _mm256_loadu_si256(quants.add(QK * b) as *const __m256i),
                flip,
            );
            let abs = _mm256_abs_epi8(s);
            for i in 0..M {
                let xq = _mm256_loadu_si256(xs[i].add(QK * b) as *const __m256i);
                let pairs = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(xq, s));
                acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(pairs, ones));
            }
        }
    }
    // Each four rows' lanes (missing rows zero) summed pairwise into [Σ0, Σ1, Σ2, Σ3] per
    // 128-bit half, then the halves added: one vector of four rows' dots.
    let zero = _mm256_setzero_si256();
    let row_acc = |i: usize| if i < M { acc[i] } else { zero };
    let mut sums = [0f32; 8];
    for (g, four) in sums.chunks_exact_mut(4).enumerate().take(M.div_ceil(4)) {
        let h = _mm256_hadd_epi32(
            _mm256_hadd_epi32(row_acc(4 * g), row_acc(4 * g + 1)),
            _mm256_hadd_epi32(row_acc(4 * g + 2), row_acc(4 * g + 3)),
        );
        let dots = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        // SAFETY: 4 f32 lanes into a 4-element slice.
        unsafe { _mm_storeu_ps(four.as_mut_ptr(), _mm_cvtepi32_ps(dots)) };
    }
    let scale = w.row_scale(row);
    for (i, o) in out.iter_mut().enumerate() {
        let dx = acts[i].d8.first().map_or(0.0, |d| d[0]);
        *o = sums[i] * scale * dx;
    }
}

/// Bytes ahead of the current chunk to prefetch. `avx2_int8`'s 2.5 KiB measured no
/// different here (0.95 and 1.06 over 5 rounds), so this stays at 1 KiB.
const PREFETCH: usize = 1024;

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
