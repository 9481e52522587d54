//! The fuzz targets' seed corpus (`fuzz/seeds/<target>/`): small valid inputs, generated
//! here so they stay valid as the loaders change. This test checks that every committed
//! seed is what the generator makes and that each opens; `TESSERA_WRITE_FUZZ_SEEDS=1
//! cargo test -p tessera-engine --test fuzz_seeds` rewrites them.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use safetensors::tensor::{Dtype, TensorView};
use std::path::{Path, PathBuf};
use tessera_core::DType;
use tessera_engine::gguf::Value;
use tessera_engine::tokenizer::Tokenizer;
use tessera_engine::weights::LoadOptions;

const DIM: usize = 32;
const FFN: usize = 64;
const HEADS: usize = 2;
const KV_HEADS: usize = 1;
/// Byte-level BPE: "a", "b", "c", their merge "ab", and the ChatML markers (special).
const TOKENS: [&str; 6] = ["a", "b", "c", "ab", "<|im_start|>", "<|im_end|>"];
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn seeds_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target)
}

fn random(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-0.5f32..0.5)).collect()
}

/// A one-layer Llama with a GPT-2 tokenizer and a chat template: every part of the
/// file the loader reads.
fn gguf_seed() -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let vocab = TOKENS.len();
    let mut mat = |name: &str, rows: usize, cols: usize, dtype: DType| RawTensor {
        name: name.into(),
        dims: if rows == 1 {
            vec![cols]
        } else {
            vec![cols, rows]
        },
        dtype,
        bytes: encode(dtype, rows, cols, &random(&mut rng, rows * cols)),
    };
    let kv = DIM / HEADS * KV_HEADS;
    let tensors = vec![
        mat("token_embd.weight", vocab, DIM, DType::Q8_0),
        mat("blk.0.attn_norm.weight", 1, DIM, DType::F32),
        mat("blk.0.attn_q.weight", DIM, DIM, DType::Q4_1),
        mat("blk.0.attn_k.weight", kv, DIM, DType::Q4_0),
        mat("blk.0.attn_v.weight", kv, DIM, DType::Q8_0),
        mat("blk.0.attn_output.weight", DIM, DIM, DType::Q4_1),
        mat("blk.0.ffn_norm.weight", 1, DIM, DType::F32),
        mat("blk.0.ffn_gate.weight", FFN, DIM, DType::Q4_1),
        mat("blk.0.ffn_up.weight", FFN, DIM, DType::Q4_1),
        mat("blk.0.ffn_down.weight", DIM, FFN, DType::Q4_1),
        mat("output_norm.weight", 1, DIM, DType::F32),
    ];
    let shape = ModelShape {
        layers: 1,
        dim: DIM,
        ffn: FFN,
        heads: HEADS,
        kv_heads: KV_HEADS,
    };
    let strings = |v: &[&str]| Value::Array(v.iter().map(|s| Value::String((*s).into())).collect());
    let mut meta = llama_metadata("llama", &shape);
    meta.extend([
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens".into(), strings(&TOKENS)),
        ("tokenizer.ggml.merges".into(), strings(&["a b"])),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array([1, 1, 1, 1, 3, 3].map(Value::I32).to_vec()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(4)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(5)),
        (
            "tokenizer.chat_template".into(),
            Value::String(CHATML.into()),
        ),
    ]);
    gguf_bytes_owned(&meta, &tensors)
}

/// `tokenizer.json` of the same vocabulary, as the `tokenizers` crate writes it.
fn tokenizer_seed() -> Vec<u8> {
    let vocab: serde_json::Map<String, serde_json::Value> = TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i.into()))
        .collect();
    let added: Vec<_> = TOKENS[4..]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": 4 + i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
        "trim_offsets": true, "use_regex": true});
    serde_json::to_vec_pretty(&serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": false, "vocab": vocab, "merges": ["a b"]},
    }))
    .expect("serializing tokenizer.json")
}

