//! `tessera regress`: run a benchmark suite and either save it as a named baseline or
//! compare it with one (see `tessera_perf::regress` for the statistics). Exit status 1
//! only for a significant slowdown beyond the threshold.

use crate::jobs::{self, Selection};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tessera_perf::bench::BenchOptions;
use tessera_perf::regress::{self, Baseline, Comparison, Entry, Verdict, BASELINE_FORMAT};
use tessera_perf::report::table;

#[derive(Args, Debug)]
pub struct RegressArgs {
    #[command(flatten)]
    sel: Selection,
    /// Save this run as baseline NAME.
    #[arg(long, conflicts_with = "baseline")]
    save_baseline: Option<String>,
    /// Compare this run with baseline NAME.
    #[arg(long, conflicts_with = "against")]
    baseline: Option<String>,
    /// Compare with another build instead of a saved baseline: this `tessera` binary's
    /// `bench --json` runs interleaved with ours, benchmark by benchmark, so host drift
    /// hits both alike and cancels in the paired comparison (for shared hosts).
    #[arg(long, value_name = "TESSERA_BIN", conflicts_with = "save_baseline")]
    against: Option<PathBuf>,
    /// Where baselines live.
    #[arg(long, default_value = ".tessera/baselines")]
    baseline_dir: PathBuf,
    /// Smallest relative change that counts (0.05 = 5%).
    #[arg(long, default_value_t = 0.05)]
    threshold: f64,
    /// Time budget per benchmark and round in milliseconds.
    #[arg(long, default_value_t = 400)]
    budget_ms: u64,
    /// Passes over the whole suite; their scatter measures the host's drift.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Print the comparison as JSON.
    #[arg(long)]
    json: bool,
    /// Also write the comparison as JUnit XML (one test case per benchmark).
    #[arg(long)]
    junit: Option<PathBuf>,
}

fn baseline_path(dir: &Path, name: &str) -> Result<PathBuf> {
    if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
        bail!("baseline name '{name}' must be a plain file name");
    }
    Ok(dir.join(format!("{name}.json")))
}

pub fn run(a: RegressArgs) -> Result<()> {
    if a.save_baseline.is_none() && a.baseline.is_none() && a.against.is_none() {
        bail!("pass --save-baseline NAME, --baseline NAME or --against TESSERA_BIN");
    }
    if !(0.0..1.0).contains(&a.threshold) {
        bail!("--threshold must be in [0, 1)");
    }
    let threads = tessera_kernels::pool::global().threads();
    let fingerprint = regress::fingerprint(threads);
    // Read the baseline first: a missing or foreign one should fail before the suite runs.
    let base = match &a.baseline {
        Some(name) => {
            let path = baseline_path(&a.baseline_dir, name)?;
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading baseline {}", path.display()))?;
            let b: Baseline = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a tessera baseline", path.display()))?;
            if b.format != BASELINE_FORMAT {
                bail!(
                    "{}: format {} (this build reads {BASELINE_FORMAT}); save a new baseline",
                    path.display(),
                    b.format
                );
            }
            if b.fingerprint != fingerprint {
                bail!(
                    "{} was made on another machine:\n  baseline: {}\n  here:     {fingerprint}",
                    path.display(),
                    b.fingerprint
                );
            }
            Some(b)
        }
        None => None,
    };
    let ceilings = jobs::calibrate();
    let opts = BenchOptions {
        budget: Duration::from_millis(a.budget_ms),
        ..Default::default()
    };
    let best = tessera_core::Isa::best().name();
    if a.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if let Some(bin) = &a.against {
        return run_against(&a, bin, &ceilings);
    }
    let mut entries: Vec<Entry> = Vec::new();
    for round in 0..a.rounds {
        eprintln!("round {}/{}", round + 1, a.rounds);
        let results = jobs::collect(&a.sel, Some(best), &ceilings, &opts, a.json)?;
        if results.is_empty() {
            bail!("the selection ran no benchmark");
        }
        for r in &results {
            push_round(
                &mut entries,
                Entry::key(r),
                r.bound,
                r.median_s,
                Entry::normalized(r),
            );
        }
    }
    if let Some(name) = &a.save_baseline {
        let path = baseline_path(&a.baseline_dir, name)?;
        std::fs::create_dir_all(&a.baseline_dir)?;
        let b = Baseline {
            format: BASELINE_FORMAT,
            fingerprint,
            tool_version: env!("CARGO_PKG_VERSION").into(),
            git_commit: jobs::git_commit(),
            entries,
        };
        std::fs::write(&path, serde_json::to_string(&b)?)?;
        eprintln!("saved {} results as {}", b.entries.len(), path.display());
        return Ok(());
    }
    let base = base.expect("checked above");
    finish(&a, &base, &entries, regress::compare)
}

