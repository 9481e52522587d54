//! `bench-model --json` gives scripts what the text report gives people: every run's
//! rates, their medians, and the host they were measured on (default model, pulled on
//! first use).

use std::process::Command;

#[test]
fn bench_model_json_has_rates_and_the_host() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "bench-model",
            "--prompt-tokens",
            "8",
            "--gen-tokens",
            "4",
            "--runs",
            "3",
            "--json",
        ])
        .env("TESSERA_THREADS", "2")
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
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
