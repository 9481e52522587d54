//! The forward pass on an accelerator: a [`Llama`] copied once onto a
//! [`Device`] (`tessera run --device wgpu|cuda`), run as the registry's device calls.
//!
//! Why it is shaped so:
//! - Every launch is a [`DeviceCall`] the registry verifies against float64 (RMSNorm,
//!   RoPE, SwiGLU, add, quantized matmul, GEMM, paged attention, embedding), so the
//!   model adds no kernel of its own; a backend that lacks one is named at load.
//! - Weights go up once. Q4_0/Q4_1/Q8_0 matrices keep their ggml blocks
//!   ([`Device::upload_blocks`]); every other format is dequantized to f32 once and runs
//!   through the GEMM with `Wᵀ` as a strided view. Stacked q/k/v and gate/up layers are
//!   split back into their parts by rows (a ggml row is whole blocks), so each output
//!   lands in its own buffer. A bias is a rank-1 GEMM update `y += 1·bᵀ`.
//! - The KV cache lives on the device, f32, one buffer per layer laid out as the paged
//!   attention call's blocks with an identity block table: values go straight from the
//!   matmul into their positions (the output view's offset), and rotated keys from RoPE
//!   (the row call's `out_offset`). Nothing but the token ids, the step's cos/sin table
//!   and the logits of the last position crosses the bus per step.
//! - The residual stream ping-pongs between two buffers: a device kernel may not read
//!   and write one buffer in one call, so `x + sublayer` goes to the other.
//! - Calls are queued ([`Device::enqueue`]); the logits' download waits for them.

use super::{Llama, SharedInput};
use crate::generate::{Decoder, Sequence};
use crate::kv_cache::{KvDtype, BLOCK};
use crate::linear::Linear;
use crate::{Error, Result};
use std::ops::Range;
use std::sync::Arc;
use tessera_core::device::{
    Device, DeviceBuffer, DeviceCall, DeviceMatrix, PagedCall, PagedShape, RowOp,
};
use tessera_core::DType;
use tessera_kernels::ops::rope::{Rope, RopeStyle};

/// A [`Llama`] whose weights live on a device.
pub struct DeviceLlama {
    cfg: super::Config,
    dev: Arc<dyn Device>,
    rope_freqs: Vec<f64>,
    /// The token embedding as f32 rows `[vocab, dim]` (the gather reads f32).
    embed: DeviceBuffer,
    layers: Vec<DeviceLayer>,
    norm: DeviceBuffer,
    head: DeviceLinear,
}

impl std::fmt::Debug for DeviceLlama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceLlama({} on {})",
            self.cfg.n_layers,
            self.dev.name()
        )
    }
}

struct DeviceLayer {
    attn_norm: DeviceBuffer,
    q: DeviceLinear,
    k: DeviceLinear,
    v: DeviceLinear,
    o: DeviceLinear,
    ffn_norm: DeviceBuffer,
    gate: DeviceLinear,
    up: DeviceLinear,
    down: DeviceLinear,
}

/// How a matrix is stored on the device.
enum Weights {
    /// ggml blocks, for the device's quantized matmul.
    Blocks(DeviceBuffer),
    /// f32 `[out, in]`, for its GEMM.
    Dense(DeviceBuffer),
}

struct DeviceLinear {
    w: Weights,
    bias: Option<DeviceBuffer>,
    inp: usize,
    out: usize,
}

/// The device ops a forward pass launches, with the dtype each must support.
const NEEDED: [(&str, DType); 8] = [
    ("embedding", DType::F32),
    ("rms_norm", DType::F32),
    ("add", DType::F32),
    ("swiglu", DType::F32),
    ("rope", DType::F32),
    ("rope_neox", DType::F32),
    ("paged_attention", DType::F32),
    ("gemm", DType::F32),
];

/// A `[rows, width]` row-major view of a whole buffer from element `offset`.
fn rows_of(buf: &DeviceBuffer, offset: usize, width: usize) -> DeviceMatrix<'_> {
    DeviceMatrix {
        buf,
        offset,
        strides: [0, width, 1],
    }
}

impl DeviceLinear {
    /// Rows `rows` of `l` (all of a plain layer, one part of a stacked one) on `dev`.
    fn upload(dev: &dyn Device, l: &dyn Linear, rows: Range<usize>) -> Result<Self> {
        let (inp, out) = (l.in_features(), rows.len());
        let w = match l.ggml_blocks() {
            Some((dtype, bytes)) if dev.supports("qmatmul", dtype) => {
                let per_row = bytes.len() / l.out_features();
                let part = &bytes[rows.start * per_row..rows.end * per_row];
                Weights::Blocks(dev.upload_blocks(dtype, out, inp, part)?)
            }
            _ => {
                let mut w = vec![0f32; out * inp];
                for (r, row) in rows.clone().zip(w.chunks_exact_mut(inp)) {
                    l.row(r, row)?;
                }
                Weights::Dense(dev.upload(&w)?)
            }
        };
        let bias = match l.bias() {
            Some(b) => Some(dev.upload(&b[rows])?),
            None => None,
        };
        Ok(DeviceLinear { w, bias, inp, out })
    }

