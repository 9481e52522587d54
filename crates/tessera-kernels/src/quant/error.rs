//! The quantization-error report behind `tessera quant-error`: for one f32 weight matrix,
//! how far each format's dequantized weights and a matmul through them land from float64.
//!
//! Matmul error is measured on `x·Wᵀ` for random activations in float64 with the
//! dequantized weights, so it isolates the format's error from any kernel's rounding.

use super::fp8::Fp8;
use super::{BlockFormat, QuantMatrix, BLOCK_DTYPES};
use super::{Fp8Matrix, Fp8Scaling};
use tessera_core::{Error, Result};

/// One format's line of the report.
#[derive(Clone, Debug, PartialEq)]
pub struct FormatError {
    /// Format name, as `--quantize` spells it.
    pub format: &'static str,
    /// Storage bits per weight, scales included.
    pub bits_per_weight: f64,
    /// ‖W − Ŵ‖₂ / ‖W‖₂.
    pub weight_rel: f64,
    /// max |W − Ŵ|.
    pub weight_max_abs: f64,
    /// ‖x·Wᵀ − x·Ŵᵀ‖₂ / ‖x·Wᵀ‖₂ over the given activations.
    pub matmul_rel: f64,
}

/// Weight distributions for reports and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dist {
    /// U(−1, 1).
    Uniform,
    /// N(0, 1) (Box–Muller).
    Normal,
    /// U(−0.05, 0.05) with one value in 40 scaled ×400: real weight rows' rare outliers.
    Outliers,
}

impl std::str::FromStr for Dist {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "uniform" => Ok(Dist::Uniform),
            "normal" => Ok(Dist::Normal),
            "outliers" => Ok(Dist::Outliers),
            _ => Err(Error::invalid(
                "quant-error",
                format!("distribution '{s}' (uniform, normal, outliers)"),
            )),
        }
    }
}

