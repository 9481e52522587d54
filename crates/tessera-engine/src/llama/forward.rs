//! The forward pass over a batch of sequences: one call runs a continuous-batching step.
//!
//! The tokens of every sequence in the step (one per decoding sequence, a chunk per
//! prefilling one) are stacked into one `[M, dim]` activation, so every projection is one
//! matmul over M rows: the weights are read once per step, not once per sequence, which
//! is where batching's throughput comes from. Only attention is per sequence: each
//! sequence's rows go, with its block table, into one varlen attention call (decode rows
//! read their blocks in place, prefill chunks attend to their cached prefix plus
//! themselves). RoPE takes each row's own position. The LM head runs only on the rows
//! whose logits are wanted (a prompt chunk that does not end its prompt needs none: at
//! 49k × 576 the head is the largest matmul of a small model).
//!
//! A single generation is the same call with one sequence ([`Llama::forward`]).

use super::{Llama, Result};
use crate::kv_cache::{KvCache, KvStore, StepTables};
use crate::linear::Linear;
use crate::profile::{self, OpCost};
use crate::Error;
use tessera_core::DType;
use tessera_core::{Isa, Layout, TensorView, TensorViewMut};
use tessera_kernels::ops::rms_norm::{rms_norm, rms_norm_residual, RmsNorm, RmsNormResidual};
use tessera_kernels::ops::rope::{rope, Rope, RopeDesc, RopeStyle};
use tessera_kernels::ops::rowwise::RowProblem;
use tessera_kernels::ops::swiglu::{swiglu, SwiGlu};
use tessera_kernels::ops::varlen_attention::{VarlenParams, VarlenProblem};
use tessera_kernels::registry::{ComputeUnit, ProblemCase};

/// Which logits a sequence of a step wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// None (a prompt chunk before the prompt's end).
    None,
    /// After its last token (decode, and the chunk that ends a prompt).
    Last,
    /// After every token (teacher-forced scoring).
    All,
}

/// One sequence's part of a step.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    /// The new tokens, at positions `pos0..pos0 + tokens.len()`.
    pub tokens: &'a [u32],
    /// Positions already cached (the first new token's position).
    pub pos0: usize,
    /// Block table covering every position up to `pos0 + tokens.len()`.
    pub table: &'a [u32],
    /// Which positions' logits to return.
    pub logits: LogitRows,
}

/// Scratch activations for a batch of `n` tokens.
struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    qr: Vec<f32>,
    k: Vec<f32>,
    kr: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
    /// Outputs of a stacked matmul before they split ([`super::SharedInput`]).
    stacked: Vec<f32>,
}

impl Scratch {
    fn new(n: usize, (d, kv, f): (usize, usize, usize)) -> Self {
        let z = |len: usize| vec![0f32; n * len];
        Scratch {
            x: z(d),
            h: z(d),
            q: z(d),
            qr: z(d),
            k: z(kv),
            kr: z(kv),
            v: z(kv),
            att: z(d),
            proj: z(d),
            gate: z(f),
            up: z(f),
            act: z(f),
            stacked: Vec::new(),
        }
    }
}

