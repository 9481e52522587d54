//! The launchers' argument checks as pure functions of shapes and buffer lengths, so
//! they are tested without a GPU: every size product is overflow-checked, every value
//! a kernel takes as `int` must fit one, and host-side index data (block tables,
//! context lengths) is validated before it could reach a kernel.

use crate::ops::{AttentionShape, GemmShape, PagedShape};
use crate::CudaError;

type Res = Result<(), CudaError>;

/// The product of `dims`, or an error when it overflows.
fn product(op: &'static str, what: &str, dims: &[usize]) -> Result<usize, CudaError> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| CudaError::shape(op, format!("{what}: {dims:?} overflows")))
}

/// A buffer of `have` elements must hold the product of `dims`.
pub(crate) fn need(op: &'static str, what: &str, have: usize, dims: &[usize]) -> Res {
    let want = product(op, what, dims)?;
    if have < want {
        return Err(CudaError::shape(
            op,
            format!("{what} holds {have} elements, needs {want}"),
        ));
    }
    Ok(())
}

/// `v` as a kernel's `int`, or an error for sizes the kernels' 32-bit indices cannot hold.
pub(crate) fn int(op: &'static str, what: &str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::shape(op, format!("{what} = {v} exceeds 2^31 − 1")))
}

fn positive(op: &'static str, dims: &[(&str, usize)]) -> Res {
    match dims.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => Err(CudaError::shape(op, format!("{name} must be positive"))),
        None => Ok(()),
    }
}

/// GEMM: positive dims, K a multiple of 8 (16-byte copies), buffers `a`, `b`, `c` long
/// enough, dims within `int`.
pub fn gemm(s: &GemmShape, a: usize, b: usize, c: usize) -> Res {
    const OP: &str = "cuda gemm";
    positive(OP, &[("M", s.m), ("N", s.n), ("K", s.k)])?;
    if !s.k.is_multiple_of(8) {
        return Err(CudaError::shape(
            OP,
            format!("K = {} is not a multiple of 8", s.k),
        ));
    }
    need(OP, "A", a, &[s.m, s.k])?;
    need(OP, "B", b, &[s.n, s.k])?;
    need(OP, "C", c, &[s.m, s.n])?;
    for (what, v) in [("M", s.m), ("N", s.n), ("K", s.k)] {
        int(OP, what, v)?;
    }
    Ok(())
}

/// Attention: head dim 64 or 128, heads a multiple of KV heads, buffer lengths.
pub fn attention(s: &AttentionShape, q: usize, k: usize, v: usize, o: usize) -> Res {
    const OP: &str = "cuda attention";
    positive(
        OP,
        &[
            ("batch", s.batch),
            ("sq", s.sq),
            ("sk", s.sk),
            ("heads", s.heads),
        ],
    )?;
    positive(OP, &[("kv heads", s.kv_heads)])?;
    if !(s.d == 64 || s.d == 128) {
        return Err(CudaError::shape(
            OP,
            format!("head dim {} (64 or 128)", s.d),
        ));
    }
    if !s.heads.is_multiple_of(s.kv_heads) {
        return Err(CudaError::shape(
            OP,
            format!("{} heads over {} KV heads", s.heads, s.kv_heads),
        ));
    }
    need(OP, "Q", q, &[s.batch, s.sq, s.heads, s.d])?;
    need(OP, "O", o, &[s.batch, s.sq, s.heads, s.d])?;
    need(OP, "K", k, &[s.batch, s.sk, s.kv_heads, s.d])?;
    need(OP, "V", v, &[s.batch, s.sk, s.kv_heads, s.d])?;
    for (what, x) in [
        ("sq", s.sq),
        ("sk", s.sk),
        ("heads", s.heads),
        ("batch", s.batch),
    ] {
        int(OP, what, x)?;
    }
    Ok(())
}

/// How a paged-attention call splits its work, once its inputs are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedPlan {
    /// Sequences in the call.
    pub seqs: usize,
    /// Width of a block-table row.
    pub max_blocks: usize,
    /// Tokens per split.
    pub chunk: usize,
    /// Splits per sequence (partial results combined afterwards).
    pub splits: usize,
}

