//! Attention for prefill, FlashAttention style: tiled, online softmax, the score matrix
//! never materialised; causal or not, GQA/MQA, optional sliding window, f32 or bf16 in.
//!
//! Layouts are the model's activations: Q `[q_len, n_heads, d]`, K/V
//! `[kv_len, n_kv_heads, d]`, O `[q_len, n_heads, d]` (f32), any strides. Causal masks
//! are bottom-right aligned (query i sees keys ≤ i + kv_len − q_len), so a prefill that
//! extends a cache works unchanged.

mod flash;
pub mod reference;
mod spec;

pub use spec::{AttentionOp, AttentionProblem, TOL_BF16, TOL_F32};

use crate::ops::paged_attention::PagedKvCache;
use crate::pool::{self, SharedMut};
use flash::{PackedKv, QueryBlock, BR};
use tessera_core::{AlignedVec, Element, Error, Isa, Result, TensorView, TensorViewMut};

/// Flags of one attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Each query sees only keys at or before its own position (bottom-right aligned when q_len < kv_len).
    pub causal: bool,
    /// Multiplies q·k before the softmax (usually 1/√d).
    pub scale: f32,
    /// Each query sees at most this many most recent visible keys.
    pub window: Option<usize>,
}

/// Validated sizes.
#[derive(Clone, Copy, Debug)]
struct Dims {
    q_len: usize,
    kv_len: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
}

impl Dims {
    /// Keys padded to whole BC blocks.
    fn kv_pad(&self) -> usize {
        self.kv_len.next_multiple_of(flash::BC)
    }
    /// Floats of one KV head's packed Kᵀ (and of its V).
    fn packed_head(&self) -> usize {
        self.kv_pad() * self.d
    }
}

fn check<T: Element>(
    q: &TensorView<'_, T>,
    k: &TensorView<'_, T>,
    v: &TensorView<'_, T>,
    o: &TensorViewMut<'_, f32>,
    p: &AttentionParams,
) -> Result<Dims> {
    const OP: &str = "attention";
    for (name, r) in [
        ("Q", q.rank()),
        ("K", k.rank()),
        ("V", v.rank()),
        ("O", o.rank()),
    ] {
        if r != 3 {
            return Err(Error::Rank {
                op: OP,
                expected: format!("3 ([tokens, heads, d]) for {name}"),
                got: r,
            });
        }
    }
    let (qd, kd) = (q.dims(), k.dims());
    let dims = Dims {
        q_len: qd[0],
        kv_len: kd[0],
        heads: qd[1],
        kv_heads: kd[1],
        d: qd[2],
    };
    if kd != v.dims() || kd[2] != dims.d || o.dims() != qd {
        return Err(Error::shape(
            OP,
            format!("Q {qd:?}, K {kd:?}, V {:?}, O {:?}", v.dims(), o.dims()),
        ));
    }
    check_dims(dims, p)?;
    Ok(dims)
}

/// The checks that do not depend on where K and V live.
fn check_dims(dims: Dims, p: &AttentionParams) -> Result<()> {
    const OP: &str = "attention";
    if dims.kv_heads == 0 || !dims.heads.is_multiple_of(dims.kv_heads) {
        return Err(Error::shape(
            OP,
            format!(
                "{} query heads not a multiple of {} KV heads",
                dims.heads, dims.kv_heads
            ),
        ));
    }
    if p.causal && dims.kv_len < dims.q_len {
        return Err(Error::shape(
            OP,
            format!(
                "causal attention needs kv_len ({}) ≥ q_len ({})",
                dims.kv_len, dims.q_len
            ),
        ));
    }
    if p.window == Some(0) {
        return Err(Error::invalid(OP, "window must be ≥ 1"));
    }
    if !p.scale.is_finite() {
        return Err(Error::invalid(
            OP,
            format!("scale {} is not finite", p.scale),
        ));
    }
    Ok(())
}

/// Attention on the best ISA.
pub fn attention<T: Element>(
    q: &TensorView<'_, T>,
    k: &TensorView<'_, T>,
    v: &TensorView<'_, T>,
    o: &mut TensorViewMut<'_, f32>,
    p: AttentionParams,
) -> Result<()> {
    attention_with(Isa::best(), pool::global().threads(), q, k, v, o, p)
}

/// Packed Kᵀ and V, reused across calls on a thread (a prefill calls attention once
/// per layer; fresh zeroed buffers cost a page fault per 4 KiB on first write).
struct KvScratch {
    kt: AlignedVec<f32>,
    vv: AlignedVec<f32>,
}

