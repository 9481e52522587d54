//! Attention over a paged KV cache, decode rows and prefill chunks alike (and dense
//! prefill, as one block): one workgroup per (query row, head), each row attending to
//! its visible range of positions (causal and windowed as the call asks).
//!
//! The workgroup walks the row's visible positions in tiles of 64: each invocation scores
//! one position (its K row found through the block table), the tile's maximum and sum
//! come from workgroup reductions, and the output row, held in workgroup memory with
//! each invocation owning every 64th element, is rescaled and accumulated online (the
//! flash-decoding recurrence), so any context length runs in fixed memory. Head widths
//! up to [`MAX_D`] fit that memory. A prefill chunk's rows each stream their own
//! positions: K/V tiles are not yet shared across the rows of a chunk, so a long chunk
//! reads its prefix once per row (correct, and parallel across rows and heads, but not
//! the flash-attention data reuse a tiled prefill kernel would have).
//!
//! The block tables and lengths change every step, so they travel with the launch (one
//! small storage buffer: each row's sequence and visible range, then the tables) rather
//! than living on the device; every id a sequence uses is checked before the launch.

use crate::context::{Buf, WgpuDevice};
use crate::kernels::{folded, need, u32_of};
use tessera_core::device::PagedCall;
use tessera_core::{Error, Result};

const PAGED: &str = include_str!("shaders/paged_attention.wgsl");

/// The widest head the shader's workgroup arrays hold.
pub const MAX_D: usize = 256;

pub(crate) fn paged_attention(dev: &WgpuDevice, call: &PagedCall<'_>) -> Result<()> {
    const OP: &str = "paged_attention";
    let c = &call.shape;
    let n = c.context_lens.len();
    if c.q_lens.len() != n {
        return Err(Error::shape(
            OP,
            format!("{n} context lengths but {} query runs", c.q_lens.len()),
        ));
    }
    let total_q = c
        .q_lens
        .iter()
        .try_fold(0usize, |a, &l| a.checked_add(l))
        .ok_or_else(|| Error::Overflow("query rows".into()))?;
    if c.d == 0 || c.d > MAX_D || c.kv_heads == 0 || !c.heads.is_multiple_of(c.kv_heads) {
        return Err(Error::shape(
            OP,
            format!(
                "{} heads over {} KV heads of width {} (1..={MAX_D})",
                c.heads, c.kv_heads, c.d
            ),
        ));
    }
    if c.block_size == 0 || c.block_tables.len() != n * c.max_blocks {
        return Err(Error::shape(
            OP,
            format!(
                "{n} sequences, {} table entries of width {}, block size {}",
                c.block_tables.len(),
                c.max_blocks,
                c.block_size
            ),
        ));
    }
    let record = c.block_size * c.kv_heads * c.d;
    let num_blocks = call.k.len() / record;
    if call.k.len() != num_blocks * record || call.v.len() != call.k.len() {
        return Err(Error::shape(
            OP,
            format!(
                "K/V hold {}/{} elements, not whole blocks of {record}",
                call.k.len(),
                call.v.len()
            ),
        ));
    }
    u32_of(OP, "cache elements", call.k.len())?;
    let mut meta = Vec::with_capacity(3 * total_q + c.block_tables.len());
    for (s, (&len, &q_len)) in c.context_lens.iter().zip(c.q_lens).enumerate() {
        let blocks = len.div_ceil(c.block_size);
        if q_len == 0 || q_len > len {
            return Err(Error::invalid(
                OP,
                format!("sequence {s}: {q_len} query rows over a context of {len}"),
            ));
        }
        if blocks > c.max_blocks {
            return Err(Error::invalid(
                OP,
                format!(
                    "sequence {s}: context {len} does not fit 1..={} positions",
                    c.max_blocks * c.block_size
                ),
            ));
        }
        let table = &c.block_tables[s * c.max_blocks..][..blocks];
        if let Some(b) = table.iter().find(|&&b| b as usize >= num_blocks) {
            return Err(Error::invalid(
                OP,
                format!("sequence {s}: block id {b} ≥ {num_blocks} blocks"),
            ));
        }
        u32_of(OP, "context", len)?;
        for i in 0..q_len {
            // Causal row i of the run sees positions ..= len − q_len + i.
            let end = if c.causal { len - q_len + i + 1 } else { len };
            let start = c.window.map_or(0, |w| end.saturating_sub(w));
            meta.extend([s as u32, start as u32, end as u32]);
        }
    }
    meta.extend_from_slice(c.block_tables);
    let rows = total_q * c.heads * c.d;
    need(OP, "q", call.q, rows)?;
    need(OP, "out", call.out, rows)?;
    u32_of(OP, "query elements", rows)?;
    if total_q == 0 || c.heads == 0 {
        return Ok(());
    }
    let bytes: Vec<u8> = meta.iter().flat_map(|w| w.to_le_bytes()).collect();
    let meta = dev.words(&bytes, "paged tables")?;
    let params = [
        u32_of(OP, "query rows", total_q)?,
        u32_of(OP, "heads", c.heads)?,
        u32_of(OP, "kv heads", c.kv_heads)?,
        c.d as u32,
        u32_of(OP, "block size", c.block_size)?,
        u32_of(OP, "max blocks", c.max_blocks)?,
        c.scale.to_bits(),
        0,
    ];
    let pipeline = dev.pipeline("paged_attention", PAGED)?;
    let bufs = [
        Some(&call.q.get::<Buf>()?.buffer),
        Some(&call.k.get::<Buf>()?.buffer),
        Some(&call.v.get::<Buf>()?.buffer),
        Some(&meta),
        Some(&call.out.get::<Buf>()?.buffer),
    ];
    dev.launch(&pipeline, &params, &bufs, folded(OP, total_q * c.heads)?)
}
