//! The default model against reference outputs committed in `tests/data/`, produced by
//! tools that share no code with the engine:
//!
//! - `smollm2_reference.json`: `scripts/reference_model.py`, a numpy float64 forward with
//!   its own GGUF parser and dequantizers (last-position logits, greedy continuations), run
//!   on `smollm2_cases.json`: the cases' texts and their token ids from llama.cpp's
//!   `llama-tokenize` (`scripts/reference_tokens.py --cases`);
//! - `tokenizer_reference.json`: llama.cpp's tokenizer on a varied corpus, through
//!   `scripts/reference_tokens.py`.
//!
//! The scripts' headers give the commands that regenerate the data. The Rust float64
//! forward in `tests/common` (which the batching and int8 tests compare with, on inputs
//! of their own) is pinned to the numpy data here too, so those tests rest on it.

mod common;

use common::open_default_model;
use serde_json::Value;
use tessera_engine::kv_cache::{KvCache, KvDtype};
use tessera_engine::linear::Activations;
use tessera_engine::pull::DEFAULT_MODEL;
use tessera_engine::tokenizer::Tokenizer;

/// f32 forward vs float64 over 30 layers: measured ~4e-7 relative on the sampled logits;
/// 1e-4 leaves room for other ISAs and thread counts, while a wrong convention anywhere
/// gives errors of order 1.
const LOGIT_TOL: f64 = 1e-4;

/// With an f16 KV cache keys and values are rounded to 2⁻¹² relative before attention:
/// measured 2–4e-4 relative on these cases (AVX-512); 2e-3 leaves room for other ISAs.
const LOGIT_TOL_F16_KV: f64 = 2e-3;

/// Logit errors under an f16 cache reach ~1e-2 on single entries (4e-4 of a norm of
/// ~3.5e3 spread over 49152 entries, with outliers), so clear means ten times that.
const CLEAR_MARGIN_F16_KV: f64 = 0.1;

/// With a q8 KV cache each key and value is within half a step of its row's absmax/127:
/// measured 1.0–4.1e-2 relative on these cases (AVX-512, 16-bit activations), a hundred
/// times f16's, because a row's few large channels set the step for all 64. Every greedy
/// step still agreed; 0.1 leaves room for other ISAs, while a wrong scale or code
/// convention gives errors of order 1.
const LOGIT_TOL_Q8_KV: f64 = 0.1;

/// q8's logit errors (~4e-2 of a norm of ~3.5e3 over 49152 entries: ~0.6 per entry,
/// more on outliers) make a lead under 2 a coin toss.
const CLEAR_MARGIN_Q8_KV: f64 = 2.0;

/// Greedy tokens must agree wherever the reference's top-1 leads the runner-up by more
/// than this (in logits). The logits' absolute errors are ~1e-3 at most (4e-7 of a vector
/// whose norm is ~3.5e3), so 0.02 is a safe margin that still checks nearly every step.
const CLEAR_MARGIN: f64 = 0.02;

fn data(name: &str) -> Value {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("valid JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array of numbers")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

#[test]
fn tokenizer_matches_llama_cpp_on_the_corpus() {
    let tok = Tokenizer::from_gguf(&open_default_model()).expect("tokenizer");
    let reference = data("tokenizer_reference.json");
    let cases = reference["cases"].as_array().expect("cases");
    assert!(cases.len() >= 15, "the corpus must stay varied");
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        let got = tok.encode(text).expect("encodes");
        assert_eq!(got, want, "token ids of {text:?}");
        // Decoding skips special tokens; everything else must come back byte for byte.
        if !text.contains("<|") {
            assert_eq!(tok.decode(&got).expect("decodes"), text);
        }
    }
}