/// Blocks the split heuristic aims for: about 2 per SM on an H100 (132 SMs).
const TARGET_BLOCKS: usize = 264;

/// Paged attention: shape, buffer lengths (`q`, `k_cache`, `v_cache`, `out`), every
/// context length within its table and every block id it reaches below `num_blocks`;
/// then the split plan (`s.chunk` tokens per split, or enough splits to fill the GPU).
pub fn paged(
    s: &PagedShape,
    tables: &[u32],
    lens: &[usize],
    (q, k_cache, v_cache, out): (usize, usize, usize, usize),
) -> Result<PagedPlan, CudaError> {
    const OP: &str = "cuda paged attention";
    let seqs = lens.len();
    positive(
        OP,
        &[
            ("sequences", seqs),
            ("heads", s.heads),
            ("kv heads", s.kv_heads),
        ],
    )?;
    positive(OP, &[("block size", s.block_size), ("d", s.d)])?;
    if !s.d.is_multiple_of(2) || s.d > 256 || !s.heads.is_multiple_of(s.kv_heads) {
        return Err(CudaError::shape(
            OP,
            format!(
                "d {} (even, ≤ 256), {} heads over {}",
                s.d, s.heads, s.kv_heads
            ),
        ));
    }
    if !tables.len().is_multiple_of(seqs) {
        return Err(CudaError::shape(
            OP,
            format!("{} table entries for {seqs} sequences", tables.len()),
        ));
    }
    let max_blocks = tables.len() / seqs;
    let cache = [s.num_blocks, s.block_size, s.kv_heads, s.d];
    need(OP, "K cache", k_cache, &cache)?;
    need(OP, "V cache", v_cache, &cache)?;
    need(OP, "q", q, &[seqs, s.heads, s.d])?;
    need(OP, "out", out, &[seqs, s.heads, s.d])?;
    for (i, &len) in lens.iter().enumerate() {
        let used = len.div_ceil(s.block_size);
        if len == 0 || used > max_blocks {
            return Err(CudaError::shape(
                OP,
                format!("sequence {i}: {len} tokens, {max_blocks} blocks in its table"),
            ));
        }
        int(OP, "context length", len)?;
        if let Some(b) = tables[i * max_blocks..][..used]
            .iter()
            .find(|&&b| b as usize >= s.num_blocks)
        {
            return Err(CudaError::shape(
                OP,
                format!("sequence {i}: block id {b} ≥ {} blocks", s.num_blocks),
            ));
        }
    }
    let max_len = lens.iter().copied().max().unwrap_or(1);
    let chunk = if s.chunk > 0 {
        s.chunk
    } else {
        let splits = TARGET_BLOCKS.div_ceil(seqs.saturating_mul(s.heads)).max(1);
        max_len.div_ceil(splits).max(64)
    };
    let splits = max_len.div_ceil(chunk);
    product(OP, "workspace", &[seqs, s.heads, splits, s.d])?;
    for (what, v) in [("heads", s.heads), ("d", s.d), ("block size", s.block_size)] {
        int(OP, what, v)?;
    }
    int(OP, "blocks per table", max_blocks)?;
    int(OP, "chunk", chunk)?;
    Ok(PagedPlan {
        seqs,
        max_blocks,
        chunk,
        splits,
    })
}

/// INT8 matvec: K a positive multiple of 4, buffer lengths (`scales` one per row).
pub fn qmatvec_i8((n, k): (usize, usize), w: usize, scales: usize, x: usize, y: usize) -> Res {
    const OP: &str = "cuda qmatvec_i8";
    positive(OP, &[("N", n), ("K", k)])?;
    if !k.is_multiple_of(4) {
        return Err(CudaError::shape(
            OP,
            format!("K = {k} is not a multiple of 4"),
        ));
    }
    need(OP, "W", w, &[n, k])?;
    need(OP, "scales", scales, &[n])?;
    need(OP, "x", x, &[k])?;
    need(OP, "y", y, &[n])?;
    int(OP, "N", n)?;
    int(OP, "K", k)?;
    Ok(())
}
