//! 16-bit activations for the integer kernels, as two 8-bit planes ([`qmatmul_a16`]).
//!
//! Why: with f32 activations a block-format matmul expands every weight to f32 (the
//! per-block kernels, `simd_rows`), about 3× the integer kernels' time at decode on an
//! Intel AVX-512 host (Q4_1 1×3072×576: 146–154 µs against 45–48 µs, docs/performance.md),
//! while 8-bit activations (`qmatmul_int8`) round each value to 1/254 of its block's
//! largest. Here each 32-block is rounded to q = round(x/d) with |q| ≤ 127·255, a step
//! of 1/64 770 of the block's largest (finer than the f16 KV cache's 2⁻¹¹ relative), and
//! split exactly as q = 255·h + l with h and l in [−127, 127]: two int8 rows with
//! scales 255·d and d. The matmul is linear in the activation row, so y = y_h + y_l:
//! the integer kernels run 2M rows, unchanged, and each output tile adds its pairs as
//! it is stored (`RowStore::PairSums`). At
//! decode both rows share one pass over the weights, so where weight reads bound the
//! 8-bit kernel the 16-bit one costs about the same.
//!
//! Why 255 and not 256: q/255 is never a half-integer, so rounding it leaves
//! |l| ≤ 127, the bound every kernel assumes of an activation code (with 256, l could
//! reach ±128).

use super::int_path::{quantize_and_run, ActSource};
use super::packed::PackedWeights;
use super::quant_acts::{amax_finite, four_sums, BlockSink, QuantActs};
use super::{int_operands, ActScales, Tiles};
use crate::multiversion;
use crate::quant::QK;
use tessera_core::{Isa, Result, TensorView, TensorViewMut};

/// Largest |q| of a block: 127 in each plane, q = 255·h + l.
pub(super) const SPLIT_RANGE: f32 = 127.0 * 255.0;

/// The ratio of the two planes' scales.
pub(super) const PLANE_RATIO: f32 = 255.0;

/// Fills `hi` and `lo` (sized for `x`) with `x`'s two planes per 32-block: the vector
/// steps of `act_quant` on AVX2 (which AVX-512 hosts run too) and NEON, bit-exact with
/// [`split_portable`] (each value's arithmetic is the same IEEE operations, and the
/// block maximum and code sums are exact in any order). At decode this runs on one
/// thread before every matmul: the portable loop, its maximum fold lane-serial, was
/// 1.7% of a16 decode's samples on host B (`perf`, 2026-11-28).
pub(super) fn split_into<S: BlockSink>(isa: Isa, x: &[f32], offset: i32, hi: &mut S, lo: &mut S) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && Isa::Avx2.is_available() {
        // SAFETY: AVX2 and FMA checked; x is whole blocks (the matmul checked K); every
        // store goes through the sinks' bounds-checked `codes` and `finish`.
        return unsafe { super::act_quant::split_ymm(x, offset, hi, lo) };
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // SAFETY: NEON is baseline on aarch64; as above for x and the planes.
        return unsafe { super::act_quant::split_neon(x, offset, hi, lo) };
    }
    split_portable(isa, x, offset, hi, lo)
}

multiversion! {
    /// [`split_into`] in portable Rust, compiled per ISA (the baseline the vector steps
    /// are checked against). A non-finite block gets NaN scales in both planes, so the
    /// outputs it reaches are NaN.
    fn split_portable<S: BlockSink>(x: &[f32], offset: i32, hi: &mut S, lo: &mut S) {
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let (amax, finite) = amax_finite(xb);
            let d = amax / SPLIT_RANGE;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let (qh, ql) = (hi.codes(b), lo.codes(b));
            for ((h, l), &v) in qh.iter_mut().zip(ql.iter_mut()).zip(xb) {
                // Clamped for a subnormal d, whose 1/d overflows; NaN converts to 0.
                let q = (v * id).round_ties_even().clamp(-SPLIT_RANGE, SPLIT_RANGE);
                // q/255 is at least 1/510 from a half-integer, far beyond the product's
                // rounding error, so this is round(q/255) and |q − 255·hq| ≤ 127.
                let hq = (q * (1.0 / PLANE_RATIO)).round_ties_even();
                *h = hq as i8;
                *l = (q - PLANE_RATIO * hq) as i8; // exact: integers below 2²⁴
            }
            let d = if finite { d } else { f32::NAN };
            let sums = (four_sums(qh), four_sums(ql));
            hi.finish(b, PLANE_RATIO * d, sums.0, offset);
            lo.finish(b, d, sums.1, offset);
        }
    }
}

