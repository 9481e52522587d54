//! `tessera tune`: search tunable spaces on this machine and save the winners to the
//! tuning cache the kernels read at start-up (see `tessera_perf::tune`).

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use tessera_core::DType;
use tessera_kernels::registry::ProblemCase;
use tessera_perf::regress::fingerprint;
use tessera_perf::report::table;
use tessera_perf::tune::{self, CacheEntry, Target};

#[derive(Args, Debug)]
pub struct TuneArgs {
    /// Ops to tune (their named benchmark shapes, or --shape).
    #[arg(required = true)]
    ops: Vec<String>,
    /// A problem in the op's syntax instead of the named set.
    #[arg(long)]
    shape: Option<String>,
    /// Only this dtype (default: every dtype the op has).
    #[arg(long)]
    dtype: Option<DType>,
    /// Timing budget per candidate in milliseconds.
    #[arg(long, default_value_t = 150)]
    budget_ms: u64,
    /// Show what would change without writing the cache.
    #[arg(long)]
    dry_run: bool,
}

/// The tuning cache's path: `$TESSERA_TUNE_CACHE`, else `<model cache>/tuning.json`.
pub fn cache_path() -> Result<PathBuf> {
    match std::env::var_os("TESSERA_TUNE_CACHE") {
        Some(p) => Ok(PathBuf::from(p)),
        None => Ok(tessera_engine::pull::cache_dir()?.join("tuning.json")),
    }
}

/// Installs this machine's tuned configurations (if any) into the kernels; a cache that
/// cannot be used is reported once and ignored, never misapplied.
pub fn install_cache() {
    let Ok(path) = cache_path() else { return };
    if !path.exists() {
        return;
    }
    let threads = tessera_kernels::pool::global().threads();
    match tune::load(&path, &fingerprint(threads)) {
        Ok(c) => {
            tessera_kernels::tuning::install(c.entries.iter().map(CacheEntry::to_tuned).collect())
        }
        Err(why) => eprintln!("tessera: tuning cache {why}"),
    }
}

pub fn run(a: TuneArgs) -> Result<()> {
    let ops = super::selected_ops(&a.ops)?;
    let ceilings = crate::jobs::calibrate();
    let isa = tessera_core::Isa::best();
    // Everything to search first, so progress can be shown against the total.
    let mut per_op = Vec::new();
    for op in ops {
        let problems: Vec<Box<dyn ProblemCase>> = match &a.shape {
            Some(s) => vec![op
                .parse_problem(s)
                .with_context(|| format!("--shape for {}", op.name()))?],
            None => op.bench_problems().into_iter().map(|(_, p)| p).collect(),
        };
        per_op.push((op, problems));
    }
    let mut targets = Vec::new();
    for (op, problems) in &per_op {
        for &dtype in op
            .dtypes()
            .iter()
            .filter(|d| a.dtype.is_none_or(|x| x == **d))
        {
            let Some(variant) = op
                .variants(dtype)
                .into_iter()
                .find(|v| v.label == isa.name())
            else {
                continue;
            };
            for problem in problems
                .iter()
                .filter(|p| p.tune_space().size() > 1 && p.supports(dtype, &variant))
            {
                targets.push((*op, problem.as_ref(), dtype, variant.clone()));
            }
        }
    }
    let bar = crate::progress::bar(targets.len() as u64, "tune");
    let mut rows = Vec::new();
    let mut entries = Vec::new();
    for (op, problem, dtype, variant) in &targets {
        let t = Target {
            op: *op,
            problem: *problem,
            dtype: *dtype,
            variant,
        };
        bar.set_message(format!(
            "{t:?} ({} configurations)",
            problem.tune_space().size()
        ));
        let o = tune::search(&t, &ceilings, Duration::from_millis(a.budget_ms))?;
        bar.inc(1);
        rows.push(vec![
            format!("{} {} {}", op.name(), o.problem, dtype),
            format!("{:.1} µs", o.default_s * 1e6),
            format!("{:.1} µs", o.best_s * 1e6),
            format!("{:.2}×", o.default_s / o.best_s),
            o.best.to_string(),
            format!("{} ({} rejected)", o.evaluated, o.rejected),
            if o.entry.is_some() {
                "yes".into()
            } else {
                "no (not looked up at run time)".into()
            },
        ]);
        entries.extend(o.entry.iter().map(CacheEntry::from_tuned));
    }
    bar.finish_and_clear();
    if rows.is_empty() {
        bail!("nothing to tune (no tunable space for the selection)");
    }
    print!(
        "{}",
        table(
            &[
                "problem",
                "default",
                "best",
                "speedup",
                "best config",
                "evaluated",
                "cached"
            ],
            &rows
        )
    );
    let path = cache_path()?;
    if a.dry_run {
        println!(
            "dry run: {} entries would be written to {}",
            entries.len(),
            path.display()
        );
    } else if !entries.is_empty() {
        let threads = tessera_kernels::pool::global().threads();
        tune::save(&path, &fingerprint(threads), &entries)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("{} entries saved to {}", entries.len(), path.display());
    }
    Ok(())
}
