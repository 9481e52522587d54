//! Hugging Face checkpoints: one random model written twice by the test — as an HF
//! directory (config.json + bf16 safetensors, q/k rows in HF order, half-split RoPE) and
//! as a GGUF in the converters' interleaved order — and the engine's HF logits compared
//! with the independent float64 forward over the GGUF. Llama (no biases, untied head) and
//! Qwen2 (q/k/v biases, tied) configurations; `--quantize` at load; malformed checkpoints.

mod common;

use common::*;
use half::bf16;
use rand::{Rng, SeedableRng};
use safetensors::tensor::{Dtype, TensorView};
use std::path::{Path, PathBuf};
use tessera_core::DType;
use tessera_engine::gguf::{Gguf, Value};
use tessera_engine::hf::HfCheckpoint;
use tessera_engine::kv_cache::KvCache;
use tessera_engine::linear::Activations;
use tessera_engine::llama::Llama;
use tessera_engine::weights::LoadOptions;

/// f32 activations: these tests compare loaders through the exact path.
fn exact_opts() -> LoadOptions {
    opts_with(Activations::F32)
}

const VOCAB: usize = 80;
const DIM: usize = 64;
const FFN: usize = 96;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = DIM / HEADS;
const LAYERS: usize = 2;

/// Same arithmetic as the GGUF synthetic test (f32 vs float64 on identical weights).
const LOGIT_TOL: f64 = 1e-5;

/// A tensor in HF layout: name, shape, values (already representable in bf16).
struct Tensor {
    name: String,
    shape: Vec<usize>,
    values: Vec<f32>,
}

fn random_model(qwen: bool) -> Vec<Tensor> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(if qwen { 11 } else { 5 });
    let mut t = |name: String, shape: &[usize], scale: f32| Tensor {
        name,
        shape: shape.to_vec(),
        values: (0..shape.iter().product())
            .map(|_| bf16::from_f32(rng.random_range(-scale..scale)).to_f32())
            .collect(),
    };
    let kv = KV_HEADS * HD;
    let mut v = vec![t("model.embed_tokens.weight".into(), &[VOCAB, DIM], 1.0)];
    for l in 0..LAYERS {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        v.push(t(p("input_layernorm.weight"), &[DIM], 1.0));
        v.push(t(p("self_attn.q_proj.weight"), &[DIM, DIM], 0.3));
        v.push(t(p("self_attn.k_proj.weight"), &[kv, DIM], 0.3));
        v.push(t(p("self_attn.v_proj.weight"), &[kv, DIM], 0.3));
        if qwen {
            v.push(t(p("self_attn.q_proj.bias"), &[DIM], 0.5));
            v.push(t(p("self_attn.k_proj.bias"), &[kv], 0.5));
            v.push(t(p("self_attn.v_proj.bias"), &[kv], 0.5));
        }
        v.push(t(p("self_attn.o_proj.weight"), &[DIM, DIM], 0.2));
        v.push(t(p("post_attention_layernorm.weight"), &[DIM], 1.0));
        v.push(t(p("mlp.gate_proj.weight"), &[FFN, DIM], 0.3));
        v.push(t(p("mlp.up_proj.weight"), &[FFN, DIM], 0.3));
        v.push(t(p("mlp.down_proj.weight"), &[DIM, FFN], 0.2));
    }
    v.push(t("model.norm.weight".into(), &[DIM], 1.0));
    if !qwen {
        v.push(t("lm_head.weight".into(), &[VOCAB, DIM], 0.5));
    }
    v
}

/// RoPE scaling under test, written the HF way and the GGUF way.
#[derive(Clone, Copy, PartialEq)]
enum Scaling {
    None,
    Linear(f64),
    /// Llama 3.1's parameters with an original context of 64, so that at head dim 16
    /// pair 0 is kept, pairs 1–2 are blended and pairs 3–7 divided by 8.
    Llama3,
}

impl Scaling {
    fn hf(self) -> serde_json::Value {
        match self {
            Scaling::None => serde_json::Value::Null,
            Scaling::Linear(f) => serde_json::json!({"type": "linear", "factor": f}),
            Scaling::Llama3 => serde_json::json!({
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
            }),
        }
    }

