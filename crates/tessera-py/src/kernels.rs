//! The kernels on caller-owned arrays: each function borrows its arguments
//! ([`crate::array`]), checks them, and runs the same entry point the engine calls, with
//! the GIL released. Outputs are float32 (the kernels accumulate and write f32); inputs
//! may be float32, float16 or bfloat16 where the kernel takes them, all of one type.

use crate::array::{borrow, check_disjoint, output, Elem, Raw};
use crate::core_err;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use tessera_core::Isa;
use tessera_kernels::ops::attention::{attention, AttentionParams};
use tessera_kernels::ops::gemm::{gemm, GemmParams};
use tessera_kernels::ops::layer_norm::{layer_norm as layer_norm_op, LayerNorm};
use tessera_kernels::ops::paged_attention::{
    paged_attention as paged_op, PagedKvCache, PagedParams, PagedSeqs, NO_SCALES,
};
use tessera_kernels::ops::rms_norm::{rms_norm as rms_norm_op, rms_norm_residual, RmsNorm};
use tessera_kernels::ops::rope::{rope as rope_op, Rope, RopeStyle};
use tessera_kernels::ops::softmax::softmax as softmax_op;
use tessera_kernels::ops::swiglu::swiglu as swiglu_op;
use tessera_kernels::pool;

/// Runs `$body` with `$T` bound to the float element type of `$raw`, or raises
/// TypeError for other types.
macro_rules! with_float {
    ($name:expr, $raw:expr, $T:ident => $body:expr) => {
        match $raw.elem {
            Elem::F32 => {
                type $T = f32;
                $body
            }
            Elem::F16 => {
                type $T = half::f16;
                $body
            }
            Elem::BF16 => {
                type $T = half::bf16;
                $body
            }
            other => Err(PyTypeError::new_err(format!(
                "{}: expected float32, float16 or bfloat16, got {}",
                $name,
                other.name()
            ))),
        }
    };
}

/// Errors unless every named array has the element type of the first.
fn same_elem(args: &[(&str, &Raw)]) -> PyResult<()> {
    let (first, r0) = args[0];
    for (name, r) in &args[1..] {
        if r.elem != r0.elem {
            return Err(PyTypeError::new_err(format!(
                "{name} is {} but {first} is {}: pass one element type",
                r.elem.name(),
                r0.elem.name()
            )));
        }
    }
    Ok(())
}

/// A 1-D float32 parameter vector (γ, β) as an owned Vec (the kernels' parameter structs
/// own theirs; these are one row long).
fn param_vec(name: &str, obj: &Bound<'_, PyAny>, n: usize) -> PyResult<Vec<f32>> {
    let a = borrow(name, obj)?;
    a.raw.expect(name, Elem::F32)?;
    if a.raw.dims != [n] {
        return Err(PyValueError::new_err(format!(
            "{name}: shape {:?}, expected [{n}] (the last dim of x)",
            a.raw.dims
        )));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: `a` is alive and float32; nothing writes to it here. Its span ends at
    // element (n − 1)·stride, so the strided walk below stays inside the slice. (A
    // per-element `TensorView::get` made a 1×576 rms_norm call 2.9 µs instead of 1.1.)
    let data = unsafe { a.raw.slice::<f32>() };
    Ok(match a.raw.strides[0] {
        // A broadcast vector (numpy's zero stride) spans its one element.
        0 => vec![data[0]; n],
        step => data.iter().step_by(step).copied().collect(),
    })
}

/// The last dimension (0 for a 0-d array).
fn last_dim(r: &Raw) -> usize {
    r.dims.last().copied().unwrap_or(0)
}

/// `out = alpha·a·b + beta·out`: a [M, K] or [batch, M, K], b [K, N] or [batch, K, N].
///
/// Float32, float16 or bfloat16 inputs (one type); out is float32 [M, N] or
/// [batch, M, N], created when not given (then beta is moot).
#[pyfunction]
#[pyo3(signature = (a, b, out=None, *, alpha=1.0, beta=0.0))]
#[pyo3(name = "gemm")]
pub fn gemm_py<'py>(
    py: Python<'py>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
    alpha: f32,
    beta: f32,
) -> PyResult<Bound<'py, PyAny>> {
    let (a, b) = (borrow("a", a)?, borrow("b", b)?);
    same_elem(&[("a", &a.raw), ("b", &b.raw)])?;
    let (ad, bd) = (&a.raw.dims, &b.raw.dims);
    if !(2..=3).contains(&ad.len()) || !(2..=3).contains(&bd.len()) {
        return Err(PyValueError::new_err(format!(
            "gemm: a {ad:?} and b {bd:?} must be 2-D or 3-D (batched)"
        )));
    }
    let m = ad[ad.len() - 2];
    let n = bd[bd.len() - 1];
    let mut dims = vec![m, n];
    if ad.len() == 3 || bd.len() == 3 {
        let batch = if ad.len() == 3 { ad[0] } else { bd[0] };
        dims.insert(0, batch);
    }
    let (obj, o) = output(py, out, &dims, &[("a", &a.raw), ("b", &b.raw)])?;
    let p = GemmParams { alpha, beta };
    let (ar, br, or) = (&a.raw, &b.raw, &o.raw);
    py.detach(|| {
        with_float!("a", ar, T => {
            // SAFETY: the arrays are borrowed for this call, typed T/f32 by the dispatch,
            // and out is disjoint from a and b (checked above).
            unsafe { gemm::<T>(&ar.view()?, &br.view()?, &mut or.view_mut()?, p) }.map_err(core_err)
        })
    })?;
    Ok(obj)
}

