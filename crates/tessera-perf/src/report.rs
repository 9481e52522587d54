//! Plain-text tables for the terminal.

use crate::bench::BenchResult;
use tessera_kernels::registry::verify::VariantReport;

/// Formats rows as left-aligned columns under a header.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        parts.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|s| s.to_string()).collect());
    out += &line(width.iter().map(|w| "-".repeat(*w)).collect());
    for r in rows {
        out += &line(r.clone());
    }
    out
}

/// The `tessera verify` table.
pub fn verify_table(reports: &[VariantReport]) -> String {
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            vec![
                r.op.to_string(),
                r.variant.clone(),
                r.dtype.to_string(),
                r.cases.len().to_string(),
                format!("{:.2e}", r.worst()),
                format!("{:.1e}", r.tolerance),
                if r.passed() {
                    "pass".into()
                } else {
                    format!("FAIL ({})", r.failures().len())
                },
            ]
        })
        .collect();
    table(
        &[
            "op",
            "variant",
            "dtype",
            "shapes",
            "worst rel err",
            "tolerance",
            "result",
        ],
        &rows,
    )
}

/// The `tessera bench` table.
pub fn bench_table(results: &[BenchResult]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            vec![
                r.op.clone(),
                r.problem.clone(),
                r.dtype.clone(),
                r.variant.clone(),
                format_time(r.median_s),
                format!("±{:.1}%", 100.0 * r.spread),
                format!("{:.1}", r.gflops),
                format!("{:.1}", r.gbps),
                format!("{:.0}%", r.roofline_pct),
                r.bound.to_string(),
                if r.bound == "memory" {
                    format!("{:.1}", r.dram_gbps)
                } else {
                    "-".into()
                },
            ]
        })
        .collect();
    table(
        &[
            "op",
            "problem",
            "dtype",
            "variant",
            "median",
            "IQR",
            "GFLOP/s",
            "GB/s",
            "roofline",
            "bound",
            "DRAM GB/s",
        ],
        &rows,
    )
}

/// Seconds as ms, µs or ns with three significant figures.
pub fn format_time(s: f64) -> String {
    if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.2} µs", s * 1e6)
    }
}