/// Adds one round of one benchmark to its entry (created on first sight).
fn push_round(entries: &mut Vec<Entry>, key: String, bound: &str, median_s: f64, round: Vec<f64>) {
    match entries.iter_mut().find(|e| e.key == key) {
        Some(e) => e.rounds.push(round),
        None => entries.push(Entry {
            key,
            bound: bound.to_string(),
            median_s,
            rounds: vec![round],
        }),
    }
}

/// Compares every entry with its baseline, reports, and exits 1 on a slowdown.
fn finish(
    a: &RegressArgs,
    base: &Baseline,
    entries: &[Entry],
    compare: regress::CompareFn,
) -> Result<()> {
    let rows: Vec<(&Entry, Option<Comparison>)> = entries
        .iter()
        .map(|e| {
            let cmp = base
                .entries
                .iter()
                .find(|b| b.key == e.key)
                .map(|b| compare(&b.rounds, &e.rounds, a.threshold));
            (e, cmp)
        })
        .collect();
    report(a, base, &rows)?;
    let slower = rows
        .iter()
        .filter(|(_, c)| c.as_ref().is_some_and(|c| c.verdict == Verdict::Slower))
        .count();
    if slower > 0 {
        eprintln!(
            "{slower} significant slowdown(s) beyond {:.0}%",
            100.0 * a.threshold
        );
        std::process::exit(1);
    }
    Ok(())
}

/// One result of a build's `bench --json`: what the comparison needs.
#[derive(serde::Deserialize)]
struct BuildResult {
    op: String,
    problem: String,
    dtype: String,
    variant: String,
    samples_s: Vec<f64>,
    median_s: f64,
    dram_gbps: f64,
    peak_gflops: f64,
    bound: String,
}

/// A build's `bench --json` document (the parts read here).
#[derive(serde::Deserialize)]
struct BuildRun {
    fingerprint: String,
    tool_version: String,
    git_commit: String,
    results: Vec<BuildResult>,
}

