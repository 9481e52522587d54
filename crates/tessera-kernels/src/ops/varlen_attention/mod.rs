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
//! every K/V read, long contexts split across threads); each prefill chunk goes to the
//! flash kernel (compute-bound, causal mask bottom-right aligned so a chunk that extends
//! a cached prefix works unchanged), whose packing of Kᵀ and V reads the sequence's
//! blocks in place (`attention_paged`). The packing costs `2·context·kv_dim` element
//! copies whatever the chunk's rows, so a short chunk (up to [`chunk_as_decode_rows`]
//! rows) joins the decode rows instead, one paged query per row over its causal prefix.

mod spec;

pub use spec::{VarlenAttentionOp, VarlenProblem, TOL_F32, TOL_HALF};

use crate::ops::attention::{attention_paged, gather_row, AttentionParams};
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
    let starts: Vec<usize> = seqs
        .q_lens
        .iter()
        .scan(0, |at, &l| {
            *at += l;
            Some(*at - l)
        })
        .collect();
    let table = |s: usize| &seqs.block_tables[s * seqs.max_blocks..][..seqs.max_blocks];
    // (query row, sequence, keys it sees): every decode row, and each row of a short
    // chunk with its causal context.
    let short = chunk_as_decode_rows(isa);
    let decodes: Vec<(usize, usize, usize)> = (0..seqs.q_lens.len())
        .filter(|&s| seqs.q_lens[s] <= short)
        .flat_map(|s| {
            let (rows, len, start) = (seqs.q_lens[s], seqs.context_lens[s], starts[s]);
            (0..rows).map(move |i| (start + i, s, len - rows + i + 1))
        })
        .collect();
    if !decodes.is_empty() {
        decode_rows(isa, q, cache, seqs, o, p, &decodes)?;
    }
    for s in (0..seqs.q_lens.len()).filter(|&s| seqs.q_lens[s] > short) {
        let (len, rows) = (seqs.context_lens[s], seqs.q_lens[s]);
        check_table(cache, table(s), len)?;
        let qs = rows_of(q.layout(), starts[s], rows)?;
        let os = rows_of(o.layout(), starts[s], rows)?;
        attention_paged(
            isa,
            p.threads,
            (
                &TensorView::new(q.data(), qs)?,
                &mut TensorViewMut::new(o.data_mut(), os)?,
            ),
            (cache, table(s), len),
            AttentionParams {
                causal: true,
                scale: p.scale,
                window: None,
            },
        )?;
    }
    Ok(())
}

/// Prefill chunks of at most this many rows run as decode rows of the paged kernel
/// (row i of a chunk over a context of `len` as one query over the first `len − rows +
/// i + 1` positions): it reads the blocks in place, where the flash kernel first packs
/// the whole context. On AVX2 the two routes tie at ~12 rows (host B, AMD Zen 3,
/// 2026-12-06, `tessera bench varlen_attention --dtype f16 --variant avx2 --shape
/// 1xRxCx9x3x64` with the limit at 8 and at 16, 3 alternated rounds, medians in µs,
/// paged against flash): 9 rows over 256, 1,024 and 2,048 keys 103/124, 341/430,
/// 623/867; 12 rows 129/121, 429/457, 858/878; 16 rows 146/140, 566/531, 1115/1039.
/// Elsewhere 8, the limit from before the decode route copied head rows whole
/// (`decode_rows`), not re-measured since.
pub fn chunk_as_decode_rows(isa: Isa) -> usize {
    match isa {
        Isa::Avx2 => AVX2_DECODE_ROWS,
        _ => OTHER_DECODE_ROWS,
    }
}

/// [`chunk_as_decode_rows`] on AVX2, and on every other ISA.
const AVX2_DECODE_ROWS: usize = 12;
const OTHER_DECODE_ROWS: usize = 8;

