//! FP8 weight matrices: one byte per weight in E4M3 or E5M2 ([`Fp8`]) and an f32 scale
//! per tensor or per output channel, `value = decode(code)·scale` — the layout FP8
//! checkpoints ship (`weight` + `weight_scale`) and FP8 GEMMs consume.
//!
//! The scale maps the largest |w| (of the row, or of the whole tensor) onto the format's
//! largest finite value, so nothing saturates. A scale is stored per row either way
//! (per-tensor scaling repeats one value): the kernels then treat both alike, and a row
//! whose source held a NaN or ∞ gets a NaN scale, so exactly that row's outputs become
//! NaN — as they would have with the f32 weights — while its neighbours stay intact.

use super::fp8::Fp8;
use tessera_core::{Error, Result};

/// How many scales an [`Fp8Matrix`] was quantized with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Scaling {
    /// One scale for the whole matrix.
    PerTensor,
    /// One scale per output channel (row).
    PerChannel,
}

/// A `[rows, cols]` FP8 matrix, row-major codes, one effective f32 scale per row.
#[derive(Clone, Debug)]
pub struct Fp8Matrix {
    format: Fp8,
    scaling: Fp8Scaling,
    rows: usize,
    cols: usize,
    codes: Vec<u8>,
    scales: Vec<f32>,
}

/// amax / max_finite, or 1 for an all-zero range (codes 0, no division by zero).
fn scale_for(format: Fp8, amax: f32) -> f32 {
    if amax > 0.0 {
        amax / format.max_finite()
    } else {
        1.0
    }
}

/// A positive `rows × cols` that is exactly `len` elements.
fn check_dims(op: &'static str, rows: usize, cols: usize, len: usize, what: &str) -> Result<()> {
    if rows == 0 || cols == 0 || rows.checked_mul(cols) != Some(len) {
        return Err(Error::shape(
            op,
            format!("{rows}×{cols} fp8 matrix from {len} {what}"),
        ));
    }
    Ok(())
}

fn amax(v: &[f32]) -> f32 {
    v.iter()
        .filter(|x| x.is_finite())
        .fold(0f32, |m, x| m.max(x.abs()))
}

impl Fp8Matrix {
    /// Quantizes row-major f32 data (round to nearest even after dividing by the scale).
    pub fn quantize(
        format: Fp8,
        scaling: Fp8Scaling,
        rows: usize,
        cols: usize,
        data: &[f32],
    ) -> Result<Self> {
        check_dims("quantize", rows, cols, data.len(), "values")?;
        let tensor_scale = scale_for(format, amax(data));
        let mut codes = Vec::with_capacity(data.len());
        let mut scales = Vec::with_capacity(rows);
        for row in data.chunks_exact(cols) {
            let s = match scaling {
                Fp8Scaling::PerTensor => tensor_scale,
                Fp8Scaling::PerChannel => scale_for(format, amax(row)),
            };
            codes.extend(row.iter().map(|&v| format.encode(v / s)));
            scales.push(if row.iter().all(|v| v.is_finite()) {
                s
            } else {
                f32::NAN
            });
        }
        Ok(Fp8Matrix {
            format,
            scaling,
            rows,
            cols,
            codes,
            scales,
        })
    }

    /// Wraps existing codes and scales (a checkpoint's `weight` and `weight_scale`):
    /// `scales` holds 1 value (per tensor) or `rows` values. A row holding a NaN or ∞
    /// code gets a NaN scale (see the module docs).
    pub fn from_parts(
        format: Fp8,
        rows: usize,
        cols: usize,
        codes: Vec<u8>,
        scales: &[f32],
    ) -> Result<Self> {
        let scaling = match scales.len() {
            1 => Fp8Scaling::PerTensor,
            n if n == rows => Fp8Scaling::PerChannel,
            n => {
                return Err(Error::shape(
                    "fp8 matrix",
                    format!("{n} scales for {rows} rows (want 1 or {rows})"),
                ))
            }
        };
        check_dims("fp8 matrix", rows, cols, codes.len(), "codes")?;
        let table = format.table();
        let scales = codes
            .chunks_exact(cols)
            .enumerate()
            .map(|(r, row)| {
                let s = scales[if scales.len() == 1 { 0 } else { r }];
                if row.iter().all(|&c| table[c as usize].is_finite()) {
                    s
                } else {
                    f32::NAN
                }
            })
            .collect();
        Ok(Fp8Matrix {
            format,
            scaling,
            rows,
            cols,
            codes,
            scales,
        })
    }