/// Runs a build's `bench` on one job (its arguments), with our ceilings so it skips
/// calibrating; its results as JSON.
fn run_build(
    bin: &Path,
    job_args: &[String],
    budget_ms: u64,
    ceilings: &tessera_perf::calibrate::Ceilings,
) -> Result<BuildRun> {
    let mut args = vec!["bench".to_string()];
    args.extend_from_slice(job_args);
    args.extend(["--json".into(), "--budget-ms".into(), budget_ms.to_string()]);
    let out = std::process::Command::new(bin)
        .args(&args)
        .env("TESSERA_CEILINGS", serde_json::to_string(ceilings)?)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        // Its first error line says why (e.g. an older build without `--problem`).
        let err = String::from_utf8_lossy(&out.stderr);
        let why = err
            .lines()
            .find(|l| l.to_lowercase().contains("error"))
            .or_else(|| err.lines().rev().find(|l| !l.trim().is_empty()))
            .unwrap_or("");
        bail!(
            "{} {} failed ({}): {why}",
            bin.display(),
            args.join(" "),
            out.status
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{}: `bench --json` output not understood", bin.display()))
}

/// `--against`: the two builds interleaved **per benchmark** (the other build's run of a
/// benchmark, then ours, or the reverse on odd rounds), so the two halves of each pair
/// are seconds apart; compared pairwise ([`regress::compare_paired`]).
fn run_against(
    a: &RegressArgs,
    bin: &Path,
    ceilings: &tessera_perf::calibrate::Ceilings,
) -> Result<()> {
    if a.rounds < 2 {
        bail!("--against pairs rounds: pass --rounds 2 or more");
    }
    let best = tessera_core::Isa::best().name();
    let jobs = jobs::jobs(&a.sel, Some(best))?;
    if jobs.is_empty() {
        bail!("the selection ran no benchmark");
    }
    let this = std::env::current_exe().context("locating this build's executable")?;
    let bar = crate::progress::bar((a.rounds * jobs.len()) as u64, "A/B");
    let (mut theirs, mut ours) = (Vec::new(), Vec::new());
    let mut meta: Option<(String, String, String)> = None;
    for round in 0..a.rounds {
        for job in &jobs {
            bar.set_message(format!("round {} {} {}", round + 1, job.op, job.problem));
            // Both builds run as child processes the same way (measured in-process, this
            // build came out 11–20 % faster on every memory-bound benchmark: the two
            // sides must not differ in anything but the build).
            let other_first = round % 2 == 0;
            for other in [other_first, !other_first] {
                let exe = if other { bin } else { this.as_path() };
                let run = run_build(exe, &job.to_args(&a.sel), a.budget_ms, ceilings)?;
                let entries = if other { &mut theirs } else { &mut ours };
                for r in &run.results {
                    let key = regress::result_key(&r.op, &r.problem, &r.dtype, &r.variant);
                    let norm =
                        regress::normalize(&r.samples_s, &r.bound, r.dram_gbps, r.peak_gflops);
                    push_round(entries, key, &r.bound, r.median_s, norm);
                }
                if other {
                    meta.get_or_insert((run.fingerprint, run.tool_version, run.git_commit));
                }
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let (fingerprint, tool_version, git_commit) = meta.unwrap_or_default();
    let here = regress::fingerprint(tessera_kernels::pool::global().threads());
    if fingerprint != here {
        eprintln!(
            "note: the other build describes this machine differently:\n  other: {fingerprint}\n  this:  {here}"
        );
    }
    let base = Baseline {
        format: BASELINE_FORMAT,
        fingerprint,
        tool_version,
        git_commit,
        entries: theirs,
    };
    finish(a, &base, &ours, regress::compare_paired)
}

fn verdict_name(c: &Option<Comparison>) -> &'static str {
    match c.as_ref().map(|c| c.verdict) {
        Some(Verdict::Faster) => "faster",
        Some(Verdict::Slower) => "SLOWER",
        Some(Verdict::Same) => "same",
        Some(Verdict::Unsure) => "unsure",
        None => "new (no baseline)",
    }
}

fn report(a: &RegressArgs, base: &Baseline, rows: &[(&Entry, Option<Comparison>)]) -> Result<()> {
    if a.json {
        let list: Vec<_> = rows
            .iter()
            .map(|(e, c)| serde_json::json!({"key": e.key, "bound": e.bound, "median_s": e.median_s, "comparison": c}))
            .collect();
        let doc = serde_json::json!({
            "baseline_commit": base.git_commit, "commit": jobs::git_commit(),
            "threshold": a.threshold, "results": list,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let body: Vec<Vec<String>> = rows
            .iter()
            .map(|(e, c)| {
                let f =
                    |v: Option<f64>, prec: usize| v.map_or("-".into(), |v| format!("{v:.prec$}"));
                vec![
                    e.key.clone(),
                    f(c.as_ref().map(|c| c.ratio), 3),
                    c.as_ref().map_or("-".into(), |c| {
                        format!("[{:.3}, {:.3}]", c.ci_low, c.ci_high)
                    }),
                    f(c.as_ref().map(|c| c.p_value), 4),
                    verdict_name(c).into(),
                ]
            })
            .collect();
        print!(
            "baseline {} vs this run (normalised by same-run calibration; threshold {:.0}%)\n{}",
            base.git_commit,
            100.0 * a.threshold,
            table(
                &["benchmark", "ratio", "95% CI", "p (MWU)", "verdict"],
                &body
            )
        );
    }
    if let Some(path) = &a.junit {
        std::fs::write(path, junit(rows)).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// JUnit XML: one test case per benchmark, failed when slower.
fn junit(rows: &[(&Entry, Option<Comparison>)]) -> String {
    let failures = rows
        .iter()
        .filter(|(_, c)| c.as_ref().is_some_and(|c| c.verdict == Verdict::Slower))
        .count();
    let mut x = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"tessera-regress\" tests=\"{}\" failures=\"{failures}\">\n",
        rows.len()
    );
    for (e, c) in rows {
        let (op, rest) = e.key.split_once('/').unwrap_or((&e.key, ""));
        x += &format!(
            "  <testcase classname=\"{}\" name=\"{}\">",
            xml_escape(op),
            xml_escape(rest)
        );
        match c {
            Some(c) if c.verdict == Verdict::Slower => {
                x += &format!(
                    "<failure message=\"{:.3}x slower (95% CI {:.3}-{:.3}, p {:.2e})\"/>",
                    c.ratio, c.ci_low, c.ci_high, c.p_value
                );
            }
            _ => x += &format!("<system-out>{}</system-out>", verdict_name(c)),
        }
        x += "</testcase>\n";
    }
    x + "</testsuite>\n"
}
