//! `tessera`: generate text; verify, benchmark and calibrate the kernels; report
//! quantization error.

mod bench_cmd;
mod bench_serve_cmd;
mod devices;
mod jobs;
mod profile_cmd;
mod progress;
mod quant_cmd;
mod regress_cmd;
mod roofline_cmd;
mod run_cmd;
mod serve_cmd;
mod tune_cmd;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use tessera_core::{CpuFeatures, Isa};
use tessera_kernels::registry::{self, verify};
use tessera_perf::{calibrate, report};

#[derive(Parser, Debug)]
#[command(
    name = "tessera",
    version,
    about = "Verified kernels for LLM inference"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate text (the default model is pulled on first use).
    Run(run_cmd::RunArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (continuous batching).
    Serve(serve_cmd::ServeArgs),
    /// Fetch a model into the cache (idempotent; verifies its SHA-256).
    Pull(run_cmd::PullArgs),
    /// Teacher-forced scoring: each next token's log-probability, top-k, perplexity.
    Score(run_cmd::ScoreArgs),
    /// Prefill and decode tokens/s on a model (median of several runs).
    BenchModel(run_cmd::BenchModelArgs),
    /// Offline serving benchmark through the continuous-batching scheduler: aggregate
    /// tokens/s, time to first token and inter-token latency percentiles.
    BenchServe(bench_serve_cmd::BenchServeArgs),
    /// Run a benchmark suite and save it as a baseline, or compare it with one
    /// (normalised by same-run calibration; exit 1 on a significant slowdown).
    Regress(regress_cmd::RegressArgs),
    /// This machine's ceilings (cached per machine) and an SVG roofline with kernels on it.
    Roofline(roofline_cmd::RooflineArgs),
    /// Search tunable spaces (each candidate verified against float64 before it is
    /// timed) and save the winners to the tuning cache the kernels read.
    Tune(tune_cmd::TuneArgs),
    /// Check every registered kernel (every dtype, every ISA variant this CPU runs) against
    /// its float64 reference; exit status 1 on any failure.
    Verify {
        /// Only these ops (default: all).
        #[arg(long = "op")]
        ops: Vec<String>,
        /// Which backends: the CPU, a device, or all (the CPU and every device that
        /// opens).
        #[arg(long, value_enum, default_value = "all")]
        backend: devices::BackendArg,
        /// Seed for the random problems and inputs.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Benchmark ops on their named shapes (or --shape) against this machine's measured
    /// peak FMA rate and DRAM bandwidth.
    Bench(bench_cmd::BenchArgs),
    /// Measure this machine's ceilings (FMA, bf16 dot, DRAM) and the pool's dispatch cost.
    Calibrate {
        /// Threads (default: all in the pool).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// List registered ops, their dtypes and variants.
    Ops {
        /// Also list the variants of the devices that open (wgpu, cuda).
        #[arg(long, value_enum, default_value = "cpu")]
        backend: devices::BackendArg,
    },
    /// Quantization error of every weight format on one matrix (weights and a matmul
    /// through them, against float64).
    QuantError(quant_cmd::QuantErrorArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tune_cmd::install_cache();
    match cli.command {
        Command::Run(args) => run_cmd::run(args),
        Command::Pull(args) => run_cmd::pull(args),
        Command::Serve(args) => serve_cmd::run(args),
        Command::Score(args) => run_cmd::score(args),
        Command::BenchModel(args) => run_cmd::bench_model(args),
        Command::BenchServe(args) => bench_serve_cmd::run(args),
        Command::Verify { ops, seed, backend } => run_verify(&ops, seed, backend),
        Command::Bench(args) => bench_cmd::run(args),
        Command::Regress(args) => regress_cmd::run(args),
        Command::Roofline(args) => roofline_cmd::run(args),
        Command::Tune(args) => tune_cmd::run(args),
        Command::Calibrate { threads } => run_calibrate(threads),
        Command::QuantError(args) => quant_cmd::run(args),
        Command::Ops { backend } => {
            devices::open(backend)?;
            for op in tessera_kernels::ops::all() {
                let dtypes: Vec<String> = op.dtypes().iter().map(|d| d.to_string()).collect();
                let variants: Vec<String> = op
                    .variants(op.dtypes()[0])
                    .iter()
                    .filter(|v| backend.keeps(v))
                    .map(|v| v.label.clone())
                    .collect();
                println!(
                    "{:<16} {:<22} [{}] {}",
                    op.name(),
                    dtypes.join(","),
                    variants.join(","),
                    op.summary()
                );
            }
            Ok(())
        }
    }
}

fn selected_ops(names: &[String]) -> Result<Vec<&'static dyn registry::OpSpec>> {
    if names.is_empty() {
        return Ok(tessera_kernels::ops::all());
    }
    names
        .iter()
        .map(|n| {
            tessera_kernels::ops::find(n).ok_or_else(|| {
                let known: Vec<&str> = tessera_kernels::ops::all()
                    .iter()
                    .map(|o| o.name())
                    .collect();
                anyhow::anyhow!("unknown op '{n}' (known: {})", known.join(", "))
            })
        })
        .collect()
}

fn run_verify(ops: &[String], seed: u64, backend: devices::BackendArg) -> Result<()> {
    devices::open(backend)?;
    eprintln!(
        "cpu: {} ({} pool threads)",
        CpuFeatures::get().summary(),
        tessera_kernels::pool::global().threads()
    );
    let mut all = Vec::new();
    for op in selected_ops(ops)? {
        let reports = verify::verify_op_where(op, seed, &|v| backend.keeps(v));
        if reports.is_empty() {
            continue;
        }
        print!("{}", report::verify_table(&reports));
        for r in &reports {
            for c in r.failures() {
                println!(
                    "  FAIL {}/{}/{} {}: rel_err {:.3e}, non-finite {}, nan propagates {:?}, error {:?}",
                    r.op, r.variant, r.dtype, c.problem, c.rel_err, c.non_finite, c.nan_propagates, c.error
                );
            }
        }
        println!();
        all.extend(reports);
    }
    let failed = all.iter().filter(|r| !r.passed()).count();
    let cases: usize = all.iter().map(|r| r.cases.len()).sum();
    println!(
        "{} variant/dtype combinations, {} cases: {} failed",
        all.len(),
        cases,
        failed
    );
    let missing = CpuFeatures::get().missing_paths();
    if !missing.is_empty() {
        println!(
            "not verified on this host (it cannot run them): {}",
            missing.join(", ")
        );
    }
    if failed > 0 {
        bail!("{failed} kernel variants failed verification");
    }
    Ok(())
}

fn run_calibrate(threads: Option<usize>) -> Result<()> {
    let threads = threads.unwrap_or(tessera_kernels::pool::global().threads());
    let c = calibrate::measure(threads);
    println!(
        "cpu            {} (best ISA {})",
        CpuFeatures::get().summary(),
        Isa::best()
    );
    println!("threads        {}", c.threads);
    println!("f32 FMA peak   {:.1} GFLOP/s", c.fma_gflops);
    println!("bf16 dot peak  {:.1} GFLOP/s", c.bf16_gflops);
    println!("int8 dot peak  {:.1} GOP/s", c.int8_gops);
    println!("DRAM read      {:.1} GB/s", c.dram_gbps);
    let (ours, rayon) = calibrate::dispatch_overhead_us(threads);
    println!("pool dispatch  {ours:.2} µs per parallel op (rayon broadcast: {rayon:.2} µs)");
    Ok(())
}
