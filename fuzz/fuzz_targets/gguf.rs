//! Any bytes as a GGUF model file: opening it (header, metadata, tensor table, weights,
//! tokenizer) must give a model or an error, never a panic, abort or hang; a model that
//! opens must tokenize, render its chat template and run one forward step.
#![no_main]

mod scratch;

use libfuzzer_sys::fuzz_target;
use tessera_engine::kv_cache::KvCache;
use tessera_engine::weights::LoadOptions;

fuzz_target!(|data: &[u8]| {
    let path = scratch::dir().join("model.gguf");
    std::fs::write(&path, data).expect("writing the input");
    let Ok((model, tok)) = tessera_engine::open(&path, &LoadOptions::default()) else {
        return;
    };
    let _ = tok.chat_prompt("Hello, world! 123");
    if let Ok(ids) = tok.encode_plain("Hello, world! 123") {
        let _ = tok.decode(&ids);
    }
    // One step of the first token, where the model is small enough to run fast.
    if model.cfg.dim <= 1024 {
        if let Ok(mut cache) = KvCache::new(&model.cfg, 4) {
            let _ = model.forward(&[0], &mut cache);
        }
    }
});
