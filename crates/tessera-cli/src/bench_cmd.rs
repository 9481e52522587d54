//! `tessera bench`.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::time::Duration;
use tessera_core::{DType, Isa};
use tessera_kernels::registry::{self, ProblemCase};
use tessera_perf::bench::{self, BenchOptions, BenchSpec};
use tessera_perf::{calibrate, report};

/// Which benchmarks to run (shared by `bench` and `regress`).
#[derive(Args, Debug)]
pub struct Selection {
    /// Ops to benchmark (default with --all: every op).
    ops: Vec<String>,
    /// Every registered op.
    #[arg(long)]
    pub all: bool,
    /// A problem in the op's syntax (e.g. 2048x2048x2048 for gemm) instead of the named set.
    #[arg(long, conflicts_with = "problem")]
    shape: Option<String>,
    /// Only the named benchmark problem of that name (e.g. "decode q/o"; see the op's set).
    #[arg(long)]
    problem: Option<String>,
    /// Only this dtype.
    #[arg(long)]
    dtype: Option<DType>,
    /// Only this variant label (e.g. avx512, avx2, scalar, avx512-dpbf16).
    #[arg(long)]
    variant: Option<String>,
    /// Tuning overrides, e.g. `--set kc=256 --set threads=1`.
    #[arg(long = "set", value_parser = parse_kv)]
    set: Vec<(String, usize)>,
}

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
    /// Also write every timed call as a Chrome trace / Perfetto JSON file.
    #[arg(long, value_name = "TRACE.json")]
    profile: Option<std::path::PathBuf>,
}

impl Selection {
    /// Nothing asked for (no op named, no --all).
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && !self.all
    }
}

fn parse_kv(s: &str) -> Result<(String, usize), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, got '{s}'"))?;
    Ok((k.to_string(), v.parse().map_err(|e| format!("{s}: {e}"))?))
}

/// Measures this machine's ceilings, printing them.
pub fn calibrate() -> calibrate::Ceilings {
    let threads = tessera_kernels::pool::global().threads();
    // A parent process that already measured them (`regress --against` runs another
    // build once per benchmark) passes its ceilings instead of paying ~1.5 s each time.
    if let Some(c) = std::env::var("TESSERA_CEILINGS")
        .ok()
        .and_then(|j| serde_json::from_str::<calibrate::Ceilings>(&j).ok())
        .filter(|c| c.threads == threads)
    {
        return c;
    }
    eprintln!("calibrating ({threads} threads)...");
    let ceilings = calibrate::measure(threads);
    eprintln!(
        "ceilings: f32 FMA {:.1} GFLOP/s, bf16 dot {:.1} GFLOP/s, DRAM {:.1} GB/s",
        ceilings.fma_gflops, ceilings.bf16_gflops, ceilings.dram_gbps
    );
    ceilings
}

/// Runs every selected benchmark (`default_variant` when the selection names none),
/// printing each row to stderr as it completes unless `quiet`.
pub fn collect(
    sel: &Selection,
    default_variant: Option<&str>,
    ceilings: &calibrate::Ceilings,
    opts: &BenchOptions,
    quiet: bool,
) -> Result<Vec<bench::BenchResult>> {
    let jobs = jobs(sel, default_variant)?;
    let bar = crate::progress::bar(jobs.len() as u64, "bench");
    let mut results = Vec::new();
    for job in &jobs {
        bar.set_message(format!(
            "{} {} {} {}",
            job.op, job.problem, job.dtype, job.variant
        ));
        let r = run_job(job, ceilings, opts)?;
        if !quiet {
            let row = report::bench_table(std::slice::from_ref(&r));
            bar.suspend(|| eprintln!("{}", row.lines().nth(2).unwrap_or_default()));
        }
        bar.inc(1);
        results.push(r);
    }
    bar.finish_and_clear();
    Ok(results)
}