/// `n` values from `dist`.
pub fn sample(dist: Dist, n: usize, rng: &mut crate::registry::Rng) -> Vec<f32> {
    use rand::Rng as _;
    (0..n)
        .map(|_| match dist {
            Dist::Uniform => rng.random_range(-1.0..1.0),
            Dist::Normal => {
                let (u, v): (f32, f32) = (rng.random_range(1e-7..1.0), rng.random_range(0.0..1.0));
                (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
            }
            Dist::Outliers => {
                let v: f32 = rng.random_range(-0.05..0.05);
                if rng.random_range(0..40) == 0 {
                    v * 400.0
                } else {
                    v
                }
            }
        })
        .collect()
}

fn fp8(f: Fp8, scaling: Fp8Scaling, rows: usize, cols: usize, w: &[f32]) -> Result<Vec<f32>> {
    Ok(Fp8Matrix::quantize(f, scaling, rows, cols, w)?.dequantize())
}

fn ggml<B: BlockFormat>(rows: usize, cols: usize, w: &[f32]) -> Result<Vec<f32>> {
    Ok(QuantMatrix::<B>::quantize(rows, cols, w)?.dequantize())
}

/// Errors of every format for `w [rows, cols]` and activations `x [m, cols]`.
pub fn report(rows: usize, cols: usize, w: &[f32], x: &[f32]) -> Result<Vec<FormatError>> {
    if rows == 0
        || cols == 0
        || w.len() != rows * cols
        || x.is_empty()
        || !x.len().is_multiple_of(cols)
    {
        return Err(Error::shape(
            "quant-error",
            format!(
                "{rows}×{cols} weights from {} values, activations of {} values",
                w.len(),
                x.len()
            ),
        ));
    }
    let exact = matmul(rows, cols, w, x);
    let bits = |dt: tessera_core::DType| 8.0 * dt.size_bytes() as f64 / dt.block_size() as f64;
    // Every block format whose block divides the rows (K-quants need 256, groups up to
    // 128); Q8_K is llama.cpp's activation format, not a weight format.
    let mut candidates: Vec<(&'static str, f64, Vec<f32>)> = Vec::new();
    for dt in BLOCK_DTYPES {
        if dt == tessera_core::DType::Q8_K || !cols.is_multiple_of(dt.block_size()) {
            continue;
        }
        let deq =
            crate::with_block_format!(dt, B => ggml::<B>(rows, cols, w)?, _ => unreachable!());
        candidates.push((dt.name(), bits(dt), deq));
    }
    let per_channel = 8.0 + 32.0 / cols as f64;
    let per_tensor = 8.0 + 32.0 / (rows * cols) as f64;
    for (name, f, scaling, bits) in [
        (
            "fp8 e4m3 /channel",
            Fp8::E4M3,
            Fp8Scaling::PerChannel,
            per_channel,
        ),
        (
            "fp8 e5m2 /channel",
            Fp8::E5M2,
            Fp8Scaling::PerChannel,
            per_channel,
        ),
        (
            "fp8 e4m3 /tensor",
            Fp8::E4M3,
            Fp8Scaling::PerTensor,
            per_tensor,
        ),
    ] {
        candidates.push((name, bits, fp8(f, scaling, rows, cols, w)?));
    }
    Ok(candidates
        .into_iter()
        .map(|(format, bits_per_weight, deq)| FormatError {
            format,
            bits_per_weight,
            weight_rel: rel(w, &deq),
            weight_max_abs: w
                .iter()
                .zip(&deq)
                .fold(0f64, |a, (&p, &q)| a.max((p as f64 - q as f64).abs())),
            matmul_rel: rel64(&exact, &matmul(rows, cols, &deq, x)),
        })
        .collect())
}

/// `x·Wᵀ` in float64.
fn matmul(rows: usize, cols: usize, w: &[f32], x: &[f32]) -> Vec<f64> {
    x.chunks_exact(cols)
        .flat_map(|xr| {
            (0..rows).map(move |r| {
                w[r * cols..(r + 1) * cols]
                    .iter()
                    .zip(xr)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum()
            })
        })
        .collect()
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let a64: Vec<f64> = a.iter().map(|&v| v as f64).collect();
    let b64: Vec<f64> = b.iter().map(|&v| v as f64).collect();
    rel64(&a64, &b64)
}

fn rel64(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(p, q)| (p - q) * (p - q)).sum();
    let den: f64 = a.iter().map(|p| p * p).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

#[cfg(test)]
mod tests {
    #[test]
    fn more_bits_less_error_and_bad_shapes() {
        let (rows, cols) = (8, 64);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1009) as f32 / 1009.0) - 0.5)
            .collect();
        let x: Vec<f32> = (0..2 * cols)
            .map(|i| ((i * 104729 % 997) as f32 / 997.0) - 0.5)
            .collect();
        let r = super::report(rows, cols, &w, &x).expect("valid");
        let get = |f: &str| r.iter().find(|e| e.format == f).expect("listed").clone();
        assert_eq!(get("q4_0").bits_per_weight, 4.5);
        assert_eq!(get("q8_0").bits_per_weight, 8.5);
        assert!(get("q8_0").weight_rel < get("q4_1").weight_rel);
        assert!(get("q4_1").weight_rel < get("q4_0").weight_rel * 1.2);
        assert!(get("fp8 e4m3 /channel").weight_rel < get("fp8 e5m2 /channel").weight_rel);
        for e in &r {
            assert!(e.weight_rel > 0.0 && e.weight_rel < 0.2, "{e:?}");
            assert!(e.matmul_rel > 0.0 && e.matmul_rel < 0.2, "{e:?}");
        }
        assert!(super::report(rows, cols, &w[1..], &x).is_err());
        // Rows of 33 fit no block format: only the per-channel formats are reported.
        let odd = super::report(rows, 33, &w[..rows * 33], &x[..66]).expect("valid");
        assert!(odd.iter().all(|e| e.format.starts_with("fp8")), "{odd:?}");
        // Rows of 256 add the K-quants and every group size.
        let w: Vec<f32> = (0..4 * 256)
            .map(|i| ((i * 7919 % 1009) as f32 / 1009.0) - 0.5)
            .collect();
        let r = super::report(4, 256, &w, &w[..256]).expect("valid");
        for f in [
            "q2_k",
            "q3_k",
            "q4_k",
            "q5_k",
            "q6_k",
            "int4_g32",
            "int4_g128",
        ] {
            assert!(r.iter().any(|e| e.format == f), "{f} listed");
        }
        let get = |f: &str| r.iter().find(|e| e.format == f).expect("listed").clone();
        assert!(get("q6_k").weight_rel < get("q4_k").weight_rel);
        assert!(get("q4_k").weight_rel < get("q2_k").weight_rel);
        assert!(get("int4_g32").weight_rel <= get("int4_g128").weight_rel);
    }
}
