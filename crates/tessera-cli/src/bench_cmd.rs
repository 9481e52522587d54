//! `tessera bench`.

use anyhow::{Context, Result};
use clap::Args;
use std::time::Duration;
use tessera_core::{DType, Isa};
use tessera_perf::bench::{self, BenchOptions};
use tessera_perf::report;

use crate::jobs::{self, Selection};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    sel: Selection,
    /// Time budget per benchmark in milliseconds.
    #[arg(long, default_value_t = 1500)]
    budget_ms: u64,
    /// Print JSON (ceilings and every sample) instead of a table.
    #[arg(long)]
    json: bool,
    /// Also time peers in the same run: the float64 reference (naive) for every op,
    /// numpy/OpenBLAS for f32 GEMM when python3 has numpy, and for memory-bound runs a
    /// cold read of the op's bytes on the same threads, timed right after it.
    #[arg(long)]
    peers: bool,
    /// Time memory-bound ops on one instance that stays in cache (no rotation): the
    /// kernel's compute rate, to compare with what DRAM delivers.
    #[arg(long)]
    in_cache: bool,
    /// Time compute-bound ops cold too: rotate copies of the operands so that every
    /// call reads them from DRAM, as a model's consecutive layers do.
    #[arg(long, conflicts_with = "in_cache")]
    cold: bool,
    /// Also write every timed call as a Chrome trace / Perfetto JSON file.
    #[arg(long, value_name = "TRACE.json")]
    profile: Option<std::path::PathBuf>,
}

/// Every timed call of every result as a Chrome trace / Perfetto JSON slice (the
/// engine's trace format), each with its problem, dtype, variant, FLOPs and bytes.
fn write_trace(path: &std::path::Path, results: &[bench::BenchResult]) -> Result<usize> {
    use tessera_engine::profile::{chrome_trace, OpEvent};
    let mut events = Vec::new();
    for r in results {
        let op = tessera_kernels::ops::find(&r.op).map_or("unknown", |o| o.name());
        let shape = format!("{} {} {} [{}]", r.problem, r.dtype, r.variant, r.config);
        for (&start, &dur) in r.sample_starts_s.iter().zip(&r.samples_s) {
            events.push(OpEvent {
                op,
                phase: "bench",
                shape: shape.clone(),
                start_us: start * 1e6,
                dur_us: dur * 1e6,
                flops: r.flops,
                bytes: r.bytes,
                unit: r.unit,
            });
        }
    }
    std::fs::write(path, chrome_trace(&events))
        .with_context(|| format!("writing the trace to {}", path.display()))?;
    Ok(events.len())
}

