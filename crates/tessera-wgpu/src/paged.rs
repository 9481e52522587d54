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
use crate::kernels::{folded, u32_of};
use tessera_core::device::checks::{self, PagedPlan};
use tessera_core::device::PagedCall;
use tessera_core::Result;

const PAGED: &str = include_str!("shaders/paged_attention.wgsl");

/// The widest head the shader's workgroup arrays hold.
pub const MAX_D: usize = 256;

pub(crate) fn paged_attention(dev: &WgpuDevice, call: &PagedCall<'_>) -> Result<()> {
    const OP: &str = "paged_attention";
    let c = &call.shape;
    let PagedPlan { total_q, meta } = checks::paged(call, MAX_D)?;
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