/// Activation rows as two 8-bit planes per row of x (`xs`, rows `ld` apart): rows 2i
/// and 2i + 1 are row i's high and low planes.
struct Planes<'a> {
    xs: &'a [f32],
    ld: usize,
    k: usize,
    offset: i32,
}

impl ActSource<2> for Planes<'_> {
    fn quantize<S: BlockSink>(&self, i: usize, [hi, lo]: &mut [S; 2]) {
        split_into(
            Isa::best(),
            &self.xs[i * self.ld..][..self.k],
            self.offset,
            hi,
            lo,
        )
    }
}

impl QuantActs {
    /// `x` as its two planes ([`split_into`]), into `hi` and `lo`'s buffers.
    pub(super) fn refill_split(hi: &mut QuantActs, lo: &mut QuantActs, x: &[f32], offset: i32) {
        Self::refill_split_on(Isa::best(), hi, lo, x, offset);
    }

    /// [`QuantActs::refill_split`] with the splitter `isa` runs (for tests).
    fn refill_split_on(isa: Isa, hi: &mut QuantActs, lo: &mut QuantActs, x: &[f32], offset: i32) {
        hi.size_for(x.len());
        lo.size_for(x.len());
        split_into(isa, x, offset, hi, lo);
    }
}

/// `y = x·Wᵀ` over packed weights with x rounded to 16 bits per 32-block (the module
/// docs): near the integer kernels' speed, with a rounding finer than f16's. Any M works; the engine
/// takes it for decode and batching steps, as `qmatmul_int8`.
pub fn qmatmul_a16(
    isa: Isa,
    threads: usize,
    w: &PackedWeights,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    qmatmul_a16_tiles(isa, Tiles::Auto, threads, w, x, y)
}

