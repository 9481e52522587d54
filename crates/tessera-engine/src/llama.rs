//! Llama-family decoder (Llama 2/3, SmolLM/SmolLM2, Mistral, Qwen2): pre-norm blocks of
//! GQA attention with RoPE and a SwiGLU MLP, RMSNorm throughout, optionally tied
//! embeddings and q/k/v biases. Every matmul goes through [`Linear`], so one forward
//! serves all formats, and tensors come through [`WeightSource`], so one loader serves
//! GGUF and safetensors.
//!
//! RoPE pairs differ by source: GGUF converters permute Llama's q/k rows so that pairs
//! are adjacent (interleaved), while HF checkpoints (and Qwen2 in GGUF) pair dimension i
//! with i + d/2 (half-split); [`Config::rope_style`] records which.
//!
//! The residual stream is fused with the next norm (`rms_norm_residual`: one pass adds a
//! sublayer's output and normalises for the next one). Keys and values are cached,
//! already rotated, in the paged [`KvCache`]: prefill attends with the flash kernel,
//! decode with the paged decode kernel.

use crate::gguf::Gguf;
use crate::kv_cache::{KvCache, KvDtype};
use crate::linear::{Biased, Linear};
use crate::profile::{self, OpCost};
use crate::rope_scaling::RopeScaling;
use crate::weights::{load_matrix, LoadOptions, WeightSource};
use crate::{Error, Result};
use tessera_core::{DType, Isa, TensorView, TensorViewMut};
use tessera_kernels::ops::attention::{attention, AttentionParams};
use tessera_kernels::ops::paged_attention::PagedParams;
use tessera_kernels::ops::rms_norm::{rms_norm, rms_norm_residual, RmsNorm};
use tessera_kernels::ops::rope::{rope, Rope, RopeStyle};
use tessera_kernels::ops::swiglu::swiglu;

/// Hyper-parameters, from GGUF metadata or an HF config.json.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub n_layers: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub eps: f32,
    pub vocab: usize,
    pub context: usize,
    pub rope_style: RopeStyle,
    pub rope_scaling: RopeScaling,
}

impl Config {
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let arch = g
            .get("general.architecture")?
            .as_str()
            .unwrap_or_default()
            .to_string();
        let rope_style = match arch.as_str() {
            "llama" | "mistral" => RopeStyle::Interleaved,
            "qwen2" => RopeStyle::HalfSplit,
            _ => {
                return Err(Error::Model(format!(
                    "architecture '{arch}' is not supported (llama, mistral, qwen2)"
                )))
            }
        };
        let int = |k: &str| -> Result<usize> {
            let key = format!("{arch}.{k}");
            let v = g
                .get(&key)?
                .as_u64()
                .ok_or_else(|| Error::Model(format!("{key} is not an integer")))?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0 && v < 1 << 24)
                .ok_or_else(|| Error::Model(format!("{key} = {v}")))
        };
        let float = |k: &str, default: f64| -> f64 {
            g.metadata
                .get(&format!("{arch}.{k}"))
                .and_then(|v| v.as_f64())
                .unwrap_or(default)
        };
        let heads = int("attention.head_count")?;
        let dim = int("embedding_length")?;
        let kv_heads = g
            .metadata
            .get(&format!("{arch}.attention.head_count_kv"))
            .map_or(Ok(heads), |_| int("attention.head_count_kv"))?;
        let vocab = g.tensor("token_embd.weight")?.rows_cols().0;
        let c = Config {
            n_layers: int("block_count")?,
            dim,
            ffn_dim: int("feed_forward_length")?,
            heads,
            kv_heads,
            head_dim: dim / heads,
            rope_theta: float("rope.freq_base", 10_000.0),
            eps: float("attention.layer_norm_rms_epsilon", 1e-5) as f32,
            vocab,
            context: int("context_length")?,
            rope_style,
            rope_scaling: RopeScaling::from_gguf(
                g.metadata
                    .get(&format!("{arch}.rope.scaling.type"))
                    .and_then(|v| v.as_str()),
                g.metadata
                    .get(&format!("{arch}.rope.scaling.factor"))
                    .and_then(|v| v.as_f64()),
            )?,
        };
        c.validated()
    }

    /// Checks the hyper-parameters fit together (a file can say anything).
    pub(crate) fn validated(self) -> Result<Self> {
        let (c, dim, heads, kv_heads) = (&self, self.dim, self.heads, self.kv_heads);
        let eps_ok = c.eps > 0.0 && c.eps.is_finite(); // false for NaN
        if !dim.is_multiple_of(heads)
            || !heads.is_multiple_of(kv_heads)
            || !c.head_dim.is_multiple_of(2)
            || c.rope_theta.is_nan()
            || c.rope_theta <= 1.0
            || !eps_ok
        {
            return Err(Error::Model(format!("inconsistent hyper-parameters {c:?}")));
        }
        Ok(self)
    }
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