impl KvScratch {
    fn empty() -> Result<Self> {
        Ok(KvScratch {
            kt: AlignedVec::zeroed(0)?,
            vv: AlignedVec::zeroed(0)?,
        })
    }
}

/// Most floats per buffer a thread keeps between calls (16 MiB: 16k tokens of 4 KV
/// heads at d = 64); larger calls allocate their own.
const REUSED_KV_FLOATS: usize = 4 << 20;

thread_local! {
    static REUSED_KV: std::cell::RefCell<Option<KvScratch>> = const { std::cell::RefCell::new(None) };
}

/// Where [`pack_kv`] reads the keys and values: token j's record, every KV head.
trait KvRows: Sync {
    /// Token j's keys and values of every KV head into `k` and `v` (`kv_heads·d` floats
    /// each, head-major, widened to f32).
    fn record(&self, isa: Isa, j: usize, k: &mut [f32], v: &mut [f32]);
}

/// K and V as `[kv_len, kv_heads, d]` views, any strides.
struct ViewRows<'v, 'a, T> {
    k: &'v TensorView<'a, T>,
    v: &'v TensorView<'a, T>,
}

impl<T: Element> KvRows for ViewRows<'_, '_, T> {
    fn record(&self, isa: Isa, j: usize, k: &mut [f32], v: &mut [f32]) {
        for (view, dst) in [(self.k, k), (self.v, v)] {
            let (l, d) = (view.layout(), view.dims()[2]);
            for (h, row) in dst.chunks_exact_mut(d).enumerate() {
                let base = l.offset() + j * l.stride(0) + h * l.stride(1);
                gather_row(isa, view.data(), base, l.stride(2), 1.0, row);
            }
        }
    }
}

/// One sequence's keys and values in place in a paged KV cache: its block table
/// (validated by the caller: every block a token reads is in the pool).
struct PagedRows<'c, 'a, T> {
    cache: &'c PagedKvCache<'a, T>,
    table: &'c [u32],
}

impl<T: Element> KvRows for PagedRows<'_, '_, T> {
    fn record(&self, isa: Isa, j: usize, k: &mut [f32], v: &mut [f32]) {
        let c = self.cache;
        let (bs, d) = (c.block_size, c.d);
        let at = (self.table[j / bs] as usize * bs + j % bs) * c.kv_heads * d;
        for (data, scales, dst) in [(c.k, c.k_scales, k), (c.v, c.v_scales, v)] {
            if !c.is_scaled() {
                // A float record is one run: one widening call for every head.
                gather_row(isa, data, at, 1, 1.0, dst);
                continue;
            }
            for (h, row) in dst.chunks_exact_mut(d).enumerate() {
                let r = at + h * d;
                gather_row(isa, data, r, 1, c.row_scale(scales, r, d), row);
            }
        }
    }
}

/// Keys per packing task (a multiple of [`flash::BC`], so tasks own whole packed
/// blocks). A task reads its keys' records whole and in order, every KV head. Tasks per
/// head read a third of each 384-byte record (3 KV heads, f16, d 64), a gapped stream:
/// in the engine's long-context chunks (`bench-serve --profile` traces, host B, AMD Zen
/// 3) they were no faster than the old copy-then-pack (24 rows over 1,977 keys: 1.99
/// ms against its 1.58 and 1.89 in two runs); record-wise tasks took 1.26.
const PACK_SPAN: usize = 2 * flash::BC;