/// Benchmarks one job.
pub fn run_job(
    job: &Job,
    ceilings: &calibrate::Ceilings,
    opts: &BenchOptions,
) -> Result<bench::BenchResult> {
    let spec = BenchSpec {
        op: job.op,
        problem: job.problem.as_ref(),
        dtype: job.dtype,
        variant: &job.variant,
        config: &job.config,
        bf16_dot: job.variant.label.contains("dpbf16"),
    };
    Ok(bench::run(&spec, ceilings, opts)?)
}

/// One benchmark to run: everything `BenchSpec` borrows, owned.
pub struct Job {
    pub op: &'static str,
    /// The named benchmark problem's name (None for `--shape`).
    pub name: Option<&'static str>,
    pub problem: Box<dyn ProblemCase>,
    pub dtype: DType,
    pub variant: registry::Variant,
    pub config: registry::TuneConfig,
}

impl Job {
    /// `tessera bench` arguments selecting exactly this job (the op, its named problem
    /// or `--shape`, dtype, variant and `--set` overrides from `sel`).
    pub fn to_args(&self, sel: &Selection) -> Vec<String> {
        let mut v = vec![self.op.to_string()];
        match (self.name, &sel.shape) {
            (Some(n), _) => v.extend(["--problem".into(), n.to_string()]),
            (None, Some(s)) => v.extend(["--shape".into(), s.clone()]),
            (None, None) => {}
        }
        v.extend(["--dtype".into(), self.dtype.to_string()]);
        v.extend(["--variant".into(), self.variant.label.clone()]);
        for (k, x) in &sel.set {
            v.extend(["--set".to_string(), format!("{k}={x}")]);
        }
        v
    }
}

/// Every (op, problem, dtype, variant) the selection names, with its configuration
/// (`--set` overrides on the defaults), in run order.
pub fn jobs(sel: &Selection, default_variant: Option<&str>) -> Result<Vec<Job>> {
    let ops = if sel.all || sel.ops.is_empty() {
        if !sel.all {
            bail!("name an op (see `tessera ops`) or pass --all");
        }
        registry::all()
    } else {
        super::selected_ops(&sel.ops)?
    };
    let variant_filter = sel.variant.as_deref().or(default_variant);
    let mut jobs = Vec::new();
    for op in ops {
        type Named = (Option<&'static str>, Box<dyn ProblemCase>);
        let problems = |op: &dyn registry::OpSpec| -> Result<Vec<Named>> {
            if let Some(s) = &sel.shape {
                let p = op
                    .parse_problem(s)
                    .with_context(|| format!("--shape for {}", op.name()))?;
                return Ok(vec![(None, p)]);
            }
            let named: Vec<Named> = op
                .bench_problems()
                .into_iter()
                .filter(|(n, _)| sel.problem.as_deref().is_none_or(|want| want == *n))
                .map(|(n, p)| (Some(n), p))
                .collect();
            if named.is_empty() && !sel.all {
                let names: Vec<&str> = op.bench_problems().iter().map(|(n, _)| *n).collect();
                bail!(
                    "{} has no problem {:?} (named: {})",
                    op.name(),
                    sel.problem,
                    names.join(", ")
                );
            }
            Ok(named)
        };
        for &dtype in op
            .dtypes()
            .iter()
            .filter(|d| sel.dtype.is_none_or(|x| x == **d))
        {
            for variant in op
                .variants(dtype)
                .into_iter()
                .filter(|v| variant_filter.is_none_or(|x| x == v.label))
            {
                for (name, problem) in problems(op)?.into_iter().filter(|(_, p)| p.supports(dtype))
                {
                    let space = problem.tune_space();
                    let mut config = space.defaults();
                    for (k, v) in &sel.set {
                        match space.0.iter().find(|p| p.name == k) {
                            Some(p) => config.set(p.name, *v),
                            None => bail!("{} has no tunable '{k}'", op.name()),
                        }
                    }
                    jobs.push(Job {
                        op: op.name(),
                        name,
                        problem,
                        dtype,
                        variant: variant.clone(),
                        config,
                    });
                }
            }
        }
    }
    if jobs.is_empty() {
        if let Some(name) = &sel.problem {
            bail!("no selected op has a problem named {name:?}");
        }
    }
    Ok(jobs)
}

/// Every timed call of every result as a Chrome trace / Perfetto JSON slice (the
/// engine's trace format), each with its problem, dtype, variant, FLOPs and bytes.
fn write_trace(path: &std::path::Path, results: &[bench::BenchResult]) -> Result<usize> {
    use tessera_engine::profile::{chrome_trace, OpEvent};
    let mut events = Vec::new();
    for r in results {
        let op = registry::find(&r.op).map_or("unknown", |o| o.name());
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
            });
        }
    }
    std::fs::write(path, chrome_trace(&events))
        .with_context(|| format!("writing the trace to {}", path.display()))?;
    Ok(events.len())
}

