//! Decode attention over a paged KV cache.
//!
//! The cache holds keys and values in fixed-size blocks, `[num_blocks, block_size,
//! kv_heads, d]`; each sequence owns a list of block ids (its block table), so sequences
//! of any length share one pool without copying. One call serves many sequences of
//! different lengths, one query token each, GQA included.
//!
//! Decode is bandwidth-bound: every cached key and value is read once. Each task takes one
//! (sequence, KV head, chunk of tokens) so all query heads of a GQA group share each K/V
//! row read, and long contexts split across threads ("flash-decoding"); partial results
//! (max, sum, weighted values) merge exactly with the log-sum-exp rule.

mod spec;

pub use spec::{PagedAttentionOp, PagedProblem, TOL_BF16, TOL_F32};

use crate::multiversion;
use crate::pool::{self, SharedMut};
use crate::simd::{dot, exp};
use tessera_core::{Element, Error, Isa, Result, TensorView, TensorViewMut};

/// The paged cache (K and V share one layout).
#[derive(Clone, Copy, Debug)]
pub struct PagedKvCache<'a, T> {
    pub k: &'a [T],
    pub v: &'a [T],
    pub num_blocks: usize,
    pub block_size: usize,
    pub kv_heads: usize,
    pub d: usize,
}

/// Sequences in one call: block table row `s` is `block_tables[s·max_blocks..][..max_blocks]`.
#[derive(Clone, Copy, Debug)]
pub struct PagedSeqs<'a> {
    pub block_tables: &'a [u32],
    pub max_blocks: usize,
    pub context_lens: &'a [usize],
}

/// Knobs of one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PagedParams {
    pub scale: f32,
    /// Tokens per task (split-K granularity).
    pub chunk: usize,
    pub threads: usize,
}

/// Default tokens per task: 256 tokens × 64 dims × 2 (K, V) × 4 B = 128 KiB streamed per
/// task, large against the ~1 µs merge and dispatch, small enough to split a 512-token
/// context over 2 threads.
pub const DEFAULT_CHUNK: usize = 256;

fn check<T: Element>(
    q: &TensorView<'_, f32>,
    c: &PagedKvCache<'_, T>,
    s: &PagedSeqs<'_>,
    o: &TensorViewMut<'_, f32>,
) -> Result<()> {
    const OP: &str = "paged_attention";
    if q.rank() != 3 || o.dims() != q.dims() {
        return Err(Error::shape(
            OP,
            format!(
                "Q {:?} and O {:?} must both be [n_seqs, heads, d]",
                q.dims(),
                o.dims()
            ),
        ));
    }
    let (n, heads, d) = (q.dims()[0], q.dims()[1], q.dims()[2]);
    let need = c
        .num_blocks
        .checked_mul(c.block_size)
        .and_then(|x| x.checked_mul(c.kv_heads))
        .and_then(|x| x.checked_mul(c.d));
    if need.is_none_or(|need| c.k.len() != need || c.v.len() != need) {
        return Err(Error::shape(
            OP,
            format!(
                "cache buffers {}/{} elements for {}×{}×{}×{}",
                c.k.len(),
                c.v.len(),
                c.num_blocks,
                c.block_size,
                c.kv_heads,
                c.d
            ),
        ));
    }
    if c.d != d || c.kv_heads == 0 || !heads.is_multiple_of(c.kv_heads) || c.block_size == 0 {
        return Err(Error::shape(
            OP,
            format!(
                "{heads} heads of d {d} vs cache {} KV heads of d {} (block size {})",
                c.kv_heads, c.d, c.block_size
            ),
        ));
    }
    if s.context_lens.len() != n || s.block_tables.len() != n * s.max_blocks {
        return Err(Error::shape(
            OP,
            format!(
                "{n} sequences but {} context lengths and {} block-table entries",
                s.context_lens.len(),
                s.block_tables.len()
            ),
        ));
    }
    for (i, &len) in s.context_lens.iter().enumerate() {
        let blocks = len.div_ceil(c.block_size);
        if len == 0 || blocks > s.max_blocks {
            return Err(Error::invalid(
                OP,
                format!(
                    "sequence {i}: context {len} does not fit 1..={} tokens",
                    s.max_blocks * c.block_size
                ),
            ));
        }
        if let Some(&b) = s.block_tables[i * s.max_blocks..][..blocks]
            .iter()
            .find(|&&b| b as usize >= c.num_blocks)
        {
            return Err(Error::invalid(
                OP,
                format!("sequence {i}: block id {b} ≥ {} blocks", c.num_blocks),
            ));
        }
    }
    Ok(())
}

