//! Verification of any registered op against its float64 reference.

use super::{OpSpec, ProblemCase, Rng, TuneConfig, Variant};
use rand::Rng as _;
use tessera_core::DType;

/// The outcome of checking one variant on one problem.
#[derive(Clone, Debug)]
pub struct CaseReport {
    /// The problem, as it displays.
    pub problem: String,
    /// ‖out−ref‖₂/‖ref‖₂ (or over the sum's magnitude for cancelling dot products).
    pub rel_err: f64,
    /// Output elements that were NaN/Inf where the reference is finite (unwritten or wrong).
    pub non_finite: usize,
    /// Some(false) when a planted NaN/Inf did not reach the outputs it must reach.
    pub nan_propagates: Option<bool>,
    /// The kernel's error, if it refused the call.
    pub error: Option<String>,
}

impl CaseReport {
    /// Within `tol`, every output finite where the reference is, NaN propagated, no error.
    pub fn passed(&self, tol: f64) -> bool {
        self.error.is_none()
            && self.non_finite == 0
            && self.rel_err <= tol
            && self.nan_propagates != Some(false)
    }
}

/// ‖out−ref‖₂ / ‖ref‖₂ (absolute norm when the reference is all zeros); NaN-aware.
///
/// Reference values below f32's normal range are taken as 0 first: f32 kernels may flush
/// subnormal results (as FTZ hardware and our vectorized `exp` do), which no model needs.
pub fn rel_error(out: &[f64], reference: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    let flush = |v: f64| {
        if v.abs() < f32::MIN_POSITIVE as f64 {
            0.0
        } else {
            v
        }
    };
    for (&o, r) in out.iter().zip(reference.iter().map(|&r| flush(r))) {
        if r.is_finite() && o.is_finite() {
            num += (o - r) * (o - r);
            den += r * r;
        }
    }
    if den > 0.0 {
        (num / den).sqrt()
    } else {
        num.sqrt()
    }
}

/// [`rel_error`], or infinity where an output is not finite and its reference is (an
/// element left NaN-poisoned, a NaN the kernel made) or the lengths differ: what a test
/// asserts on, as `rel_error` skips the non-finite pairs.
pub fn rel_error_finite(out: &[f64], reference: &[f64]) -> f64 {
    let lost = out
        .iter()
        .zip(reference)
        .any(|(o, r)| r.is_finite() && !o.is_finite());
    if lost || out.len() != reference.len() {
        f64::INFINITY
    } else {
        rel_error(out, reference)
    }
}

fn norm(v: &[f64]) -> f64 {
    v.iter()
        .filter(|x| x.is_finite())
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
}