/// Attention `softmax(scale·q·kᵀ)·v` per head: q [q_len, heads, d], k and v
/// [kv_len, kv_heads, d] (heads a multiple of kv_heads: GQA/MQA).
///
/// causal: query i sees keys up to kv_len − q_len + i; window: at most that many most
/// recent visible keys; scale defaults to 1/√d. Returns out [q_len, heads, d] float32.
#[pyfunction]
#[pyo3(signature = (q, k, v, out=None, *, causal=false, scale=None, window=None))]
#[allow(clippy::too_many_arguments)] // q, k, v, out are the op; the rest keyword knobs
#[pyo3(name = "attention")]
pub fn attention_py<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
    causal: bool,
    scale: Option<f32>,
    window: Option<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let (q, k, v) = (borrow("q", q)?, borrow("k", k)?, borrow("v", v)?);
    same_elem(&[("q", &q.raw), ("k", &k.raw), ("v", &v.raw)])?;
    if q.raw.rank() != 3 {
        return Err(PyValueError::new_err(format!(
            "attention: q {:?} must be [q_len, heads, d]",
            q.raw.dims
        )));
    }
    let d = q.raw.dims[2];
    let (obj, o) = output(
        py,
        out,
        &q.raw.dims,
        &[("q", &q.raw), ("k", &k.raw), ("v", &v.raw)],
    )?;
    let p = AttentionParams {
        causal,
        scale: scale.unwrap_or(1.0 / (d.max(1) as f32).sqrt()),
        window,
    };
    let (qr, kr, vr, or) = (&q.raw, &k.raw, &v.raw, &o.raw);
    py.detach(|| {
        with_float!("q", qr, T => {
            // SAFETY: as in gemm.
            unsafe {
                attention::<T>(&qr.view()?, &kr.view()?, &vr.view()?, &mut or.view_mut()?, p)
            }
            .map_err(core_err)
        })
    })?;
    Ok(obj)
}

