//! Quantized weight formats: ggml blocks ([`ggml`]) and FP8 ([`fp8`]).
//!
//! A [`QuantMatrix`] is a `[rows, cols]` weight matrix stored row by row in a block
//! format, exactly as a GGUF tensor lays it out (each row `cols / 32` blocks), so a
//! memory-mapped tensor can be viewed in place with [`blocks_from_bytes`] and the matmul
//! kernels (`ops::qmatmul`) read the blocks directly, dequantizing in registers.

pub mod error;
pub mod fp8;
pub mod ggml;

pub use ggml::{BlockFormat, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, QK};

use tessera_core::{Error, Result};

/// Views raw little-endian bytes (e.g. a memory-mapped GGUF tensor) as blocks, in place.
/// Errors when the length is not a whole number of blocks or the bytes are misaligned
/// for the blocks' f16 fields (GGUF aligns tensor data to 32 bytes; every block size here
/// is even, so well-formed files always pass).
pub fn blocks_from_bytes<B: BlockFormat>(bytes: &[u8]) -> Result<&[B]> {
    let size = std::mem::size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return Err(Error::invalid(
            "quant",
            format!(
                "{} bytes is not a whole number of {} blocks ({size} bytes each)",
                bytes.len(),
                B::DTYPE
            ),
        ));
    }
    if bytes.as_ptr().align_offset(std::mem::align_of::<B>()) != 0 {
        return Err(Error::invalid(
            "quant",
            format!(
                "{} block data is not {}-byte aligned",
                B::DTYPE,
                std::mem::align_of::<B>()
            ),
        ));
    }
    // SAFETY: B is a repr(C) struct of f16/u8/i8 fields with no padding (size asserted
    // equal to the GGUF block size) for which every bit pattern is valid; the pointer is
    // aligned for B and the length is an exact multiple of its size.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const B, bytes.len() / size) })
}

fn check_cols(cols: usize) -> Result<()> {
    if cols == 0 || !cols.is_multiple_of(QK) {
        return Err(Error::shape(
            "quant",
            format!("{cols} columns: must be a positive multiple of {QK}"),
        ));
    }
    Ok(())
}

/// A `[rows, cols]` matrix of blocks, row-major; `cols` is a multiple of [`QK`].
#[derive(Clone, Debug)]
pub struct QuantMatrix<B> {
    rows: usize,
    cols: usize,
    blocks: Vec<B>,
}

impl<B: BlockFormat> QuantMatrix<B> {
    /// Quantizes row-major f32 data. Errors on a length/shape mismatch, `cols` not a
    /// multiple of 32, or a block whose scale overflows f16 (|weights| ≳ 5e5) — which
    /// would silently turn finite weights into ∞/NaN.
    pub fn quantize(rows: usize, cols: usize, data: &[f32]) -> Result<Self> {
        check_cols(cols)?;
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(Error::shape(
                "quantize",
                format!("{rows}×{cols} matrix from {} values", data.len()),
            ));
        }
        let mut blocks = Vec::with_capacity(data.len() / QK);
        for (i, chunk) in data.chunks_exact(QK).enumerate() {
            let x: &[f32; QK] = chunk.try_into().expect("chunks_exact(QK)");
            let b = B::quantize(x);
            if x.iter().all(|v| v.is_finite()) && !b.scale_is_finite() {
                return Err(Error::invalid(
                    "quantize",
                    format!(
                        "block {i} (row {}, columns {}..{}): scale overflows f16 in {}",
                        i * QK / cols,
                        i * QK % cols,
                        i * QK % cols + QK,
                        B::DTYPE
                    ),
                ));
            }
            blocks.push(b);
        }
        Ok(QuantMatrix { rows, cols, blocks })
    }

    /// Wraps existing blocks (from a file); their count must be `rows · cols / 32`.
    pub fn from_blocks(rows: usize, cols: usize, blocks: Vec<B>) -> Result<Self> {
        check_cols(cols)?;
        if rows.checked_mul(cols / QK) != Some(blocks.len()) {
            return Err(Error::shape(
                "quant",
                format!(
                    "{rows}×{cols} {} matrix needs {rows}·{} blocks, got {}",
                    B::DTYPE,
                    cols / QK,
                    blocks.len()
                ),
            ));
        }
        Ok(QuantMatrix { rows, cols, blocks })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn blocks(&self) -> &[B] {
        &self.blocks
    }
    /// The blocks of row `r` (panics if r ≥ rows, like slice indexing).
    pub fn row(&self, r: usize) -> &[B] {
        let per = self.cols / QK;
        &self.blocks[r * per..(r + 1) * per]
    }
    /// Bytes of block storage.
    pub fn size_bytes(&self) -> usize {
        std::mem::size_of_val(self.blocks.as_slice())
    }

    /// The row-major f32 values the blocks define.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (b, o) in self.blocks.iter().zip(out.chunks_exact_mut(QK)) {
            b.dequantize(o.try_into().expect("chunks_exact_mut(QK)"));
        }
        out
    }
}

#[cfg(test)]
mod tests;