impl Llama {
    /// Runs `tokens` at the cache's next positions and returns the logits of the last one.
    /// Token ids ≥ vocab and a full cache are errors (the cache is left unchanged).
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        self.forward_one(tokens, cache, LogitRows::Last)
    }

    /// As [`Llama::forward`], returning the logits after every token (`[n, vocab]`), for
    /// teacher-forced scoring.
    pub fn forward_all(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        self.forward_one(tokens, cache, LogitRows::All)
    }

    fn forward_one(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        logits: LogitRows,
    ) -> Result<Vec<f32>> {
        let pos0 = cache.len();
        if tokens.is_empty() {
            return Err(Error::Model("forward needs at least one token".into()));
        }
        self.check_tokens(tokens)?;
        cache.reserve(pos0 + tokens.len())?;
        let (store, table) = cache.parts();
        let seq = SeqInput {
            tokens,
            pos0,
            table,
            logits,
        };
        let out = self.forward_batch(store, &[seq])?;
        cache.set_len(pos0 + tokens.len());
        Ok(out)
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            Some(t) => Err(Error::Model(format!(
                "token id {t} ≥ vocabulary size {}",
                self.cfg.vocab
            ))),
            None => Ok(()),
        }
    }

    /// One step over many sequences (module docs): writes every sequence's new
    /// keys and values into `store` through its block table and returns the wanted
    /// logits, `[rows, vocab]`, sequences in order. Bad token ids, empty sequences and
    /// block tables that do not cover their positions are errors before anything runs.
    pub fn forward_batch(&self, store: &mut KvStore, seqs: &[SeqInput<'_>]) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.forward_batch_into(store, seqs, &mut logits)?;
        Ok(logits)
    }

    /// [`Llama::forward_batch`] into `logits` (resized to `[rows, vocab]`): a caller that
    /// keeps it from step to step does not zero ~3 MB of fresh logits per 16-row step
    /// (145 µs of each batched decode step on host C).
    pub fn forward_batch_into(
        &self,
        store: &mut KvStore,
        seqs: &[SeqInput<'_>],
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let c = &self.cfg;
        if seqs.is_empty() {
            return Err(Error::Model("a step needs at least one sequence".into()));
        }
        for s in seqs {
            if s.tokens.is_empty() {
                return Err(Error::Model("a sequence in a step has no tokens".into()));
            }
            self.check_tokens(s.tokens)?;
            let end = s.pos0 + s.tokens.len();
            if end > c.context {
                return Err(Error::Model(format!(
                    "{end} positions exceed the model's {}-token context",
                    c.context
                )));
            }
            store.check_table(s.table, end)?;
        }
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        profile::set_decode(seqs.iter().all(|s| s.tokens.len() == 1));
        let (d, kv, f) = (c.dim, c.kv_dim(), c.ffn_dim);
        let mut s = Scratch::new(n, (d, kv, f));
        let embed_cost = || cost(format!("{n}x{d}"), 0, n * d * 8);
        profile::record("embed", embed_cost, || -> Result<()> {
            let tokens = seqs.iter().flat_map(|q| q.tokens);
            for (i, &t) in tokens.enumerate() {
                self.embed.row(t as usize, &mut s.x[i * d..(i + 1) * d])?;
            }
            Ok(())
        })?;
        let positions: Vec<usize> = seqs
            .iter()
            .flat_map(|q| q.pos0..q.pos0 + q.tokens.len())
            .collect();
        let rope = |heads| {
            Rope::with_frequencies(
                c.rope_style,
                &positions,
                heads,
                c.head_dim,
                &self.rope_freqs,
            )
        };
        let (rope_q, rope_k) = (rope(c.heads)?, rope(c.kv_heads)?);
        // Every layer attends over the same tables: flattened once per step.
        let step = StepTables::new(
            seqs.iter()
                .map(|q| (q.table, q.pos0 + q.tokens.len(), q.tokens.len())),
        );
        for (l, layer) in self.layers.iter().enumerate() {
            // h = norm(x) (first layer), else x += previous MLP output; h = norm(x).
            if l == 0 {
                norm(&s.x, &layer.attn_norm, &mut s.h, n)?;
            } else {
                norm_residual(&s.proj, &mut s.x, &layer.attn_norm, &mut s.h)?;
            }
            // The KV lines this layer's write will store into, asked for now so that
            // they arrive during the q/k/v matmul (KvStore::prefetch_for_write).
            for q in seqs {
                store.prefetch_for_write(l, q.table, q.pos0, q.tokens.len());
            }
            layer.qkv.forward(
                (["attn_q", "attn_k", "attn_v"], "attn_qkv"),
                &s.h,
                [&mut s.q, &mut s.k, &mut s.v],
                &mut s.stacked,
                n,
            )?;
            rotate(&s.q, &rope_q, &mut s.qr, [n, c.heads, c.head_dim])?;
            rotate(&s.k, &rope_k, &mut s.kr, [n, c.kv_heads, c.head_dim])?;
            let kv_bytes = || cost(format!("{n}x{kv}"), 0, 16 * n * kv);
            profile::record("kv_write", kv_bytes, || {
                let mut at = 0;
                for q in seqs {
                    let rows = at * kv..(at + q.tokens.len()) * kv;
                    store.write(l, q.table, q.pos0, &s.kr[rows.clone()], &s.v[rows]);
                    at += q.tokens.len();
                }
            });
            self.attend(l, store, &step, &mut s, n)?;
            linear("attn_output", &*layer.o, &s.att, &mut s.proj, n)?;
            norm_residual(&s.proj, &mut s.x, &layer.ffn_norm, &mut s.h)?;
            let stacked = layer.gate_up.forward_unsplit(
                (["ffn_gate", "ffn_up"], "ffn_gate_up"),
                &s.h,
                [&mut s.gate, &mut s.up],
                &mut s.stacked,
                n,
            )?;
            // Gate and up as [n, f] views: the stacked output's two column halves where
            // one matmul made both (no copy), else their own buffers.
            let (gate, up) = match stacked {
                Some(width) => {
                    let half = |at| {
                        let l = Layout::strided(&[n, f], &[width, 1], at)?;
                        TensorView::new(&s.stacked[..n * width], l)
                    };
                    (half(0)?, half(f)?)
                }
                None => (view(&s.gate, &[n, f])?, view(&s.up, &[n, f])?),
            };
            let act_cost = || {
                let problem = RowProblem::<SwiGlu>::new(n, f, false);
                registry_cost(format!("{n}x{f}"), &problem, DType::F32)
            };
            profile::record("swiglu", act_cost, || -> Result<()> {
                Ok(swiglu(
                    Isa::best(),
                    &gate,
                    &up,
                    &mut TensorViewMut::contiguous(&mut s.act, &[n, f])?,
                )?)
            })?;
            linear("ffn_down", &*layer.down, &s.act, &mut s.proj, n)?;
        }
        self.head(seqs, &mut s, logits)
    }

    /// The final residual add, norm and LM head over the rows whose logits are wanted.
    fn head(&self, seqs: &[SeqInput<'_>], s: &mut Scratch, logits: &mut Vec<f32>) -> Result<()> {
        let (d, vocab) = (self.cfg.dim, self.cfg.vocab);
        let mut rows = Vec::new();
        let mut at = 0;
        for q in seqs {
            let n = q.tokens.len();
            match q.logits {
                LogitRows::None => {}
                LogitRows::Last => rows.push(at + n - 1),
                LogitRows::All => rows.extend(at..at + n),
            }
            at += n;
        }
        let m = rows.len();
        logits.resize(m * vocab, 0.0);
        if m == 0 {
            return Ok(());
        }
        // Gather the wanted rows (contiguous in the common cases: one sequence, all rows).
        let (mut proj, mut x) = (vec![0f32; m * d], vec![0f32; m * d]);
        for (i, &r) in rows.iter().enumerate() {
            proj[i * d..(i + 1) * d].copy_from_slice(&s.proj[r * d..(r + 1) * d]);
            x[i * d..(i + 1) * d].copy_from_slice(&s.x[r * d..(r + 1) * d]);
        }
        let mut h = vec![0f32; m * d];
        norm_residual(&proj, &mut x, &self.norm, &mut h)?;
        let head = self.output.as_deref().unwrap_or(&*self.embed);
        linear("lm_head", head, &h, logits, m)?;
        Ok(())
    }

    /// Attention of the step's rows over each sequence's cache (one varlen call).
    fn attend(
        &self,
        layer: usize,
        store: &KvStore,
        step: &StepTables,
        s: &mut Scratch,
        n: usize,
    ) -> Result<()> {
        let c = &self.cfg;
        let hd = c.head_dim;
        let att_cost = || {
            let problem = VarlenProblem {
                runs: step
                    .q_lens
                    .iter()
                    .copied()
                    .zip(step.lens.iter().copied())
                    .collect(),
                heads: c.heads,
                kv_heads: c.kv_heads,
                d: hd,
                block_size: crate::kv_cache::BLOCK,
                shared_blocks: 0,
            };
            let kv_dtype = match store.dtype() {
                crate::kv_cache::KvDtype::F32 => DType::F32,
                crate::kv_cache::KvDtype::F16 => DType::F16,
                crate::kv_cache::KvDtype::Q8 => DType::I8,
            };
            let seen: usize = step.lens.iter().sum();
            registry_cost(format!("{n}q x {seen}kv"), &problem, kv_dtype)
        };
        let decode = step.q_lens.iter().all(|&m| m == 1);
        let qv = view(&s.qr, &[n, c.heads, hd])?;
        let mut out = TensorViewMut::contiguous(&mut s.att, &[n, c.heads, hd])?;
        let params = VarlenParams {
            scale: 1.0 / (hd as f32).sqrt(),
            threads: tessera_kernels::pool::global().threads(),
        };
        let op = if decode {
            "attention_decode"
        } else {
            "attention_prefill"
        };
        profile::record(op, att_cost, || {
            store.attend(layer, step, &qv, &mut out, params)
        })
    }
}

fn cost(shape: String, flops: usize, bytes: usize) -> OpCost {
    OpCost {
        shape,
        flops: flops as f64,
        bytes: bytes as f64,
        unit: ComputeUnit::Fma,
    }
}

/// The profile's cost of a call that is a registered op: the op's own cost model, so a
/// trace and `tessera bench` count FLOPs and bytes the same way.
fn registry_cost(shape: String, problem: &dyn ProblemCase, dtype: DType) -> OpCost {
    let c = problem.cost(dtype);
    OpCost {
        shape,
        flops: c.flops,
        bytes: c.bytes,
        unit: ComputeUnit::Fma,
    }
}

/// `y [n, out] = x [n, in]·Wᵀ`, recorded as `op`.
pub(super) fn linear(
    op: &'static str,
    l: &dyn Linear,
    x: &[f32],
    y: &mut [f32],
    n: usize,
) -> Result<()> {
    let (i, o) = (l.in_features(), l.out_features());
    let c = || {
        let bytes = l.weight_bytes() + 4 * n * (i + o);
        OpCost {
            unit: l.compute_unit(n),
            ..cost(format!("{n}x{o}x{i} {}", l.dtype()), 2 * n * o * i, bytes)
        }
    };
    profile::record(op, c, || {
        l.forward(
            &view(&x[..n * i], &[n, i])?,
            &mut TensorViewMut::contiguous(&mut y[..n * o], &[n, o])?,
        )
    })
}

fn norm(x: &[f32], w: &RmsNorm, h: &mut [f32], n: usize) -> Result<()> {
    let d = w.gamma.len();
    let c = || {
        let problem = RowProblem::<RmsNorm>::new(n, d, false);
        registry_cost(format!("{n}x{d}"), &problem, DType::F32)
    };
    profile::record("rms_norm", c, || {
        Ok(rms_norm(
            Isa::best(),
            &view(x, &[n, d])?,
            w,
            &mut TensorViewMut::contiguous(h, &[n, d])?,
        )?)
    })
}

/// `x += r; h = norm(x)` in one pass.
fn norm_residual(r: &[f32], x: &mut [f32], w: &RmsNorm, h: &mut [f32]) -> Result<()> {
    let (len, d) = (h.len(), w.gamma.len());
    let c = || {
        let problem = RowProblem::<RmsNormResidual>::new(len / d, d, false);
        registry_cost(format!("{len}"), &problem, DType::F32)
    };
    profile::record("rms_norm_residual", c, || {
        Ok(rms_norm_residual(Isa::best(), r, x, w, h)?)
    })
}

fn rotate(x: &[f32], table: &Rope, out: &mut [f32], dims: [usize; 3]) -> Result<()> {
    let c = || {
        let [n, heads, d] = dims;
        let rows = n * heads;
        let shape = format!("{dims:?}");
        match table.style {
            RopeStyle::Interleaved => registry_cost(
                shape,
                &RowProblem::<RopeDesc<false>>::new(rows, d, false),
                DType::F32,
            ),
            RopeStyle::HalfSplit => registry_cost(
                shape,
                &RowProblem::<RopeDesc<true>>::new(rows, d, false),
                DType::F32,
            ),
        }
    };
    profile::record("rope", c, || {
        Ok(rope(
            Isa::best(),
            &view(x, &dims)?,
            table,
            &mut TensorViewMut::contiguous(out, &dims)?,
        )?)
    })
}

/// A contiguous view (shape errors become engine errors).
fn view<'a>(b: &'a [f32], dims: &[usize]) -> Result<TensorView<'a, f32>> {
    Ok(TensorView::contiguous(b, dims)?)
}