    /// The FP8 encoding.
    pub fn format(&self) -> Fp8 {
        self.format
    }
    /// How the scales are shared.
    pub fn scaling(&self) -> Fp8Scaling {
        self.scaling
    }
    /// The format as a dtype tag (`f8e4m3` / `f8e5m2`).
    pub fn dtype(&self) -> tessera_core::DType {
        self.format.dtype()
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
    pub fn row(&self, r: usize) -> &[u8] {
        &self.codes[r * self.cols..(r + 1) * self.cols]
    }
    /// The effective scale of every row.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
    /// Bytes of storage: the codes and the scales as quantized (1 or one per row).
    pub fn size_bytes(&self) -> usize {
        let scales = match self.scaling {
            Fp8Scaling::PerTensor => 1,
            Fp8Scaling::PerChannel => self.rows,
        };
        self.codes.len() + 4 * scales
    }
    /// Row r's values decode(code)·scale into `out` (panics, like slice indexing,
    /// unless r < rows and `out.len() == cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "a row of {} values", self.cols);
        // decode_finite, not a table: building one per row cost 256 decodes on the
        // prefill path. Rows holding NaN/∞ codes have a NaN scale, so they are NaN anyway.
        let (f, s) = (self.format, self.scales[r]);
        for (o, &c) in out.iter_mut().zip(self.row(r)) {
            *o = f.decode_finite(c) * s;
        }
    }
    /// The row-major f32 values.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.codes.len()];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, row);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * (1 + i / cols) as f32 * 0.01)
            .collect()
    }

    #[test]
    fn scales_bound_the_error_and_nothing_saturates() {
        let (rows, cols) = (4, 33);
        let w = data(rows, cols);
        for f in [Fp8::E4M3, Fp8::E5M2] {
            for scaling in [Fp8Scaling::PerTensor, Fp8Scaling::PerChannel] {
                let m = Fp8Matrix::quantize(f, scaling, rows, cols, &w).unwrap();
                // Relative half-ulp of the mantissa (3 or 2 bits) for normal values.
                let half_ulp = match f {
                    Fp8::E4M3 => 1.0 / 16.0,
                    Fp8::E5M2 => 1.0 / 8.0,
                };
                for (r, (src, deq)) in w.chunks(cols).zip(m.dequantize().chunks(cols)).enumerate() {
                    let s = m.scales()[r];
                    let amax = src.iter().fold(0f32, |a, v| a.max(v.abs()));
                    assert!(amax <= f.max_finite() * s * (1.0 + 1e-6), "{f:?} saturates");
                    for (a, b) in src.iter().zip(deq) {
                        let tiny = f.decode(1) * s; // the subnormal step
                        assert!((a - b).abs() <= half_ulp * a.abs() + tiny, "{a} → {b}");
                    }
                }
                let per_row = m.scales().windows(2).all(|p| p[0] == p[1]);
                assert_eq!(per_row, scaling == Fp8Scaling::PerTensor, "{scaling:?}");
            }
        }
    }

    #[test]
    fn degenerate_rows_shapes_and_nonfinite() {
        let zeros = Fp8Matrix::quantize(Fp8::E4M3, Fp8Scaling::PerChannel, 2, 3, &[0.0; 6]);
        assert!(zeros.unwrap().dequantize().iter().all(|&v| v == 0.0));
        for bad in [(0, 3, 0), (2, 3, 5), (usize::MAX, 2, 4)] {
            let v = vec![1.0; bad.2];
            assert!(
                Fp8Matrix::quantize(Fp8::E5M2, Fp8Scaling::PerTensor, bad.0, bad.1, &v).is_err()
            );
        }
        let mut w = data(3, 8);
        w[9] = f32::INFINITY;
        let m = Fp8Matrix::quantize(Fp8::E4M3, Fp8Scaling::PerTensor, 3, 8, &w).unwrap();
        assert!(m.scales()[0].is_finite() && m.scales()[1].is_nan() && m.scales()[2].is_finite());
        // The finite rows keep the tensor scale of the finite values.
        assert_eq!(m.scales()[0], m.scales()[2]);
    }

    #[test]
    fn from_parts_checks_and_marks_nan_rows() {
        let codes = vec![0x38u8, 0x40, 0x7F, 0x01];
        let m = Fp8Matrix::from_parts(Fp8::E4M3, 2, 2, codes.clone(), &[0.5]).unwrap();
        assert_eq!(m.dequantize()[..2], [0.5, 1.0]);
        assert!(m.scales()[1].is_nan());
        assert_eq!(m.scaling(), Fp8Scaling::PerTensor);
        assert!(Fp8Matrix::from_parts(Fp8::E4M3, 2, 2, codes.clone(), &[1.0; 3]).is_err());
        assert!(Fp8Matrix::from_parts(Fp8::E4M3, 3, 2, codes, &[1.0]).is_err());
    }
}
