//! `--profile FILE` on `run` and `bench-model`: the engine's per-op events written as a
//! Chrome trace, and the per-op "utilization gaps" table: each op's share of the time,
//! its achieved GB/s and GFLOP/s, and how close it came to its roofline bound, judged
//! against this machine's ceilings measured right after the run.

use anyhow::{Context, Result};
use std::path::Path;
use tessera_engine::profile::{self, OpEvent};
use tessera_kernels::registry::ComputeUnit;
use tessera_perf::calibrate;
use tessera_perf::report::table;

/// Writes the trace to `path` and prints the summary to stderr.
pub fn report(events: &[OpEvent], path: &Path) -> Result<()> {
    std::fs::write(path, profile::chrome_trace(events))
        .with_context(|| format!("writing {}", path.display()))?;
    let threads = tessera_kernels::pool::global().threads();
    let peaks = calibrate::measure(threads);
    // The probe drifts on shared hosts; a second reading right after narrows it.
    let dram = 0.5 * (peaks.dram_gbps + calibrate::dram_read_now(threads, 5));
    let summary = profile::summarize(events);
    let mut rows = Vec::new();
    for phase in ["prefill", "decode"] {
        let ops: Vec<_> = summary.iter().filter(|s| s.phase == phase).collect();
        let total: f64 = ops.iter().map(|s| s.total_us).sum();
        for s in ops {
            // The op's floor: its bytes at DRAM speed or its FLOPs at the peak of the
            // arithmetic each call ran on (8-bit dots for integer-activation matmuls).
            let (memory_us, compute_us) = (
                s.bytes / dram / 1e3,
                s.compute_floor_us(|u| peaks.peak_gflops(u)),
            );
            let floor_us = memory_us.max(compute_us);
            let bound = if memory_us > compute_us {
                "memory"
            } else {
                "compute"
            };
            rows.push(vec![
                phase.to_string(),
                s.op.to_string(),
                s.calls.to_string(),
                format!("{:.2}", s.total_us / 1e3),
                format!("{:.1}%", 100.0 * s.total_us / total),
                format!("{:.1}", s.total_us / s.calls as f64),
                format!("{:.1}", s.gbps()),
                format!("{:.1}", s.gflops()),
                bound.to_string(),
                format!("{:.0}%", 100.0 * floor_us / s.total_us),
            ]);
        }
    }
    eprintln!(
        "per-op profile ({} events, trace in {}); ceilings: DRAM {dram:.1} GB/s, f32 FMA {:.0} GFLOP/s, int8 dot {:.0} GOP/s (integer-activation matmuls; 16-bit activations are two 8-bit planes, so at most half of it), {threads} threads; bytes count at DRAM speed, so an op whose data stay in cache (a step's activations) can pass 100%\n{}",
        events.len(),
        path.display(),
        peaks.fma_gflops,
        peaks.peak_gflops(ComputeUnit::Int8Dot),
        table(
            &[
                "phase", "op", "calls", "total ms", "share", "avg µs", "GB/s", "GFLOP/s",
                "bound", "% roofline",
            ],
            &rows
        )
    );
    Ok(())
}

/// Fails now if `path` cannot be written later (its directory missing, say), so a long
/// run does not end in an error after all its work.
pub fn check_writable(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        anyhow::bail!(
            "cannot write {}: the directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    if path.is_dir() {
        anyhow::bail!("cannot write {}: it is a directory", path.display());
    }
    Ok(())
}