/// What one task reads.
#[derive(Debug)]
struct ChunkJob<'a, T> {
    cache: &'a PagedKvCache<'a, T>,
    table: &'a [u32],
    kvh: usize,
    /// The group's scaled queries, `group·d`.
    q: &'a [f32],
    t0: usize,
    t1: usize,
}

multiversion! {
    /// Scores, softmax pieces and weighted values of tokens t0..t1 for every head of a
    /// group; `o` gets `group·d` un-normalised outputs, `ml` gets (max, sum) per head.
    fn chunk_body<T: Element>(job: &ChunkJob<'_, T>, scores: &mut [f32], o: &mut [f32], ml: &mut [(f32, f32)]) {
        let c = job.cache;
        let (d, g) = (c.d, ml.len());
        let n = job.t1 - job.t0;
        let row = |t: usize| {
            let b = job.table[t / c.block_size] as usize;
            ((b * c.block_size + t % c.block_size) * c.kv_heads + job.kvh) * d
        };
        match d {
            64 => key_scores::<T, 64>(job, scores, g),
            128 => key_scores::<T, 128>(job, scores, g),
            _ => {
                for (i, t) in (job.t0..job.t1).enumerate() {
                    let k = &c.k[row(t)..row(t) + d];
                    for h in 0..g {
                        scores[h * n + i] = dot(&job.q[h * d..(h + 1) * d], k);
                    }
                }
            }
        }
        for h in 0..g {
            let s = &mut scores[h * n..(h + 1) * n];
            let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let nan = s.iter().any(|x| x.is_nan());
            let l = crate::simd::exp_shifted_sum(s, m);
            ml[h] = (m, if nan { f32::NAN } else { l });
        }
        match (d, g) {
            (64, 1..=4) => weighted_values::<T, 64>(job, scores, o, g),
            (128, 1..=2) => weighted_values::<T, 128>(job, scores, o, g),
            _ => {
                o.fill(0.0);
                for (i, t) in (job.t0..job.t1).enumerate() {
                    let v = &c.v[row(t)..row(t) + d];
                    for h in 0..g {
                        let p = scores[h * n + i];
                        for (x, &vv) in o[h * d..(h + 1) * d].iter_mut().zip(v) {
                            *x += p * vv.to_f32();
                        }
                    }
                }
            }
        }
    }
}

/// `scores[h][t] = q_h · k_t` for a compile-time head dim: each key row is loaded once as
/// D/16 vectors and dotted with every head of the group into 16-lane accumulators.
#[inline(always)]
fn key_scores<T: Element, const D: usize>(job: &ChunkJob<'_, T>, scores: &mut [f32], g: usize) {
    let c = job.cache;
    let n = job.t1 - job.t0;
    for (i, t) in (job.t0..job.t1).enumerate() {
        let b = job.table[t / c.block_size] as usize;
        let off = ((b * c.block_size + t % c.block_size) * c.kv_heads + job.kvh) * D;
        let k: &[T; D] = c.k[off..off + D].try_into().expect("D-wide rows");
        for h in 0..g {
            let q: &[f32; D] = job.q[h * D..(h + 1) * D].try_into().expect("D-wide rows");
            let mut lanes = [0f32; 16];
            for blk in 0..D / 16 {
                for l in 0..16 {
                    lanes[l] += q[blk * 16 + l] * k[blk * 16 + l].to_f32();
                }
            }
            scores[h * n + i] = crate::simd::hsum(lanes);
        }
    }
}

/// `o[h] = Σ_t p[h][t]·v_t` for a compile-time head dim: up to 4 (D = 64) or 2 (D = 128)
/// heads' outputs stay in 16 zmm registers while the chunk's V rows stream past once.
#[inline(always)]
fn weighted_values<T: Element, const D: usize>(
    job: &ChunkJob<'_, T>,
    scores: &[f32],
    o: &mut [f32],
    g: usize,
) {
    const MAX_G: usize = 4;
    let c = job.cache;
    let n = job.t1 - job.t0;
    let mut acc = [[0f32; D]; MAX_G];
    for (i, t) in (job.t0..job.t1).enumerate() {
        let b = job.table[t / c.block_size] as usize;
        let off = ((b * c.block_size + t % c.block_size) * c.kv_heads + job.kvh) * D;
        let v: &[T; D] = c.v[off..off + D].try_into().expect("D-wide rows");
        for (h, a) in acc.iter_mut().enumerate().take(g) {
            let p = scores[h * n + i];
            for x in 0..D {
                a[x] += p * v[x].to_f32();
            }
        }
    }
    for (h, a) in acc.iter().enumerate().take(g) {
        o[h * D..(h + 1) * D].copy_from_slice(a);
    }
}