/// The `hf_checkpoint` target's input: `config.json`, `\n--\n`, `model.safetensors`
/// (bf16, tied embeddings).
fn checkpoint_seed() -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let kv = DIM / HEADS * KV_HEADS;
    let shapes: Vec<(&str, Vec<usize>)> = vec![
        ("model.embed_tokens.weight", vec![TOKENS.len(), DIM]),
        ("model.layers.0.input_layernorm.weight", vec![DIM]),
        ("model.layers.0.self_attn.q_proj.weight", vec![DIM, DIM]),
        ("model.layers.0.self_attn.k_proj.weight", vec![kv, DIM]),
        ("model.layers.0.self_attn.v_proj.weight", vec![kv, DIM]),
        ("model.layers.0.self_attn.o_proj.weight", vec![DIM, DIM]),
        ("model.layers.0.post_attention_layernorm.weight", vec![DIM]),
        ("model.layers.0.mlp.gate_proj.weight", vec![FFN, DIM]),
        ("model.layers.0.mlp.up_proj.weight", vec![FFN, DIM]),
        ("model.layers.0.mlp.down_proj.weight", vec![DIM, FFN]),
        ("model.norm.weight", vec![DIM]),
    ];
    let bytes: Vec<(&str, Vec<u8>, Vec<usize>)> = shapes
        .into_iter()
        .map(|(name, shape)| {
            let n = shape.iter().product();
            let b = random(&mut rng, n)
                .into_iter()
                .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
                .collect();
            (name, b, shape)
        })
        .collect();
    let views = bytes.iter().map(|(n, b, s)| {
        let view = TensorView::new(Dtype::BF16, s.clone(), b).expect("tensor view");
        (n.to_string(), view)
    });
    let weights = safetensors::serialize(views, None).expect("serializing safetensors");
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": DIM, "intermediate_size": FFN, "num_hidden_layers": 1,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": TOKENS.len(),
        "max_position_embeddings": 256, "tie_word_embeddings": true,
    });
    let mut seed = serde_json::to_vec(&config).expect("serializing config.json");
    seed.extend(b"\n--\n");
    seed.extend(weights);
    seed
}

/// Writes (when asked) or compares the seed at `fuzz/seeds/<target>/<name>`.
fn check_seed(target: &str, name: &str, bytes: &[u8]) {
    let path = seeds_dir(target).join(name);
    if std::env::var_os("TESSERA_WRITE_FUZZ_SEEDS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).expect("creating the seeds directory");
        std::fs::write(&path, bytes).expect("writing a seed");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (TESSERA_WRITE_FUZZ_SEEDS=1 regenerates the seeds)",
            path.display()
        )
    });
    assert!(
        committed == bytes,
        "{} differs from the generator's (TESSERA_WRITE_FUZZ_SEEDS=1 regenerates it)",
        path.display()
    );
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-seeds-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch directory");
    d
}

#[test]
fn seeds_are_current_and_open() {
    // The GGUF seed opens whole: model, tokenizer, chat template.
    let gguf = gguf_seed();
    check_seed("gguf", "tiny-llama.gguf", &gguf);
    let dir = scratch("gguf");
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, &gguf).unwrap();
    let (model, tok) = tessera_engine::open(&path, &LoadOptions::default()).expect("gguf seed");
    assert_eq!((model.cfg.dim, model.cfg.vocab), (DIM, TOKENS.len()));
    assert_eq!(tok.encode_plain("ab").unwrap(), vec![3]);
    assert_eq!(
        tok.chat_prompt("c").unwrap(),
        "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n"
    );

    // The tokenizer seed: the same vocabulary, the ChatML markers special.
    let json = tokenizer_seed();
    check_seed("tokenizer_json", "bpe.json", &json);
    let dir = scratch("tok");
    std::fs::write(dir.join("tokenizer.json"), &json).unwrap();
    let tok = Tokenizer::from_hf_dir(&dir).expect("tokenizer seed");
    assert_eq!(tok.encode_plain("abc<|im_end|>").unwrap(), vec![3, 2, 5]);

    // The checkpoint seed, split as the target splits it.
    let ck = checkpoint_seed();
    check_seed("hf_checkpoint", "tiny-llama", &ck);
    let dir = scratch("hf");
    let at = ck.windows(4).position(|w| w == b"\n--\n").unwrap();
    std::fs::write(dir.join("config.json"), &ck[..at]).unwrap();
    std::fs::write(dir.join("model.safetensors"), &ck[at + 4..]).unwrap();
    std::fs::write(dir.join("tokenizer.json"), &json).unwrap();
    let (model, _) = tessera_engine::open(&dir, &LoadOptions::default()).expect("hf seed");
    assert_eq!(model.cfg.n_layers, 1);
}

/// Found by the `tokenizer_json` target: a control byte inside the decoder object made
/// the `tokenizers` crate panic (an `expect` in its decoder deserializer) instead of
/// returning an error. Loading must report the file as malformed.
#[test]
fn tokenizer_json_that_panics_tokenizers_is_an_error() {
    let mut json = tokenizer_seed();
    let decoder = json.windows(9).position(|w| w == b"\"decoder\"").unwrap();
    let at = decoder
        + json[decoder..]
            .windows(11)
            .position(|w| w == b"\"use_regex\"")
            .unwrap();
    json.splice(at..at, *b"\x01\x00");
    let dir = scratch("tok-panic");
    std::fs::write(dir.join("tokenizer.json"), &json).unwrap();
    let Err(e) = Tokenizer::from_hf_dir(&dir) else {
        panic!("a malformed tokenizer.json loaded");
    };
    assert!(e.to_string().contains("malformed"), "{e}");
}
