//! The regression gate's statistics: is a new set of timing samples slower than a
//! baseline's, beyond noise?
//!
//! Shared hosts drift (this one's DRAM rate moves between 34 and 71 GB/s over minutes), so
//! samples are first **normalised** by a calibration kernel measured in the same run: a
//! memory-bound op's seconds × the DRAM GB/s probed around it, a compute-bound op's
//! seconds × the FMA GFLOP/s peak, i.e. time in units of the machine's own speed at that
//! moment. That alone is not enough here: unchanged reruns still moved single benchmarks
//! by 0.55–1.15×, because each benchmark meets the host in a different state. So a suite
//! runs in **rounds** (the whole suite R times over), and the uncertainty of the ratio of
//! medians combines the within-run **bootstrap** interval with the **between-round**
//! scatter of each benchmark's median (pooled over baseline and new rounds): drift widens
//! the interval instead of posing as a change. A **Mann–Whitney U** test on the pooled
//! samples must agree before anything is called faster or slower. Each result is one of
//! faster / slower / same / unsure; only "slower" fails the gate.

use serde::{Deserialize, Serialize};

/// Two-sided p-value of the Mann–Whitney U test (normal approximation with the tie
/// correction; fine from ~8 samples per side, which the benchmark runner guarantees).
pub fn mann_whitney_p(a: &[f64], b: &[f64]) -> f64 {
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    if a.is_empty() || b.is_empty() {
        return 1.0;
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|&x| (x, true))
        .chain(b.iter().map(|&x| (x, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    // Mid-ranks for ties, and Σ(t³ − t) for the variance correction.
    let (mut rank_a, mut ties, mut i) = (0.0, 0.0, 0);
    while i < all.len() {
        let j = i + all[i..].iter().take_while(|x| x.0 == all[i].0).count();
        let mid = (i + j + 1) as f64 / 2.0;
        rank_a += mid * all[i..j].iter().filter(|x| x.1).count() as f64;
        let t = (j - i) as f64;
        ties += t * t * t - t;
        i = j;
    }
    let u = rank_a - n1 * (n1 + 1.0) / 2.0;
    let n = n1 + n2;
    let var = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)));
    if var <= 0.0 {
        return 1.0; // every value equal
    }
    let z = (u - n1 * n2 / 2.0).abs() / var.sqrt();
    2.0 * normal_upper_tail(z)
}

/// P(Z > z) for a standard normal, via erfc (Abramowitz–Stegun 7.1.26, |error| < 1.5e-7).
fn normal_upper_tail(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    0.5 * poly * (-x * x).exp()
}

/// At most `cap` samples, evenly spaced in time order (bootstrap cost stays bounded).
fn thin(v: &[f64], cap: usize) -> Vec<f64> {
    if v.len() <= cap {
        return v.to_vec();
    }
    (0..cap).map(|i| v[i * v.len() / cap]).collect()
}

fn median_of(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// A `conf` (e.g. 0.95) bootstrap interval for median(new) / median(base), by resampling
/// both sides `resamples` times with a fixed seed (the gate is deterministic).
pub fn bootstrap_ratio_ci(base: &[f64], new: &[f64], resamples: usize, conf: f64) -> (f64, f64) {
    let (b, n) = (thin(base, 400), thin(new, 400));
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |len: usize| {
        // xorshift64*: plenty for resampling indices.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % len
    };
    let mut ratios = Vec::with_capacity(resamples);
    let (mut rb, mut rn) = (vec![0.0; b.len()], vec![0.0; n.len()]);
    for _ in 0..resamples {
        rb.iter_mut().for_each(|x| *x = b[next(b.len())]);
        rn.iter_mut().for_each(|x| *x = n[next(n.len())]);
        ratios.push(median_of(&mut rn) / median_of(&mut rb));
    }
    let tail = (1.0 - conf) / 2.0;
    (
        crate::stats::quantile(&ratios, tail),
        crate::stats::quantile(&ratios, 1.0 - tail),
    )
}

/// How a result moved against its baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Faster beyond the threshold, the interval entirely below it, significant.
    Faster,
    /// Slower beyond the threshold, the interval entirely above it, significant.
    Slower,
    /// The interval lies within ± the threshold.
    Same,
    /// Neither: the measurement cannot tell.
    Unsure,
}

/// One result compared with its baseline.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// median(new) / median(base), normalised samples: > 1 is slower.
    pub ratio: f64,
    /// Low end of the 95% interval of the ratio (within-run bootstrap and between-round spread).
    pub ci_low: f64,
    /// High end of the 95% interval of the ratio.
    pub ci_high: f64,
    /// Two-sided Mann–Whitney p-value of the two runs' normalised samples.
    pub p_value: f64,
    /// The decision the interval and p-value give.
    pub verdict: Verdict,
}