    /// Each part of a layer group, split by rows where the group is stacked.
    fn parts<const N: usize>(dev: &dyn Device, group: &SharedInput<N>) -> Result<Vec<Self>> {
        match group {
            SharedInput::Separate(parts) => parts
                .iter()
                .map(|p| Self::upload(dev, &**p, 0..p.out_features()))
                .collect(),
            SharedInput::Stacked(w, outs) => {
                let mut at = 0;
                outs.iter()
                    .map(|&o| {
                        at += o;
                        Self::upload(dev, &**w, at - o..at)
                    })
                    .collect()
            }
        }
    }

    /// `y[n, out] = x[n, in]·Wᵀ (+ b)`; `ones` holds at least `n` ones (the bias's
    /// rank-1 update).
    fn forward(
        &self,
        dev: &dyn Device,
        (x, y): (DeviceMatrix<'_>, DeviceMatrix<'_>),
        n: usize,
        ones: &DeviceBuffer,
    ) -> Result<()> {
        match &self.w {
            Weights::Blocks(w) => dev.enqueue(&DeviceCall::QMatmul { w, x, y, m: n })?,
            Weights::Dense(w) => dev.enqueue(&DeviceCall::Gemm {
                a: x,
                // Wᵀ [in, out]: element (i, j) is W[j, i].
                b: DeviceMatrix {
                    buf: w,
                    offset: 0,
                    strides: [0, 1, self.inp],
                },
                c: y,
                dims: [1, n, self.out, self.inp],
                alpha: 1.0,
                beta: 0.0,
            })?,
        }
        if let Some(b) = &self.bias {
            dev.enqueue(&DeviceCall::Gemm {
                a: rows_of(ones, 0, 1),
                b: rows_of(b, 0, self.out),
                c: y,
                dims: [1, n, self.out, 1],
                alpha: 1.0,
                beta: 1.0,
            })?;
        }
        Ok(())
    }
}

impl DeviceLlama {
    /// Copies `model` onto `dev`. A backend without one of the calls the forward
    /// launches is an error naming it. Load the model with `Activations::F32`: a layer
    /// repacked for integer activations no longer holds its blocks and goes up as f32
    /// (correct, but 8× the memory of Q4 blocks and the slower GEMM path).
    pub fn new(model: &Llama, dev: Arc<dyn Device>) -> Result<Self> {
        if let Some((op, _)) = NEEDED.iter().find(|(op, t)| !dev.supports(op, *t)) {
            return Err(Error::Model(format!(
                "the {} device ({}) has no {op} kernel, which the forward pass needs",
                dev.kind(),
                dev.name()
            )));
        }
        let c = &model.cfg;
        let d = &*dev;
        let mut table = vec![0f32; c.vocab * c.dim];
        for (r, row) in table.chunks_exact_mut(c.dim).enumerate() {
            model.embed.row(r, row)?;
        }
        let embed = d.upload(&table)?;
        drop(table);
        let mut layers = Vec::with_capacity(model.layers.len());
        for l in &model.layers {
            let [q, k, v]: [DeviceLinear; 3] = DeviceLinear::parts(d, &l.qkv)?
                .try_into()
                .map_err(|_| Error::Model("q/k/v split".into()))?;
            let [gate, up]: [DeviceLinear; 2] = DeviceLinear::parts(d, &l.gate_up)?
                .try_into()
                .map_err(|_| Error::Model("gate/up split".into()))?;
            let whole = |w: &dyn Linear| DeviceLinear::upload(d, w, 0..w.out_features());
            layers.push(DeviceLayer {
                attn_norm: d.upload(&l.attn_norm.gamma)?,
                q,
                k,
                v,
                o: whole(&*l.o)?,
                ffn_norm: d.upload(&l.ffn_norm.gamma)?,
                gate,
                up,
                down: whole(&*l.down)?,
            });
        }
        let head = model.output.as_deref().unwrap_or(&*model.embed);
        Ok(DeviceLlama {
            cfg: c.clone(),
            rope_freqs: model.rope_freqs.clone(),
            embed,
            layers,
            norm: d.upload(&model.norm.gamma)?,
            head: DeviceLinear::upload(d, head, 0..head.out_features())?,
            dev,
        })
    }

    /// The device it runs on.
    pub fn device(&self) -> &dyn Device {
        &*self.dev
    }