    /// Llama 3's per-pair divisors as llama.cpp's converter stores them in
    /// `rope_freqs.weight` (written here from the published definition).
    fn llama3_divisors() -> Vec<f32> {
        let (factor, lo, hi, ctx) = (8.0f64, 1.0, 4.0, 64.0);
        (0..HD / 2)
            .map(|i| {
                let wavelen =
                    2.0 * std::f64::consts::PI * 10_000f64.powf(2.0 * i as f64 / HD as f64);
                let div = if wavelen < ctx / hi {
                    1.0
                } else if wavelen > ctx / lo {
                    factor
                } else {
                    let s = (ctx / wavelen - lo) / (hi - lo);
                    1.0 / ((1.0 - s) / factor + s)
                };
                div as f32
            })
            .collect()
    }
}

fn config_json(qwen: bool) -> String {
    config_json_scaled(qwen, Scaling::None)
}

fn config_json_scaled(qwen: bool, scaling: Scaling) -> String {
    serde_json::json!({
        "architectures": [if qwen { "Qwen2ForCausalLM" } else { "LlamaForCausalLM" }],
        "model_type": if qwen { "qwen2" } else { "llama" },
        "hidden_size": DIM, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": VOCAB,
        "max_position_embeddings": 256, "tie_word_embeddings": qwen,
        "rope_scaling": scaling.hf(),
    })
    .to_string()
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-hf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn write_checkpoint(dir: &Path, tensors: &[Tensor], config: &str) {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|t| {
            let b = t
                .values
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                .collect();
            (t.name.clone(), b, t.shape.clone())
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = bytes
        .iter()
        .map(|(n, b, s)| {
            let view = TensorView::new(Dtype::BF16, s.clone(), b).expect("view");
            (n.clone(), view)
        })
        .collect();
    let data = safetensors::serialize(views, None).expect("serialize");
    std::fs::write(dir.join("model.safetensors"), data).expect("write");
    std::fs::write(dir.join("config.json"), config).expect("write");
}

/// HF q/k rows (pair i ↔ i + d/2) in the GGUF converters' interleaved order (2i, 2i+1).
fn interleave_rows(v: &[f32], rows: usize) -> Vec<f32> {
    let cols = v.len() / rows;
    let mut out = vec![0f32; v.len()];
    for h in 0..rows / HD {
        for i in 0..HD / 2 {
            for j in 0..2 {
                let (dst, src) = (h * HD + 2 * i + j, h * HD + j * HD / 2 + i);
                out[dst * cols..][..cols].copy_from_slice(&v[src * cols..][..cols]);
            }
        }
    }
    out
}

/// The same model as a GGUF (`dtype` for the matrices, f32 vectors): arch `llama` with
/// q/k rows interleaved as the converters write them, or `qwen2` in HF order.
fn as_gguf(tensors: &[Tensor], dtype: DType, arch: &str, scaling: Scaling) -> Vec<u8> {
    let mut raw = tensors
        .iter()
        .map(|t| {
            let name = gguf_name(&t.name);
            let rows = if t.shape.len() == 2 { t.shape[0] } else { 1 };
            let qk = arch == "llama" && (name.contains("attn_q") || name.contains("attn_k"));
            // A bias vector permutes like a matrix with one column.
            let values = match qk {
                true => interleave_rows(&t.values, t.shape[0]),
                false => t.values.clone(),
            };
            let (dims, dt) = match t.shape[..] {
                [n] => (vec![n], DType::F32),
                [r, c] => (vec![c, r], dtype),
                _ => unreachable!(),
            };
            RawTensor {
                bytes: encode(dt, rows, values.len() / rows, &values),
                name,
                dims,
                dtype: dt,
            }
        })
        .collect::<Vec<_>>();
    if scaling == Scaling::Llama3 {
        let div = Scaling::llama3_divisors();
        raw.push(RawTensor {
            name: "rope_freqs.weight".into(),
            dims: vec![div.len()],
            dtype: DType::F32,
            bytes: encode(DType::F32, 1, div.len(), &div),
        });
    }
    let shape = ModelShape {
        layers: LAYERS,
        dim: DIM,
        ffn: FFN,
        heads: HEADS,
        kv_heads: KV_HEADS,
    };
    let mut meta = llama_metadata(arch, &shape);
    if let Scaling::Linear(f) = scaling {
        let s = |k: &str| format!("{arch}.rope.scaling.{k}");
        meta.push((s("type"), Value::String("linear".into())));
        meta.push((s("factor"), Value::F32(f as f32)));
    }
    gguf_bytes_owned(&meta, &raw)
}

fn gguf_name(hf: &str) -> String {
    let map = [
        ("model.embed_tokens.", "token_embd."),
        ("model.norm.", "output_norm."),
        ("lm_head.", "output."),
        (".input_layernorm.", ".attn_norm."),
        (".post_attention_layernorm.", ".ffn_norm."),
        (".self_attn.q_proj.", ".attn_q."),
        (".self_attn.k_proj.", ".attn_k."),
        (".self_attn.v_proj.", ".attn_v."),
        (".self_attn.o_proj.", ".attn_output."),
        (".mlp.gate_proj.", ".ffn_gate."),
        (".mlp.up_proj.", ".ffn_up."),
        (".mlp.down_proj.", ".ffn_down."),
        ("model.layers.", "blk."),
    ];
    map.iter().fold(hf.to_owned(), |s, (a, b)| s.replace(a, b))
}

/// Engine logits from the HF directory vs float64 over the equivalent GGUF.
fn check(dir: &Path, tensors: &[Tensor], opts: LoadOptions, gguf_dtype: DType) {
    check_scaled(dir, tensors, opts, gguf_dtype, Scaling::None);
}

/// `t` with its matrix replaced by the values `target` stores for it (row-wise formats,
/// so they commute with the q/k row permutation).
fn defined_by(t: &Tensor, target: DType) -> Tensor {
    let values = match (&t.shape[..], target) {
        (&[r, c], DType::I8) => tessera_kernels::quant::Int8Matrix::quantize(r, c, &t.values)
            .expect("quantizable")
            .dequantize(),
        (&[r, c], DType::F8E4M3) => tessera_kernels::quant::Fp8Matrix::quantize(
            tessera_kernels::quant::fp8::Fp8::E4M3,
            tessera_kernels::quant::Fp8Scaling::PerChannel,
            r,
            c,
            &t.values,
        )
        .expect("quantizable")
        .dequantize(),
        (&[r, c], DType::Int4G32) => tessera_kernels::quant::QuantMatrix::<
            tessera_kernels::quant::BlockInt4G32,
        >::quantize(r, c, &t.values)
        .expect("quantizable")
        .dequantize(),
        _ => t.values.clone(),
    };
    Tensor {
        name: t.name.clone(),
        shape: t.shape.clone(),
        values,
    }
}

fn check_scaled(
    dir: &Path,
    tensors: &[Tensor],
    opts: LoadOptions,
    gguf_dtype: DType,
    scaling: Scaling,
) {
    check_with_reference(dir, tensors, opts, gguf_dtype, scaling)
}

/// The checkpoint in `dir` loaded with `opts` against the float64 forward of a GGUF
/// holding `tensors` in `gguf_dtype` (which the engine must also match).
fn check_with_reference(
    dir: &Path,
    tensors: &[Tensor],
    opts: LoadOptions,
    gguf_dtype: DType,
    scaling: Scaling,
) {
    let ck = HfCheckpoint::open(dir).expect("opens");
    let model = Llama::from_source(ck.config.clone(), &ck, &opts).expect("loads");
    let gpath = dir.join("same.gguf");
    write(&gpath, &as_gguf(tensors, gguf_dtype, "llama", scaling));
    // The GGUF twin through the engine's GGUF path must agree too.
    let g = Gguf::open(&gpath).expect("gguf");
    let twin = load_with(&g, Activations::F32);
    let tokens: Vec<u32> = (0..23u32).map(|i| (i * 29 + 3) % VOCAB as u32).collect();
    let want = reference_logits(&g, &tokens);
    for (what, m) in [("hf", &model), ("gguf twin", &twin)] {
        let mut cache = KvCache::new(&m.cfg, 32).expect("cache");
        let got = m.forward(&tokens[..20], &mut cache).expect("prefill");
        let e = rel(&got, &want[19]);
        assert!(
            e < LOGIT_TOL,
            "{}: {what} prefill rel error {e}",
            dir.display()
        );
        for i in 20..23 {
            let got = m.forward(&tokens[i..i + 1], &mut cache).expect("decode");
            let e = rel(&got, &want[i]);
            assert!(
                e < LOGIT_TOL,
                "{}: {what} decode {i} rel error {e}",
                dir.display()
            );
        }
    }
}

/// Linear and Llama 3 RoPE scaling: HF `rope_scaling` and its GGUF forms (metadata,
/// `rope_freqs.weight`) against the float64 forward, which applies the scaling from the
/// GGUF on its own; and the scaled model must differ from the unscaled one.
#[test]
fn rope_scaling_matches_float64_reference() {
    let tensors = random_model(false);
    let tokens: Vec<u32> = (0..20u32).map(|i| (i * 7 + 2) % VOCAB as u32).collect();
    let unscaled = {
        let dir = temp_dir("unscaled");
        write_checkpoint(&dir, &tensors, &config_json(false));
        let ck = HfCheckpoint::open(&dir).expect("opens");
        let m = Llama::from_source(ck.config.clone(), &ck, &exact_opts()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        m.forward(&tokens, &mut KvCache::new(&m.cfg, 32).unwrap())
            .unwrap()
    };
    for scaling in [Scaling::Linear(4.0), Scaling::Llama3] {
        let dir = temp_dir("scaled");
        write_checkpoint(&dir, &tensors, &config_json_scaled(false, scaling));
        check_scaled(&dir, &tensors, exact_opts(), DType::F32, scaling);
        let ck = HfCheckpoint::open(&dir).expect("opens");
        let m = Llama::from_source(ck.config.clone(), &ck, &exact_opts()).unwrap();
        let scaled = m
            .forward(&tokens, &mut KvCache::new(&m.cfg, 32).unwrap())
            .unwrap();
        let moved = rel(
            &scaled,
            &unscaled.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        );
        assert!(moved > 1e-3, "scaling changed the logits by only {moved}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn hf_llama_and_qwen2_match_float64_reference() {
    for qwen in [false, true] {
        let dir = temp_dir(if qwen { "qwen2" } else { "llama" });
        let tensors = random_model(qwen);
        write_checkpoint(&dir, &tensors, &config_json(qwen));
        check(&dir, &tensors, exact_opts(), DType::F32);
        // Quantized at load: row-wise blocks commute with the q/k row permutation, so the
        // reference is the GGUF holding the same blocks.
        let q8 = LoadOptions {
            quantize: Some(DType::Q8_0),
            ..exact_opts()
        };
        check(&dir, &tensors, q8, DType::Q8_0);
        // Formats GGUF cannot hold (per-channel INT8 and FP8, 4-bit groups): the
        // reference is an f32 GGUF of the weights those formats define.
        for target in [DType::I8, DType::F8E4M3, DType::Int4G32] {
            let defined: Vec<Tensor> = tensors.iter().map(|t| defined_by(t, target)).collect();
            let opts = LoadOptions {
                quantize: Some(target),
                ..exact_opts()
            };
            check_with_reference(&dir, &defined, opts, DType::F32, Scaling::None);
        }
        open_with_tokenizer(&dir);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `tessera_engine::open` on the directory once it has a tokenizer.json (a word-level
/// vocabulary "w0".."w79" stands in for a real one).
fn open_with_tokenizer(dir: &Path) {
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    let vocab = (0..VOCAB as u32).map(|i| (format!("w{i}"), i)).collect();
    let wl = WordLevel::builder()
        .vocab(vocab)
        .unk_token("w0".into())
        .build()
        .expect("word level");
    let mut tok = tokenizers::Tokenizer::new(wl);
    tok.with_pre_tokenizer(Some(Whitespace {}));
    tok.save(dir.join("tokenizer.json"), false).expect("save");
    let (model, tok) = tessera_engine::open(&dir.join("model.safetensors"), &exact_opts())
        .expect("opens the directory through a file inside it");
    let ids = tok.encode("w3 w17 w42").expect("encodes");
    assert_eq!(ids, [3, 17, 42]);
    let mut cache = KvCache::new(&model.cfg, 8).expect("cache");
    let logits = model.forward(&ids, &mut cache).expect("forward");
    assert_eq!(logits.len(), VOCAB);
    // The same model as opening the directory itself: the same logits, bit for bit.
    let (by_dir, _) = tessera_engine::open(dir, &exact_opts()).expect("directory");
    let mut cache = KvCache::new(&by_dir.cfg, 8).expect("cache");
    let want = by_dir.forward(&ids, &mut cache).expect("forward");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&logits), bits(&want));
}

/// A Qwen2 GGUF (biases, half-split RoPE, HF row order) through the GGUF loader, against
/// the float64 forward reading the same file.
#[test]
fn qwen2_gguf_matches_float64_reference() {
    let dir = temp_dir("qwen2-gguf");
    let path = dir.join("qwen2.gguf");
    write(
        &path,
        &as_gguf(&random_model(true), DType::Q8_0, "qwen2", Scaling::None),
    );
    let g = Gguf::open(&path).expect("gguf");
    let model = load_with(&g, Activations::F32);
    let tokens: Vec<u32> = (0..21u32).map(|i| (i * 13 + 1) % VOCAB as u32).collect();
    let want = reference_logits(&g, &tokens);
    let mut cache = KvCache::new(&model.cfg, 32).expect("cache");
    let got = model.forward(&tokens[..20], &mut cache).expect("prefill");
    assert!(rel(&got, &want[19]) < LOGIT_TOL, "{}", rel(&got, &want[19]));
    let got = model.forward(&tokens[20..], &mut cache).expect("decode");
    assert!(rel(&got, &want[20]) < LOGIT_TOL, "{}", rel(&got, &want[20]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mistral_sliding_window_caps_the_context() {
    let mut j: serde_json::Value = serde_json::from_str(&config_json(false)).unwrap();
    j["model_type"] = "mistral".into();
    j["sliding_window"] = 128.into();
    let c = tessera_engine::hf::config_from_json(&j).expect("valid");
    assert_eq!(
        c.context, 128,
        "attention beyond the window would differ from the model"
    );
    j["sliding_window"] = serde_json::Value::Null;
    assert_eq!(
        tessera_engine::hf::config_from_json(&j).unwrap().context,
        256
    );
}

#[test]
fn malformed_checkpoints_are_errors() {
    let dir = temp_dir("bad");
    let tensors = random_model(false);
    let open = |dir: &Path| HfCheckpoint::open(dir).map(|_| ());
    let cfg = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut j: serde_json::Value = serde_json::from_str(&config_json(false)).unwrap();
        edit(&mut j);
        j.to_string()
    };
    let cases: Vec<(&str, String)> = vec![
        ("model_type", cfg(&|j| j["model_type"] = "gpt2".into())),
        (
            "rope_scaling yarn",
            cfg(&|j| j["rope_scaling"] = serde_json::json!({"type": "yarn", "factor": 4.0})),
        ),
        (
            "rope_scaling llama3 without its parameters",
            cfg(&|j| j["rope_scaling"] = serde_json::json!({"rope_type": "llama3"})),
        ),
        ("heads", cfg(&|j| j["num_attention_heads"] = 5.into())),
        ("hidden_size", cfg(&|j| j["hidden_size"] = 0.into())),
        (
            "rope_theta as a string",
            cfg(&|j| j["rope_theta"] = "100000".into()),
        ),
        (
            "rms_norm_eps as a string",
            cfg(&|j| j["rms_norm_eps"] = "1e-5".into()),
        ),
    ];
    for (what, config) in cases {
        write_checkpoint(&dir, &tensors, &config);
        assert!(open(&dir).is_err(), "{what} accepted");
    }
    // Truncated safetensors file.
    write_checkpoint(&dir, &tensors, &config_json(false));
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    assert!(open(&dir).is_err(), "truncated file accepted");
    // A directory without config.json, and a device, say what they are.
    let empty = temp_dir("empty");
    let e = tessera_engine::open(&empty, &exact_opts()).unwrap_err();
    assert!(e.to_string().contains("without config.json"), "{e}");
    let e = tessera_engine::open(Path::new("/dev/null"), &exact_opts()).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    // Fewer layers declared than the checkpoint holds: a truncated model must not run.
    write_checkpoint(&dir, &tensors, &cfg(&|j| j["num_hidden_layers"] = 1.into()));
    let loaded = HfCheckpoint::open(&dir)
        .and_then(|ck| Llama::from_source(ck.config.clone(), &ck, &exact_opts()));
    let e = loaded.expect_err("a layer count below the checkpoint's accepted");
    assert!(e.to_string().contains("more layers"), "{e}");
    // A missing tensor, and an untied model without its head.
    for drop in ["model.layers.1.mlp.up_proj.weight", "lm_head.weight"] {
        let kept: Vec<Tensor> = random_model(false)
            .into_iter()
            .filter(|t| t.name != drop)
            .collect();
        write_checkpoint(&dir, &kept, &config_json(false));
        let loaded = HfCheckpoint::open(&dir)
            .and_then(|ck| Llama::from_source(ck.config.clone(), &ck, &exact_opts()));
        assert!(loaded.is_err(), "checkpoint without {drop} accepted");
    }
    // A matrix of the wrong shape.
    let mut wrong = random_model(false);
    wrong[2].shape = vec![DIM / 2, DIM * 2];
    write_checkpoint(&dir, &wrong, &config_json(false));
    let ck = HfCheckpoint::open(&dir).expect("header is fine");
    assert!(Llama::from_source(ck.config.clone(), &ck, &exact_opts()).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