#[derive(Debug)]
struct Layer {
    attn_norm: RmsNorm,
    /// q, k, v.
    qkv: SharedInput<3>,
    o: Box<dyn Linear>,
    ffn_norm: RmsNorm,
    /// gate, up.
    gate_up: SharedInput<2>,
    down: Box<dyn Linear>,
}

/// Projections of one input, stacked into one matmul at load where their formats allow
/// ([`crate::linear::stack`]), else run one by one.
#[derive(Debug)]
enum SharedInput<const N: usize> {
    Separate([Box<dyn Linear>; N]),
    /// The stacked layer and each part's output width.
    Stacked(Box<dyn Linear>, [usize; N]),
}

impl<const N: usize> SharedInput<N> {
    fn new(parts: [Box<dyn Linear>; N]) -> Self {
        match crate::linear::stack(&parts.each_ref().map(|p| &**p)) {
            Some(w) => SharedInput::Stacked(w, parts.each_ref().map(|p| p.out_features())),
            None => SharedInput::Separate(parts),
        }
    }

    fn is_stacked(&self) -> bool {
        matches!(self, SharedInput::Stacked(..))
    }

    /// Each matrix with the number of the model's matrices it holds.
    fn matrices(&self) -> Vec<(&dyn Linear, usize)> {
        match self {
            SharedInput::Separate(parts) => parts.iter().map(|p| (&**p, 1)).collect(),
            SharedInput::Stacked(w, _) => vec![(&**w, N)],
        }
    }

