//! Property tests of the ggml 32-weight block formats over random data (mixed magnitudes,
//! outliers, all-equal and zero blocks): dequantize ∘ quantize stays within each format's
//! derived error bound per block, and the symmetric formats are idempotent (quantizing
//! their own dequantized values gives back the same values). The same for the K-quants
//! over 256-weight super-blocks whose 16-weight sub-blocks differ in magnitude by up to
//! 2⁸ (what stresses their quantized sub-block scales).

mod common;

use proptest::prelude::*;
use tessera_kernels::quant::{
    BlockFormat, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0,
    BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, QuantMatrix, QK, QK_K,
};

/// Worst error per block as a fraction of the block's largest magnitude: half a
/// quantization step (step = range / levels) plus the scale's f16 rounding (2⁻¹¹
/// relative, times the largest code), plus the minimum's f16 rounding for the formats
/// with one. Q8_0 (±127 steps of amax/127): 1/254 + 2⁻¹¹. Q4_0 and Q5_0 put the signed
/// extreme at code −8 (−16), so the opposite side reaches only +7 (+15) steps and values
/// near −extreme clamp by up to a whole step of amax/8 (amax/16): 1/8 + 2⁻¹¹ and
/// 1/16 + 2⁻¹¹, as ggml defines them. Q4_1 (range up to 2× the magnitude, 15 steps):
/// 1/15 + 2·2⁻¹¹; Q5_1: 1/31 + 2·2⁻¹¹. A small margin covers the f32 arithmetic. Tiny
/// blocks have f16-subnormal scales, rounded by up to 2⁻²⁵ absolute instead: that times
/// the largest code (and once more for a minimum) is added as an absolute term.
fn bound<B: BlockFormat>(amax: f64) -> f64 {
    let f16 = 2f64.powi(-11);
    // (relative part, largest code for the subnormal-scale term)
    let b: (f64, f64) = match B::DTYPE {
        tessera_core::DType::Q8_0 => (1.0 / 254.0 + f16, 127.0),
        tessera_core::DType::Q4_0 => (1.0 / 8.0 + f16, 8.0),
        tessera_core::DType::Q5_0 => (1.0 / 16.0 + f16, 16.0),
        tessera_core::DType::Q4_1 => (1.0 / 15.0 + 2.0 * f16, 16.0),
        tessera_core::DType::Q5_1 => (1.0 / 31.0 + 2.0 * f16, 32.0),
        d => panic!("no bound for {d}"),
    };
    b.0 * 1.001 * amax + b.1 * 2f64.powi(-25)
}

/// The K-quants' worst error per super-block as a fraction of its largest magnitude.
/// A rounding quantizer stays within half a level step (Q8_K, f32 scale: 1/254). The
/// other K-quants fit each sub-block's scale (and minimum) to a weighted squared error,
/// which may clip a sub-block's extreme value by up to one level step of its range:
/// Q6_K (6-bit symmetric) 1/32, Q5_K 2/31 and Q4_K 2/15 (with a minimum, a range up to
/// 2·max), Q3_K (codes −4..3) 1/4, Q2_K 2/3. Q3_K and Q2_K also round their sub-block
/// scales (and Q2_K its minimums) to 6 and 4 bits against the super-block's f16 scale,
/// up to half a scale step times the largest code: 1/64 for Q3_K, 1/30 + 1/30 for Q2_K
/// (the finer formats' fits absorb theirs). Measured worst over 180,000 random
/// super-blocks like `k_matrix`'s: 0.0039, 0.021, 0.054, 0.098, 0.265, 0.411. The
/// absolute term covers f16-subnormal super-block scales (tiny blocks): 2⁻²⁵ times the
/// largest product of weight code and sub-block scale code (and of the minimum's).
fn k_bound<B: BlockFormat>(amax: f64) -> f64 {
    let (rel, codes): (f64, f64) = match B::DTYPE {
        tessera_core::DType::Q8_K => (1.0 / 254.0, 0.0),
        tessera_core::DType::Q6_K => (1.0 / 32.0, 32.0 * 128.0),
        tessera_core::DType::Q5_K => (2.0 / 31.0, 2.0 * 32.0 * 64.0),
        tessera_core::DType::Q4_K => (2.0 / 15.0, 2.0 * 16.0 * 64.0),
        tessera_core::DType::Q3_K => (1.0 / 4.0 + 1.0 / 64.0, 4.0 * 32.0),
        tessera_core::DType::Q2_K => (2.0 / 3.0 + 2.0 / 30.0, 2.0 * 4.0 * 16.0),
        d => panic!("no bound for {d}"),
    };
    rel * 1.001 * amax + codes * 2f64.powi(-25)
}

fn round_trip<B: BlockFormat>(rows: usize, cols: usize, data: &[f32]) -> Result<(), TestCaseError> {
    within::<B>(rows, cols, data, bound::<B>)
}

fn k_round_trip<B: BlockFormat>(
    rows: usize,
    cols: usize,
    data: &[f32],
) -> Result<(), TestCaseError> {
    within::<B>(rows, cols, data, k_bound::<B>)
}

