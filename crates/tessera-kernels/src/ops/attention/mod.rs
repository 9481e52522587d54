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
    Ok(dims)
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

/// Packs Kᵀ and V of every KV head to f32 (once per call, shared by all query heads).
fn pack_kv<T: Element>(
    k: &TensorView<'_, T>,
    v: &TensorView<'_, T>,
    dm: Dims,
    threads: usize,
) -> Result<(AlignedVec<f32>, AlignedVec<f32>)> {
    let kv_pad = dm.kv_len.next_multiple_of(flash::BC);
    let per_head = kv_pad * dm.d;
    let mut kt = AlignedVec::<f32>::zeroed(dm.kv_heads * per_head)?;
    let mut vv = AlignedVec::<f32>::zeroed(dm.kv_heads * per_head)?;
    let (ktp, vvp) = (SharedMut(kt.as_mut_ptr()), SharedMut(vv.as_mut_ptr()));
    let (kl, vl) = (k.layout(), v.layout());
    pool::global().run(dm.kv_heads, threads, |h| {
        // SAFETY: task h writes only head h's disjoint `per_head` slice of each buffer.
        let (kt, vv) = unsafe {
            (
                std::slice::from_raw_parts_mut(ktp.get().add(h * per_head), per_head),
                std::slice::from_raw_parts_mut(vvp.get().add(h * per_head), per_head),
            )
        };
        let (k_cs, v_cs) = (kl.stride(2), vl.stride(2));
        for j in 0..dm.kv_len {
            let (kb, vb) = (kl.index_of(&[j, h, 0]), vl.index_of(&[j, h, 0]));
            for p in 0..dm.d {
                kt[PackedKv::kt_index(dm.d, j, p)] = k.data()[kb + p * k_cs].to_f32();
                vv[j * dm.d + p] = v.data()[vb + p * v_cs].to_f32();
            }
        }
    });
    Ok((kt, vv))
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
    if dm.q_len == 0 || dm.heads == 0 || dm.d == 0 {
        return Ok(());
    }
    if dm.kv_len == 0 {
        return Err(Error::shape("attention", "no keys to attend to"));
    }
    let (kt, vv) = pack_kv(k, v, dm, threads)?;
    let kv_pad = dm.kv_len.next_multiple_of(flash::BC);
    let per_head = kv_pad * dm.d;
    let group = dm.heads / dm.kv_heads;
    let q_blocks = dm.q_len.div_ceil(BR);
    let (ql, ol) = (*q.layout(), *o.layout());
    let optr = SharedMut(o.data_mut().as_mut_ptr());
    // Blocks in reverse so the long causal rows (last blocks) start first: better balance.
    pool::global().run(dm.heads * q_blocks, threads, |t| {
        let (h, qb) = (t % dm.heads, q_blocks - 1 - t / dm.heads);
        let first = qb * BR;
        let rows = BR.min(dm.q_len - first);
        let mut qbuf = vec![0f32; rows * dm.d];
        let (q_data, q_cs) = (q.data(), ql.stride(2));
        for r in 0..rows {
            let base = ql.index_of(&[first + r, h, 0]);
            for (c, x) in qbuf[r * dm.d..(r + 1) * dm.d].iter_mut().enumerate() {
                *x = q_data[base + c * q_cs].to_f32() * p.scale;
            }
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
            for (c, &x) in out[r * dm.d..(r + 1) * dm.d].iter().enumerate() {
                // SAFETY: (first+r, h, c) is inside the validated, non-overlapping O view;
                // each task owns a distinct (head, row block) and so distinct elements.
                unsafe { *optr.get().add(base + c * o_cs) = x };
            }
        }
    });
    Ok(())
}
