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

mod cpu;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod lanes_kernel;
pub(crate) mod spec;

pub(crate) use spec::run_attention_on_device;
pub use spec::{PagedAttentionOp, PagedProblem, TOL_BF16, TOL_F32, TOL_I8};

use crate::pool::{self, SharedMut};
use crate::registry::{TuneParam, TuneSpace};
use crate::reuse::with_reused;
use crate::simd::exp;
use tessera_core::{Element, Error, Isa, Result, TensorView, TensorViewMut};

/// The paged cache (K and V share one layout).
///
/// An `i8` cache stores codes with one f32 scale per position and KV head: element x of
/// head h at position p is `k[(p·kv_heads + h)·d + x] · k_scales[p·kv_heads + h]`
/// (p counting positions over the whole pool, `num_blocks·block_size`). Float caches
/// leave the scales empty ([`NO_SCALES`]).
#[derive(Clone, Copy, Debug)]
pub struct PagedKvCache<'a, T> {
    /// Keys: `[num_blocks, block_size, kv_heads, d]`.
    pub k: &'a [T],
    /// Values, laid out as the keys.
    pub v: &'a [T],
    /// An i8 cache's key scales, `[num_blocks, block_size, kv_heads]`; else empty.
    pub k_scales: &'a [f32],
    /// An i8 cache's value scales, as the keys'.
    pub v_scales: &'a [f32],
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub d: usize,
}

/// The scales of a float cache: none.
pub const NO_SCALES: &[f32] = &[];

impl<T: Element> PagedKvCache<'_, T> {
    /// Whether elements are int8 codes with per-row scales.
    pub fn is_scaled(&self) -> bool {
        T::DTYPE == tessera_core::DType::I8
    }
    /// The factor of the row at element offset `at` (a record's start plus `kvh·d`)
    /// in `scales` (`k_scales` or `v_scales`): its scale for an i8 cache, 1 otherwise.
    /// `d` is the head dim (`self.d`), passed so that a kernel compiled for one head dim
    /// indexes with a shift: dividing by the runtime field put six integer divisions on
    /// every token of the lanes kernel's i8 path (4–6% of its time in cache).
    #[inline(always)]
    pub(crate) fn row_scale(&self, scales: &[f32], at: usize, d: usize) -> f32 {
        debug_assert_eq!(d, self.d);
        if self.is_scaled() {
            scales[at / d]
        } else {
            1.0
        }
    }
}

/// Sequences in one call: block table row `s` is `block_tables[s·max_blocks..][..max_blocks]`.
#[derive(Clone, Copy, Debug)]
pub struct PagedSeqs<'a> {
    /// Each sequence's block ids, `max_blocks` per row.
    pub block_tables: &'a [u32],
    /// Width of a block-table row.
    pub max_blocks: usize,
    /// Each sequence's cached length.
    pub context_lens: &'a [usize],
}

/// Knobs of one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PagedParams {
    /// Multiplies the scores (usually 1/√d).
    pub scale: f32,
    /// Tokens per task (split-K granularity); 0 picks [`auto_chunk`].
    pub chunk: usize,
    /// Threads the call may use.
    pub threads: usize,
}

/// Largest chunk: long runs amortise each task's setup (query gather, score buffers,
/// the merge) and keep the prefetch stream going; measured best at 1024 on 16×2048.
pub const MAX_CHUNK: usize = 1024;

/// The tunable parameters: the split granularity and the thread count.
pub fn tune_space() -> TuneSpace {
    let t = pool::global().threads();
    TuneSpace(vec![
        TuneParam {
            name: "chunk",
            default: 0,
            choices: vec![64, 128, 256, 512, 1024],
        },
        TuneParam {
            name: "threads",
            default: t,
            choices: (1..=t).collect(),
        },
    ])
}

/// What a tuned chunk is keyed by (bucketed by the tuning cache): sequences, mean
/// context length, KV heads, head dim — the quantities the best split depends on.
pub fn tune_dims(seqs: usize, total_tokens: usize, kv_heads: usize, d: usize) -> Vec<usize> {
    vec![seqs, total_tokens / seqs.max(1), kv_heads, d]
}

/// The chunk `tessera tune` chose for such a call on this machine, if any. (The tuned
/// thread count is not applied: callers choose their threads.)
pub(crate) fn tuned_chunk(isa: Isa, dtype: tessera_core::DType, dims: &[usize]) -> Option<usize> {
    if crate::tuning::is_empty() {
        return None;
    }
    let cfg = crate::tuning::lookup(
        "paged_attention",
        &dtype.to_string(),
        isa.name(),
        dims,
        &tune_space(),
    )?;
    cfg.get("chunk").filter(|&c| c > 0)
}