/// [`qmatmul_a16`] with the tile kernel's use pinned (the registry's variants).
pub(super) fn qmatmul_a16_tiles(
    isa: Isa,
    tiles: Tiles,
    threads: usize,
    w: &PackedWeights,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let Some((m, _, xs, ld)) = int_operands(isa, w, x, y)? else {
        return Ok(());
    };
    let planes = Planes {
        xs: &xs,
        ld,
        k: w.cols(),
        offset: w.offset(),
    };
    let scales = (ActScales::PerBlock, tiles);
    quantize_and_run::<2>(isa, threads, w, scales, (m, &planes), y);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    /// Half a step of the split plus the f32 roundings of the quantizer, as a factor
    /// on half a step (derived where it is used).
    const STEP_ROUNDING_SLACK: f64 = 1.02;

    /// The planes reconstruct the row to within half a step (1/64 770 of each block's
    /// largest value, plus f32 rounding), every code stays in [−127, 127], and the
    /// scales are 255 apart (up to f32 rounding).
    #[test]
    fn planes_reconstruct_the_row() {
        let mut rng = rand::rng();
        for k in [32, 96, 576] {
            let x: Vec<f32> = (0..k)
                .map(|i| rng.random_range(-1.0f32..1.0) * if i % 7 == 0 { 30.0 } else { 1.0 })
                .collect();
            let (mut hi, mut lo) = (QuantActs::default(), QuantActs::default());
            QuantActs::refill_split(&mut hi, &mut lo, &x, 8);
            for (b, xb) in x.chunks_exact(QK).enumerate() {
                let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                let (dh, dl) = (hi.d8[b][0] as f64, lo.d8[b][0] as f64);
                // 255·d rounded to f32: within half an f32 ulp of the exact ratio.
                assert!((dh / dl / 255.0 - 1.0).abs() <= f32::EPSILON as f64);
                for (i, &v) in xb.iter().enumerate() {
                    let (h, l) = (hi.q[b * QK + i], lo.q[b * QK + i]);
                    assert!(h > i8::MIN && l > i8::MIN, "{h} {l}"); // in [−127, 127]
                    let back = h as f64 * dh + l as f64 * dl;
                    // Half a step d/2 (d = amax/32 385), plus f32 rounding measured in
                    // steps: 1/d and v·(1/d) each within 2⁻²⁴ of |v/d| ≤ 32 385
                    // (0.0039 d together), and 255·d rounded to f32 times |h| ≤ 127
                    // (0.0019 d): at most 0.5058 d, so 1.0116 half steps; 1.02 of slack.
                    let bound = amax / 64770.0 * STEP_ROUNDING_SLACK;
                    assert!((back - v as f64).abs() <= bound, "{v}: {back}");
                }
            }
        }
    }

    /// Every field of both planes, as bits (f32 by `to_bits`).
    fn plane_bits(a: &QuantActs) -> Vec<u32> {
        let mut v: Vec<u32> = a.q.iter().map(|&q| q as u8 as u32).collect();
        v.extend(a.d8.iter().flatten().map(|x| x.to_bits()));
        v.extend(a.init.iter().flatten().map(|&x| x as u32));
        v.extend(a.lane_sums.iter().flatten().map(|x| x.to_bits()));
        v.extend(a.block_init.iter().map(|&x| x as u32));
        v.extend(a.block_sums.iter().map(|x| x.to_bits()));
        v.extend(a.half_sums.iter().map(|&x| x as u32));
        v
    }

    /// The split is compiled per ISA (vector steps on AVX2 and NEON): each must give
    /// the portable loop's planes bit for bit. Bit-equality holds by construction here,
    /// not by luck of a reduction order: each value goes through the same IEEE
    /// operations, and the block maximum and the code sums are exact in any order.
    /// Covers ties of the rounding (to even), an all-zero block, a block whose 1/d
    /// overflows, NaN and ∞, and random rows of every magnitude.
    #[test]
    fn split_is_the_same_on_every_isa() {
        let mut rng = rand::rng();
        let mut x: Vec<f32> = (0..8 * QK).map(|_| rng.random_range(-3.0..3.0)).collect();
        // Block 1: amax = 127·255 makes d = 1, so n + 0.5 is a tie (to even).
        for (j, v) in x[QK..2 * QK].iter_mut().enumerate() {
            *v = j as f32 - 15.5;
        }
        x[QK] = SPLIT_RANGE;
        x[2 * QK..3 * QK].fill(0.0);
        for v in &mut x[3 * QK..4 * QK] {
            *v = rng.random_range(-1e-38..1e-38);
        }
        x[5 * QK + 3] = f32::NAN;
        x[6 * QK + 30] = f32::NEG_INFINITY;
        let run = |isa: Isa, x: &[f32], offset: i32| {
            let (mut hi, mut lo) = (QuantActs::default(), QuantActs::default());
            QuantActs::refill_split_on(isa, &mut hi, &mut lo, x, offset);
            (plane_bits(&hi), plane_bits(&lo))
        };
        let want = run(Isa::Scalar, &x, 8);
        let (mut hi, mut lo) = (QuantActs::default(), QuantActs::default());
        QuantActs::refill_split_on(Isa::Scalar, &mut hi, &mut lo, &x, 8);
        // The ties went to even: −1.5 → −2, −0.5 and 0.5 → 0, 1.5 → 2 (block 1).
        let q = |j: usize| 255 * i32::from(hi.q[QK + j]) + i32::from(lo.q[QK + j]);
        assert_eq!([14, 15, 16, 17, 0].map(q), [-2, 0, 0, 2, 32385]);
        assert!(hi.d8[5][0].is_nan() && lo.d8[6][0].is_nan() && lo.d8[4][0].is_finite());
        for isa in Isa::available() {
            assert!(run(isa, &x, 8) == want, "{isa}");
        }
        for _ in 0..200 {
            let k = QK * rng.random_range(1..40);
            let scale = 10f32.powi(rng.random_range(-6..6));
            let x: Vec<f32> = (0..k).map(|_| rng.random_range(-scale..scale)).collect();
            let want = run(Isa::Scalar, &x, 128);
            for isa in Isa::available() {
                assert!(run(isa, &x, 128) == want, "{isa} K = {k}, scale {scale}");
            }
        }
    }

    /// On two threads (the split spread over them from [`PARALLEL_ROW_VALUES`] values),
    /// contiguous outputs, outputs in rows strided past N (a view into a wider buffer)
    /// and column-major outputs hold the one-thread call's values bit for bit — each
    /// output comes from the same kernel pass and one addition of its planes whatever
    /// the threads and the layout — and the gaps between rows stay untouched. M = 16 at
    /// K = 288 and N = 264 takes the threads' path for the split; M = 3 stays on the
    /// caller.
    #[test]
    fn threaded_and_strided_outputs_match_one_thread() {
        use crate::pool::PARALLEL_ROW_VALUES;
        use crate::quant::{ggml::BlockQ4_1, QuantMatrix};
        let mut rng = rand::rng();
        let (n, k) = (264, 9 * QK);
        assert!(16 * k >= PARALLEL_ROW_VALUES);
        let data: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let w = PackedWeights::new(&QuantMatrix::<BlockQ4_1>::quantize(n, k, &data).unwrap());
        for m in [3, 16] {
            let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-2.0..2.0)).collect();
            let xv = TensorView::contiguous(&x, &[m, k]).unwrap();
            // (i, j) lives at i·row + j·col of a buffer of `len`.
            let run = |threads: usize, (row, col, len): (usize, usize, usize)| {
                let mut y = vec![-7.0f32; len];
                let layout = tessera_core::Layout::strided(&[m, n], &[row, col], 0).unwrap();
                let mut yv = TensorViewMut::new(&mut y, layout).unwrap();
                qmatmul_a16(Isa::best(), threads, &w, &xv, &mut yv).unwrap();
                y
            };
            let want = run(1, (n, 1, m * n));
            assert!(want.iter().all(|v| v.is_finite()), "M {m}");
            for (row, col, len) in [(n, 1, m * n), (n + 5, 1, m * (n + 5)), (1, m, m * n)] {
                let got = run(2, (row, col, len));
                let mut written = vec![false; len];
                for i in 0..m {
                    for j in 0..n {
                        let at = i * row + j * col;
                        written[at] = true;
                        let (g, e) = (got[at], want[i * n + j]);
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "M {m}, strides {row}/{col}, ({i}, {j})"
                        );
                    }
                }
                for (at, _) in written.iter().enumerate().filter(|(_, w)| !**w) {
                    assert_eq!(
                        got[at], -7.0,
                        "M {m}, strides {row}/{col}: gap {at} written"
                    );
                }
            }
        }
    }

    /// The engine's 16-bit entry (`qmatmul_packed_a16`) at decode, batch and prefill
    /// sizes — M = 1, 16, 80, 130, the last two past `INT8_BATCH_M`: on AMX tiles where
    /// they serve Q4_1 (`a16_prefill_pays`), else dequantize + f32 GEMM — against
    /// float64 over the dequantized weights and the unrounded x. Each output may differ
    /// by every activation's half step of 16-bit rounding (1/64 770 of its block's
    /// largest |x|, with [`STEP_ROUNDING_SLACK`]) times |w|, plus [`super::super::TOL_INT8`]'s
    /// f32 accumulation relative to Σ|w·x|.
    #[test]
    fn packed_a16_entry_matches_float64_at_every_m() {
        use crate::quant::{ggml::BlockQ4_1, QuantMatrix};
        let mut rng = rand::rng();
        let (n, k) = (72, 6 * QK);
        let data: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let w = PackedWeights::new(&QuantMatrix::<BlockQ4_1>::quantize(n, k, &data).unwrap());
        let wf: Vec<Vec<f64>> = (0..n)
            .map(|r| {
                let mut row = vec![0f32; k];
                w.dequantize_row(r, &mut row);
                row.into_iter().map(f64::from).collect()
            })
            .collect();
        for m in [1, 16, 80, 130] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| rng.random_range(-1.0f32..1.0) * if i % 11 == 0 { 8.0 } else { 1.0 })
                .collect();
            let mut y = vec![f32::NAN; m * n];
            let xv = TensorView::contiguous(&x, &[m, k]).unwrap();
            let mut yv = TensorViewMut::contiguous(&mut y, &[m, n]).unwrap();
            super::super::qmatmul_packed_a16(Isa::best(), 2, &w, &xv, &mut yv).unwrap();
            for i in 0..m {
                let xr = &x[i * k..][..k];
                let half_step: Vec<f64> = xr
                    .chunks_exact(QK)
                    .flat_map(|b| {
                        let amax = b.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                        [amax / 64770.0 * STEP_ROUNDING_SLACK; QK]
                    })
                    .collect();
                for (j, wr) in wf.iter().enumerate() {
                    let want: f64 = wr.iter().zip(xr).map(|(a, &b)| a * b as f64).sum();
                    let mag: f64 = wr.iter().zip(xr).map(|(a, &b)| (a * b as f64).abs()).sum();
                    let rounding: f64 = wr.iter().zip(&half_step).map(|(a, h)| a.abs() * h).sum();
                    let bound = rounding + super::super::TOL_INT8.rel * mag;
                    let got = y[i * n + j] as f64;
                    assert!(
                        (got - want).abs() <= bound,
                        "M {m} ({i}, {j}): {got} vs {want}, bound {bound}"
                    );
                }
            }
        }
    }

    /// A non-finite value makes its block's scales NaN in both planes, and leaves the
    /// other blocks alone.
    #[test]
    fn non_finite_blocks_get_nan_scales() {
        let mut x = vec![1.0f32; 64];
        x[40] = f32::INFINITY;
        let (mut hi, mut lo) = (QuantActs::default(), QuantActs::default());
        QuantActs::refill_split(&mut hi, &mut lo, &x, 0);
        assert!(hi.d8[0][0].is_finite() && lo.d8[0][0].is_finite());
        assert!(hi.d8[1][0].is_nan() && lo.d8[1][0].is_nan());
    }
}
