//! Property tests of the formats outside ggml's: AWQ/GPTQ-style 4-bit groups,
//! per-channel INT8 and FP8 (per tensor and per channel). Over random matrices whose
//! 16-value runs differ in magnitude by up to 2⁸ (plus outliers, constant and zero
//! runs), dequantize ∘ quantize stays within each format's derived bound, and the
//! formats that round onto a fixed grid give back their own values when requantized.

mod common;

use proptest::prelude::*;
use tessera_kernels::quant::fp8::Fp8;
use tessera_kernels::quant::{
    BlockFormat, BlockInt4G128, BlockInt4G32, BlockInt4G64, Fp8Matrix, Fp8Scaling, Int8Matrix,
    QuantMatrix,
};

/// Matrices in runs of 16 up to 2⁸ apart ([`common::runs_matrix`]), columns a multiple
/// of the largest group.
fn matrix() -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
    common::runs_matrix(4, 128)
}

/// Largest magnitude in `x`.
fn amax(x: &[f32]) -> f64 {
    x.iter().fold(0f64, |a, &v| a.max((v as f64).abs()))
}

/// 4-bit groups: the grid spans [min, max] of the group (0 included) in 15 steps of
/// s = range/15 ≤ 2·max|x|/15, offset by a zero point rounded to an integer. Rounding
/// costs s/2; the rounded zero point shifts the grid by up to s/2, so an extreme value
/// may clip by that much more: one step, 2/15 of max|x|. The scale's f16 rounding
/// (2⁻¹¹ relative) moves the grid's far end by up to 15 codes of it. Tiny groups have an
/// f16-subnormal scale, rounded by up to 2⁻²⁵ absolute: 16 codes of it.
fn group_bound(amax: f64) -> f64 {
    (2.0 / 15.0 + 2.0 * 15.0 * 2f64.powi(-11) / 15.0) * 1.001 * amax + 16.0 * 2f64.powi(-25)
}

fn group_round_trip<B: BlockFormat>(
    rows: usize,
    cols: usize,
    data: &[f32],
) -> Result<(), TestCaseError> {
    let back = QuantMatrix::<B>::quantize(rows, cols, data)
        .expect("quantizable")
        .dequantize();
    for (g, (x, y)) in data.chunks(B::BLOCK).zip(back.chunks(B::BLOCK)).enumerate() {
        let bound = group_bound(amax(x));
        for (&a, &b) in x.iter().zip(y) {
            let err = (a as f64 - b as f64).abs();
            prop_assert!(
                err <= bound,
                "{} group {g}: {a} → {b} (error {err:e}, bound {bound:e})",
                B::DTYPE
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn int4_groups_stay_within_one_step((rows, cols, data) in matrix()) {
        group_round_trip::<BlockInt4G32>(rows, cols, &data)?;
        group_round_trip::<BlockInt4G64>(rows, cols, &data)?;
        group_round_trip::<BlockInt4G128>(rows, cols, &data)?;
    }

    /// Per-channel INT8: s = max|row|/127 in f32, codes rounded and never clipped, so
    /// the error is at most s/2 = max|row|/254 (plus f32 rounding of the product).
    /// Requantizing the dequantized row keeps its maximum, hence its scale and codes.
    #[test]
    fn int8_rows_stay_within_half_a_step((rows, cols, data) in matrix()) {
        let m = Int8Matrix::quantize(rows, cols, &data).expect("quantizable");
        let back = m.dequantize();
        for (r, (x, y)) in data.chunks(cols).zip(back.chunks(cols)).enumerate() {
            let bound = amax(x) / 254.0 * 1.001;
            for (&a, &b) in x.iter().zip(y) {
                prop_assert!((a as f64 - b as f64).abs() <= bound, "row {r}: {a} → {b}");
            }
        }
        let twice = Int8Matrix::quantize(rows, cols, &back).expect("quantizable").dequantize();
        for (i, (&a, &b)) in back.iter().zip(&twice).enumerate() {
            prop_assert!((a as f64 - b as f64).abs() <= (a as f64).abs() * 2f64.powi(-22), "value {i}: {a} → {b}");
        }
    }

    /// FP8 after dividing by the scale s = max|x|/max_finite (per tensor or per row):
    /// round-to-nearest keeps half an ulp of the significand, 2⁻⁴ relative for E4M3
    /// (3 bits) and 2⁻³ for E5M2 (2 bits), down to the subnormals, whose spacing (2⁻⁹
    /// and 2⁻¹⁶) times s bounds the rest; the f32 product adds 2⁻²⁴.
    #[test]
    fn fp8_values_stay_within_half_an_ulp((rows, cols, data) in matrix()) {
        for format in [Fp8::E4M3, Fp8::E5M2] {
            let (rel, sub) = match format {
                Fp8::E4M3 => (2f64.powi(-4), 2f64.powi(-10)),
                Fp8::E5M2 => (2f64.powi(-3), 2f64.powi(-17)),
            };
            for scaling in [Fp8Scaling::PerTensor, Fp8Scaling::PerChannel] {
                let m = Fp8Matrix::quantize(format, scaling, rows, cols, &data).expect("quantizable");
                let scales = m.scales().to_vec();
                let mut row = vec![0f32; cols];
                for r in 0..rows {
                    m.dequantize_row(r, &mut row);
                    let s = scales[if scales.len() == 1 { 0 } else { r }] as f64;
                    for (c, (&a, &b)) in data[r * cols..][..cols].iter().zip(&row).enumerate() {
                        let bound = (rel + 2f64.powi(-24)) * 1.001 * (a as f64).abs() + sub * s;
                        let err = (a as f64 - b as f64).abs();
                        prop_assert!(err <= bound, "{format:?} {scaling:?} [{r}, {c}]: {a} → {b} (scale {s:e})");
                    }
                }
            }
        }
    }
}