/// Runs one variant on one problem with fresh random inputs.
pub fn check(
    problem: &dyn ProblemCase,
    dtype: DType,
    variant: &Variant,
    cfg: Option<&TuneConfig>,
    rng: &mut Rng,
) -> CaseReport {
    let mut report = CaseReport {
        problem: problem.to_string(),
        rel_err: f64::NAN,
        non_finite: 0,
        nan_propagates: None,
        error: None,
    };
    let cfg = cfg
        .cloned()
        .unwrap_or_else(|| problem.tune_space().defaults());
    let seed: u64 = rng.random();
    let mut inst = match problem.instantiate(dtype, &mut super::rng(seed)) {
        Ok(i) => i,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    let reference = inst.reference_for(variant);
    inst.poison();
    if let Err(e) = inst.run(variant, &cfg) {
        report.error = Some(e.to_string());
        return report;
    }
    let out = inst.output();
    if out.len() != reference.len() {
        report.error = Some(format!(
            "{} outputs, reference has {}",
            out.len(),
            reference.len()
        ));
        return report;
    }
    report.non_finite = out
        .iter()
        .zip(&reference)
        .filter(|(o, r)| r.is_finite() && !o.is_finite())
        .count();
    report.rel_err = match inst.magnitude(variant) {
        Some(mag) => {
            rel_error(&out, &reference) * norm(&reference) / norm(&mag).max(f64::MIN_POSITIVE)
        }
        None => rel_error(&out, &reference),
    };

    // A second instance (same seed) with a planted NaN/Inf.
    if let Ok(mut inst) = problem.instantiate(dtype, &mut super::rng(seed)) {
        if let Some(must) = inst.inject_nonfinite(rng) {
            inst.poison();
            report.nan_propagates = Some(
                inst.run(variant, &cfg).is_ok() && {
                    let out = inst.output();
                    must.iter()
                        .all(|&i| out.get(i).is_some_and(|v| !v.is_finite()))
                },
            );
        }
    }
    report
}

/// The summary of one (op, variant, dtype) over many problems.
#[derive(Clone, Debug)]
pub struct VariantReport {
    /// The op's name.
    pub op: &'static str,
    /// The variant's label.
    pub variant: String,
    /// The element type checked.
    pub dtype: DType,
    /// The tolerance the cases were held to.
    pub tolerance: f64,
    /// One report per problem.
    pub cases: Vec<CaseReport>,
}

impl VariantReport {
    /// The largest error over the cases.
    pub fn worst(&self) -> f64 {
        self.cases.iter().map(|c| c.rel_err).fold(0.0, f64::max)
    }
    /// The cases that failed.
    pub fn failures(&self) -> Vec<&CaseReport> {
        self.cases
            .iter()
            .filter(|c| !c.passed(self.tolerance))
            .collect()
    }
    /// Whether every case passed.
    pub fn passed(&self) -> bool {
        self.failures().is_empty()
    }
}

/// The ops every device backend implements: the set a model forward needs, which the
/// backends' tests require them to keep claiming.
pub const DEVICE_OPS: [&str; 12] = [
    "rms_norm",
    "softmax",
    "swiglu",
    "add",
    "rope",
    "rope_neox",
    "gemm",
    "qmatmul",
    "attention",
    "paged_attention",
    "varlen_attention",
    "embedding",
];

/// One variant/dtype group of a [`BackendCheck`].
#[derive(Debug, Clone, PartialEq)]
pub struct GroupRun {
    /// The op.
    pub op: &'static str,
    /// The variant's label.
    pub variant: String,
    /// The element type.
    pub dtype: DType,
    /// Cases run.
    pub cases: usize,
}

impl std::fmt::Display for GroupRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{} ({})",
            self.op, self.variant, self.dtype, self.cases
        )
    }
}

/// What [`verify_backend`] found: the ops that had a variant on the backend, the cases
/// run, and one line per failed case (op, variant, dtype, problem, error, tolerance).
#[derive(Debug, Default)]
pub struct BackendCheck {
    /// Ops with at least one variant on the backend.
    pub ops: Vec<&'static str>,
    /// Each variant/dtype group verified, with its case count.
    pub groups: Vec<GroupRun>,
    /// The failed cases, one line each.
    pub failures: Vec<String>,
}

impl BackendCheck {
    /// Cases run, over every group.
    pub fn cases(&self) -> usize {
        self.groups.iter().map(|g| g.cases).sum()
    }

