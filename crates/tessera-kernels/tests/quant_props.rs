//! Property tests of the ggml 32-weight block formats over random data (mixed magnitudes,
//! outliers, all-equal and zero blocks): dequantize ∘ quantize stays within each format's
//! derived error bound per block, and the symmetric formats are idempotent (quantizing
//! their own dequantized values gives back the same blocks).

use proptest::prelude::*;
use tessera_kernels::quant::{
    BlockFormat, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, QuantMatrix, QK,
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

fn round_trip<B: BlockFormat>(rows: usize, cols: usize, data: &[f32]) -> Result<(), TestCaseError> {
    let q = QuantMatrix::<B>::quantize(rows, cols, data).expect("quantizable");
    let back = q.dequantize();
    for (blk, (x, y)) in data.chunks(QK).zip(back.chunks(QK)).enumerate() {
        let amax = x.iter().fold(0f64, |a, &v| a.max((v as f64).abs()));
        for (&a, &b) in x.iter().zip(y) {
            let err = (a as f64 - b as f64).abs();
            prop_assert!(
                err <= bound::<B>(amax),
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
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    prop_assert_eq!(bits(&once), bits(&twice), "{}", B::DTYPE);
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
}