pub fn run(args: BenchArgs) -> Result<()> {
    crate::devices::open(args.sel.backend)?;
    // Bad selections and output paths fail now, not after calibrating and benchmarking.
    jobs::jobs(&args.sel, None)?;
    if let Some(path) = &args.profile {
        crate::profile_cmd::check_writable(path)?;
    }
    let missing = tessera_core::CpuFeatures::get().missing_paths();
    if !missing.is_empty() {
        eprintln!(
            "tessera: not measured on this host (it cannot run them): {}",
            missing.join(", ")
        );
    }
    let ceilings = jobs::calibrate();
    let opts = BenchOptions {
        budget: Duration::from_millis(args.budget_ms),
        cold_read: args.peers,
        in_cache: args.in_cache,
        cold: args.cold,
        device_ceilings: crate::devices::device_ceilings(args.sel.backend)?,
        ..Default::default()
    };
    let results = jobs::collect(&args.sel, None, &ceilings, &opts, args.json)?;
    if let Some(path) = &args.profile {
        let n = write_trace(path, &results)?;
        eprintln!("wrote {n} kernel calls to {}", path.display());
    }
    let peers = if args.peers {
        peer_rows(&args.sel, &results)?
    } else {
        Vec::new()
    };
    // What this host could not run, so a report from it says which columns are missing.
    let not_run = tessera_core::CpuFeatures::get().missing_paths();
    if args.json {
        let threads = tessera_kernels::pool::global().threads();
        let doc = serde_json::json!({
            "not_run_on_this_host": not_run,
            "fingerprint": tessera_perf::regress::fingerprint(threads),
            "tool_version": env!("CARGO_PKG_VERSION"),
            "git_commit": jobs::git_commit(),
            "cpu": tessera_core::CpuFeatures::get().summary(),
            "best_isa": Isa::best().name(),
            "ceilings": ceilings,
            "results": results,
            "peers": peers.iter().map(|p| serde_json::json!({
                "op": p.op, "problem": p.problem, "dtype": p.dtype, "variant": p.variant,
                "ours_s": p.ours_s, "naive_s": p.naive_s, "numpy_s": p.numpy_s,
                "cold_read_s": p.cold_read_s,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", report::bench_table(&results));
        for r in &results {
            if let Some(t) = r.transfer {
                println!(
                    "{} {} {} {}: upload {:.3} ms, download {:.3} ms (outside the timed calls)",
                    r.op,
                    r.problem,
                    r.dtype,
                    r.variant,
                    t.upload_s * 1e3,
                    t.download_s * 1e3
                );
            }
        }
        if !peers.is_empty() {
            print!("{}", peer_table(&peers));
        }
        if !not_run.is_empty() {
            println!(
                "not benchmarked on this host (it cannot run them): {}",
                not_run.join(", ")
            );
        }
    }
    Ok(())
}

/// One result and its peers' times (None: not applicable or not installed).
struct PeerRow {
    op: String,
    problem: String,
    dtype: String,
    variant: String,
    ours_s: f64,
    naive_s: Option<f64>,
    numpy_s: Option<f64>,
    cold_read_s: Option<f64>,
}

/// Times the peers of every result (problems re-parsed from their names).
fn peer_rows(sel: &Selection, results: &[bench::BenchResult]) -> Result<Vec<PeerRow>> {
    let threads = tessera_kernels::pool::global().threads();
    let mut rows = Vec::new();
    for r in results {
        let Some(op) = tessera_kernels::ops::find(&r.op) else {
            continue;
        };
        let problem = match &sel.shape {
            Some(s) => op.parse_problem(s)?,
            None => match op
                .bench_problems()
                .into_iter()
                .find(|(_, p)| p.to_string() == r.problem)
            {
                Some((_, p)) => p,
                None => continue,
            },
        };
        let dtype: DType = r.dtype.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
        eprintln!("peers for {} {} {}...", r.op, r.problem, r.dtype);
        let numpy_s = match (r.op.as_str(), dtype, problem.tune_dims()) {
            ("gemm", DType::F32, Some(d)) => {
                tessera_perf::peers::numpy_gemm_s(d[0], d[1], d[2], threads)
            }
            _ => None,
        };
        rows.push(PeerRow {
            op: r.op.clone(),
            problem: r.problem.clone(),
            dtype: r.dtype.clone(),
            variant: r.variant.clone(),
            ours_s: r.median_s,
            naive_s: tessera_perf::peers::naive_s(problem.as_ref(), dtype),
            numpy_s,
            cold_read_s: r.cold_read_s,
        });
    }
    Ok(rows)
}

fn peer_table(rows: &[PeerRow]) -> String {
    let cell = |peer: Option<f64>, ours: f64| match peer {
        Some(s) => format!("{} ({:.2}× ours)", report::format_time(s), s / ours),
        None => "-".into(),
    };
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|p| {
            vec![
                format!("{} {} {} {}", p.op, p.problem, p.dtype, p.variant),
                report::format_time(p.ours_s),
                cell(p.naive_s, p.ours_s),
                cell(p.numpy_s, p.ours_s),
                cell(p.cold_read_s, p.ours_s),
            ]
        })
        .collect();
    format!(
        "\npeers, same run (a peer's time / ours: > 1 means we are faster)\n{}",
        report::table(
            &[
                "benchmark",
                "ours",
                "naive float64 reference",
                "numpy (OpenBLAS)",
                "cold read of its bytes"
            ],
            &body
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_has_one_slice_per_timed_call() {
        let r = bench::BenchResult {
            op: "rms_norm".into(),
            problem: "4x8".into(),
            dtype: "f32".into(),
            variant: "scalar".into(),
            config: "threads=1".into(),
            samples_s: vec![2e-6, 3e-6],
            sample_starts_s: vec![1.0, 1.5],
            median_s: 2.5e-6,
            spread: 0.1,
            flops: 96.0,
            bytes: 288.0,
            gflops: 0.0,
            gbps: 0.0,
            roofline_pct: 0.0,
            dram_gbps: 1.0,
            peak_gflops: 1.0,
            unit: tessera_kernels::registry::ComputeUnit::Fma,
            bound: "memory",
            rotation: 1,
            cold_read_s: None,
            transfer: None,
        };
        let path = std::env::temp_dir().join(format!("tessera-trace-{}.json", std::process::id()));
        assert_eq!(write_trace(&path, &[r]).unwrap(), 2);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[1]["name"], "rms_norm");
        assert_eq!(events[1]["ts"], 1.5e6);
        assert_eq!(events[1]["dur"], 3.0);
        assert_eq!(events[0]["args"]["bytes"], 288.0);
        assert!(events[0]["args"]["shape"]
            .as_str()
            .unwrap()
            .contains("4x8 f32 scalar"));
        let _ = std::fs::remove_file(path);
    }
}