    /// Prints what ran and panics unless every case passed, every op of [`DEVICE_OPS`]
    /// had a variant, and more than `min_cases` cases ran: the device backends' test.
    pub fn assert_complete(&self, backend: &str, min_cases: usize) {
        eprintln!(
            "{backend}: {} cases over {} ops in {} groups: {}",
            self.cases(),
            self.ops.len(),
            self.groups.len(),
            self.groups
                .iter()
                .map(GroupRun::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert!(
            self.failures.is_empty(),
            "{backend} failures:\n{}",
            self.failures.join("\n")
        );
        for op in DEVICE_OPS {
            assert!(self.ops.contains(&op), "{op}: no {backend} variant");
        }
        let cases = self.cases();
        assert!(cases > min_cases, "only {cases} cases ran");
    }

    /// Whether a group of `op` with variant label `variant` ran at least one case.
    pub fn ran(&self, op: &str, variant: &str) -> bool {
        self.groups
            .iter()
            .any(|g| g.op == op && g.variant == variant && g.cases > 0)
    }
}

/// A device's row calls honour `out_offset` (the engine writes rotated keys straight
/// into its cache through it): the rows land there, the rest of the buffer keeps its
/// contents, and an offset that runs past the end is an error. Panics otherwise: a check
/// the device backends' tests share.
pub fn assert_row_offsets(dev: &dyn tessera_core::device::Device) {
    use tessera_core::device::{DeviceCall, RowOp};
    let (a, b) = (
        dev.upload(&[1.0, 2.0, 3.0, 4.0]).expect("upload"),
        dev.upload(&[0.5, -2.0, 30.0, 0.25]).expect("upload"),
    );
    let (out, ab) = (dev.upload(&[-7.0; 8]).expect("upload"), [&a, &b]);
    let add = |out_offset| DeviceCall::Rows {
        op: RowOp::Add,
        inputs: &ab,
        gamma: None,
        out: &out,
        out_offset,
        rows: 2,
        n: 2,
    };
    dev.run(&add(3)).expect("an offset within the buffer");
    let got = dev.download(&out).expect("download");
    assert_eq!(got, [-7.0, -7.0, -7.0, 1.5, 0.0, 33.0, 4.25, -7.0]);
    let err = dev.run(&add(5)).expect_err("past the end").to_string();
    assert!(
        err.contains("out holds 8 elements, the call needs 9"),
        "{err}"
    );
}

/// Every op's variants on `backend` (a device's, say), on each op's test problems: how
/// a device backend's tests check all it claims without listing the ops themselves.
pub fn verify_backend(backend: super::Backend, seed: u64) -> BackendCheck {
    let mut out = BackendCheck::default();
    for op in crate::ops::all() {
        let reports = verify_op_where(op, seed ^ op.name().len() as u64, &|v| v.backend == backend);
        if reports.is_empty() {
            continue;
        }
        out.ops.push(op.name());
        for r in &reports {
            out.groups.push(GroupRun {
                op: r.op,
                variant: r.variant.clone(),
                dtype: r.dtype,
                cases: r.cases.len(),
            });
            out.failures.extend(r.failures().iter().map(|c| {
                format!(
                    "{}/{}/{} {}: rel_err {:.3e} (tol {:.1e}) non-finite {} nan {:?} error {:?}",
                    r.op,
                    r.variant,
                    r.dtype,
                    c.problem,
                    c.rel_err,
                    r.tolerance,
                    c.non_finite,
                    c.nan_propagates,
                    c.error
                )
            }));
        }
    }
    out
}

/// Checks every dtype × variant of `op` on its random test problems.
pub fn verify_op(op: &dyn OpSpec, seed: u64) -> Vec<VariantReport> {
    verify_op_where(op, seed, &|_| true)
}

/// [`verify_op`] over the variants `keep` accepts (one backend, say).
pub fn verify_op_where(
    op: &dyn OpSpec,
    seed: u64,
    keep: &dyn Fn(&Variant) -> bool,
) -> Vec<VariantReport> {
    let mut rng = super::rng(seed);
    let problems = op.test_problems(&mut rng);
    let mut reports = Vec::new();
    for &dtype in op.dtypes() {
        for variant in op.variants(dtype).into_iter().filter(|v| keep(v)) {
            let cases = problems
                .iter()
                .filter(|p| p.supports(dtype, &variant))
                .map(|p| check(p.as_ref(), dtype, &variant, None, &mut rng))
                .collect();
            reports.push(VariantReport {
                op: op.name(),
                variant: variant.label.clone(),
                dtype,
                tolerance: op.variant_tolerance(dtype, &variant).rel,
                cases,
            });
        }
    }
    reports
}

/// Panics with a readable table of every failure (for `#[test]`s).
pub fn assert_op_verified(op: &dyn OpSpec) {
    let name = op.name();
    let reports = verify_op(op, 0x7e55e7a ^ name.len() as u64);
    assert!(!reports.is_empty(), "op '{name}' has no variants to verify");
    let mut msg = String::new();
    for r in &reports {
        assert!(!r.cases.is_empty(), "{name}/{}: no problems", r.variant);
        for c in r.failures() {
            msg += &format!(
                "{}/{}/{}: {} rel_err={:.3e} (tol {:.1e}) non_finite={} nan_propagates={:?} error={:?}\n",
                r.op, r.variant, r.dtype, c.problem, c.rel_err, r.tolerance, c.non_finite,
                c.nan_propagates, c.error
            );
        }
    }
    assert!(msg.is_empty(), "verification failures:\n{msg}");
}
