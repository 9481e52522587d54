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
//! already rotated, in paged blocks ([`crate::kv_cache`]). The forward pass itself, over
//! a batch of sequences, is in `forward`.

mod device;
mod forward;

pub use device::DeviceLlama;
pub use forward::{LogitRows, SeqInput};

use crate::gguf::Gguf;
use crate::linear::{Activations, Biased, Linear};
use crate::rope_scaling::RopeScaling;
use crate::weights::{load_matrix_unpacked, LoadOptions, WeightSource};
use crate::{Error, Result};
use forward::linear;
use tessera_core::DType;
use tessera_kernels::ops::rms_norm::RmsNorm;
use tessera_kernels::ops::rope::RopeStyle;

/// Hyper-parameters, from GGUF metadata or an HF config.json.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Transformer layers.
    pub n_layers: usize,
    /// Width of the residual stream.
    pub dim: usize,
    /// Width of the MLP's hidden layer.
    pub ffn_dim: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RoPE base frequency θ.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Rows of the token embedding (the tokenizer may have fewer tokens).
    pub vocab: usize,
    /// Positions the model was trained for (capped by a sliding window where the model has one).
    pub context: usize,
    /// Which elements RoPE rotates together.
    pub rope_style: RopeStyle,
    /// How RoPE frequencies are scaled for long contexts.
    pub rope_scaling: RopeScaling,
}

impl Config {
    /// Reads and checks the configuration of a GGUF model (every key strict).
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
        // Absent: the architecture's default; present, it must be a number (a string
        // here once ran with the default θ and answered in another language).
        let float = |k: &str, default: f64| -> Result<f64> {
            let key = format!("{arch}.{k}");
            match g.metadata.get(&key) {
                None => Ok(default),
                Some(v) => v
                    .as_f64()
                    .ok_or_else(|| Error::Model(format!("{key} = {v:?} is not a number"))),
            }
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
            rope_theta: float("rope.freq_base", 10_000.0)?,
            eps: float("attention.layer_norm_rms_epsilon", 1e-5)? as f32,
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
        let problem = if heads == 0 || !dim.is_multiple_of(heads) {
            format!("{heads} attention heads do not divide the width {dim}")
        } else if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            format!("{kv_heads} KV heads do not divide the {heads} attention heads")
        } else if !c.head_dim.is_multiple_of(2) {
            format!("head dimension {} is odd (RoPE rotates pairs)", c.head_dim)
        } else if c.rope_theta.is_nan() || c.rope_theta <= 1.0 {
            format!("RoPE base {} is not above 1", c.rope_theta)
        } else if !eps_ok {
            format!("norm epsilon {} is not a positive number", c.eps)
        } else {
            return Ok(self);
        };
        Err(Error::Model(format!(
            "inconsistent hyper-parameters: {problem}"
        )))
    }
    /// Width of one position's keys (or values).
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