    /// How many matrices run through the quantized matmul (their blocks uploaded) and
    /// how many through the f32 GEMM (dequantized at upload).
    pub fn matmul_paths(&self) -> (usize, usize) {
        let all = self
            .layers
            .iter()
            .flat_map(|l| [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]);
        let blocks = all
            .chain([&self.head])
            .filter(|l| matches!(l.w, Weights::Blocks(_)))
            .count();
        (blocks, self.layers.len() * 7 + 1 - blocks)
    }
}

impl Decoder for DeviceLlama {
    fn config(&self) -> &super::Config {
        &self.cfg
    }
    fn sequence(&self, capacity: usize, kv_dtype: KvDtype) -> Result<Box<dyn Sequence + '_>> {
        if kv_dtype != KvDtype::F32 {
            return Err(Error::Model(format!(
                "the device KV cache holds f32, not {kv_dtype:?} (--kv-cache f32)"
            )));
        }
        if capacity == 0 || capacity > self.cfg.context {
            return Err(Error::Model(format!(
                "a sequence of {capacity} positions (the model's context is {})",
                self.cfg.context
            )));
        }
        let blocks = capacity.div_ceil(BLOCK);
        let per_layer = blocks * BLOCK * self.cfg.kv_dim();
        let zeros = vec![0f32; per_layer];
        let cache = |_| self.dev.upload(&zeros).map_err(Error::from);
        Ok(Box::new(DeviceSequence {
            model: self,
            k: (0..self.cfg.n_layers).map(cache).collect::<Result<_>>()?,
            v: (0..self.cfg.n_layers).map(cache).collect::<Result<_>>()?,
            table: (0..blocks as u32).collect(),
            capacity,
            len: 0,
            scratch: None,
        }))
    }
}

/// One sequence's device cache and the step's activations.
struct DeviceSequence<'a> {
    model: &'a DeviceLlama,
    /// Keys and values per layer, `[blocks, BLOCK, kv_heads, head_dim]`.
    k: Vec<DeviceBuffer>,
    v: Vec<DeviceBuffer>,
    /// The identity block table: block b holds positions `b·BLOCK..`.
    table: Vec<u32>,
    capacity: usize,
    len: usize,
    /// Activations for the last step's token count (decode steps reuse them).
    scratch: Option<Scratch>,
}

/// A step's activations on the device, for `n` tokens.
struct Scratch {
    n: usize,
    /// The residual stream, ping-ponged (module docs).
    x: [DeviceBuffer; 2],
    h: DeviceBuffer,
    q: DeviceBuffer,
    qr: DeviceBuffer,
    k: DeviceBuffer,
    att: DeviceBuffer,
    proj: DeviceBuffer,
    gate: DeviceBuffer,
    up: DeviceBuffer,
    act: DeviceBuffer,
    rope: DeviceBuffer,
    ones: DeviceBuffer,
    logits: DeviceBuffer,
}

impl Scratch {
    fn new(dev: &dyn Device, c: &super::Config, n: usize) -> Result<Self> {
        let z = |len: usize| dev.upload(&vec![0f32; n * len]);
        Ok(Scratch {
            n,
            x: [z(c.dim)?, z(c.dim)?],
            h: z(c.dim)?,
            q: z(c.dim)?,
            qr: z(c.dim)?,
            k: z(c.kv_dim())?,
            att: z(c.dim)?,
            proj: z(c.dim)?,
            gate: z(c.ffn_dim)?,
            up: z(c.ffn_dim)?,
            act: z(c.ffn_dim)?,
            rope: z(c.head_dim)?,
            ones: dev.upload(&vec![1f32; n])?,
            logits: dev.upload(&vec![0f32; c.vocab])?,
        })
    }
}

/// Queues one row-wise call: `op` over `inputs` (and its parameter row) into `out`
/// from element `out_offset`, `rows × n`.
fn row_call(
    dev: &dyn Device,
    op: RowOp,
    (inputs, gamma): (&[&DeviceBuffer], Option<&DeviceBuffer>),
    (out, out_offset): (&DeviceBuffer, usize),
    [rows, n]: [usize; 2],
) -> Result<()> {
    Ok(dev.enqueue(&DeviceCall::Rows {
        op,
        inputs,
        gamma,
        out,
        out_offset,
        rows,
        n,
    })?)
}

