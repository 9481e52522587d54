//! What `bench`, `regress`, `roofline` and `tune` run: the selection of ops, problems,
//! dtypes and variants they share (`Selection`), its expansion into benchmark jobs, the
//! calibration they are measured against, and the commit a result is labelled with.
//! Its own module so the commands depend on it and not on each other.

use anyhow::{bail, Context, Result};
use clap::Args;
use tessera_core::DType;
use tessera_kernels::registry::{self, ComputeUnit, ProblemCase};
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
    pub shape: Option<String>,
    /// Only the named benchmark problem of that name (e.g. "decode q/o"; see the op's set).
    #[arg(long)]
    problem: Option<String>,
    /// Only this dtype.
    #[arg(long)]
    dtype: Option<DType>,
    /// Only this variant label (e.g. avx512, avx2, scalar, avx512-dpbf16, wgpu).
    #[arg(long)]
    variant: Option<String>,
    /// Which backends: the CPU (default), a device, or all (the CPU and every device
    /// that opens).
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: crate::devices::BackendArg,
    /// Tuning overrides, e.g. `--set kc=256 --set threads=1`.
    #[arg(long = "set", value_parser = parse_kv)]
    set: Vec<(String, usize)>,
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
        "ceilings: f32 FMA {:.1} GFLOP/s, bf16 dot {:.1} GFLOP/s, int8 dot {:.1} GOP/s, DRAM {:.1} GB/s",
        ceilings.fma_gflops, ceilings.bf16_gflops, ceilings.int8_gops, ceilings.dram_gbps
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
        unit: tessera_kernels::ops::find(job.op).map_or(ComputeUnit::Fma, |op| {
            op.compute_unit(job.dtype, &job.variant)
        }),
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
        tessera_kernels::ops::all()
    } else {
        crate::selected_ops(&sel.ops)?
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
                .filter(|v| sel.backend.keeps(v))
            {
                for (name, problem) in problems(op)?
                    .into_iter()
                    .filter(|(_, p)| p.supports(dtype, &variant))
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

/// The checkout's short commit, or "unknown" outside a git work tree.
pub fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_expand_the_selection_and_reject_unknown_tunables() {
        let sel = |set: Vec<(String, usize)>| Selection {
            ops: vec!["rms_norm".into()],
            all: false,
            shape: Some("3x64".into()),
            problem: None,
            dtype: Some(DType::F32),
            variant: Some("scalar".into()),
            backend: crate::devices::BackendArg::Cpu,
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
            backend: crate::devices::BackendArg::Cpu,
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
