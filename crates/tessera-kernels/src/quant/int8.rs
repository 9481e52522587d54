//! INT8 weights with one f32 scale per output channel (row), symmetric:
//! `value = q·scale`, q ∈ −127..=127, scale = max|row| / 127.
//!
//! The format of W8A8 inference (SmoothQuant, TensorRT-LLM's int8 GEMMs): per-channel
//! scales cost nothing in the matmul (one multiply per output), and with activations
//! quantized per row as well (`ops::qmatmul::qmatmul_w8a8`) the whole dot product is
//! integer. Rounding is half to even; a row holding a NaN or ∞ gets a NaN scale.

use super::QK;
use tessera_core::{Error, Result};

/// A `[rows, cols]` int8 matrix with per-row scales.
#[derive(Clone, Debug)]
pub struct Int8Matrix {
    rows: usize,
    cols: usize,
    q: Vec<i8>,
    scales: Vec<f32>,
}

impl Int8Matrix {
    /// Quantizes row-major f32 data. `cols` must be a positive multiple of 32 (the
    /// integer kernels' chunk).
    pub fn quantize(rows: usize, cols: usize, data: &[f32]) -> Result<Self> {
        if cols == 0 || !cols.is_multiple_of(QK) || rows.checked_mul(cols) != Some(data.len()) {
            return Err(Error::shape(
                "quantize",
                format!(
                    "{rows}×{cols} int8 matrix from {} values (columns a positive multiple of {QK})",
                    data.len()
                ),
            ));
        }
        let mut q = vec![0i8; data.len()];
        let mut scales = Vec::with_capacity(rows);
        for (src, dst) in data.chunks_exact(cols).zip(q.chunks_exact_mut(cols)) {
            let amax = src.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / 127.0;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            for (d, &v) in dst.iter_mut().zip(src) {
                *d = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
            }
            let finite = src.iter().all(|v| v.is_finite());
            scales.push(if finite { scale } else { f32::NAN });
        }
        Ok(Int8Matrix {
            rows,
            cols,
            q,
            scales,
        })
    }

    /// Output features (rows).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Input features (columns).
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Row r's codes (panics if r ≥ rows).
    pub fn row(&self, r: usize) -> &[i8] {
        &self.q[r * self.cols..(r + 1) * self.cols]
    }
    /// One scale per row.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
    /// Always `DType::I8`.
    pub fn dtype(&self) -> tessera_core::DType {
        tessera_core::DType::I8
    }
    /// Bytes of storage (codes and scales).
    pub fn size_bytes(&self) -> usize {
        self.q.len() + 4 * self.scales.len()
    }
    /// Row r's values q·scale into `out` (panics, like slice indexing, unless r < rows
    /// and `out.len() == cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "a row of {} values", self.cols);
        let s = self.scales[r];
        for (o, &q) in out.iter_mut().zip(self.row(r)) {
            *o = q as f32 * s;
        }
    }

    /// The row-major f32 values (q·scale, one rounding).
    pub fn dequantize(&self) -> Vec<f32> {
        self.q
            .chunks_exact(self.cols)
            .zip(&self.scales)
            .flat_map(|(r, &s)| r.iter().map(move |&q| q as f32 * s))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_channel_round_trip_and_errors() {
        let data: Vec<f32> = (0..3 * 64)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * (1 + i / 64) as f32)
            .collect();
        let m = Int8Matrix::quantize(3, 64, &data).expect("valid");
        for (r, (row, deq)) in data.chunks(64).zip(m.dequantize().chunks(64)).enumerate() {
            let s = m.scales()[r];
            assert_eq!(s, row.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0);
            for (a, b) in row.iter().zip(deq) {
                assert!(
                    (a - b).abs() <= 0.5 * s * (1.0 + 1e-6),
                    "row {r}: {a} → {b}"
                );
            }
        }
        assert!(Int8Matrix::quantize(1, 33, &[0.0; 33]).is_err());
        assert!(Int8Matrix::quantize(2, 32, &[0.0; 32]).is_err());
        let zeros = Int8Matrix::quantize(1, 32, &[0.0; 32]).expect("valid");
        assert!(zeros.dequantize().iter().all(|&v| v == 0.0));
        let mut bad = vec![1.0f32; 64];
        bad[40] = f32::NAN;
        let m = Int8Matrix::quantize(2, 32, &bad).expect("valid");
        assert!(m.scales()[0].is_finite() && m.scales()[1].is_nan());
    }
}