impl From<&Config> for crate::kv_cache::KvShape {
    fn from(c: &Config) -> Self {
        crate::kv_cache::KvShape {
            layers: c.n_layers,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
        }
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
/// ([`crate::linear::stack`]), else run one by one. The parts come unpacked and the
/// result is packed once: packing each part and then the stack left the parts' copies
/// behind as dead space in the 2 MiB-page chunks (`tessera_core::huge`), ~43 MB for the
/// default model.
#[derive(Debug)]
enum SharedInput<const N: usize> {
    Separate([Box<dyn Linear>; N]),
    /// The stacked layer and each part's output width.
    Stacked(Box<dyn Linear>, [usize; N]),
}

impl<const N: usize> SharedInput<N> {
    /// The parts as loaded, before their activation mode is set; `acts` is set on the
    /// stacked layer, or on each part when they do not stack.
    fn new(mut parts: [Box<dyn Linear>; N], acts: Activations) -> Self {
        match crate::linear::stack(&parts.each_ref().map(|p| &**p)) {
            Some(mut w) => {
                w.set_activations(acts);
                SharedInput::Stacked(w, parts.each_ref().map(|p| p.out_features()))
            }
            None => {
                parts.iter_mut().for_each(|p| p.set_activations(acts));
                SharedInput::Separate(parts)
            }
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
                let buf = stacked_rows(&**w, stacked_op, x, buf, n)?;
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

    /// As [`SharedInput::forward`], but a stacked layer's output stays unsplit in
    /// `buf` (`[n, width]`, the parts side by side): returns `Some(width)` then, `None`
    /// when the parts ran separately into `ys`.
    fn forward_unsplit(
        &self,
        ops: ([&'static str; N], &'static str),
        x: &[f32],
        ys: [&mut [f32]; N],
        buf: &mut Vec<f32>,
        n: usize,
    ) -> Result<Option<usize>> {
        match self {
            SharedInput::Separate(_) => self.forward(ops, x, ys, buf, n).map(|_| None),
            SharedInput::Stacked(w, _) => {
                stacked_rows(&**w, ops.1, x, buf, n)?;
                Ok(Some(w.out_features()))
            }
        }
    }
}

/// Runs the stacked layer `w` into the first `n·width` floats of `buf`, growing it only
/// when too short: the step's stacked layers (q/k/v 960 wide, gate/up 3072) share it,
/// and resizing it down and up again zeroed the difference in every layer.
fn stacked_rows<'b>(
    w: &dyn Linear,
    op: &'static str,
    x: &[f32],
    buf: &'b mut Vec<f32>,
    n: usize,
) -> Result<&'b mut [f32]> {
    let len = n * w.out_features();
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    linear(op, w, x, &mut buf[..len], n)?;
    Ok(&mut buf[..len])
}

/// A loaded model.
#[derive(Debug)]
pub struct Llama {
    /// The model's configuration.
    pub cfg: Config,
    embed: Box<dyn Linear>,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// None when the output projection is tied to the embedding.
    output: Option<Box<dyn Linear>>,
    /// RoPE frequency of each rotated pair, scaling applied.
    rope_freqs: Vec<f64>,
    /// Loaded with [`LoadOptions::activations`].
    activations: Activations,
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
        let mut by = std::collections::BTreeMap::<DType, (usize, usize)>::new();
        for (l, count) in self.layers_stored() {
            let e = by.entry(l.dtype()).or_default();
            e.0 += count;
            e.1 += l.weight_bytes();
        }
        by.into_iter().map(|(d, (n, b))| (d, n, b)).collect()
    }

    /// Bytes of weights held in 2 MiB pages (`LoadOptions::large_pages`): what a user
    /// checks to see the option took (0 where the mode keeps blocks unpacked, f32).
    pub fn large_page_bytes(&self) -> usize {
        self.layers_stored()
            .into_iter()
            .filter(|(l, _)| l.in_large_pages())
            .map(|(l, _)| l.weight_bytes())
            .sum()
    }

    /// Every stored weight layer once, with how many matrices it holds (stacked layers
    /// count their parts).
    fn layers_stored(&self) -> Vec<(&dyn Linear, usize)> {
        let mut all: Vec<(&dyn Linear, usize)> = vec![(self.embed.as_ref(), 1)];
        for l in &self.layers {
            all.extend(l.qkv.matrices());
            all.extend(l.gate_up.matrices());
            all.extend([(l.o.as_ref(), 1), (l.down.as_ref(), 1)]);
        }
        all.extend(self.output.as_deref().map(|o| (o, 1)));
        all
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
        let mut l = self.part(name, out, inp)?;
        l.set_activations(self.opts.activations);
        Ok(l)
    }

    /// As [`Loader::linear`], the activation mode left for [`SharedInput::new`] to set.
    fn part(&self, name: &str, out: usize, inp: usize) -> Result<Box<dyn Linear>> {
        let wname = format!("{name}.weight");
        let l = load_matrix_unpacked(self.src, &wname, self.opts)?;
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

impl Llama {
    /// A GGUF model with its weights in their stored formats.
    pub fn load(g: &Gguf) -> Result<Self> {
        Self::from_source(Config::from_gguf(g)?, g, &LoadOptions::default())
    }

    /// A model of `cfg` from any weight source, its packed weights placed as
    /// `opts.large_pages` asks.
    pub fn from_source(cfg: Config, src: &dyn WeightSource, opts: &LoadOptions) -> Result<Self> {
        tessera_core::huge::with_large_pages(opts.large_pages, || {
            Self::from_source_placed(cfg, src, opts)
        })
    }

    /// [`Llama::from_source`] inside its placement scope.
    fn from_source_placed(
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
        // A layer count below the file's would run a truncated model without a word.
        if src.has(&format!("blk.{}.attn_norm.weight", cfg.n_layers)) {
            return Err(Error::Model(format!(
                "the weights have more layers than the {} the configuration declares",
                cfg.n_layers
            )));
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
                qkv: SharedInput::new(
                    [
                        ld.part(&n("attn_q"), d, d)?,
                        ld.part(&n("attn_k"), kv, d)?,
                        ld.part(&n("attn_v"), kv, d)?,
                    ],
                    opts.activations,
                ),
                o: ld.linear(&n("attn_output"), d, d)?,
                ffn_norm: norm("ffn_norm")?,
                gate_up: SharedInput::new(
                    [ld.part(&n("ffn_gate"), f, d)?, ld.part(&n("ffn_up"), f, d)?],
                    opts.activations,
                ),
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
            activations: opts.activations,
        })
    }

    /// How matmuls of up to [`tessera_kernels::ops::qmatmul::INT8_BATCH_M`] rows take
    /// their activations ([`LoadOptions::activations`]).
    pub fn activations(&self) -> Activations {
        self.activations
    }

    /// How many groups of projections (a layer's q/k/v, its gate/up) run as one stacked
    /// matmul: those whose matrices share a block format ([`crate::linear::stack`]).
    pub fn stacked_projections(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.qkv.is_stacked() as usize + l.gate_up.is_stacked() as usize)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear::QuantLinear;
    use tessera_kernels::quant::{BlockQ4_0, BlockQ8_0, QuantMatrix};

    fn q4_0(rows: usize, seed: f32) -> Box<dyn Linear> {
        let data: Vec<f32> = (0..rows * 64).map(|i| (i as f32 * seed).sin()).collect();
        Box::new(QuantLinear::new(
            QuantMatrix::<BlockQ4_0>::quantize(rows, 64, &data).unwrap(),
        ))
    }

    /// Parts arrive unpacked; the stacked layer (or each part, where they do not stack)
    /// gets the activation mode, so an integer mode packs it once (a packed layer no
    /// longer hands out its ggml blocks) and f32 keeps the blocks.
    #[test]
    fn shared_inputs_set_the_mode_on_what_they_keep() {
        for (acts, packed) in [(Activations::A16, true), (Activations::F32, false)] {
            let s = SharedInput::new([q4_0(16, 0.1), q4_0(8, 0.2)], acts);
            assert!(s.is_stacked());
            for (w, _) in s.matrices() {
                assert_eq!(w.ggml_blocks().is_none(), packed, "{acts:?} stacked");
            }
            let data = vec![0.5f32; 8 * 64];
            let q8: Box<dyn Linear> = Box::new(QuantLinear::new(
                QuantMatrix::<BlockQ8_0>::quantize(8, 64, &data).unwrap(),
            ));
            let s = SharedInput::new([q4_0(16, 0.3), q8], acts);
            assert!(!s.is_stacked());
            for (w, _) in s.matrices() {
                assert_eq!(w.ggml_blocks().is_none(), packed, "{acts:?} separate");
            }
        }
    }
}
