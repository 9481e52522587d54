//! A per-process scratch directory: the loaders under test read files (memory-mapped, as
//! users' models are), so each input is written there first.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `$TMPDIR/tessera-fuzz-<pid>`, created on first use with the subdirectories the
/// targets write (`checkpoint`, `tokenizer`), once per process rather than per input.
/// Also puts back the default panic hook in place of libfuzzer-sys's aborting one, so a
/// panic the code under test catches and turns into an error (a dependency's, see
/// `Tokenizer::from_hf_dir`) is not a crash; an uncaught panic still is (`fuzz_target!`
/// aborts on it).
pub fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        drop(std::panic::take_hook());
        let d = std::env::temp_dir().join(format!("tessera-fuzz-{}", std::process::id()));
        for sub in ["checkpoint", "tokenizer"] {
            std::fs::create_dir_all(d.join(sub)).expect("creating the fuzz scratch directory");
        }
        d
    })
}