/// The tokenizer.json path: the default model's pipeline exported as tokenizer.json and
/// read back the way HF checkpoints are read must still agree with llama.cpp.
#[test]
fn tokenizer_json_round_trip_matches_llama_cpp() {
    let g = open_default_model();
    let gguf_tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    let dir = std::env::temp_dir().join(format!("tessera-tokjson-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(
        dir.join("tokenizer.json"),
        gguf_tok.to_hf_json().expect("json"),
    )
    .expect("write");
    let config = serde_json::json!({
        "add_bos_token": false,
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>"},
        "chat_template": gguf_tok.chat_template,
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("write");
    let tok = Tokenizer::from_hf_dir(&dir).expect("reads tokenizer.json");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(tok.bos, Some(1));
    assert_eq!(tok.eos, Some(2));
    assert!(tok.stop.contains(&2));
    for case in data("tokenizer_reference.json")["cases"]
        .as_array()
        .expect("cases")
    {
        let text = case["text"].as_str().expect("text");
        assert_eq!(
            tok.encode(text).expect("encodes"),
            ids(&case["ids"]),
            "{text:?}"
        );
    }
    assert_eq!(
        tok.chat_prompt("Hi").expect("template"),
        gguf_tok.chat_prompt("Hi").expect("template"),
        "same chat template"
    );
}

#[test]
fn logits_and_greedy_tokens_match_numpy_float64() {
    // The exact path (f32 activations and KV), then the defaults (16-bit activations,
    // f16 KV), whose KV rounding dominates: 2⁻¹¹ against the activations' 1/64 770;
    // then the opt-in q8 KV cache.
    check_against_numpy(KvDtype::F32, Activations::F32, LOGIT_TOL, CLEAR_MARGIN);
    check_against_numpy(
        KvDtype::F16,
        Activations::default(),
        LOGIT_TOL_F16_KV,
        CLEAR_MARGIN_F16_KV,
    );
    check_against_numpy(
        KvDtype::Q8,
        Activations::default(),
        LOGIT_TOL_Q8_KV,
        CLEAR_MARGIN_Q8_KV,
    );
}

fn check_against_numpy(kv: KvDtype, acts: Activations, tol: f64, clear_margin: f64) {
    let g = open_default_model();
    let model = common::load_with(&g, acts);
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    let reference = data("smollm2_reference.json");
    assert_eq!(
        reference["model_sha256"].as_str(),
        Some(DEFAULT_MODEL.sha256),
        "reference data was made for another model file"
    );
    for case in reference["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let tokens = ids(&case["tokens"]);
        if let Some(text) = case["text"].as_str() {
            assert_eq!(tok.encode(text).expect("encodes"), tokens, "{name}: ids");
        }
        let greedy = ids(&case["greedy"]);
        let margins = floats(&case["greedy_margins"]);
        let mut cache =
            KvCache::with_dtype(&model.cfg, tokens.len() + greedy.len(), kv).expect("cache");
        let logits = model.forward(&tokens, &mut cache).expect("prefill");

        let stride = case["sample_stride"].as_u64().expect("stride") as usize;
        let want = floats(&case["logits_sampled"]);
        let got: Vec<f32> = logits.iter().step_by(stride).copied().collect();
        assert_eq!(got.len(), want.len(), "{name}: sample count");
        let e = common::rel(&got, &want);
        assert!(e < tol, "{name} ({kv:?} KV): sampled logits rel error {e}");
        let l2: f64 = logits
            .iter()
            .map(|&v| (v as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        let want_l2 = case["logits_l2"].as_f64().expect("l2");
        assert!(
            (l2 - want_l2).abs() < tol * want_l2,
            "{name}: ‖logits‖ {l2} vs {want_l2}"
        );
        for pair in case["top"].as_array().expect("top") {
            let (id, v) = (pair[0].as_u64().expect("id"), pair[1].as_f64().expect("v"));
            let d = (logits[id as usize] as f64 - v).abs();
            assert!(d < tol * want_l2, "{name}: logit of {id} off by {d}");
        }

        // Greedy continuation, compared while the reference's choices are clear.
        let mut logits = logits;
        let mut checked = 0;
        for (step, (&want_tok, &margin)) in greedy.iter().zip(&margins).enumerate() {
            let got_tok = argmax(&logits);
            if got_tok != want_tok {
                assert!(
                    margin < clear_margin,
                    "{name}: step {step} chose {got_tok}, reference {want_tok} (margin {margin})"
                );
                break;
            }
            checked += 1;
            logits = model.forward(&[got_tok], &mut cache).expect("decode");
        }
        assert!(checked >= 6, "{name}: only {checked} greedy steps compared");
    }
}

/// The Rust float64 forward (tests/common) reads weights through the engine's GGUF parser
/// and dequantizer, numpy through its own; both then sum in float64 in different orders:
/// measured 3–6e-15 relative on these logits. 1e-9 leaves room for other summation
/// orders, while a misread weight or a wrong convention moves logits by whole percents.
const F64_REFERENCES_TOL: f64 = 1e-9;

#[test]
fn rust_float64_reference_matches_numpy() {
    let g = open_default_model();
    let reference = data("smollm2_reference.json");
    for case in reference["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let tokens = ids(&case["tokens"]);
        let last = common::reference_logits(&g, &tokens).pop().expect("logits");
        let stride = case["sample_stride"].as_u64().expect("stride") as usize;
        let want = floats(&case["logits_sampled"]);
        let got: Vec<f64> = last.iter().step_by(stride).copied().collect();
        assert_eq!(got.len(), want.len(), "{name}: sample count");
        let num: f64 = got.iter().zip(&want).map(|(a, b)| (a - b).powi(2)).sum();
        let den: f64 = want.iter().map(|b| b * b).sum();
        let e = (num / den).sqrt();
        assert!(e < F64_REFERENCES_TOL, "{name}: rel error {e}");
        let want_l2 = case["logits_l2"].as_f64().expect("l2");
        for pair in case["top"].as_array().expect("top") {
            let (id, v) = (pair[0].as_u64().expect("id"), pair[1].as_f64().expect("v"));
            let d = (last[id as usize] - v).abs();
            assert!(
                d < F64_REFERENCES_TOL * want_l2,
                "{name}: logit of {id} off by {d}"
            );
        }
    }
}

/// The model reference's inputs are committed (`smollm2_cases.json`, ids from
/// llama-tokenize) and are what the reference was run on.
#[test]
fn model_reference_inputs_are_committed_llama_cpp_tokens() {
    let inputs = data("smollm2_cases.json");
    let reference = data("smollm2_reference.json");
    let (inputs, outputs) = (
        inputs["cases"].as_array().expect("cases"),
        reference["cases"].as_array().expect("cases"),
    );
    assert_eq!(inputs.len(), outputs.len(), "one output per input case");
    for (i, o) in inputs.iter().zip(outputs) {
        assert_eq!(i["name"], o["name"]);
        assert_eq!(i["text"], o["text"], "{}", i["name"]);
        assert_eq!(ids(&i["tokens"]), ids(&o["tokens"]), "{}", i["name"]);
        assert_eq!(
            i["greedy"].as_u64(),
            Some(o["greedy"].as_array().expect("greedy").len() as u64),
            "{}",
            i["name"]
        );
    }
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}