/// Packs Kᵀ and V of every KV head to f32 (once per call, shared by all query heads)
/// into `s`, each head `kv_pad·d` floats, the keys past `kv_len` zero; tasks of
/// [`PACK_SPAN`] keys.
fn pack_kv(isa: Isa, src: &impl KvRows, dm: Dims, threads: usize, s: &mut KvScratch) -> Result<()> {
    const { assert!(PACK_SPAN.is_multiple_of(flash::BC)) };
    let (kv_pad, per_head, d) = (dm.kv_pad(), dm.packed_head(), dm.d);
    let len = dm
        .kv_heads
        .checked_mul(per_head)
        .ok_or_else(|| Error::Overflow(format!("packed K/V of {} x {per_head}", dm.kv_heads)))?;
    for buf in [&mut s.kt, &mut s.vv] {
        if buf.len() < len {
            *buf = AlignedVec::zeroed(len)?;
        }
    }
    let (ktp, vvp) = (SharedMut(s.kt.as_mut_ptr()), SharedMut(s.vv.as_mut_ptr()));
    let rec = dm.kv_heads * d;
    pool::global().run(kv_pad.div_ceil(PACK_SPAN), threads, |t| {
        let j0 = t * PACK_SPAN;
        let j1 = (j0 + PACK_SPAN).min(kv_pad);
        // SAFETY: keys j0..j1 of head h (j0 and j1 multiples of BC) are floats
        // [j0·d, j1·d) of the head's `per_head` in both layouts (Kᵀ block-major, V
        // row-major): disjoint between tasks and heads, inside buffers kv_heads·per_head
        // long.
        let mut heads: Vec<(&mut [f32], &mut [f32])> = (0..dm.kv_heads)
            .map(|h| unsafe {
                let at = h * per_head + j0 * d;
                (
                    std::slice::from_raw_parts_mut(ktp.get().add(at), (j1 - j0) * d),
                    std::slice::from_raw_parts_mut(vvp.get().add(at), (j1 - j0) * d),
                )
            })
            .collect();
        let (mut krec, mut vrec) = (vec![0f32; rec], vec![0f32; rec]);
        for j in j0..j1.min(dm.kv_len) {
            src.record(isa, j, &mut krec, &mut vrec);
            let (kt0, v0) = (PackedKv::kt_index(d, j - j0, 0), (j - j0) * d);
            let recs = krec.chunks_exact(d).zip(vrec.chunks_exact(d));
            for ((kt, vv), (kr, vr)) in heads.iter_mut().zip(recs) {
                for (p, &x) in kr.iter().enumerate() {
                    // Kᵀ's column j: one value per BC-wide row of the block.
                    kt[kt0 + p * flash::BC] = x;
                }
                vv[v0..v0 + d].copy_from_slice(vr);
            }
        }
        // Padded keys: zero scores' inputs and zero values (their weight is zeroed too,
        // but 0 × a stale NaN would not be 0).
        for (kt, vv) in &mut heads {
            for j in dm.kv_len.max(j0)..j1 {
                for p in 0..d {
                    kt[PackedKv::kt_index(d, j - j0, p)] = 0.0;
                }
                vv[(j - j0) * d..][..d].fill(0.0);
            }
        }
    });
    Ok(())
}

/// Attention on a chosen ISA and thread count.
#[allow(clippy::too_many_arguments)] // q, k, v, o are the op; isa/threads/params its knobs
pub fn attention_with<T: Element>(
    isa: Isa,
    threads: usize,
    q: &TensorView<'_, T>,
    k: &TensorView<'_, T>,
    v: &TensorView<'_, T>,
    o: &mut TensorViewMut<'_, f32>,
    p: AttentionParams,
) -> Result<()> {
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    let dm = check(q, k, v, o, &p)?;
    attend(isa, threads, (q, o), dm, p, &ViewRows { k, v })
}