impl Sequence for DeviceSequence<'_> {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let m = self.model;
        let c = &m.cfg;
        let (n, pos0) = (tokens.len(), self.len);
        if n == 0 {
            return Err(Error::Model("forward needs at least one token".into()));
        }
        if pos0 + n > self.capacity {
            return Err(Error::Model(format!(
                "{} positions exceed the sequence's {}",
                pos0 + n,
                self.capacity
            )));
        }
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(Error::Model(format!(
                "token id {t} ≥ vocabulary size {}",
                c.vocab
            )));
        }
        let dev = &*m.dev;
        if self.scratch.as_ref().is_none_or(|s| s.n != n) {
            self.scratch = None; // free the old step's buffers first
            self.scratch = Some(Scratch::new(dev, c, n)?);
        }
        let s = self.scratch.as_ref().expect("made above");
        let positions: Vec<usize> = (pos0..pos0 + n).collect();
        let rope =
            Rope::with_frequencies(c.rope_style, &positions, c.heads, c.head_dim, &m.rope_freqs)?;
        dev.write(&s.rope, rope.table())?;
        let (d, kv, f, hd) = (c.dim, c.kv_dim(), c.ffn_dim, c.head_dim);
        dev.enqueue(&DeviceCall::Embedding {
            table: rows_of(&m.embed, 0, d),
            vocab: c.vocab,
            dim: d,
            ids: tokens,
            out: &s.x[0],
        })?;
        let rows = |op, inputs: &[&DeviceBuffer], gamma, out, dims| {
            row_call(dev, op, (inputs, gamma), out, dims)
        };
        let norm = RowOp::RmsNorm { eps: c.eps };
        let half_split = c.rope_style == RopeStyle::HalfSplit;
        let rope_of = |heads| RowOp::Rope { heads, half_split };
        let mat = |buf, width| rows_of(buf, 0, width);
        let shape = PagedShape {
            block_tables: &self.table,
            max_blocks: self.table.len(),
            context_lens: &[pos0 + n],
            q_lens: &[n],
            heads: c.heads,
            kv_heads: c.kv_heads,
            d: hd,
            block_size: BLOCK,
            scale: 1.0 / (hd as f32).sqrt(),
            causal: true,
            window: None,
        };
        // x + proj into the other residual buffer, which becomes the stream.
        let residual = |cur: usize| -> Result<usize> {
            let sum = [&s.x[cur], &s.proj];
            rows(RowOp::Add, &sum, None, (&s.x[1 - cur], 0), [n, d])?;
            Ok(1 - cur)
        };
        let mut cur = 0;
        for (l, layer) in m.layers.iter().enumerate() {
            let (kc, vc) = (&self.k[l], &self.v[l]);
            rows(
                norm,
                &[&s.x[cur]],
                Some(&layer.attn_norm),
                (&s.h, 0),
                [n, d],
            )?;
            let h = mat(&s.h, d);
            layer.q.forward(dev, (h, mat(&s.q, d)), n, &s.ones)?;
            layer.k.forward(dev, (h, mat(&s.k, kv)), n, &s.ones)?;
            // Values straight into their cache positions.
            layer
                .v
                .forward(dev, (h, rows_of(vc, pos0 * kv, kv)), n, &s.ones)?;
            let q_rows = [n * c.heads, hd];
            rows(rope_of(c.heads), &[&s.q], Some(&s.rope), (&s.qr, 0), q_rows)?;
            let k_rows = [n * c.kv_heads, hd];
            let k_at = (kc, pos0 * kv);
            rows(rope_of(c.kv_heads), &[&s.k], Some(&s.rope), k_at, k_rows)?;
            dev.enqueue(&DeviceCall::PagedAttention(PagedCall {
                q: &s.qr,
                k: kc,
                v: vc,
                out: &s.att,
                shape,
            }))?;
            layer
                .o
                .forward(dev, (mat(&s.att, d), mat(&s.proj, d)), n, &s.ones)?;
            cur = residual(cur)?;
            rows(norm, &[&s.x[cur]], Some(&layer.ffn_norm), (&s.h, 0), [n, d])?;
            let h = mat(&s.h, d);
            layer.gate.forward(dev, (h, mat(&s.gate, f)), n, &s.ones)?;
            layer.up.forward(dev, (h, mat(&s.up, f)), n, &s.ones)?;
            rows(RowOp::SwiGlu, &[&s.gate, &s.up], None, (&s.act, 0), [n, f])?;
            layer
                .down
                .forward(dev, (mat(&s.act, f), mat(&s.proj, d)), n, &s.ones)?;
            cur = residual(cur)?;
        }
        rows(norm, &[&s.x[cur]], Some(&m.norm), (&s.h, 0), [n, d])?;
        // The LM head on the last position only.
        let last = rows_of(&s.h, (n - 1) * d, d);
        m.head
            .forward(dev, (last, mat(&s.logits, c.vocab)), 1, &s.ones)?;
        let logits = dev.download(&s.logits)?;
        self.len += n;
        Ok(logits)
    }
    fn cached(&self) -> usize {
        self.len
    }
}