/// Decode attention over a paged KV cache: q [n_seqs, heads, d]; k_cache and v_cache
/// [num_blocks, block_size, kv_heads, d] (contiguous); block_tables int32
/// [n_seqs, max_blocks]; context_lens int32 or int64 [n_seqs]. Sequence s attends to its
/// first context_lens[s] cached tokens, token t at block block_tables[s, t // block_size].
#[pyfunction]
#[pyo3(signature = (q, k_cache, v_cache, block_tables, context_lens, out=None, *, scale=None))]
#[allow(clippy::too_many_arguments)] // the op's operands; scale is a keyword
#[pyo3(name = "paged_attention")]
pub fn paged_attention_py<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k_cache: &Bound<'py, PyAny>,
    v_cache: &Bound<'py, PyAny>,
    block_tables: &Bound<'py, PyAny>,
    context_lens: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
    scale: Option<f32>,
) -> PyResult<Bound<'py, PyAny>> {
    let q = borrow("q", q)?;
    q.raw.expect("q", Elem::F32)?;
    let (kc, vc) = (borrow("k_cache", k_cache)?, borrow("v_cache", v_cache)?);
    same_elem(&[("k_cache", &kc.raw), ("v_cache", &vc.raw)])?;
    for (name, c) in [("k_cache", &kc), ("v_cache", &vc)] {
        if c.raw.rank() != 4 || !c.raw.is_contiguous() || c.raw.dims != kc.raw.dims {
            return Err(PyValueError::new_err(format!(
                "{name}: shape {:?} must be contiguous [num_blocks, block_size, kv_heads, d], \
                 the same for both caches",
                c.raw.dims
            )));
        }
    }
    let bt = borrow("block_tables", block_tables)?;
    bt.raw.expect("block_tables", Elem::I32)?;
    if q.raw.rank() != 3 || bt.raw.rank() != 2 || bt.raw.dims[0] != q.raw.dims[0] {
        return Err(PyValueError::new_err(format!(
            "paged_attention: q {:?} must be [n_seqs, heads, d] and block_tables {:?} \
             [n_seqs, max_blocks]",
            q.raw.dims, bt.raw.dims
        )));
    }
    // SAFETY: `bt` is alive for this call.
    let tables: Vec<u32> = unsafe { bt.raw.indices("block_tables") }?;
    let cl = borrow("context_lens", context_lens)?;
    if cl.raw.dims != [q.raw.dims[0]] {
        return Err(PyValueError::new_err(format!(
            "context_lens: shape {:?}, expected [{}]",
            cl.raw.dims, q.raw.dims[0]
        )));
    }
    // SAFETY: `cl` is alive for this call.
    let lens: Vec<usize> = unsafe { cl.raw.indices("context_lens") }?;
    let (obj, o) = output(
        py,
        out,
        &q.raw.dims,
        &[("q", &q.raw), ("k_cache", &kc.raw), ("v_cache", &vc.raw)],
    )?;
    let d = q.raw.dims[2];
    let cd = kc.raw.dims.clone();
    let max_blocks = bt.raw.dims[1];
    let p = PagedParams {
        scale: scale.unwrap_or(1.0 / (d.max(1) as f32).sqrt()),
        chunk: 0,
        threads: pool::global().threads(),
    };
    let (qr, kr, vr, or) = (&q.raw, &kc.raw, &vc.raw, &o.raw);
    py.detach(|| {
        with_float!("k_cache", kr, T => {
            // SAFETY: as in gemm; the caches are contiguous, so their slices are the
            // [num_blocks·block_size·kv_heads·d] buffers the kernel indexes.
            unsafe {
                let cache = PagedKvCache::<T> {
                    k: kr.slice(),
                    v: vr.slice(),
                    // Float caches only here (`with_float!`): no per-row scales.
                    k_scales: NO_SCALES,
                    v_scales: NO_SCALES,
                    num_blocks: cd[0],
                    block_size: cd[1],
                    kv_heads: cd[2],
                    d: cd[3],
                };
                let seqs = PagedSeqs {
                    block_tables: &tables,
                    max_blocks,
                    context_lens: &lens,
                };
                paged_op(Isa::best(), &qr.view()?, &cache, &seqs, &mut or.view_mut()?, p)
            }
            .map_err(core_err)
        })
    })?;
    Ok(obj)
}

/// RMSNorm over the last dim: `out = x / sqrt(mean(x²) + eps) · weight`.
///
/// With `residual` (float32, contiguous, x's shape, x float32 contiguous): first
/// `residual += x` in place, then out = rmsnorm(residual)·weight (the fused pre-norm of a
/// transformer block).
#[pyfunction]
#[pyo3(signature = (x, weight, eps=1e-6, out=None, *, residual=None))]
pub fn rms_norm<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
    eps: f32,
    out: Option<&Bound<'py, PyAny>>,
    residual: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let x = borrow("x", x)?;
    let p = RmsNorm {
        gamma: param_vec("weight", weight, last_dim(&x.raw))?,
        eps,
    };
    let (obj, o) = output(py, out, &x.raw.dims, &[("x", &x.raw)])?;
    let isa = Isa::best();
    if let Some(res) = residual {
        let r = borrow("residual", res)?;
        r.raw.expect("residual", Elem::F32)?;
        x.raw.expect("x", Elem::F32)?;
        if !r.writeable || r.raw.dims != x.raw.dims || !r.raw.is_contiguous() {
            return Err(PyValueError::new_err(format!(
                "residual: must be a writeable contiguous float32 array of x's shape {:?}",
                x.raw.dims
            )));
        }
        if !x.raw.is_contiguous() || !o.raw.is_contiguous() {
            return Err(PyValueError::new_err(
                "rms_norm with residual: x and out must be contiguous",
            ));
        }
        check_disjoint("residual", &r.raw, &[("x", &x.raw), ("out", &o.raw)])?;
        let (xr, rr, or) = (&x.raw, &r.raw, &o.raw);
        py.detach(|| {
            // SAFETY: the three arrays are alive, float32, contiguous and pairwise
            // disjoint (checked above).
            unsafe { rms_norm_residual(isa, xr.slice(), rr.slice_mut(), &p, or.slice_mut()) }
                .map_err(core_err)
        })?;
        return Ok(obj);
    }
    let (xr, or) = (&x.raw, &o.raw);
    py.detach(|| {
        with_float!("x", xr, T => {
            // SAFETY: as in gemm.
            unsafe { rms_norm_op::<T>(isa, &xr.view()?, &p, &mut or.view_mut()?) }.map_err(core_err)
        })
    })?;
    Ok(obj)
}

