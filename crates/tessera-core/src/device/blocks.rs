//! ggml blocks (an f16 scale, an f16 min for Q4_1, then the codes) split for a device:
//! each block's `(scale, min)` and its code bytes apart, so a kernel reads aligned
//! words instead of 18-, 20- or 34-byte records. Shared by every device backend; each
//! stores the halves in its own layout (wgpu as f32 pairs and u32 words, CUDA as f16
//! and bytes).

use crate::{DType, Error, Result};
use half::f16;

/// The block formats the device matmuls read (Q4_0, Q4_1, Q8_0), with a small code
/// the kernels switch on.
pub fn format_code(format: DType) -> Option<u32> {
    match format {
        DType::Q4_0 => Some(0),
        DType::Q4_1 => Some(1),
        DType::Q8_0 => Some(2),
        _ => None,
    }
}

/// Split weights: `scales[2·b..]` = (d, m) of block b (m = 0 but for Q4_1), `codes`
/// the blocks' code bytes in order (16 nibble bytes, or 32 int8 bytes, per block).
#[derive(Debug)]
pub struct Repacked {
    /// Two per block: scale and min.
    pub scales: Vec<f32>,
    /// Code bytes, blocks in order.
    pub codes: Vec<u8>,
}

/// Splits `rows × cols` weights stored as `format` blocks (`op` names the caller in
/// errors: wrong format, columns not whole blocks, a byte count that does not match).
pub fn repack(
    op: &'static str,
    format: DType,
    rows: usize,
    cols: usize,
    raw: &[u8],
) -> Result<Repacked> {
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
    let mut codes = Vec::with_capacity(blocks * code_bytes);
    let half_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    for b in raw.chunks_exact(size) {
        scales.push(half_at(b, 0));
        scales.push(if format == DType::Q4_1 {
            half_at(b, 2)
        } else {
            0.0
        });
        codes.extend_from_slice(&b[head..head + code_bytes]);
    }
    Ok(Repacked { scales, codes })
}

/// Per-channel INT8 weights as [`Device::upload_blocks`](super::Device::upload_blocks)
/// takes them (`format` I8): the `rows × cols` codes row-major, then each row's f32 scale
/// (little-endian). Returns the codes and the scales, or an error naming the mismatch.
pub fn split_int8<'a>(
    op: &'static str,
    rows: usize,
    cols: usize,
    raw: &'a [u8],
) -> Result<(&'a [u8], Vec<f32>)> {
    if cols == 0 || !cols.is_multiple_of(4) {
        return Err(Error::shape(
            op,
            format!("{cols} columns are not a positive multiple of 4"),
        ));
    }
    let codes = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::Overflow(format!("{rows}x{cols} weights")))?;
    if raw.len() != codes + 4 * rows {
        return Err(Error::shape(
            op,
            format!(
                "{} bytes for {rows}x{cols} INT8 codes and {rows} f32 scales",
                raw.len()
            ),
        ));
    }
    let (q, s) = raw.split_at(codes);
    let scales = s
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok((q, scales))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_upload_layout_splits_codes_and_scales() {
        let mut raw: Vec<u8> = (0..8).map(|i| (i as i8 - 4) as u8).collect();
        raw.extend(0.5f32.to_le_bytes());
        raw.extend((-2.0f32).to_le_bytes());
        let (q, s) = split_int8("t", 2, 4, &raw).unwrap();
        assert_eq!(q.len(), 8);
        assert_eq!(q[0] as i8, -4);
        assert_eq!(s, [0.5, -2.0]);
        let e = split_int8("t", 2, 4, &raw[..15]).unwrap_err().to_string();
        assert!(
            e.contains("15 bytes for 2x4 INT8 codes and 2 f32 scales"),
            "{e}"
        );
        let e = split_int8("t", 2, 6, &raw).unwrap_err().to_string();
        assert!(e.contains("not a positive multiple of 4"), "{e}");
    }
}
