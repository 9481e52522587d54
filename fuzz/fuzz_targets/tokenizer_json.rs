//! Any bytes as `tokenizer.json` (with `tokenizer_config.json` empty): loading must give a
//! tokenizer or an error, never a panic; a tokenizer that loads must encode, decode and
//! render a chat prompt.
#![no_main]

mod scratch;

use libfuzzer_sys::fuzz_target;
use tessera_engine::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    let dir = scratch::dir().join("tokenizer");
    std::fs::write(dir.join("tokenizer.json"), data).expect("writing tokenizer.json");
    let Ok(tok) = Tokenizer::from_hf_dir(&dir) else {
        return;
    };
    if let Ok(ids) = tok.encode("Hello, world! 123 <|im_start|>") {
        let _ = tok.decode(&ids);
    }
    let _ = tok.chat_prompt("Hi");
});
