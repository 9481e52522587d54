//! `tessera roofline`: this machine's ceilings (measured once, cached per machine) and an
//! SVG roofline with kernels placed on it, from a fresh benchmark run of the named ops or
//! from a saved `tessera bench --json` file. With `--backend wgpu|cuda` the ceilings are
//! that device's own probes (memory bandwidth, f32 FMA rate) and the points its
//! variants, run on the same registry problems as the CPU's.

use crate::devices::BackendArg;
use crate::jobs::{self, Selection};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use tessera_perf::bench::BenchOptions;
use tessera_perf::report::table;
use tessera_perf::roofline::{svg, Point, Roofline};

#[derive(Args, Debug)]
pub struct RooflineArgs {
    /// Ops to benchmark and place on the plot (with --all: every op); none: ceilings only.
    #[command(flatten)]
    sel: Selection,
    /// Place the results of a saved `tessera bench --json` run instead of benchmarking.
    #[arg(long, conflicts_with = "all")]
    from: Option<PathBuf>,
    /// Where to write the SVG.
    #[arg(long, default_value = "roofline.svg")]
    out: PathBuf,
    /// Measure the ceilings again even if this machine's are cached.
    #[arg(long)]
    refresh: bool,
    /// Time budget per benchmark in milliseconds.
    #[arg(long, default_value_t = 500)]
    budget_ms: u64,
}

fn points_from_json(path: &PathBuf) -> Result<Vec<Point>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let results = doc["results"].as_array().with_context(|| {
        format!(
            "{}: no \"results\" (expected `tessera bench --json` output)",
            path.display()
        )
    })?;
    results
        .iter()
        .map(|r| {
            let num = |k: &str| {
                r[k].as_f64()
                    .with_context(|| format!("a result without {k}"))
            };
            let label = ["op", "problem", "dtype", "variant"]
                .map(|k| r[k].as_str().unwrap_or("?"))
                .join(" ");
            Ok(Point {
                label,
                intensity: num("flops")? / num("bytes")?.max(1.0),
                gflops: num("gflops")?,
            })
        })
        .collect()
}

/// The device's roofline from its probes: one memory ceiling and its f32 FMA rate.
fn device_roofline(backend: BackendArg) -> Result<Roofline> {
    crate::devices::open(backend)?;
    let c = crate::devices::device_ceilings(backend)?
        .context("the device opened but measured no ceilings")?;
    let label = format!("{backend:?}").to_lowercase();
    let name = tessera_core::device::installed()
        .iter()
        .find(|d| d.kind().name() == label)
        .map(|d| d.name())
        .unwrap_or_default();
    Ok(Roofline {
        fingerprint: format!("{name} ({label})"),
        threads: 0,
        fma_gflops: c.fma_gflops,
        bf16_gflops: 0.0,
        int8_gops: 0.0,
        dram_gbps: c.dram_gbps,
        l3_gbps: 0.0,
        l2_gbps: 0.0,
    })
}

pub fn run(a: RooflineArgs) -> Result<()> {
    let backend = a.sel.backend;
    match backend {
        BackendArg::Cpu => run_on(a, None),
        BackendArg::Wgpu | BackendArg::Cuda => {
            let r = device_roofline(backend)?;
            let rows = vec![
                vec!["f32 FMA".into(), format!("{:.0} GFLOP/s", r.fma_gflops)],
                vec!["memory".into(), format!("{:.1} GB/s", r.dram_gbps)],
            ];
            print!("{}\n{}", r.fingerprint, table(&["ceiling", "rate"], &rows));
            let label = format!("{backend:?}").to_lowercase();
            run_on(a, Some((r, label)))
        }
        BackendArg::All => {
            anyhow::bail!("a roofline plots one machine's ceilings: --backend cpu, wgpu or cuda")
        }
    }
}

/// Places the points on the CPU's roofline, or on `device`'s (its roofline and its
/// variants' label).
fn run_on(a: RooflineArgs, device: Option<(Roofline, String)>) -> Result<()> {
    if let Some((r, variant)) = device {
        return place(&a, &r, &variant);
    }
    let threads = tessera_kernels::pool::global().threads();
    let cache = tessera_engine::pull::cache_dir()?.join("roofline.json");
    eprintln!(
        "ceilings ({}, cached in {})",
        if a.refresh {
            "measuring"
        } else {
            "cached or measuring"
        },
        cache.display()
    );
    let r = Roofline::cached(&cache, threads, a.refresh);
    let rows = vec![
        vec!["f32 FMA".into(), format!("{:.0} GFLOP/s", r.fma_gflops)],
        vec!["bf16 dot".into(), format!("{:.0} GFLOP/s", r.bf16_gflops)],
        vec!["int8 dot".into(), format!("{:.0} GOP/s", r.int8_gops)],
        vec!["L2 read".into(), format!("{:.0} GB/s", r.l2_gbps)],
        vec!["L3 read".into(), format!("{:.0} GB/s", r.l3_gbps)],
        vec!["DRAM read".into(), format!("{:.1} GB/s", r.dram_gbps)],
    ];
    print!("{}\n{}", r.fingerprint, table(&["ceiling", "rate"], &rows));
    place(&a, &r, tessera_core::Isa::best().name())
}

/// Benchmarks the selection's `variant` (unless `--from` names saved results) and
/// writes the SVG of `r` with them placed.
fn place(a: &RooflineArgs, r: &Roofline, variant: &str) -> Result<()> {
    let points = match &a.from {
        Some(path) => points_from_json(path)?,
        None if a.sel.is_empty() => Vec::new(),
        None => {
            let ceilings = jobs::calibrate();
            let opts = BenchOptions {
                budget: Duration::from_millis(a.budget_ms),
                device_ceilings: crate::devices::device_ceilings(a.sel.backend)?,
                ..Default::default()
            };
            jobs::collect(&a.sel, Some(variant), &ceilings, &opts, false)?
                .iter()
                .map(|b| Point {
                    label: format!("{} {} {}", b.op, b.problem, b.dtype),
                    intensity: b.flops / b.bytes.max(1.0),
                    gflops: b.gflops,
                })
                .collect()
        }
    };
    std::fs::write(&a.out, svg(r, &points))
        .with_context(|| format!("writing {}", a.out.display()))?;
    println!("{} kernels placed; wrote {}", points.len(), a.out.display());
    Ok(())
}