/// `O[s, h] = softmax(scale·q·K)·V` over each sequence's cached tokens.
pub fn paged_attention<T: Element>(
    isa: Isa,
    q: &TensorView<'_, f32>,
    cache: &PagedKvCache<'_, T>,
    seqs: &PagedSeqs<'_>,
    o: &mut TensorViewMut<'_, f32>,
    p: PagedParams,
) -> Result<()> {
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    check(q, cache, seqs, o)?;
    let (n, heads, d) = (q.dims()[0], q.dims()[1], q.dims()[2]);
    let g = heads / cache.kv_heads;
    let chunk = p.chunk.max(1);
    // Task list: (seq, kv head, chunk index); partials land in task-indexed slots.
    let mut tasks = Vec::new();
    for s in 0..n {
        for kvh in 0..cache.kv_heads {
            for ci in 0..seqs.context_lens[s].div_ceil(chunk) {
                tasks.push((s, kvh, ci));
            }
        }
    }
    let mut partial_o = vec![0f32; tasks.len() * g * d];
    let mut partial_ml = vec![(0f32, 0f32); tasks.len() * g];
    let (po, pml) = (
        SharedMut(partial_o.as_mut_ptr()),
        SharedMut(partial_ml.as_mut_ptr()),
    );
    let ql = *q.layout();
    pool::global().run(tasks.len(), p.threads, |ti| {
        let (s, kvh, ci) = tasks[ti];
        let len = seqs.context_lens[s];
        let (t0, t1) = (ci * chunk, ((ci + 1) * chunk).min(len));
        let mut qbuf = vec![0f32; g * d];
        for h in 0..g {
            for x in 0..d {
                qbuf[h * d + x] = q.data()[ql.index_of(&[s, kvh * g + h, x])] * p.scale;
            }
        }
        let job = ChunkJob {
            cache,
            table: &seqs.block_tables[s * seqs.max_blocks..][..seqs.max_blocks],
            kvh,
            q: &qbuf,
            t0,
            t1,
        };
        let mut scores = vec![0f32; g * (t1 - t0)];
        // SAFETY: task ti alone owns slots ti·g·d.. and ti·g.. of the partial buffers.
        let (o, ml) = unsafe {
            (
                std::slice::from_raw_parts_mut(po.get().add(ti * g * d), g * d),
                std::slice::from_raw_parts_mut(pml.get().add(ti * g), g),
            )
        };
        chunk_body(isa, &job, &mut scores, o, ml);
    });
    merge(&tasks, &partial_o, &partial_ml, (d, g), o);
    Ok(())
}

/// Combines chunk partials: with M = max mᵢ, O = Σ e^{mᵢ−M}·oᵢ / Σ e^{mᵢ−M}·lᵢ.
fn merge(
    tasks: &[(usize, usize, usize)],
    po: &[f32],
    pml: &[(f32, f32)],
    (d, g): (usize, usize),
    o: &mut TensorViewMut<'_, f32>,
) {
    let ol = *o.layout();
    let out = o.data_mut();
    let mut i = 0;
    while i < tasks.len() {
        let (s, kvh, _) = tasks[i];
        let end = i + tasks[i..]
            .iter()
            .take_while(|t| t.0 == s && t.1 == kvh)
            .count();
        for h in 0..g {
            let parts = || (i..end).map(|ti| (pml[ti * g + h], &po[(ti * g + h) * d..][..d]));
            let m = parts().fold(f32::NEG_INFINITY, |a, (p, _)| a.max(p.0));
            let mut acc = vec![0f32; d];
            let mut l = 0f32;
            for ((pm, pl), po) in parts() {
                let w = exp(pm - m);
                l += w * pl;
                acc.iter_mut().zip(po).for_each(|(a, &x)| *a += w * x);
            }
            for (x, a) in acc.iter().enumerate() {
                out[ol.index_of(&[s, kvh * g + h, x])] = a / l;
            }
        }
        i = end;
    }
}
