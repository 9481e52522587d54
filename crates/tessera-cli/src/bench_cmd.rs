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
    #[arg(long)]
    shape: Option<String>,
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
    let ops = if sel.all || sel.ops.is_empty() {
        if !sel.all {
            bail!("name an op (see `tessera ops`) or pass --all");
        }
        registry::all()
    } else {
        super::selected_ops(&sel.ops)?
    };
    let variant_filter = sel.variant.as_deref().or(default_variant);
    let mut results = Vec::new();
    for op in ops {
        let problems: Vec<(String, Box<dyn ProblemCase>)> = match &sel.shape {
            Some(s) => vec![(
                s.clone(),
                op.parse_problem(s)
                    .with_context(|| format!("--shape for {}", op.name()))?,
            )],
            None => op
                .bench_problems()
                .into_iter()
                .map(|(n, p)| (n.to_string(), p))
                .collect(),
        };
        for &dtype in op
            .dtypes()
            .iter()
            .filter(|d| sel.dtype.is_none_or(|x| x == **d))
        {
            for variant in op
                .variants(dtype)
                .iter()
                .filter(|v| variant_filter.is_none_or(|x| x == v.label))
            {
                for (_, problem) in &problems {
                    let mut config = problem.tune_space().defaults();
                    for (k, v) in &sel.set {
                        let name = problem
                            .tune_space()
                            .0
                            .iter()
                            .find(|p| p.name == k)
                            .map(|p| p.name);
                        match name {
                            Some(n) => config.set(n, *v),
                            None => bail!("{} has no tunable '{k}'", op.name()),
                        }
                    }
                    let spec = BenchSpec {
                        op: op.name(),
                        problem: problem.as_ref(),
                        dtype,
                        variant,
                        config: &config,
                        bf16_dot: variant.label.contains("dpbf16"),
                    };
                    let r = bench::run(&spec, ceilings, opts)?;
                    if !quiet {
                        eprintln!(
                            "{}",
                            report::bench_table(std::slice::from_ref(&r))
                                .lines()
                                .nth(2)
                                .unwrap_or_default()
                        );
                    }
                    results.push(r);
                }
            }
        }
    }
    Ok(results)
}

pub fn run(args: BenchArgs) -> Result<()> {
    let ceilings = calibrate();
    let opts = BenchOptions {
        budget: Duration::from_millis(args.budget_ms),
        ..Default::default()
    };
    let results = collect(&args.sel, None, &ceilings, &opts, args.json)?;
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
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", report::bench_table(&results));
    }
    Ok(())
}
