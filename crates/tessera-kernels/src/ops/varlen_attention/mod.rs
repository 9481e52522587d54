//! Varlen attention over a paged KV cache: one call for a whole continuous-batching step.
//!
//! A step mixes sequences in two states: decoding ones contribute one query row each,
//! prefilling ones a chunk of rows (the next part of their prompt). Every sequence's new
//! keys and values are already in the cache, so sequence `s`'s `q_lens[s]` queries sit at
//! its last positions `context_lens[s] − q_lens[s] ..` and attend causally to everything
//! cached before them plus themselves.
//!
//! The two states have different bottlenecks, so the call splits them, as vLLM's
//! attention backends do: the decode rows of all sequences go to one
//! [`paged_attention`] call (bandwidth-bound, reads each block in place, GQA heads share
//! every K/V read, long contexts split across threads); each prefill chunk gathers its
//! sequence's keys and values into one contiguous run and goes to the flash kernel
//! ([`attention_with`], compute-bound, causal mask bottom-right aligned so a chunk that
//! extends a cached prefix works unchanged). The gather costs `2·context·kv_dim`
//! element copies against the chunk's `4·q_len·context·heads·d` FLOPs, a small share
//! whenever the chunk has more than a few rows.

mod spec;

pub use spec::{VarlenAttentionOp, VarlenProblem, TOL_F32, TOL_HALF};

use crate::ops::attention::{attention_with, AttentionParams};
use crate::ops::paged_attention::{paged_attention, PagedKvCache, PagedParams, PagedSeqs};
use tessera_core::{Element, Error, Isa, Layout, Result, TensorView, TensorViewMut};

/// The sequences of one call.
#[derive(Clone, Copy, Debug)]
pub struct VarlenSeqs<'a> {
    /// Row `s` is `block_tables[s·max_blocks..][..max_blocks]`.
    pub block_tables: &'a [u32],
    /// Width of a block-table row.
    pub max_blocks: usize,
    /// Each sequence's cached length, this call's keys included.
    pub context_lens: &'a [usize],
    /// Query rows of each sequence, in order (1 for a decode, a chunk for a prefill).
    pub q_lens: &'a [usize],
}

/// Knobs of one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VarlenParams {
    /// Multiplies q·k before the softmax (usually 1/√d).
    pub scale: f32,
    /// Threads the call may use.
    pub threads: usize,
}

fn check(q: &TensorView<'_, f32>, s: &VarlenSeqs<'_>, o: &TensorViewMut<'_, f32>) -> Result<()> {
    const OP: &str = "varlen_attention";
    if q.rank() != 3 || o.dims() != q.dims() {
        return Err(Error::shape(
            OP,
            format!(
                "Q {:?} and O {:?} must both be [total_q, heads, d]",
                q.dims(),
                o.dims()
            ),
        ));
    }
    let n = s.q_lens.len();
    if s.context_lens.len() != n || s.block_tables.len() != n * s.max_blocks {
        return Err(Error::shape(
            OP,
            format!(
                "{n} query runs but {} context lengths and {} block-table entries",
                s.context_lens.len(),
                s.block_tables.len()
            ),
        ));
    }
    let total = s.q_lens.iter().try_fold(0usize, |a, &l| a.checked_add(l));
    if total != Some(q.dims()[0]) {
        return Err(Error::shape(
            OP,
            format!("query runs {:?} vs {} query rows", s.q_lens, q.dims()[0]),
        ));
    }
    for (i, (&ql, &len)) in s.q_lens.iter().zip(s.context_lens).enumerate() {
        if ql == 0 || ql > len {
            return Err(Error::invalid(
                OP,
                format!("sequence {i}: {ql} queries over a context of {len}"),
            ));
        }
    }
    // Block ranges, ids, the cache buffers and head counts: the paged kernel's checks.
    Ok(())
}

/// `O = softmax(scale·Q·Kᵀ + causal)·V` for every sequence's query run over its cached
/// keys and values ([module docs](self)). Q and O are `[total_q, heads, d]`, any strides.
pub fn varlen_attention<T: Element>(
    isa: Isa,
    q: &TensorView<'_, f32>,
    cache: &PagedKvCache<'_, T>,
    seqs: &VarlenSeqs<'_>,
    o: &mut TensorViewMut<'_, f32>,
    p: VarlenParams,
) -> Result<()> {
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    check(q, seqs, o)?;
    let d = q.dims()[2];
    let starts: Vec<usize> = seqs
        .q_lens
        .iter()
        .scan(0, |at, &l| {
            *at += l;
            Some(*at - l)
        })
        .collect();
    let table = |s: usize| &seqs.block_tables[s * seqs.max_blocks..][..seqs.max_blocks];
    let decodes: Vec<usize> = (0..seqs.q_lens.len())
        .filter(|&s| seqs.q_lens[s] == 1)
        .collect();
    if !decodes.is_empty() {
        decode_rows(isa, q, cache, seqs, o, p, (&decodes, &starts))?;
    }
    let (mut kc, mut vc) = (Vec::new(), Vec::new());
    let row_len = cache.kv_heads * d;
    for s in (0..seqs.q_lens.len()).filter(|&s| seqs.q_lens[s] > 1) {
        let (len, rows) = (seqs.context_lens[s], seqs.q_lens[s]);
        gather(cache, table(s), len, (&mut kc, &mut vc))?;
        let dims = [len, cache.kv_heads, d];
        let qs = rows_of(q.layout(), starts[s], rows)?;
        let os = rows_of(o.layout(), starts[s], rows)?;
        attention_with(
            isa,
            p.threads,
            &TensorView::new(q.data(), qs)?,
            &TensorView::contiguous(&kc[..len * row_len], &dims)?,
            &TensorView::contiguous(&vc[..len * row_len], &dims)?,
            &mut TensorViewMut::new(o.data_mut(), os)?,
            AttentionParams {
                causal: true,
                scale: p.scale,
                window: None,
            },
        )?;
    }
    Ok(())
}