/// Causal or windowed attention of `q` (`[q_len, heads, d]`) over the first `kv_len`
/// positions of one sequence in a paged KV cache, read in place through its block
/// `table`: a prefill chunk of a batching step. The caller has checked that every block
/// the positions fall in is inside the pool; copying the positions out first (f32
/// `[kv_len, kv_heads, d]`) and packing that was twice the memory traffic, and in
/// `tessera bench varlen_attention` the copy's fresh buffers page-faulted in every call
/// (perf).
pub(crate) fn attention_paged<T: Element>(
    isa: Isa,
    threads: usize,
    (q, o): (&TensorView<'_, f32>, &mut TensorViewMut<'_, f32>),
    (cache, table, kv_len): (&PagedKvCache<'_, T>, &[u32], usize),
    p: AttentionParams,
) -> Result<()> {
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    let qd = q.dims();
    if q.rank() != 3 || o.dims() != qd || qd[2] != cache.d {
        return Err(Error::shape(
            "attention",
            format!(
                "Q {qd:?} and O {:?} must both be [tokens, heads, {}]",
                o.dims(),
                cache.d
            ),
        ));
    }
    let dm = Dims {
        q_len: qd[0],
        kv_len,
        heads: qd[1],
        kv_heads: cache.kv_heads,
        d: qd[2],
    };
    check_dims(dm, &p)?;
    attend(isa, threads, (q, o), dm, p, &PagedRows { cache, table })
}

/// Packs the keys and values `kv` reads, then runs the flash body on every (query
/// head, query block).
fn attend<T: Element>(
    isa: Isa,
    threads: usize,
    (q, o): (&TensorView<'_, T>, &mut TensorViewMut<'_, f32>),
    dm: Dims,
    p: AttentionParams,
    kv: &impl KvRows,
) -> Result<()> {
    if dm.q_len == 0 || dm.heads == 0 || dm.d == 0 {
        return Ok(());
    }
    if dm.kv_len == 0 {
        return Err(Error::shape("attention", "no keys to attend to"));
    }
    REUSED_KV.with(|cell| {
        let mut fresh = None;
        let mut reused = cell.try_borrow_mut().ok();
        let slot = match reused.as_deref_mut() {
            Some(s) if dm.kv_heads.saturating_mul(dm.packed_head()) <= REUSED_KV_FLOATS => s,
            _ => &mut fresh,
        };
        let scratch = match slot {
            Some(s) => s,
            None => slot.insert(KvScratch::empty()?),
        };
        pack_kv(isa, kv, dm, threads, scratch)?;
        let (kt, vv) = (&scratch.kt, &scratch.vv);
        let per_head = dm.packed_head();
        let group = dm.heads / dm.kv_heads;
        let q_blocks = dm.q_len.div_ceil(BR);
        let (ql, ol) = (*q.layout(), *o.layout());
        let optr = SharedMut(o.data_mut().as_mut_ptr());
        // Scores in base 2: the flash body weighs keys by 2^(s − max) (its module docs).
        let q_scale = p.scale * std::f32::consts::LOG2_E;
        // Blocks in reverse so the long causal rows (last blocks) start first: better balance.
        pool::global().run(dm.heads * q_blocks, threads, |t| {
            let (h, qb) = (t % dm.heads, q_blocks - 1 - t / dm.heads);
            let first = qb * BR;
            let rows = BR.min(dm.q_len - first);
            let mut qbuf = vec![0f32; flash::padded_q_len(rows, dm.d)];
            for r in 0..rows {
                let base = ql.index_of(&[first + r, h, 0]);
                let dst = &mut qbuf[r * dm.d..(r + 1) * dm.d];
                gather_row(isa, q.data(), base, ql.stride(2), q_scale, dst);
            }
            let kvh = h / group;
            let kv = PackedKv {
                kt: &kt[kvh * per_head..(kvh + 1) * per_head],
                v: &vv[kvh * per_head..(kvh + 1) * per_head],
                kv_len: dm.kv_len,
                d: dm.d,
            };
            let block = QueryBlock {
                q: &qbuf,
                first,
                rows,
                q_len: dm.q_len,
                causal: p.causal,
                window: p.window,
            };
            let mut out = vec![0f32; rows * dm.d];
            flash::attend_block(isa, &kv, &block, &mut out);
            let o_cs = ol.stride(2);
            for r in 0..rows {
                let base = ol.index_of(&[first + r, h, 0]);
                let src = &out[r * dm.d..(r + 1) * dm.d];
                if o_cs == 1 {
                    // SAFETY: (first+r, h, 0..d) is a contiguous run inside the validated,
                    // non-overlapping O view; each task owns a distinct (head, row block).
                    unsafe {
                        std::ptr::copy_nonoverlapping(src.as_ptr(), optr.get().add(base), dm.d)
                    };
                    continue;
                }
                for (c, &x) in src.iter().enumerate() {
                    // SAFETY: (first+r, h, c) is inside the validated, non-overlapping O view;
                    // each task owns a distinct (head, row block) and so distinct elements.
                    unsafe { *optr.get().add(base + c * o_cs) = x };
                }
            }
        });
        Ok(())
    })
}

/// `dst[c] = data[base + c·stride]·scale` widened to f32: one head's row of Q or V. A
/// contiguous row (the models' layout) takes the ISA's vector loop: the per-element
/// index walk cost ~1/6 of the tile work at 512 tokens, d = 64 (AVX2, host B).
pub(crate) fn gather_row<T: Element>(
    isa: Isa,
    data: &[T],
    base: usize,
    stride: usize,
    scale: f32,
    dst: &mut [f32],
) {
    if stride == 1 {
        widen_scaled(isa, &data[base..][..dst.len()], scale, dst);
        return;
    }
    for (c, x) in dst.iter_mut().enumerate() {
        *x = data[base + c * stride].to_f32() * scale;
    }
}

crate::multiversion! {
    /// `dst[i] = src[i]·scale` widened to f32 (×1.0 is exact).
    fn widen_scaled<T: Element>(src: &[T], scale: f32, dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32() * scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::verify::rel_error;
    use rand::{Rng, SeedableRng};
    use tessera_core::Layout;

    /// Q, K, V and O whose head dim is not the innermost axis (stored `[tokens, d,
    /// heads]`, viewed `[tokens, heads, d]`) take the element-strided gather and
    /// scatter, on every ISA, against the float64 reference; a ragged 70-row block
    /// checks the padded query rows are never written.
    #[test]
    fn element_strided_views_match_the_reference() {
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (q_len, kv_len, heads, kv_heads, d) = (70, 75, 4, 2, 64);
        let view = |tokens: usize, h: usize| {
            Layout::contiguous(&[tokens, d, h])
                .and_then(|l| l.transposed(1, 2))
                .expect("layout")
        };
        let mut rand_vec =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
        let (q, k, v) = (
            rand_vec(q_len * heads * d),
            rand_vec(kv_len * kv_heads * d),
            rand_vec(kv_len * kv_heads * d),
        );
        let (lq, lk) = (view(q_len, heads), view(kv_len, kv_heads));
        let scale = 1.0 / (d as f32).sqrt();
        let row = |data: &[f32], l: &Layout, t: usize, h: usize| -> Vec<f64> {
            (0..d)
                .map(|c| data[l.index_of(&[t, h, c])] as f64)
                .collect()
        };
        let mut expected = Vec::new();
        for i in 0..q_len {
            for h in 0..heads {
                let range = reference::key_range(i, q_len, kv_len, true, None);
                let kvh = h / (heads / kv_heads);
                expected.extend(reference::attend(
                    &row(&q, &lq, i, h),
                    range,
                    |j| row(&k, &lk, j, kvh),
                    |j| row(&v, &lk, j, kvh),
                    scale as f64,
                ));
            }
        }
        for isa in Isa::available() {
            let mut o = vec![f32::NAN; q_len * heads * d];
            let params = AttentionParams {
                causal: true,
                scale,
                window: None,
            };
            attention_with(
                isa,
                2,
                &TensorView::new(&q, lq).expect("q"),
                &TensorView::new(&k, lk).expect("k"),
                &TensorView::new(&v, lk).expect("v"),
                &mut TensorViewMut::new(&mut o, lq).expect("o"),
                params,
            )
            .expect("attention");
            let got: Vec<f64> = (0..q_len)
                .flat_map(|i| (0..heads).map(move |h| (i, h)))
                .flat_map(|(i, h)| row(&o, &lq, i, h))
                .collect();
            assert!(
                got.iter().all(|x| x.is_finite()),
                "{isa}: NaN left (seed {seed})"
            );
            let err = rel_error(&got, &expected);
            assert!(err <= TOL_F32.rel, "{isa}: error {err:.2e} (seed {seed})");
        }
    }

    /// The packed K/V buffers are reused across calls on a thread: a call whose keys
    /// end inside a block must not see the values an earlier, longer call left in its
    /// padding (here NaN), on any ISA.
    #[test]
    fn reused_kv_padding_is_zeroed() {
        let (heads, d) = (2, 64);
        let params = AttentionParams {
            causal: false,
            scale: 0.125,
            window: None,
        };
        let run = |isa: Isa, len: usize, v: &[f32], o: &mut [f32]| {
            let l = Layout::contiguous(&[len, heads, d]).expect("layout");
            let ones = vec![0.5f32; len * heads * d];
            attention_with(
                isa,
                1,
                &TensorView::new(&ones, l).expect("q"),
                &TensorView::new(&ones, l).expect("k"),
                &TensorView::new(v, l).expect("v"),
                &mut TensorViewMut::new(o, l).expect("o"),
                params,
            )
            .expect("attention");
        };
        for isa in Isa::available() {
            let long = vec![f32::NAN; 128 * heads * d];
            run(isa, 128, &long, &mut vec![0.0; 128 * heads * d]);
            // Equal scores: every output is the mean of the values, here 1.0.
            let mut o = vec![f32::NAN; 70 * heads * d];
            run(isa, 70, &vec![1.0; 70 * heads * d], &mut o);
            assert!(
                o.iter().all(|&x| (x - 1.0).abs() < 1e-6),
                "{isa}: {:?}",
                &o[..4]
            );
        }
    }
}
