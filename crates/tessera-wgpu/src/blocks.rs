//! ggml blocks (an f16 scale, an f16 min for Q4_1, then the codes) repacked for the
//! device: one `(scale, min)` f32 pair per block and the codes as little-endian u32
//! words, so the shader reads aligned words instead of 18-, 20- or 34-byte records.

use half::f16;
use tessera_core::{DType, Error, Result};

/// The formats the WGSL matmul reads, with their shader code.
pub(crate) fn format_code(format: DType) -> Option<u32> {
    match format {
        DType::Q4_0 => Some(0),
        DType::Q4_1 => Some(1),
        DType::Q8_0 => Some(2),
        _ => None,
    }
}

/// Repacked weights: `scales[2·b..]` = (d, m) of block b, `codes` its words.
pub(crate) struct Repacked {
    pub scales: Vec<f32>,
    pub codes: Vec<u32>,
}

/// Repacks `rows × cols` weights stored as `format` blocks.
pub(crate) fn repack(format: DType, rows: usize, cols: usize, raw: &[u8]) -> Result<Repacked> {
    let op = "wgpu upload_blocks";
    format_code(format).ok_or_else(|| Error::DType {
        op,
        dtype: format.to_string(),
    })?;
    if cols == 0 || !cols.is_multiple_of(32) {
        return Err(Error::shape(
            op,
            format!("{cols} columns are not whole 32-weight blocks"),
        ));
    }
    let blocks = rows
        .checked_mul(cols / 32)
        .ok_or_else(|| Error::Overflow(format!("{rows}x{cols} weights")))?;
    let size = format.size_bytes();
    if raw.len() != blocks * size {
        return Err(Error::shape(
            op,
            format!("{} bytes for {blocks} {format} blocks of {size}", raw.len()),
        ));
    }
    let (head, code_bytes) = match format {
        DType::Q4_1 => (4, 16),
        DType::Q4_0 => (2, 16),
        _ => (2, 32),
    };
    let mut scales = Vec::with_capacity(2 * blocks);
    let mut codes = Vec::with_capacity(blocks * code_bytes / 4);
    let half_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    for b in raw.chunks_exact(size) {
        scales.push(half_at(b, 0));
        scales.push(if format == DType::Q4_1 {
            half_at(b, 2)
        } else {
            0.0
        });
        codes.extend(
            b[head..head + code_bytes]
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])),
        );
    }
    Ok(Repacked { scales, codes })
}