/// A comparison of baseline rounds with new rounds under a threshold ([`compare`],
/// [`compare_paired`]).
pub type CompareFn = fn(&[Vec<f64>], &[Vec<f64>], f64) -> Comparison;

/// Significance level of the rank test for calling faster or slower.
pub const ALPHA: f64 = 0.01;

/// Between-round scatter (sd of log round-medians) assumed when a side has one round:
/// the smallest drift seen between unchanged runs on the reference host.
pub const DEFAULT_ROUND_SD: f64 = 0.05;

/// Compares normalised samples, one `Vec` per round on each side. `threshold` (e.g.
/// 0.05) is the smallest change that matters: slower only when the whole interval is
/// above 1 + threshold (and the rank test agrees), same when it lies within 1 ± threshold,
/// unsure otherwise.
pub fn compare(base: &[Vec<f64>], new: &[Vec<f64>], threshold: f64) -> Comparison {
    // A baseline file is user-editable: empty rounds get no verdict, not a panic.
    if [base, new]
        .iter()
        .any(|r| r.is_empty() || r.iter().any(Vec::is_empty))
    {
        return Comparison {
            ratio: f64::NAN,
            ci_low: f64::NAN,
            ci_high: f64::NAN,
            p_value: f64::NAN,
            verdict: Verdict::Unsure,
        };
    }
    let pool = |r: &[Vec<f64>]| r.concat();
    let (pb, pn) = (pool(base), pool(new));
    let p = mann_whitney_p(&pb, &pn);
    let ratio = median_of(&mut pn.clone()) / median_of(&mut pb.clone());
    let (lo, hi) = bootstrap_ratio_ci(&pb, &pn, 1000, 0.95);
    // Within-run half-width in log space, then the between-round part added in quadrature.
    let within = 0.5 * (hi / lo).ln();
    let logs =
        |r: &[Vec<f64>]| -> Vec<f64> { r.iter().map(|v| median_of(&mut v.clone()).ln()).collect() };
    let (lb, ln) = (logs(base), logs(new));
    let ss = |v: &[f64]| {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>()
    };
    let df = (lb.len() + ln.len()).saturating_sub(2);
    let sd = if df == 0 {
        DEFAULT_ROUND_SD
    } else {
        ((ss(&lb) + ss(&ln)) / df as f64).sqrt()
    };
    let between = 2.0 * sd * (1.0 / lb.len() as f64 + 1.0 / ln.len() as f64).sqrt();
    let hw = (within * within + between * between).sqrt();
    let (lo, hi) = (ratio * (-hw).exp(), ratio * hw.exp());
    comparison(ratio, (lo, hi), p, threshold)
}

/// The verdict rules shared by both comparisons.
fn comparison(ratio: f64, (lo, hi): (f64, f64), p: f64, threshold: f64) -> Comparison {
    let verdict = if lo > 1.0 + threshold && p < ALPHA {
        Verdict::Slower
    } else if hi < 1.0 - threshold && p < ALPHA {
        Verdict::Faster
    } else if lo >= 1.0 - threshold && hi <= 1.0 + threshold {
        Verdict::Same
    } else {
        Verdict::Unsure
    };
    Comparison {
        ratio,
        ci_low: lo,
        ci_high: hi,
        p_value: p,
        verdict,
    }
}

/// Two-sided 97.5% quantile of Student's t for `df` degrees of freedom (tabulated to 10,
/// rounded up beyond: the interval errs wide).
fn t975(df: usize) -> f64 {
    const T: [f64; 10] = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23];
    match df {
        0 => f64::INFINITY,
        1..=10 => T[df - 1],
        11..=20 => 2.2,
        21..=30 => 2.1,
        _ => 2.0,
    }
}

