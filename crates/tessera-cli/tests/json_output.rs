//! `bench-model --json` gives scripts what the text report gives people: every run's
//! rates, their medians, and the host they were measured on (default model, pulled on
//! first use). `bench --json` names the kernel paths the host could not run.

use std::process::Command;

/// The one JSON object `tessera ARGS` prints on `threads` threads (the run must succeed).
fn json_of(args: &[&str], threads: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("TESSERA_THREADS", threads)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn bench_model_json_has_rates_and_the_host() {
    let j = json_of(
        &[
            "bench-model",
            "--prompt-tokens",
            "8",
            "--gen-tokens",
            "4",
            "--runs",
            "3",
            "--json",
        ],
        "2",
    );
    assert_eq!(j["prompt_tokens"], 8);
    assert_eq!(j["gen_tokens"], 4);
    assert_eq!(j["threads"], 2);
    assert!(["scalar", "avx2", "avx512", "neon"].contains(&j["isa"].as_str().unwrap()));
    assert!(j["host"].as_str().unwrap().contains("2 threads"));
    for k in ["prefill", "decode"] {
        let mut runs: Vec<f64> = j[format!("{k}_tok_s_runs")]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(runs.len(), 3, "{k}");
        runs.sort_by(f64::total_cmp);
        assert_eq!(
            j[format!("{k}_tok_s")].as_f64().unwrap(),
            runs[1],
            "{k}: the median"
        );
    }
}

#[test]
fn bench_json_names_the_paths_this_host_cannot_run() {
    let j = json_of(
        &[
            "bench",
            "silu",
            "--dtype",
            "f32",
            "--variant",
            "scalar",
            "--budget-ms",
            "20",
            "--json",
        ],
        "1",
    );
    let not_run: Vec<&str> = j["not_run_on_this_host"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|v| v.as_str().expect("a string"))
        .collect();
    // An x86 host cannot run NEON and an Arm host cannot run AVX2: the list is never
    // empty, and it names the other architecture's path.
    let other = if cfg!(target_arch = "x86_64") {
        "neon"
    } else {
        "avx2"
    };
    assert!(not_run.iter().any(|p| p.starts_with(other)), "{not_run:?}");
    assert!(!j["results"].as_array().expect("results").is_empty());
}