/// The decode rows, `(query row, sequence, keys it sees)`, through one paged call:
/// compacted when other rows sit between them or a row sees fewer keys than its
/// sequence holds.
fn decode_rows<T: Element>(
    isa: Isa,
    q: &TensorView<'_, f32>,
    cache: &PagedKvCache<'_, T>,
    seqs: &VarlenSeqs<'_>,
    o: &mut TensorViewMut<'_, f32>,
    p: VarlenParams,
    decodes: &[(usize, usize, usize)],
) -> Result<()> {
    let (heads, d) = (q.dims()[1], q.dims()[2]);
    let params = PagedParams {
        scale: p.scale,
        chunk: 0,
        threads: p.threads,
    };
    if seqs.q_lens.iter().all(|&l| l == 1) {
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
    let (ql, x_stride) = (q.layout(), q.layout().stride(2));
    for (&(row, s, len), dst) in decodes.iter().zip(qd.chunks_exact_mut(heads * d)) {
        for (h, dst) in dst.chunks_exact_mut(d).enumerate() {
            gather_row(isa, q.data(), ql.index_of(&[row, h, 0]), x_stride, 1.0, dst);
        }
        tables.extend_from_slice(&seqs.block_tables[s * mb..][..mb]);
        lens.push(len);
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
    for (&(row, _, _), src) in decodes.iter().zip(od.chunks_exact(heads * d)) {
        for (h, src) in src.chunks_exact(d).enumerate() {
            let base = ol.index_of(&[row, h, 0]);
            match ol.stride(2) {
                1 => out[base..][..d].copy_from_slice(src),
                st => src
                    .iter()
                    .enumerate()
                    .for_each(|(x, &v)| out[base + x * st] = v),
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

/// Checks that positions `0..len` of one sequence lie in blocks of the pool, and the
/// cache's buffers match its stated shape, before the flash kernel reads them in place.
fn check_table<T: Element>(c: &PagedKvCache<'_, T>, table: &[u32], len: usize) -> Result<()> {
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
    match table[..blocks]
        .iter()
        .find(|&&b| b as usize >= c.num_blocks)
    {
        Some(b) => Err(Error::invalid(
            "varlen_attention",
            format!("block id {b} ≥ {} blocks", c.num_blocks),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::paged_attention::NO_SCALES;

    /// Every ISA here runs a chunk of `decode` rows as decode rows and one of `flash`
    /// rows on the flash route: the route tests below depend on both.
    fn assert_routes_split(decode: usize, flash: usize) {
        for isa in Isa::available() {
            let limit = chunk_as_decode_rows(isa);
            assert!(decode <= limit && limit < flash, "{isa}: limit {limit}");
        }
    }

    /// A prefill chunk's blocks are read in place, by the flash path's packing or, for a
    /// short chunk, by the paged decode kernel, so a block table that points past the
    /// pool or ends before the context, and a query head width that is not the cache's,
    /// must each be an error before anything is read (an index past the pool would
    /// panic), on every ISA and either route; the same calls with good tables run.
    #[test]
    fn bad_chunk_tables_and_shapes_are_errors() {
        let (blocks, bs, kv_heads, heads, d) = (4, 4, 1, 2, 8);
        let pool = vec![0.5f32; blocks * bs * kv_heads * d];
        let cache = PagedKvCache {
            k: &pool,
            v: &pool,
            k_scales: NO_SCALES,
            v_scales: NO_SCALES,
            num_blocks: blocks,
            block_size: bs,
            kv_heads,
            d,
        };
        let params = VarlenParams {
            scale: 0.35,
            threads: 2,
        };
        let run = |isa: Isa, table: &[u32], (rows, len): (usize, usize), qd: usize| {
            let q = vec![0.25f32; rows * heads * qd];
            let mut o = vec![f32::NAN; q.len()];
            let seqs = VarlenSeqs {
                block_tables: table,
                max_blocks: table.len(),
                context_lens: &[len],
                q_lens: &[rows],
            };
            let dims = [rows, heads, qd];
            varlen_attention(
                isa,
                &TensorView::contiguous(&q, &dims).expect("q"),
                &cache,
                &seqs,
                &mut TensorViewMut::contiguous(&mut o, &dims).expect("o"),
                params,
            )
            .map(|()| o)
        };
        // A chunk the decode kernel takes, and one the flash path takes, on every ISA.
        assert_routes_split(3, 14);
        let chunks: [(usize, usize, [u32; 4]); 2] = [(3, 10, [2, 0, 3, 1]), (14, 16, [2, 0, 3, 1])];
        for isa in Isa::available() {
            for (rows, len, good) in chunks {
                let used = len.div_ceil(bs);
                let what = format!("{isa}, {rows} rows over {len}");
                // Equal keys: every output is the mean of the values, 0.5.
                let o = run(isa, &good[..used], (rows, len), d).expect("a good table");
                assert!(o.iter().all(|&x| (x - 0.5).abs() < 1e-6), "{what}: {o:?}");
                let mut past = good;
                past[1] = blocks as u32;
                let err = run(isa, &past[..used], (rows, len), d).expect_err("block 4 of 4");
                assert!(err.to_string().contains("block"), "{what}: {err}");
                let short = run(isa, &good[..used - 1], (rows, len), d);
                assert!(short.is_err(), "{what}: a table one block short");
                let wide = run(isa, &good[..used], (rows, len), d + 1);
                assert!(wide.is_err(), "{what}: head width");
            }
        }
    }

    /// Q and O views whose head rows are not contiguous (heads innermost) give what a
    /// float64 reference gives, on every ISA and both routes: the decode route copies
    /// rows out and back, the flash route gathers them, each with a strided fallback
    /// beside the contiguous copy the models use.
    #[test]
    fn strided_head_rows_match_the_float64_reference() {
        use rand::{Rng as _, SeedableRng};
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (blocks, bs, kv_heads, heads, d) = (6, 4, 2, 4, 8);
        let mut uniform =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
        let (k, v) = (
            uniform(blocks * bs * kv_heads * d),
            uniform(blocks * bs * kv_heads * d),
        );
        let cache = PagedKvCache {
            k: &k,
            v: &v,
            k_scales: NO_SCALES,
            v_scales: NO_SCALES,
            num_blocks: blocks,
            block_size: bs,
            kv_heads,
            d,
        };
        let table = [3u32, 0, 5, 1, 4];
        let params = VarlenParams {
            scale: 0.35,
            threads: 2,
        };
        // Values lie in [-1, 1], so the registry's relative f32 tolerance is absolute here.
        let tol = spec::TOL_F32.rel;
        assert_routes_split(3, 14);
        for (rows, len) in [(3usize, 10usize), (14, 19)] {
            // Stored [rows, d, heads]: element (r, h, x) at r·heads·d + x·heads + h.
            let at = |r: usize, h: usize, x: usize| (r * d + x) * heads + h;
            let layout = Layout::strided(&[rows, heads, d], &[heads * d, 1, heads], 0).unwrap();
            let q = uniform(rows * heads * d);
            let cached = |src: &[f32], j: usize, kvh: usize, x: usize| {
                let slot = table[j / bs] as usize * bs + j % bs;
                f64::from(src[(slot * kv_heads + kvh) * d + x])
            };
            let mut want = vec![0f64; q.len()];
            for r in 0..rows {
                let keys = len - rows + r + 1;
                for h in 0..heads {
                    let kvh = h / (heads / kv_heads);
                    let scores: Vec<f64> = (0..keys)
                        .map(|j| {
                            let dot: f64 = (0..d)
                                .map(|x| f64::from(q[at(r, h, x)]) * cached(&k, j, kvh, x))
                                .sum();
                            dot * f64::from(params.scale)
                        })
                        .collect();
                    let top = scores.iter().copied().fold(f64::MIN, f64::max);
                    let w: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                    let z: f64 = w.iter().sum();
                    for x in 0..d {
                        want[at(r, h, x)] =
                            (0..keys).map(|j| w[j] * cached(&v, j, kvh, x)).sum::<f64>() / z;
                    }
                }
            }
            let seqs = VarlenSeqs {
                block_tables: &table,
                max_blocks: table.len(),
                context_lens: &[len],
                q_lens: &[rows],
            };
            for isa in Isa::available() {
                let mut o = vec![f32::NAN; q.len()];
                varlen_attention(
                    isa,
                    &TensorView::new(&q, layout).unwrap(),
                    &cache,
                    &seqs,
                    &mut TensorViewMut::new(&mut o, layout).unwrap(),
                    params,
                )
                .unwrap();
                let worst = o
                    .iter()
                    .zip(&want)
                    .map(|(&g, w)| (f64::from(g) - w).abs())
                    .fold(0.0, f64::max);
                assert!(
                    worst <= tol,
                    "{isa}, {rows} rows over {len}, seed {seed}: error {worst:e}"
                );
            }
        }
    }
}