/// Quantizes `data`, dequantizes it, and checks each value's error against `bound` of
/// its (super-)block's largest magnitude.
fn within<B: BlockFormat>(
    rows: usize,
    cols: usize,
    data: &[f32],
    bound: fn(f64) -> f64,
) -> Result<(), TestCaseError> {
    let q = QuantMatrix::<B>::quantize(rows, cols, data).expect("quantizable");
    let back = q.dequantize();
    for (blk, (x, y)) in data.chunks(B::BLOCK).zip(back.chunks(B::BLOCK)).enumerate() {
        let amax = x.iter().fold(0f64, |a, &v| a.max((v as f64).abs()));
        for (&a, &b) in x.iter().zip(y) {
            let err = (a as f64 - b as f64).abs();
            prop_assert!(
                err <= bound(amax),
                "{} block {blk}: {a} → {b} (error {err:e}, block max {amax:e})",
                B::DTYPE
            );
        }
    }
    Ok(())
}

fn idempotent<B: BlockFormat>(rows: usize, cols: usize, data: &[f32]) -> Result<(), TestCaseError> {
    let once = QuantMatrix::<B>::quantize(rows, cols, data)
        .expect("quantizable")
        .dequantize();
    let twice = QuantMatrix::<B>::quantize(rows, cols, &once)
        .expect("quantizable")
        .dequantize();
    // Values, not bits: when the signed extreme ties in magnitude with one of the other
    // sign after the first pass, the format takes the first of them, so the scale's sign
    // (and with it the sign of a zero, −0.0 against 0.0) may flip; every value is equal.
    prop_assert_eq!(&once, &twice, "{}", B::DTYPE);
    Ok(())
}

/// Blocks of one of several kinds: uniform of a random scale, with one outlier, all
/// equal, or all zero.
fn matrix() -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
    (1usize..4, 1usize..5).prop_flat_map(|(rows, nb)| {
        let cols = nb * QK;
        let block =
            (0u8..4, -8i32..8, prop::collection::vec(-1.0f32..1.0, QK)).prop_map(|(kind, e, v)| {
                let s = 2f32.powi(e);
                match kind {
                    0 => v.iter().map(|x| x * s).collect::<Vec<f32>>(),
                    1 => v
                        .iter()
                        .enumerate()
                        .map(|(i, x)| if i == 7 { x.signum() * 40.0 * s } else { x * s })
                        .collect(),
                    2 => vec![v[0] * s; QK],
                    _ => vec![0.0; QK],
                }
            });
        prop::collection::vec(block, rows * nb).prop_map(move |bs| (rows, cols, bs.concat()))
    })
}

/// Super-blocks whose 16-weight sub-blocks differ in scale by up to 2⁸
/// ([`common::runs_matrix`]).
fn k_matrix() -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
    common::runs_matrix(3, QK_K)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn dequantized_values_stay_within_the_format_bound((rows, cols, data) in matrix()) {
        round_trip::<BlockQ8_0>(rows, cols, &data)?;
        round_trip::<BlockQ4_0>(rows, cols, &data)?;
        round_trip::<BlockQ5_0>(rows, cols, &data)?;
        round_trip::<BlockQ4_1>(rows, cols, &data)?;
        round_trip::<BlockQ5_1>(rows, cols, &data)?;
    }

    #[test]
    fn symmetric_formats_requantize_to_themselves((rows, cols, data) in matrix()) {
        idempotent::<BlockQ8_0>(rows, cols, &data)?;
        idempotent::<BlockQ4_0>(rows, cols, &data)?;
        idempotent::<BlockQ5_0>(rows, cols, &data)?;
    }

    #[test]
    fn k_quant_values_stay_within_the_format_bound((rows, cols, data) in k_matrix()) {
        k_round_trip::<BlockQ8K>(rows, cols, &data)?;
        k_round_trip::<BlockQ6K>(rows, cols, &data)?;
        k_round_trip::<BlockQ5K>(rows, cols, &data)?;
        k_round_trip::<BlockQ4K>(rows, cols, &data)?;
        k_round_trip::<BlockQ3K>(rows, cols, &data)?;
        k_round_trip::<BlockQ2K>(rows, cols, &data)?;
    }

    /// Q8_K stores 1/iscale rather than the scale it rounded with, so requantizing its
    /// own values gives the same codes but a scale that may differ in the last bit:
    /// values agree within 2 ulp (2⁻²² relative).
    #[test]
    fn q8_k_requantizes_to_itself((rows, cols, data) in k_matrix()) {
        let once = QuantMatrix::<BlockQ8K>::quantize(rows, cols, &data).expect("quantizable").dequantize();
        let twice = QuantMatrix::<BlockQ8K>::quantize(rows, cols, &once).expect("quantizable").dequantize();
        for (i, (&a, &b)) in once.iter().zip(&twice).enumerate() {
            prop_assert!(
                (a as f64 - b as f64).abs() <= (a as f64).abs() * 2f64.powi(-22),
                "q8_k value {i}: {a} requantized to {b}"
            );
        }
    }
}
