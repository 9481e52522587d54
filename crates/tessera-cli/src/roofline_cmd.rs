//! `tessera roofline`: this machine's ceilings (measured once, cached per machine) and an
//! SVG roofline with kernels placed on it, from a fresh benchmark run of the named ops or
//! from a saved `tessera bench --json` file.

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

pub fn run(a: RooflineArgs) -> Result<()> {
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
    let points = match &a.from {
        Some(path) => points_from_json(path)?,
        None if a.sel.is_empty() => Vec::new(),
        None => {
            let ceilings = jobs::calibrate();
            let opts = BenchOptions {
                budget: Duration::from_millis(a.budget_ms),
                ..Default::default()
            };
            let best = tessera_core::Isa::best().name();
            jobs::collect(&a.sel, Some(best), &ceilings, &opts, false)?
                .iter()
                .map(|b| Point {
                    label: format!("{} {} {}", b.op, b.problem, b.dtype),
                    intensity: b.flops / b.bytes.max(1.0),
                    gflops: b.gflops,
                })
                .collect()
        }
    };
    std::fs::write(&a.out, svg(&r, &points))
        .with_context(|| format!("writing {}", a.out.display()))?;
    println!("{} kernels placed; wrote {}", points.len(), a.out.display());
    Ok(())
}
