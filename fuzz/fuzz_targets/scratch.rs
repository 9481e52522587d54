//! A per-process scratch directory: the loaders under test read files (memory-mapped, as
//! users' models are), so each input is written there first.

use std::path::PathBuf;

/// `$TMPDIR/tessera-fuzz-<pid>`, created on first use. Also puts back the default panic
/// hook in place of libfuzzer-sys's aborting one, so a panic the code under test catches
/// and turns into an error (a dependency's, see `Tokenizer::from_hf_dir`) is not a
/// crash; an uncaught panic still is (`fuzz_target!` aborts on it).
pub fn dir() -> PathBuf {
    static DEFAULT_HOOK: std::sync::Once = std::sync::Once::new();
    DEFAULT_HOOK.call_once(|| drop(std::panic::take_hook()));
    let d = std::env::temp_dir().join(format!("tessera-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("creating the fuzz scratch directory");
    d
}