/// Compares rounds measured **interleaved** (baseline and new build alternating in one
/// session, round r of each side adjacent in time): host drift then moves both sides of
/// a round together and cancels in the per-round ratio. The interval is Student's t on
/// the per-round log ratios, combined in quadrature with the within-run bootstrap;
/// verdicts as in [`compare`]. Needs at least 2 rounds per side (paired by index).
pub fn compare_paired(base: &[Vec<f64>], new: &[Vec<f64>], threshold: f64) -> Comparison {
    let rounds = base.len().min(new.len());
    if rounds < 2
        || base[..rounds]
            .iter()
            .chain(&new[..rounds])
            .any(Vec::is_empty)
    {
        return compare(base, new, threshold);
    }
    let logs: Vec<f64> = (0..rounds)
        .map(|r| (median_of(&mut new[r].clone()) / median_of(&mut base[r].clone())).ln())
        .collect();
    let mean = logs.iter().sum::<f64>() / rounds as f64;
    let var = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (rounds - 1) as f64;
    let paired = t975(rounds - 1) * (var / rounds as f64).sqrt();
    let (pb, pn) = (base[..rounds].concat(), new[..rounds].concat());
    let (lo, hi) = bootstrap_ratio_ci(&pb, &pn, 1000, 0.95);
    let within = 0.5 * (hi / lo).ln();
    let hw = (within * within + paired * paired).sqrt();
    let ratio = mean.exp();
    let p = mann_whitney_p(&pb, &pn);
    comparison(ratio, (ratio * (-hw).exp(), ratio * hw.exp()), p, threshold)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic log-normal-ish timing noise around `center` (±`spread` relative).
    fn samples(center: f64, spread: f64, n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (s >> 11) as f64 / (1u64 << 53) as f64;
                center * (1.0 + spread * (2.0 * u - 1.0))
            })
            .collect()
    }

    #[test]
    fn mann_whitney_known_answers() {
        // Complete separation of 10 vs 10: U = 0, z = 3.78, p ≈ 1.6e-4.
        let a: Vec<f64> = (0..10).map(f64::from).collect();
        let b: Vec<f64> = (10..20).map(f64::from).collect();
        let p = mann_whitney_p(&a, &b);
        assert!((p - 1.57e-4).abs() < 2e-5, "p = {p}");
        // Identical sets: no evidence at all.
        assert!(mann_whitney_p(&a, &a) > 0.99);
        // All values equal: defined, not NaN.
        assert_eq!(mann_whitney_p(&[1.0; 5], &[1.0; 5]), 1.0);
    }

    #[test]
    fn normal_tail_known_values() {
        assert!((normal_upper_tail(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_upper_tail(1.959_964) - 0.025).abs() < 1e-6);
    }

    #[test]
    fn bootstrap_interval_covers_the_true_ratio() {
        let base = samples(1.0, 0.05, 300, 1);
        let new = samples(1.2, 0.05, 300, 2);
        let (lo, hi) = bootstrap_ratio_ci(&base, &new, 1000, 0.95);
        assert!(lo < 1.2 && 1.2 < hi, "[{lo}, {hi}]");
        assert!(hi - lo < 0.05, "narrow with 300 samples: [{lo}, {hi}]");
    }

    /// Rounds of 100 samples around the given centres (one centre per round).
    fn rounds(centres: &[f64], seed: u64) -> Vec<Vec<f64>> {
        centres
            .iter()
            .enumerate()
            .map(|(i, &c)| samples(c, 0.05, 100, seed * 10 + i as u64))
            .collect()
    }

    #[test]
    fn verdicts_for_planted_changes() {
        let t = 0.05;
        let steady = rounds(&[1.0, 1.0, 1.0], 1);
        let v = |b: &[Vec<f64>], n: &[Vec<f64>]| compare(b, n, t).verdict;
        assert_eq!(v(&steady, &rounds(&[1.0, 1.0, 1.0], 2)), Verdict::Same);
        assert_eq!(v(&steady, &rounds(&[1.25, 1.25, 1.25], 3)), Verdict::Slower);
        assert_eq!(v(&steady, &rounds(&[0.75, 0.75, 0.75], 4)), Verdict::Faster);
        // A 5% change sits on the threshold: neither same nor slower.
        let edge = compare(&steady, &rounds(&[1.05, 1.05, 1.05], 5), t);
        assert_eq!(edge.verdict, Verdict::Unsure, "{edge:?}");
    }

    #[test]
    fn drift_between_rounds_is_not_a_slowdown() {
        // Host drift of ±10–20% between rounds, no change in the code: within-run samples
        // alone would call this slower; the between-round scatter must keep it unsure.
        let base = rounds(&[0.9, 1.0, 1.1], 6);
        let new = rounds(&[1.0, 1.15, 1.2], 7);
        let c = compare(&base, &new, 0.05);
        assert_ne!(c.verdict, Verdict::Slower, "{c:?}");
        // A planted 2× slowdown still stands out of the same drift.
        let slow = rounds(&[1.8, 2.0, 2.2], 8);
        assert_eq!(compare(&base, &slow, 0.05).verdict, Verdict::Slower);
        // Empty rounds (an edited baseline) give no verdict rather than a panic.
        assert_eq!(compare(&[], &slow, 0.05).verdict, Verdict::Unsure);
        assert_eq!(compare(&[vec![]], &slow, 0.05).verdict, Verdict::Unsure);
    }

    #[test]
    fn interleaved_rounds_cancel_drift() {
        // The host drifts ±20% between rounds, but both builds see the same state in a
        // round: unpaired, that is at best unsure; paired, the unchanged build is same.
        let drift = [0.8, 1.0, 1.2, 0.9, 1.1];
        let base = rounds(&drift, 9);
        let same = rounds(&drift, 10);
        assert_ne!(compare(&base, &same, 0.05).verdict, Verdict::Same);
        let c = compare_paired(&base, &same, 0.05);
        assert_eq!(c.verdict, Verdict::Same, "{c:?}");
        // A planted 25% slowdown under the same drift is caught, a 25% speed-up too.
        let slow: Vec<f64> = drift.iter().map(|d| d * 1.25).collect();
        let c = compare_paired(&base, &rounds(&slow, 11), 0.05);
        assert_eq!(c.verdict, Verdict::Slower, "{c:?}");
        assert!((c.ratio - 1.25).abs() < 0.02, "{c:?}");
        let fast: Vec<f64> = drift.iter().map(|d| d * 0.75).collect();
        assert_eq!(
            compare_paired(&base, &rounds(&fast, 12), 0.05).verdict,
            Verdict::Faster
        );
        // One round cannot be paired: the unpaired comparison answers.
        let one = compare_paired(&base[..1], &same[..1], 0.05);
        assert_eq!(one.verdict, compare(&base[..1], &same[..1], 0.05).verdict);
    }

    #[test]
    fn t_quantiles_err_wide() {
        assert_eq!(t975(2), 4.30);
        assert!(t975(15) >= 2.131 && t975(25) >= 2.060 && t975(100) >= 1.984);
        assert!(t975(0).is_infinite());
    }
}

