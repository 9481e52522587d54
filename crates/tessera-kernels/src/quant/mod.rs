//! Quantized weight formats: ggml's 32-weight blocks ([`ggml`]), 256-weight K-quants
//! ([`kquants`]), AWQ/GPTQ-style 4-bit groups ([`group`]), and FP8 ([`fp8`]).
//!
//! A [`QuantMatrix`] is a `[rows, cols]` weight matrix stored row by row in a block
//! format, exactly as a GGUF tensor lays it out (each row `cols / BLOCK` blocks), so a
//! memory-mapped tensor can be viewed in place with [`blocks_from_bytes`] and the matmul
//! kernels (`ops::qmatmul`) read the blocks directly, dequantizing in registers.

pub mod error;
pub mod fp8;
mod fp8_matrix;
pub mod ggml;
pub mod group;
pub mod int8;
mod kquantize;
pub mod kquants;

pub use fp8_matrix::{Fp8Matrix, Fp8Scaling};
pub use ggml::{
    BlockFormat, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, FactoredScales,
    SplitScales, QK,
};
pub use group::{BlockInt4G128, BlockInt4G32, BlockInt4G64};
pub use int8::Int8Matrix;
pub use kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, KQuant, QK_K};

/// Runs `$body` with `$B` bound to the block type of a block-format [`DType`]
/// (`tessera_core::DType`), or evaluates `$other` for any other dtype: the one place
/// that maps a runtime tag to a compile-time format.
#[macro_export]
macro_rules! with_block_format {
    ($dtype:expr, $B:ident => $body:expr, _ => $other:expr) => {{
        use tessera_core::DType as D;
        use $crate::quant as q;
        match $dtype {
            D::Q4_0 => {
                type $B = q::BlockQ4_0;
                $body
            }
            D::Q4_1 => {
                type $B = q::BlockQ4_1;
                $body
            }
            D::Q5_0 => {
                type $B = q::BlockQ5_0;
                $body
            }
            D::Q5_1 => {
                type $B = q::BlockQ5_1;
                $body
            }
            D::Q8_0 => {
                type $B = q::BlockQ8_0;
                $body
            }
            D::Q2_K => {
                type $B = q::BlockQ2K;
                $body
            }
            D::Q3_K => {
                type $B = q::BlockQ3K;
                $body
            }
            D::Q4_K => {
                type $B = q::BlockQ4K;
                $body
            }
            D::Q5_K => {
                type $B = q::BlockQ5K;
                $body
            }
            D::Q6_K => {
                type $B = q::BlockQ6K;
                $body
            }
            D::Q8_K => {
                type $B = q::BlockQ8K;
                $body
            }
            D::Int4G32 => {
                type $B = q::BlockInt4G32;
                $body
            }
            D::Int4G64 => {
                type $B = q::BlockInt4G64;
                $body
            }
            D::Int4G128 => {
                type $B = q::BlockInt4G128;
                $body
            }
            _ => $other,
        }
    }};
}

/// Every block-format dtype, in [`DType::ALL`] order.
pub const BLOCK_DTYPES: [DType; 14] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::Q8_K,
    DType::Int4G32,
    DType::Int4G64,
    DType::Int4G128,
];

use tessera_core::{DType, Error, Result};

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

fn check_cols<B: BlockFormat>(cols: usize) -> Result<()> {
    if cols == 0 || !cols.is_multiple_of(B::BLOCK) {
        return Err(Error::shape(
            "quant",
            format!(
                "{cols} columns: {} needs a positive multiple of {}",
                B::DTYPE,
                B::BLOCK
            ),
        ));
    }
    Ok(())
}

/// A `[rows, cols]` matrix of blocks, row-major; `cols` is a multiple of the block size.
#[derive(Clone, Debug)]
pub struct QuantMatrix<B> {
    rows: usize,
    cols: usize,
    blocks: Vec<B>,
}

impl<B: BlockFormat> QuantMatrix<B> {
    /// Quantizes row-major f32 data. Errors on a length/shape mismatch, `cols` not a
    /// multiple of the block size, or a block whose scale overflows f16 (|weights| ≳ 5e5) — which
    /// would silently turn finite weights into ∞/NaN.
    pub fn quantize(rows: usize, cols: usize, data: &[f32]) -> Result<Self> {
        check_cols::<B>(cols)?;
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(Error::shape(
                "quantize",
                format!("{rows}×{cols} matrix from {} values", data.len()),
            ));
        }
        let bs = B::BLOCK;
        let mut blocks = Vec::with_capacity(data.len() / bs);
        for (i, x) in data.chunks_exact(bs).enumerate() {
            let b = B::quantize(x);
            if x.iter().all(|v| v.is_finite()) && !b.scale_is_finite() {
                return Err(Error::invalid(
                    "quantize",
                    format!(
                        "block {i} (row {}, columns {}..{}): scale overflows f16 in {}",
                        i * bs / cols,
                        i * bs % cols,
                        i * bs % cols + bs,
                        B::DTYPE
                    ),
                ));
            }
            blocks.push(b);
        }
        Ok(QuantMatrix { rows, cols, blocks })
    }

    /// Wraps existing blocks (from a file); their count must be `rows · cols / BLOCK`.
    pub fn from_blocks(rows: usize, cols: usize, blocks: Vec<B>) -> Result<Self> {
        check_cols::<B>(cols)?;
        if rows.checked_mul(cols / B::BLOCK) != Some(blocks.len()) {
            return Err(Error::shape(
                "quant",
                format!(
                    "{rows}×{cols} {} matrix needs {rows}·{} blocks, got {}",
                    B::DTYPE,
                    cols / B::BLOCK,
                    blocks.len()
                ),
            ));
        }
        Ok(QuantMatrix { rows, cols, blocks })
    }

    /// Output features (rows).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Input features (columns).
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The block format's dtype.
    pub fn dtype(&self) -> DType {
        B::DTYPE
    }
    /// The blocks, row-major.
    pub fn blocks(&self) -> &[B] {
        &self.blocks
    }
    /// The blocks of row `r` (panics if r ≥ rows, like slice indexing).
    pub fn row(&self, r: usize) -> &[B] {
        let per = self.cols / B::BLOCK;
        &self.blocks[r * per..(r + 1) * per]
    }
    /// Bytes of block storage.
    pub fn size_bytes(&self) -> usize {
        std::mem::size_of_val(self.blocks.as_slice())
    }
    /// The blocks as their GGUF bytes (what a device backend uploads).
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: every BlockFormat is a `repr(C)` record of u8/f16 fields without
        // padding (the layout blocks_from_bytes reads GGUF data through); any byte
        // pattern of it is a valid u8, and the length is the blocks' exact size.
        unsafe { std::slice::from_raw_parts(self.blocks.as_ptr() as *const u8, self.size_bytes()) }
    }

    /// Row r's values into `out` (panics, like slice indexing, unless r < rows and
    /// `out.len() == cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "a row of {} values", self.cols);
        for (b, o) in self.row(r).iter().zip(out.chunks_exact_mut(B::BLOCK)) {
            b.dequantize(o);
        }
    }

    /// The row-major f32 values the blocks define.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (b, o) in self.blocks.iter().zip(out.chunks_exact_mut(B::BLOCK)) {
            b.dequantize(o);
        }
        out
    }
}

#[cfg(test)]
mod tests;
