//! The checks every backend makes on a [`DeviceCall`](super::DeviceCall) before it
//! launches anything, and the launch plans they yield: written once here so the wgpu
//! and CUDA backends reject exactly the same bad calls with the same messages. What is
//! backend-specific (index width, the widest head a kernel holds) is a parameter.

use super::{DeviceBuffer, PagedCall, RowOp};
use crate::{Error, Result};

/// An error unless `buf` holds at least `len` elements.
pub fn need(op: &'static str, name: &str, buf: &DeviceBuffer, len: usize) -> Result<()> {
    if buf.len() < len {
        return Err(Error::shape(
            op,
            format!("{name} holds {} elements, the call needs {len}", buf.len()),
        ));
    }
    Ok(())
}

/// An error unless `dtype` is a 16-bit float an `upload_half` keeps (F16, BF16).
pub fn half_dtype(op: &'static str, dtype: crate::DType) -> Result<()> {
    if !matches!(dtype, crate::DType::F16 | crate::DType::BF16) {
        return Err(Error::DType {
            op,
            dtype: dtype.to_string(),
        });
    }
    Ok(())
}

/// A checked row-wise call: its element count and the parameters its kernel takes.
#[derive(Debug)]
pub struct RowsPlan<'a> {
    /// `rows · n`.
    pub len: usize,
    /// The second buffer the kernel reads: SwiGLU's up, RMSNorm's γ, RoPE's cos/sin
    /// table (the input itself for softmax, which reads one).
    pub second: &'a DeviceBuffer,
    /// RMSNorm's ε (0 otherwise).
    pub eps: f32,
    /// RoPE's heads per token (0 otherwise).
    pub heads: usize,
}

/// Checks a [`DeviceCall::Rows`](super::DeviceCall::Rows): input count, every buffer's
/// length, γ or the RoPE table present and long enough, RoPE rows whole tokens of even
/// width. `out` must hold `out_offset + rows·n`.
pub fn rows<'a>(
    op: RowOp,
    inputs: &[&'a DeviceBuffer],
    gamma: Option<&'a DeviceBuffer>,
    (out, out_offset): (&DeviceBuffer, usize),
    [rows, n]: [usize; 2],
) -> Result<RowsPlan<'a>> {
    let name = op.name();
    let len = rows
        .checked_mul(n)
        .ok_or_else(|| Error::Overflow(format!("{rows}x{n}")))?;
    if inputs.len() != op.inputs() {
        return Err(Error::invalid(
            name,
            format!("{} inputs, the op takes {}", inputs.len(), op.inputs()),
        ));
    }
    for x in inputs {
        need(name, "input", x, len)?;
    }
    let out_end = len
        .checked_add(out_offset)
        .ok_or_else(|| Error::Overflow(format!("{out_offset} + {len}")))?;
    need(name, "out", out, out_end)?;
    let (second, eps, heads) = match op {
        RowOp::RmsNorm { eps } => {
            let g = gamma.ok_or_else(|| Error::invalid(name, "γ missing"))?;
            need(name, "γ", g, n)?;
            (g, eps, 0)
        }
        RowOp::SwiGlu | RowOp::Add => (inputs[1], 0.0, 0),
        RowOp::Softmax => (inputs[0], 0.0, 0),
        RowOp::Rope { heads, .. } => {
            if heads == 0 || !rows.is_multiple_of(heads) || !n.is_multiple_of(2) {
                return Err(Error::shape(
                    name,
                    format!(
                        "{rows} rows of {n} are not whole tokens of {heads} heads of even width"
                    ),
                ));
            }
            let table = gamma.ok_or_else(|| Error::invalid(name, "cos/sin table missing"))?;
            // rows/heads tokens × n/2 cosines, then as many sines.
            need(name, "cos/sin table", table, rows / heads * n)?;
            (table, 0.0, heads)
        }
    };
    Ok(RowsPlan {
        len,
        second,
        eps,
        heads,
    })
}

/// An error naming the first token id that is not below `vocab`.
pub fn token_ids(op: &'static str, ids: &[u32], vocab: usize) -> Result<()> {
    if let Some((pos, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
        return Err(Error::invalid(
            op,
            format!("token id {id} at position {pos} ≥ vocabulary size {vocab}"),
        ));
    }
    Ok(())
}

/// A checked paged-attention call as one table the kernels read: for each query row
/// `(sequence, first visible position, end)`, then the block tables as given.
#[derive(Debug)]
pub struct PagedPlan {
    /// Query rows over all sequences.
    pub total_q: usize,
    /// `3 · total_q` row entries, then `block_tables`.
    pub meta: Vec<u32>,
}

/// Checks a [`PagedCall`]: lengths of the per-sequence slices, heads a multiple of KV
/// heads, head width in `1..=max_d`, K/V whole blocks, every sequence's context within
/// its table row and every block id it reaches in range, q and out long enough; every
/// index within u32.
pub fn paged(call: &PagedCall<'_>, max_d: usize) -> Result<PagedPlan> {
    const OP: &str = "paged_attention";
    let u32_of = |what: &str, v: usize| {
        u32::try_from(v).map_err(|_| Error::shape(OP, format!("{what} = {v} exceeds u32")))
    };
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
    if c.d == 0 || c.d > max_d || c.kv_heads == 0 || !c.heads.is_multiple_of(c.kv_heads) {
        return Err(Error::shape(
            OP,
            format!(
                "{} heads over {} KV heads of width {} (1..={max_d})",
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
    u32_of("cache elements", call.k.len())?;
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
        u32_of("context", len)?;
        for i in 0..q_len {
            // Causal row i of the run sees positions ..= len − q_len + i.
            let end = if c.causal { len - q_len + i + 1 } else { len };
            let start = c.window.map_or(0, |w| end.saturating_sub(w));
            meta.extend([s as u32, start as u32, end as u32]);
        }
    }
    meta.extend_from_slice(c.block_tables);
    let rows = total_q
        .checked_mul(c.heads * c.d)
        .ok_or_else(|| Error::Overflow("query elements".into()))?;
    need(OP, "q", call.q, rows)?;
    need(OP, "out", call.out, rows)?;
    u32_of("query elements", rows)?;
    Ok(PagedPlan { total_q, meta })
}