/// Tokens per task when the caller leaves it to us: the context split evenly over the
/// threads, at least 64 tokens, at most [`MAX_CHUNK`]. Longer runs pay less per-task
/// setup and keep each thread's prefetch stream going; sequences shorter than a chunk
/// are one task each, so a batch of many still balances by claiming. Four tasks per
/// thread (the earlier rule) measured 15–20% slower on host H (Intel AVX-512, 2
/// threads, f16 cache, 9/3 heads × 64, cold; `tessera bench paged_attention --shape S
/// --set chunk=C`, zmm and ymm alike): 1 × 512 tokens chunk 64 29.1 µs against 24.6 at
/// 256 (one task per thread; 40.9 at 1024, one task in all), 16 × 192 181 against 146
/// at 256 (one task per sequence); 1 × 2048 best at 512–1024, 16 × 1024 at 512–1024.
pub fn auto_chunk(total_tokens: usize, threads: usize) -> usize {
    (total_tokens / threads.max(1))
        .clamp(64, MAX_CHUNK)
        .next_multiple_of(64)
}

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
    let rows = need.map(|n| n / c.d.max(1));
    // (A scaled cache of zero-width heads would have no rows to scale: rejected.)
    let scales = if c.is_scaled() {
        rows.filter(|_| c.d > 0)
    } else {
        Some(0)
    };
    if scales.is_none_or(|r| c.k_scales.len() != r || c.v_scales.len() != r) {
        return Err(Error::shape(
            OP,
            format!(
                "{}/{} scales for a {} cache of {:?} rows (one per position and KV head \
                 for i8, none for float caches)",
                c.k_scales.len(),
                c.v_scales.len(),
                T::DTYPE,
                rows
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

/// What one task reads: tokens t0..t1 of one sequence, every KV head (so the cache is
/// read as whole contiguous token records, not one head's slice of each).
#[derive(Debug)]
pub(crate) struct ChunkAll<'a, T> {
    cache: &'a PagedKvCache<'a, T>,
    /// Where each token's record (`kv_heads·d` elements) starts in the cache buffers,
    /// one entry per token of the chunk: resolved once per task ([`records`]) so the
    /// K and V passes do no block-table division per token.
    records: &'a [usize],
    /// Every head's scaled query, `heads·d`.
    q: &'a [f32],
}

/// One KV head's share of a [`ChunkAll`] (the portable kernel's unit).
#[derive(Debug)]
pub(crate) struct ChunkJob<'a, T> {
    cache: &'a PagedKvCache<'a, T>,
    /// As in [`ChunkAll`].
    records: &'a [usize],
    kvh: usize,
    /// The group's scaled queries, `group·d`.
    q: &'a [f32],
}

/// The record offsets of tokens `t0..t1` under a block table, a block at a time, into
/// `out` (cleared first).
fn records(
    cache: &PagedKvCache<'_, impl Element>,
    table: &[u32],
    (t0, t1): (usize, usize),
    out: &mut Vec<usize>,
) {
    let (bs, rec_len) = (cache.block_size, cache.kv_heads * cache.d);
    out.clear();
    let mut t = t0;
    while t < t1 {
        let (bi, within) = (t / bs, t % bs);
        let run = (bs - within).min(t1 - t);
        let first = table[bi] as usize * bs + within;
        out.extend((first..first + run).map(|r| r * rec_len));
        t += run;
    }
}

/// A task's buffers: the scaled queries, the chunk's record offsets and its scores.
#[derive(Default)]
struct TaskScratch {
    q: Vec<f32>,
    records: Vec<usize>,
    scores: Vec<f32>,
}

thread_local! {
    /// Each thread's [`TaskScratch`], reused across tasks and calls: allocating and
    /// freeing the three per task (calloc, memset, free) was ~4% of a one-sequence ×
    /// 512-token f16 call (perf, host H).
    static SCRATCH: std::cell::RefCell<TaskScratch> = std::cell::RefCell::default();
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
    let chunk = match p.chunk {
        0 => {
            let total = seqs.context_lens.iter().sum();
            tuned_chunk(isa, T::DTYPE, &tune_dims(n, total, cache.kv_heads, d))
                .unwrap_or_else(|| auto_chunk(total, p.threads))
        }
        c => c,
    };
    // Task list: (seq, chunk index); partials land in task-indexed slots.
    let tasks: Vec<(usize, usize)> = (0..n)
        .flat_map(|s| (0..seqs.context_lens[s].div_ceil(chunk)).map(move |ci| (s, ci)))
        .collect();
    let mut partial_o = vec![0f32; tasks.len() * heads * d];
    let mut partial_ml = vec![(0f32, 0f32); tasks.len() * heads];
    let (po, pml) = (
        SharedMut(partial_o.as_mut_ptr()),
        SharedMut(partial_ml.as_mut_ptr()),
    );
    let ql = *q.layout();
    let ol = *o.layout();
    let out = SharedMut(o.data_mut().as_mut_ptr());
    pool::global().run(tasks.len(), p.threads, |ti| {
        with_reused(&SCRATCH, true, |scratch| {
            let TaskScratch {
                q: qbuf,
                records: recs,
                scores,
            } = scratch;
            let (s, ci) = tasks[ti];
            let len = seqs.context_lens[s];
            let (t0, t1) = (ci * chunk, ((ci + 1) * chunk).min(len));
            // Every element is written below (each head's row).
            qbuf.resize(heads * d, 0.0);
            let qs = ql.stride(2);
            for h in 0..heads {
                let (base, row) = (ql.index_of(&[s, h, 0]), &mut qbuf[h * d..][..d]);
                if qs == 1 {
                    // One bounds check per head and a loop LLVM vectorizes (so is the output's
                    // division below): per-element indexing in both made the task closure 11%
                    // of a 16×192 call's samples, 4% with these (perf, host B).
                    let src = &q.data()[base..base + d];
                    row.iter_mut().zip(src).for_each(|(v, &x)| *v = x * p.scale);
                } else {
                    for (x, v) in row.iter_mut().enumerate() {
                        *v = q.data()[base + x * qs] * p.scale;
                    }
                }
            }
            let table = &seqs.block_tables[s * seqs.max_blocks..][..seqs.max_blocks];
            records(cache, table, (t0, t1), recs);
            let job = ChunkAll {
                cache,
                records: recs,
                q: qbuf,
            };
            scores.clear();
            scores.resize(heads * (t1 - t0), 0.0);
            // SAFETY: task ti alone owns slots ti·heads·d.. and ti·heads.. of the partials.
            let (o, ml) = unsafe {
                (
                    std::slice::from_raw_parts_mut(po.get().add(ti * heads * d), heads * d),
                    std::slice::from_raw_parts_mut(pml.get().add(ti * heads), heads),
                )
            };
            cpu::chunk(isa, &job, scores, o, ml);
            if (t0, t1) == (0, len) {
                // The sequence's only chunk: its normalized rows are final.
                let os = ol.stride(2);
                for h in 0..heads {
                    let (base, l) = (ol.index_of(&[s, h, 0]), ml[h].1);
                    let row = &o[h * d..][..d];
                    if os == 1 {
                        // SAFETY: O[s, h, 0..d] is contiguous in the validated view, and
                        // sequence s's rows belong to this task alone.
                        let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add(base), d) };
                        dst.iter_mut().zip(row).for_each(|(y, &v)| *y = v / l);
                    } else {
                        for (x, v) in row.iter().enumerate() {
                            // SAFETY: O[s, h, x] lies in the validated view, and sequence
                            // s's rows belong to this task alone.
                            unsafe { *out.get().add(base + x * os) = v / l };
                        }
                    }
                }
            }
        })
    });
    merge(&tasks, &partial_o, &partial_ml, (d, heads), o);
    Ok(())
}