/// LayerNorm over the last dim: `out = (x − mean) / sqrt(var + eps) · weight + bias`.
#[pyfunction]
#[pyo3(signature = (x, weight, bias, eps=1e-5, out=None))]
pub fn layer_norm<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
    bias: &Bound<'py, PyAny>,
    eps: f32,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let x = borrow("x", x)?;
    let n = last_dim(&x.raw);
    let p = LayerNorm {
        gamma: param_vec("weight", weight, n)?,
        beta: param_vec("bias", bias, n)?,
        eps,
    };
    let (obj, o) = output(py, out, &x.raw.dims, &[("x", &x.raw)])?;
    let (xr, or) = (&x.raw, &o.raw);
    py.detach(|| {
        with_float!("x", xr, T => {
            // SAFETY: as in gemm.
            unsafe { layer_norm_op::<T>(Isa::best(), &xr.view()?, &p, &mut or.view_mut()?) }
                .map_err(core_err)
        })
    })?;
    Ok(obj)
}

/// Rotary position embedding of x [tokens, heads, d] at `positions` (one per token).
///
/// style "half_split" rotates (xᵢ, xᵢ₊d/2) (Hugging Face, NeoX); "interleaved" rotates
/// (x₂ᵢ, x₂ᵢ₊₁) (GGUF Llama). Frequencies theta^(−2i/d).
#[pyfunction]
#[pyo3(signature = (x, positions, *, theta=10000.0, style="half_split", out=None))]
pub fn rope<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    positions: &Bound<'py, PyAny>,
    theta: f64,
    style: &str,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let x = borrow("x", x)?;
    if x.raw.rank() != 3 {
        return Err(PyValueError::new_err(format!(
            "rope: x {:?} must be [tokens, heads, d]",
            x.raw.dims
        )));
    }
    let style = match style {
        "half_split" | "neox" => RopeStyle::HalfSplit,
        "interleaved" | "gptj" => RopeStyle::Interleaved,
        s => {
            return Err(PyValueError::new_err(format!(
                "rope: style {s:?} is not \"half_split\" or \"interleaved\""
            )))
        }
    };
    let pa = borrow("positions", positions)?;
    if pa.raw.dims != [x.raw.dims[0]] {
        return Err(PyValueError::new_err(format!(
            "positions: shape {:?}, expected [{}] (one per token)",
            pa.raw.dims, x.raw.dims[0]
        )));
    }
    // SAFETY: `pa` is alive for this call.
    let pos: Vec<usize> = unsafe { pa.raw.indices("positions") }?;
    let table = Rope::new(style, &pos, x.raw.dims[1], x.raw.dims[2], theta).map_err(core_err)?;
    let (obj, o) = output(py, out, &x.raw.dims, &[("x", &x.raw)])?;
    let (xr, or) = (&x.raw, &o.raw);
    py.detach(|| {
        with_float!("x", xr, T => {
            // SAFETY: as in gemm.
            unsafe { rope_op::<T>(Isa::best(), &xr.view()?, &table, &mut or.view_mut()?) }
                .map_err(core_err)
        })
    })?;
    Ok(obj)
}

/// `out = silu(gate)·up` elementwise (the Llama MLP activation); gate and up share shape.
#[pyfunction]
#[pyo3(signature = (gate, up, out=None))]
pub fn swiglu<'py>(
    py: Python<'py>,
    gate: &Bound<'py, PyAny>,
    up: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (g, u) = (borrow("gate", gate)?, borrow("up", up)?);
    same_elem(&[("gate", &g.raw), ("up", &u.raw)])?;
    if g.raw.dims != u.raw.dims {
        return Err(PyValueError::new_err(format!(
            "swiglu: gate {:?} and up {:?} differ",
            g.raw.dims, u.raw.dims
        )));
    }
    let (obj, o) = output(py, out, &g.raw.dims, &[("gate", &g.raw), ("up", &u.raw)])?;
    let (gr, ur, or) = (&g.raw, &u.raw, &o.raw);
    py.detach(|| {
        with_float!("gate", gr, T => {
            // SAFETY: as in gemm.
            unsafe { swiglu_op::<T>(Isa::best(), &gr.view()?, &ur.view()?, &mut or.view_mut()?) }
                .map_err(core_err)
        })
    })?;
    Ok(obj)
}

/// Softmax over the last dim of a 2-D or 3-D array.
#[pyfunction]
#[pyo3(signature = (x, out=None))]
pub fn softmax<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let x = borrow("x", x)?;
    let (obj, o) = output(py, out, &x.raw.dims, &[("x", &x.raw)])?;
    let (xr, or) = (&x.raw, &o.raw);
    py.detach(|| {
        with_float!("x", xr, T => {
            // SAFETY: as in gemm.
            unsafe { softmax_op::<T>(Isa::best(), &xr.view()?, &mut or.view_mut()?) }
                .map_err(core_err)
        })
    })?;
    Ok(obj)
}
