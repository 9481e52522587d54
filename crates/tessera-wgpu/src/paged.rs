//! Decode attention over a paged KV cache: one workgroup per (sequence, query head).
//!
//! The workgroup walks its sequence's positions in tiles of 64: each invocation scores
//! one position (its K row found through the block table), the tile's maximum and sum
//! come from workgroup reductions, and the output row, held in workgroup memory with
//! each invocation owning every 64th element, is rescaled and accumulated online (the
//! flash-decoding recurrence), so any context length runs in fixed memory. Head widths
//! up to [`MAX_D`] fit that memory.
//!
//! The block tables and lengths change every decode step, so they travel with the
//! launch (one small storage buffer: lengths, then tables) rather than living on the
//! device; every id a sequence uses is checked against the cache before the launch.

use crate::context::{Buf, WgpuDevice};
use crate::kernels::{folded, need, u32_of};
use tessera_core::device::PagedCall;
use tessera_core::{Error, Result};

const PAGED: &str = include_str!("shaders/paged_attention.wgsl");

/// The widest head the shader's workgroup arrays hold.
pub const MAX_D: usize = 256;

pub(crate) fn paged_attention(dev: &WgpuDevice, c: &PagedCall<'_>) -> Result<()> {
    const OP: &str = "paged_attention";
    let n = c.context_lens.len();
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
    let rows = n * c.heads * c.d;
    need(OP, "q", c.q, rows)?;
    need(OP, "out", c.out, rows)?;
    let record = c.block_size * c.kv_heads * c.d;
    let num_blocks = c.k.len() / record;
    if c.k.len() != num_blocks * record || c.v.len() != c.k.len() {
        return Err(Error::shape(
            OP,
            format!(
                "K/V hold {}/{} elements, not whole blocks of {record}",
                c.k.len(),
                c.v.len()
            ),
        ));
    }
    u32_of(OP, "cache elements", c.k.len())?;
    u32_of(OP, "query elements", rows)?;
    let mut meta = Vec::with_capacity(n + c.block_tables.len());
    for (s, &len) in c.context_lens.iter().enumerate() {
        let blocks = len.div_ceil(c.block_size);
        if len == 0 || blocks > c.max_blocks {
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
        meta.push(u32_of(OP, "context", len)?);
    }
    meta.extend_from_slice(c.block_tables);
    if n == 0 || c.heads == 0 {
        return Ok(());
    }
    let bytes: Vec<u8> = meta.iter().flat_map(|w| w.to_le_bytes()).collect();
    let meta = dev.words(&bytes, "paged tables")?;
    let params = [
        u32_of(OP, "sequences", n)?,
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
        Some(&c.q.get::<Buf>()?.buffer),
        Some(&c.k.get::<Buf>()?.buffer),
        Some(&c.v.get::<Buf>()?.buffer),
        Some(&meta),
        Some(&c.out.get::<Buf>()?.buffer),
    ];
    dev.launch(&pipeline, &params, &bufs, folded(OP, n * c.heads)?)
}