/// The decode rows through one paged call: compacted when other rows sit between them.
fn decode_rows<T: Element>(
    isa: Isa,
    q: &TensorView<'_, f32>,
    cache: &PagedKvCache<'_, T>,
    seqs: &VarlenSeqs<'_>,
    o: &mut TensorViewMut<'_, f32>,
    p: VarlenParams,
    (decodes, starts): (&[usize], &[usize]),
) -> Result<()> {
    let (heads, d) = (q.dims()[1], q.dims()[2]);
    let params = PagedParams {
        scale: p.scale,
        chunk: 0,
        threads: p.threads,
    };
    if decodes.len() == seqs.q_lens.len() {
        let all = PagedSeqs {
            block_tables: seqs.block_tables,
            max_blocks: seqs.max_blocks,
            context_lens: seqs.context_lens,
        };
        return paged_attention(isa, q, cache, &all, o, params);
    }
    let mb = seqs.max_blocks;
    let mut qd = vec![0f32; decodes.len() * heads * d];
    let mut tables = Vec::with_capacity(decodes.len() * mb);
    let mut lens = Vec::with_capacity(decodes.len());
    for (i, &s) in decodes.iter().enumerate() {
        for h in 0..heads {
            for x in 0..d {
                qd[(i * heads + h) * d + x] = q.data()[q.layout().index_of(&[starts[s], h, x])];
            }
        }
        tables.extend_from_slice(&seqs.block_tables[s * mb..][..mb]);
        lens.push(seqs.context_lens[s]);
    }
    let dims = [decodes.len(), heads, d];
    let mut od = vec![0f32; qd.len()];
    let sub = PagedSeqs {
        block_tables: &tables,
        max_blocks: mb,
        context_lens: &lens,
    };
    paged_attention(
        isa,
        &TensorView::contiguous(&qd, &dims)?,
        cache,
        &sub,
        &mut TensorViewMut::contiguous(&mut od, &dims)?,
        params,
    )?;
    let ol = *o.layout();
    let out = o.data_mut();
    for (i, &s) in decodes.iter().enumerate() {
        for h in 0..heads {
            for x in 0..d {
                out[ol.index_of(&[starts[s], h, x])] = od[(i * heads + h) * d + x];
            }
        }
    }
    Ok(())
}

/// Rows `start..start+rows` of a `[total, heads, d]` layout.
fn rows_of(l: &Layout, start: usize, rows: usize) -> Result<Layout> {
    let dims = [rows, l.dim(1), l.dim(2)];
    Layout::strided(&dims, l.strides(), l.offset() + start * l.stride(0))
}

/// Copies positions `0..len` of one sequence into contiguous f32 `[len, kv_heads, d]`
/// buffers, checking its block ids against the pool.
fn gather<T: Element>(
    c: &PagedKvCache<'_, T>,
    table: &[u32],
    len: usize,
    (k, v): (&mut Vec<f32>, &mut Vec<f32>),
) -> Result<()> {
    let row = c.kv_heads * c.d;
    let blocks = len.div_ceil(c.block_size.max(1));
    let need = c.num_blocks * c.block_size * row;
    let scales = if c.is_scaled() { need / c.d.max(1) } else { 0 };
    if c.block_size == 0
        || c.d == 0
        || blocks > table.len()
        || c.k.len() != need
        || c.v.len() != need
        || c.k_scales.len() != scales
        || c.v_scales.len() != scales
    {
        return Err(Error::shape(
            "varlen_attention",
            format!(
                "context {len} over {} table entries of a {}×{}×{row} cache ({}/{} elements, \
                 {}/{} scales)",
                table.len(),
                c.num_blocks,
                c.block_size,
                c.k.len(),
                c.v.len(),
                c.k_scales.len(),
                c.v_scales.len()
            ),
        ));
    }
    k.resize(len * row, 0.0);
    v.resize(len * row, 0.0);
    for (bi, &b) in table[..blocks].iter().enumerate() {
        if b as usize >= c.num_blocks {
            return Err(Error::invalid(
                "varlen_attention",
                format!("block id {b} ≥ {} blocks", c.num_blocks),
            ));
        }
        let t0 = bi * c.block_size;
        let n = c.block_size.min(len - t0) * row;
        let src_at = b as usize * c.block_size * row;
        // Each d-wide row widens times its pool row's scale (an i8 cache; a float
        // cache has none and copies as it is).
        let widen = |dst: &mut [f32], src: &[T], scales: &[f32]| {
            let rows = dst.chunks_exact_mut(c.d).zip(src.chunks_exact(c.d));
            for (r, (dr, sr)) in rows.enumerate() {
                let sc = scales.get(src_at / c.d + r).copied().unwrap_or(1.0);
                dr.iter_mut()
                    .zip(sr)
                    .for_each(|(d, s)| *d = s.to_f32() * sc);
            }
        };
        widen(&mut k[t0 * row..][..n], &c.k[src_at..][..n], c.k_scales);
        widen(&mut v[t0 * row..][..n], &c.v[src_at..][..n], c.v_scales);
    }
    Ok(())
}