    /// `ys[i] = x·W_iᵀ` for `n` rows, profiled as `ops[i]`, or as `stacked_op` when one
    /// matmul into `buf` computes them all (its rows then split into the ys).
    fn forward(
        &self,
        (ops, stacked_op): ([&'static str; N], &'static str),
        x: &[f32],
        mut ys: [&mut [f32]; N],
        buf: &mut Vec<f32>,
        n: usize,
    ) -> Result<()> {
        match self {
            SharedInput::Separate(parts) => {
                for ((op, w), y) in ops.into_iter().zip(parts).zip(ys) {
                    linear(op, &**w, x, y, n)?;
                }
            }
            SharedInput::Stacked(w, outs) => {
                let total = w.out_features();
                buf.resize(n * total, 0.0);
                linear(stacked_op, &**w, x, buf, n)?;
                for (i, row) in buf.chunks_exact(total).enumerate() {
                    let mut at = 0;
                    for (y, &o) in ys.iter_mut().zip(outs) {
                        y[i * o..(i + 1) * o].copy_from_slice(&row[at..at + o]);
                        at += o;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A loaded model.
#[derive(Debug)]
pub struct Llama {
    pub cfg: Config,
    embed: Box<dyn Linear>,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// None when the output projection is tied to the embedding.
    output: Option<Box<dyn Linear>>,
    /// RoPE frequency of each rotated pair, scaling applied.
    rope_freqs: Vec<f64>,
    /// Loaded with [`LoadOptions::int8_activations`].
    int8_activations: bool,
}

/// A norm's weights, checked against the model width.
fn norm_of(src: &dyn WeightSource, name: &str, dim: usize, eps: f32) -> Result<RmsNorm> {
    let gamma = src.vector(name)?;
    if gamma.len() != dim {
        return Err(Error::Model(format!(
            "{name}: {} values for dim {dim}",
            gamma.len()
        )));
    }
    Ok(RmsNorm { gamma, eps })
}

impl Llama {
    /// How many weight matrices are stored in each format, and their bytes (what a
    /// user checks after `--quantize`, which may fall back per matrix).
    pub fn weight_formats(&self) -> Vec<(DType, usize, usize)> {
        let mut all: Vec<(&dyn Linear, usize)> = vec![(self.embed.as_ref(), 1)];
        for l in &self.layers {
            all.extend(l.qkv.matrices());
            all.extend(l.gate_up.matrices());
            all.extend([(l.o.as_ref(), 1), (l.down.as_ref(), 1)]);
        }
        all.extend(self.output.as_deref().map(|o| (o, 1)));
        let mut by = std::collections::BTreeMap::<DType, (usize, usize)>::new();
        for (l, count) in all {
            let e = by.entry(l.dtype()).or_default();
            e.0 += count;
            e.1 += l.weight_bytes();
        }
        by.into_iter().map(|(d, (n, b))| (d, n, b)).collect()
    }
}

/// The builder's view of a source: shape-checked matrices, optional biases.
struct Loader<'a> {
    src: &'a dyn WeightSource,
    opts: &'a LoadOptions,
}

impl Loader<'_> {
    /// Loads `name.weight` (and `name.bias` when the file has one) and checks the shape.
    fn linear(&self, name: &str, out: usize, inp: usize) -> Result<Box<dyn Linear>> {
        let wname = format!("{name}.weight");
        let l = load_matrix(self.src, &wname, self.opts)?;
        if (l.out_features(), l.in_features()) != (out, inp) {
            return Err(Error::Model(format!(
                "{wname}: {}×{}, expected {out}×{inp}",
                l.out_features(),
                l.in_features()
            )));
        }
        let bname = format!("{name}.bias");
        if !self.src.has(&bname) {
            return Ok(l);
        }
        let bias = self.src.vector(&bname)?;
        if bias.len() != out {
            return Err(Error::Model(format!(
                "{bname}: {} values for {out} outputs",
                bias.len()
            )));
        }
        Ok(Box::new(Biased { inner: l, bias }))
    }
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
    /// Prefill's contiguous copies of the cached keys and values.
    kc: Vec<f32>,
    vc: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
    /// Outputs of a stacked matmul before they split ([`SharedInput`]).
    stacked: Vec<f32>,
}

impl Llama {
    /// A GGUF model with its weights in their stored formats.
    pub fn load(g: &Gguf) -> Result<Self> {
        Self::from_source(Config::from_gguf(g)?, g, &LoadOptions::default())
    }

    /// A model of `cfg` from any weight source.
    pub fn from_source(
        mut cfg: Config,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        if src.has("rope_freqs.weight") {
            if cfg.rope_scaling != RopeScaling::None {
                return Err(Error::Model(format!(
                    "rope_freqs.weight and {:?} both scale RoPE",
                    cfg.rope_scaling
                )));
            }
            let f = src.vector("rope_freqs.weight")?;
            cfg.rope_scaling = RopeScaling::factors(f.into_iter().map(f64::from).collect())?;
        }
        let rope_freqs = cfg.rope_scaling.frequencies(cfg.head_dim, cfg.rope_theta)?;
        let (d, f, kv) = (cfg.dim, cfg.ffn_dim, cfg.kv_dim());
        let ld = Loader { src, opts };
        let embed = ld.linear("token_embd", cfg.vocab, d)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{l}.{s}");
            let norm = |s: &str| norm_of(src, &format!("blk.{l}.{s}.weight"), d, cfg.eps);
            layers.push(Layer {
                attn_norm: norm("attn_norm")?,
                qkv: SharedInput::new([
                    ld.linear(&n("attn_q"), d, d)?,
                    ld.linear(&n("attn_k"), kv, d)?,
                    ld.linear(&n("attn_v"), kv, d)?,
                ]),
                o: ld.linear(&n("attn_output"), d, d)?,
                ffn_norm: norm("ffn_norm")?,
                gate_up: SharedInput::new([
                    ld.linear(&n("ffn_gate"), f, d)?,
                    ld.linear(&n("ffn_up"), f, d)?,
                ]),
                down: ld.linear(&n("ffn_down"), d, f)?,
            });
        }
        let output = match src.has("output.weight") {
            true => Some(ld.linear("output", cfg.vocab, d)?),
            false => None,
        };
        Ok(Llama {
            norm: norm_of(src, "output_norm.weight", d, cfg.eps)?,
            cfg,
            embed,
            layers,
            output,
            rope_freqs,
            int8_activations: opts.int8_activations,
        })
    }

    /// Whether matmuls of up to [`tessera_kernels::ops::qmatmul::SMALL_M`] rows run with
    /// 8-bit activations ([`LoadOptions::int8_activations`]).
    pub fn int8_activations(&self) -> bool {
        self.int8_activations
    }

    /// How many groups of projections (a layer's q/k/v, its gate/up) run as one stacked
    /// matmul: those whose matrices share a block format ([`crate::linear::stack`]).
    pub fn stacked_projections(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.qkv.is_stacked() as usize + l.gate_up.is_stacked() as usize)
            .sum()
    }

    /// Runs `tokens` at the cache's next positions and returns the logits of the last one.
    /// Token ids ≥ vocab and a full cache are errors (the cache is left unchanged).
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        self.run(tokens, cache, false)
    }

    /// As [`Llama::forward`], returning the logits after every token (`[n, vocab]`), for
    /// teacher-forced scoring.
    pub fn forward_all(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        self.run(tokens, cache, true)
    }

    fn run(&self, tokens: &[u32], cache: &mut KvCache, all: bool) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let (n, pos0) = (tokens.len(), cache.len());
        if n == 0 {
            return Err(Error::Model("forward needs at least one token".into()));
        }
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(Error::Model(format!(
                "token id {t} ≥ vocabulary size {}",
                c.vocab
            )));
        }
        cache.reserve(pos0 + n)?;
        profile::set_decode(n == 1);
        let (d, kv, f) = (c.dim, c.kv_dim(), c.ffn_dim);
        let z = |len: usize| vec![0f32; n * len];
        let mut s = Scratch {
            x: z(d),
            h: z(d),
            q: z(d),
            qr: z(d),
            k: z(kv),
            kr: z(kv),
            v: z(kv),
            kc: Vec::new(),
            vc: Vec::new(),
            att: z(d),
            proj: z(d),
            gate: z(f),
            up: z(f),
            act: z(f),
            stacked: Vec::new(),
        };
        let embed_cost = || cost(format!("{n}x{d}"), 0, n * d * 8);
        profile::record("embed", embed_cost, || -> Result<()> {
            for (i, &t) in tokens.iter().enumerate() {
                self.embed.row(t as usize, &mut s.x[i * d..(i + 1) * d])?;
            }
            Ok(())
        })?;
        let positions: Vec<usize> = (pos0..pos0 + n).collect();
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
        for (l, layer) in self.layers.iter().enumerate() {
            // h = norm(x) (first layer), else x += previous MLP output; h = norm(x).
            if l == 0 {
                norm(&s.x, &layer.attn_norm, &mut s.h, n)?;
            } else {
                norm_residual(&s.proj, &mut s.x, &layer.attn_norm, &mut s.h)?;
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
            profile::record("kv_write", kv_bytes, || cache.write(l, pos0, &s.kr, &s.v));
            self.attend(l, cache, &mut s, pos0, n)?;
            linear("attn_output", &*layer.o, &s.att, &mut s.proj, n)?;
            norm_residual(&s.proj, &mut s.x, &layer.ffn_norm, &mut s.h)?;
            layer.gate_up.forward(
                (["ffn_gate", "ffn_up"], "ffn_gate_up"),
                &s.h,
                [&mut s.gate, &mut s.up],
                &mut s.stacked,
                n,
            )?;
            let act_cost = || cost(format!("{n}x{f}"), 6 * n * f, 12 * n * f);
            profile::record("swiglu", act_cost, || -> Result<()> {
                Ok(swiglu(
                    Isa::best(),
                    &view(&s.gate, &[n, f])?,
                    &view(&s.up, &[n, f])?,
                    &mut TensorViewMut::contiguous(&mut s.act, &[n, f])?,
                )?)
            })?;
            linear("ffn_down", &*layer.down, &s.act, &mut s.proj, n)?;
        }
        // Final residual add and norm: every row, or the last token's only.
        let rows = if all { 0..n } else { n - 1..n };
        let m = rows.len();
        let mut h = vec![0f32; m * d];
        norm_residual(
            &s.proj[rows.start * d..],
            &mut s.x[rows.start * d..],
            &self.norm,
            &mut h,
        )?;
        let head = self.output.as_deref().unwrap_or(&*self.embed);
        let mut logits = vec![0f32; m * c.vocab];
        linear("lm_head", head, &h, &mut logits, m)?;
        cache.set_len(pos0 + n);
        Ok(logits)
    }

    /// Attention of the `n` new queries over the cache: the paged kernel reading blocks
    /// in place for one token (decode), the flash kernel over a gathered copy otherwise.
    fn attend(
        &self,
        layer: usize,
        cache: &KvCache,
        s: &mut Scratch,
        pos0: usize,
        n: usize,
    ) -> Result<()> {
        let c = &self.cfg;
        let (seen, hd) = (pos0 + n, c.head_dim);
        let scale = 1.0 / (hd as f32).sqrt();
        // Each query reads keys and values of its visible positions once.
        let visible = n * pos0 + n * (n + 1) / 2;
        let kv_elt = match cache.dtype() {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        };
        let att_cost = || {
            let bytes = 2 * kv_elt * seen * c.kv_dim() + 8 * n * c.dim;
            cost(
                format!("{n}q x {seen}kv"),
                4 * c.heads * hd * visible,
                bytes,
            )
        };
        let qv = view(&s.qr, &[n, c.heads, hd])?;
        let mut out = TensorViewMut::contiguous(&mut s.att, &[n, c.heads, hd])?;
        if n == 1 {
            let params = PagedParams {
                scale,
                chunk: 0,
                threads: tessera_kernels::pool::global().threads(),
            };
            return profile::record("attention_decode", att_cost, || {
                cache.attend(layer, seen, &qv, &mut out, params)
            });
        }
        profile::record("attention_prefill", att_cost, || {
            cache.gather(layer, seen, &mut s.kc, &mut s.vc);
            let params = AttentionParams {
                causal: true,
                scale,
                window: None,
            };
            Ok(attention(
                &qv,
                &view(&s.kc, &[seen, c.kv_heads, hd])?,
                &view(&s.vc, &[seen, c.kv_heads, hd])?,
                &mut out,
                params,
            )?)
        })
    }
}

fn cost(shape: String, flops: usize, bytes: usize) -> OpCost {
    OpCost {
        shape,
        flops: flops as f64,
        bytes: bytes as f64,
    }
}

/// `y [n, out] = x [n, in]·Wᵀ`, recorded as `op`.
fn linear(op: &'static str, l: &dyn Linear, x: &[f32], y: &mut [f32], n: usize) -> Result<()> {
    let (i, o) = (l.in_features(), l.out_features());
    let c = || {
        let bytes = l.weight_bytes() + 4 * n * (i + o);
        cost(format!("{n}x{o}x{i} {}", l.dtype()), 2 * n * o * i, bytes)
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
    let c = || cost(format!("{n}x{d}"), 4 * n * d, 8 * n * d);
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
    let len = h.len();
    let c = || cost(format!("{len}"), 5 * len, 16 * len);
    profile::record("rms_norm_residual", c, || {
        Ok(rms_norm_residual(Isa::best(), r, x, w, h)?)
    })
}

fn rotate(x: &[f32], table: &Rope, out: &mut [f32], dims: [usize; 3]) -> Result<()> {
    let len = x.len();
    let c = || cost(format!("{dims:?}"), 3 * len, 8 * len);
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