pub fn run(args: BenchArgs) -> Result<()> {
    // Bad selections and output paths fail now, not after calibrating and benchmarking.
    jobs(&args.sel, None)?;
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
    let ceilings = calibrate();
    let opts = BenchOptions {
        budget: Duration::from_millis(args.budget_ms),
        cold_read: args.peers,
        in_cache: args.in_cache,
        ..Default::default()
    };
    let results = collect(&args.sel, None, &ceilings, &opts, args.json)?;
    if let Some(path) = &args.profile {
        let n = write_trace(path, &results)?;
        eprintln!("wrote {n} kernel calls to {}", path.display());
    }
    let peers = if args.peers {
        peer_rows(&args.sel, &results)?
    } else {
        Vec::new()
    };
    if args.json {
        let threads = tessera_kernels::pool::global().threads();
        let doc = serde_json::json!({
            "fingerprint": tessera_perf::regress::fingerprint(threads),
            "tool_version": env!("CARGO_PKG_VERSION"),
            "git_commit": crate::regress_cmd::git_commit(),
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
        if !peers.is_empty() {
            print!("{}", peer_table(&peers));
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
        let Some(op) = registry::find(&r.op) else {
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
            bound: "memory",
            rotation: 1,
            cold_read_s: None,
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

    #[test]
    fn jobs_expand_the_selection_and_reject_unknown_tunables() {
        let sel = |set: Vec<(String, usize)>| Selection {
            ops: vec!["rms_norm".into()],
            all: false,
            shape: Some("3x64".into()),
            problem: None,
            dtype: Some(DType::F32),
            variant: Some("scalar".into()),
            set,
        };
        let j = jobs(&sel(vec![("threads".into(), 1)]), None).unwrap();
        assert_eq!(j.len(), 1);
        assert_eq!((j[0].op, j[0].config.get("threads")), ("rms_norm", Some(1)));
        assert!(jobs(&sel(vec![("bogus".into(), 1)]), None).is_err());
        // A job names itself for another build: op, shape, dtype, variant, overrides.
        assert_eq!(
            j[0].to_args(&sel(vec![("threads".into(), 1)])).join(" "),
            "rms_norm --shape 3x64 --dtype f32 --variant scalar --set threads=1"
        );
    }

    #[test]
    fn named_problems_select_one_and_unknown_names_are_errors() {
        let sel = |problem: &str| Selection {
            ops: vec!["qmatmul".into()],
            all: false,
            shape: None,
            problem: Some(problem.into()),
            dtype: Some(DType::Q8_0),
            variant: Some("scalar".into()),
            set: vec![],
        };
        let j = jobs(&sel("decode q/o"), None).unwrap();
        assert_eq!(j.len(), 1);
        assert_eq!(j[0].name, Some("decode q/o"));
        assert_eq!(
            j[0].to_args(&sel("decode q/o")).join(" "),
            "qmatmul --problem decode q/o --dtype q8_0 --variant scalar"
        );
        let err = jobs(&sel("nope"), None)
            .err()
            .expect("unknown name")
            .to_string();
        assert!(err.contains("decode q/o"), "lists the names: {err}");
        // With --all, ops without the name are skipped; no op having it is an error.
        let all = |problem: &str| Selection {
            ops: vec![],
            all: true,
            ..sel(problem)
        };
        let j = jobs(&all("decode q/o"), None).unwrap();
        assert!(!j.is_empty() && j.iter().all(|j| j.op.starts_with("qmatmul")));
        assert!(jobs(&all("nope"), None).is_err());
    }
}