/// A saved suite run: what `--save-baseline` writes and `--baseline` reads.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Baseline {
    /// Bumped when the meaning of the numbers changes.
    pub format: u32,
    /// CPU, thread count and ISA: baselines compare only on the machine that made them.
    pub fingerprint: String,
    /// The `tessera` version that wrote it.
    pub tool_version: String,
    /// The commit it was built from ("unknown" outside git).
    pub git_commit: String,
    /// One entry per benchmark.
    pub entries: Vec<Entry>,
}

/// The format this build writes and accepts.
pub const BASELINE_FORMAT: u32 = 1;

/// One benchmark's normalised samples.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    /// `op/problem/dtype/variant` ([`result_key`]).
    pub key: String,
    /// `"memory"` or `"compute"`: which calibration rate normalises its samples.
    pub bound: String,
    /// Median time of the run that saved it, seconds.
    pub median_s: f64,
    /// Per round, seconds × the calibration rate measured with them (GB/s or GFLOP/s).
    pub rounds: Vec<Vec<f64>>,
}

impl Entry {
    /// The samples of one result × the DRAM rate (memory-bound) or the compute peak
    /// (compute-bound) probed just around them.
    pub fn normalized(r: &crate::bench::BenchResult) -> Vec<f64> {
        normalize(&r.samples_s, r.bound, r.dram_gbps, r.peak_gflops)
    }

    /// The key a result is matched by across runs.
    pub fn key(r: &crate::bench::BenchResult) -> String {
        result_key(&r.op, &r.problem, &r.dtype, &r.variant)
    }
}

/// `op/problem/dtype/variant`: how a result is matched across runs and builds.
pub fn result_key(op: &str, problem: &str, dtype: &str, variant: &str) -> String {
    format!("{op}/{problem}/{dtype}/{variant}")
}

/// Seconds × the rate that bounds the benchmark (DRAM GB/s when memory-bound, else the
/// compute peak), both as probed around it: time in units of the machine's own speed.
pub fn normalize(samples_s: &[f64], bound: &str, dram_gbps: f64, peak_gflops: f64) -> Vec<f64> {
    let rate = if bound == "memory" {
        dram_gbps
    } else {
        peak_gflops
    };
    samples_s.iter().map(|s| s * rate).collect()
}

/// The CPU's model name (`/proc/cpuinfo`), or the architecture where it is not known.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// This machine as baselines identify it.
pub fn fingerprint(threads: usize) -> String {
    let model = cpu_model();
    format!(
        "{model} | {} | {threads} threads | {}",
        tessera_core::CpuFeatures::get().summary(),
        tessera_core::Isa::best().name()
    )
}
