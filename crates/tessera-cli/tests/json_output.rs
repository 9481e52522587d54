//! `bench-model --json` gives scripts what the text report gives people: every run's
//! rates, their medians, and the host they were measured on (default model, pulled on
//! first use). `bench --json` names the kernel paths the host could not run. A
//! `bench-serve` sweep pairs its levels round by round.

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

/// A `bench-serve` sweep runs every level once per round and pairs each level's decode
/// rate with the first level's of the same round: the ratios and medians in `levels`
/// are recomputed here from the individual runs it also reports (the first level's
/// ratios are 1 by construction, and checked as such).
#[test]
fn bench_serve_sweep_pairs_each_level_with_the_first_by_round() {
    let j = json_of(
        &[
            "bench-serve",
            "--concurrency",
            "1,3",
            "--rounds",
            "2",
            "--prompt-tokens",
            "12",
            "--gen-tokens",
            "5",
            "--json",
        ],
        "2",
    );
    assert!(j["host"].as_str().unwrap().contains("2 threads"));
    assert_eq!(j["rounds"], 2);
    let runs = j["runs"].as_array().unwrap();
    // Round by round, the levels in the order given; the default 4 requests per stream.
    let order: Vec<(u64, u64, u64)> = runs
        .iter()
        .map(|r| {
            let n = |k: &str| r[k].as_u64().unwrap();
            (n("round"), n("concurrency"), n("requests"))
        })
        .collect();
    assert_eq!(order, [(1, 1, 4), (1, 3, 12), (2, 1, 4), (2, 3, 12)]);
    let decode = |r: &serde_json::Value| r["decode_only_tok_s"].as_f64().unwrap();
    let median2 = |v: [f64; 2]| (v[0] + v[1]) / 2.0;
    let levels = j["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for (l, level) in levels.iter().enumerate() {
        let rates: Vec<f64> = [0, 1].map(|round| decode(&runs[2 * round + l])).to_vec();
        assert!(rates.iter().all(|&r| r.is_finite() && r > 0.0), "{rates:?}");
        let want: Vec<f64> = [0, 1]
            .map(|round| decode(&runs[2 * round + l]) / decode(&runs[2 * round]))
            .to_vec();
        let got: Vec<f64> = level["decode_ratio_to_first"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        // serde_json's default float parsing may land one ulp off the printed value.
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        assert_eq!(got.len(), 2, "level {l}");
        assert!(
            got.iter().zip(&want).all(|(&g, &w)| close(g, w)),
            "level {l}: {got:?} against {want:?}"
        );
        assert!(close(
            level["decode_only_tok_s_median"].as_f64().unwrap(),
            median2([rates[0], rates[1]])
        ));
        assert!(close(
            level["decode_ratio_to_first_median"].as_f64().unwrap(),
            median2([want[0], want[1]])
        ));
    }
}
