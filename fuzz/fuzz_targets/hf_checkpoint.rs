//! Any bytes as an HF checkpoint: the input up to the first `\n--\n` is `config.json`, the
//! rest `model.safetensors`, beside a fixed small `tokenizer.json`. Opening it must give a
//! model or an error, never a panic, abort or hang.
#![no_main]

mod scratch;

use libfuzzer_sys::fuzz_target;
use tessera_engine::weights::LoadOptions;

/// A byte-level BPE tokenizer with a 4-token vocabulary (the tokenizer has its own
/// target).
const TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,
"trim_offsets":true,"use_regex":true},"post_processor":null,"decoder":{"type":"ByteLevel",
"add_prefix_space":true,"trim_offsets":true,"use_regex":true},"model":{"type":"BPE",
"dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,
"fuse_unk":false,"byte_fallback":false,"vocab":{"a":0,"b":1,"ab":2,"c":3},"merges":["a b"]}}"#;

fuzz_target!(|data: &[u8]| {
    let sep = b"\n--\n";
    let (config, weights) = match data.windows(sep.len()).position(|w| w == sep) {
        Some(at) => (&data[..at], &data[at + sep.len()..]),
        None => (data, &[][..]),
    };
    let dir = scratch::dir().join("checkpoint");
    std::fs::write(dir.join("config.json"), config).expect("writing config.json");
    std::fs::write(dir.join("model.safetensors"), weights).expect("writing the weights");
    std::fs::write(dir.join("tokenizer.json"), TOKENIZER).expect("writing tokenizer.json");
    let _ = tessera_engine::open(&dir, &LoadOptions::default());
});