/// Combines chunk partials: with M = max mᵢ, O = Σ e^{mᵢ−M}·oᵢ / Σ e^{mᵢ−M}·lᵢ.
/// Sequences of one chunk were written by their task. (This loop ran on the caller
/// alone, one `index_of` per element, for every sequence: 18% of a 16-sequence ×
/// 64-token f16 call, perf.)
fn merge(
    tasks: &[(usize, usize)],
    po: &[f32],
    pml: &[(f32, f32)],
    (d, heads): (usize, usize),
    o: &mut TensorViewMut<'_, f32>,
) {
    let ol = *o.layout();
    let out = o.data_mut();
    let mut acc = vec![0f32; d];
    let mut i = 0;
    while i < tasks.len() {
        let s = tasks[i].0;
        let end = i + tasks[i..].iter().take_while(|t| t.0 == s).count();
        if end - i == 1 {
            i = end;
            continue;
        }
        for h in 0..heads {
            let parts =
                || (i..end).map(|ti| (pml[ti * heads + h], &po[(ti * heads + h) * d..][..d]));
            let m = parts().fold(f32::NEG_INFINITY, |a, (p, _)| a.max(p.0));
            acc.fill(0.0);
            let mut l = 0f32;
            for ((pm, pl), po) in parts() {
                let w = exp(pm - m);
                l += w * pl;
                acc.iter_mut().zip(po).for_each(|(a, &x)| *a += w * x);
            }
            // One reciprocal per row and, for a contiguous row, a loop LLVM vectorizes:
            // a division and an indexed store per element were 5% of a one-sequence ×
            // 512-token f16 call on one thread (perf, host H), all on the caller.
            let (base, os, inv) = (ol.index_of(&[s, h, 0]), ol.stride(2), 1.0 / l);
            if os == 1 {
                let row = &mut out[base..base + d];
                row.iter_mut().zip(&acc).for_each(|(y, &a)| *y = a * inv);
            } else {
                for (x, a) in acc.iter().enumerate() {
                    out[base + x * os] = a * inv;
                }
            }
        }
        i = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use tessera_core::Layout;

    /// Queries and outputs as strided views (every other float, NaN or a sentinel in
    /// the gaps) give the contiguous views' outputs bit for bit (the same values reach
    /// the same kernel), with one chunk per sequence and with several (the merge), and
    /// the gaps stay untouched. The registry's problems use contiguous views.
    /// Scales that do not match the cache get a clear error, never a panic: an i8 cache
    /// needs one per position and KV head (and heads of positive width), a float cache
    /// none.
    #[test]
    fn mismatched_scales_are_an_error() {
        const D: usize = 8;
        fn run<T: Element>(k: &[T], (k_scales, v_scales): (&[f32], &[f32])) -> Result<()> {
            let (heads, dims) = (2, [1, 2, D]);
            let q = vec![0.25f32; heads * D];
            let mut o = vec![f32::NAN; heads * D];
            let cache = PagedKvCache {
                k,
                v: k,
                k_scales,
                v_scales,
                num_blocks: 2,
                block_size: 4,
                kv_heads: 1,
                d: D,
            };
            let seqs = PagedSeqs {
                block_tables: &[1, 0],
                max_blocks: 2,
                context_lens: &[5],
            };
            let params = PagedParams {
                scale: 0.5,
                chunk: 0,
                threads: 1,
            };
            paged_attention(
                Isa::Scalar,
                &TensorView::contiguous(&q, &dims)?,
                &cache,
                &seqs,
                &mut TensorViewMut::contiguous(&mut o, &dims)?,
                params,
            )
        }
        let n = 2 * 4 * D;
        let (codes, floats, rows) = (vec![3i8; n], vec![0.5f32; n], vec![0.1f32; n / D]);
        assert!(run(&codes, (&rows, &rows)).is_ok());
        assert!(run(&floats, (NO_SCALES, NO_SCALES)).is_ok());
        let bad = [
            run(&codes, (&rows[1..], &rows)),
            run(&codes, (&rows, NO_SCALES)),
            run(&floats, (&rows, &rows)),
        ];
        for e in bad {
            let e = e.unwrap_err();
            assert!(e.to_string().contains("scales"), "{e}");
        }
    }

    #[test]
    fn strided_queries_and_outputs_match_contiguous() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (heads, kv_heads, d, block_size, max_blocks, num_blocks) = (4, 2, 64, 4, 4, 8);
        let lens = [7usize, 13];
        let n = lens.len();
        let mut random =
            |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-1.0..1.0)).collect() };
        let (k, v) = (
            random(num_blocks * block_size * kv_heads * d),
            random(num_blocks * block_size * kv_heads * d),
        );
        let q = random(n * heads * d);
        // Sequence 0 in blocks 5, 1; sequence 1 in 0, 7, 3, 2 (out of order, with holes).
        let tables = [5u32, 1, 0, 0, 0, 7, 3, 2];
        let cache = PagedKvCache {
            k: &k,
            v: &v,
            k_scales: NO_SCALES,
            v_scales: NO_SCALES,
            num_blocks,
            block_size,
            kv_heads,
            d,
        };
        let seqs = PagedSeqs {
            block_tables: &tables,
            max_blocks,
            context_lens: &lens,
        };
        let dims = [n, heads, d];
        let strided = Layout::strided(&dims, &[2 * heads * d, 2 * d, 2], 0).unwrap();
        let mut q2 = vec![f32::NAN; 2 * q.len()];
        for (i, &x) in q.iter().enumerate() {
            q2[2 * i] = x;
        }
        for isa in Isa::available() {
            for chunk in [0, 4] {
                let params = PagedParams {
                    scale: 0.125,
                    chunk,
                    threads: 2,
                };
                let mut want = vec![f32::NAN; q.len()];
                let qv = TensorView::contiguous(&q, &dims).unwrap();
                let mut ov = TensorViewMut::contiguous(&mut want, &dims).unwrap();
                paged_attention(isa, &qv, &cache, &seqs, &mut ov, params).unwrap();
                let mut got = vec![-7.0f32; 2 * q.len()];
                let qv = TensorView::new(&q2, strided).unwrap();
                let mut ov = TensorViewMut::new(&mut got, strided).unwrap();
                paged_attention(isa, &qv, &cache, &seqs, &mut ov, params).unwrap();
                for (i, w) in want.iter().enumerate() {
                    let at = format!("{isa} chunk {chunk} element {i}");
                    assert!(w.is_finite(), "{at}");
                    assert_eq!(got[2 * i].to_bits(), w.to_bits(), "{at}");
                    assert_eq!(got[2 * i + 1], -7.0, "{at}: a gap was written");
                }
            }
        }
    }
}
