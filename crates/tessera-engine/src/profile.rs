//! Per-op profiling of the forward pass: one event per kernel call (op, shape, start,
//! duration, FLOPs, minimum bytes), a per-op summary and a Chrome trace / Perfetto JSON.
//!
//! Off by default, and then each op pays one relaxed atomic load: the event (and the
//! string describing its shape) is built only when profiling is on. Events go to one
//! process-wide buffer because ops are issued by the one thread that runs the forward
//! pass (the kernels' worker threads are inside the timed calls).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;
use tessera_kernels::registry::ComputeUnit;

static ENABLED: AtomicBool = AtomicBool::new(false);
static EVENTS: Mutex<Vec<OpEvent>> = Mutex::new(Vec::new());
/// 0: prefill, 1: decode (ops of the two phases have different shapes and limits).
static DECODE: AtomicBool = AtomicBool::new(false);

/// Which phase the following ops belong to (set by the forward pass).
pub fn set_decode(decode: bool) {
    DECODE.store(decode, Ordering::Relaxed);
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// One kernel call.
#[derive(Clone, Debug, PartialEq)]
pub struct OpEvent {
    /// The op's name.
    pub op: &'static str,
    /// "prefill" or "decode".
    pub phase: &'static str,
    /// Shape of the call, for display.
    pub shape: String,
    /// Microseconds since the profiler's epoch.
    pub start_us: f64,
    /// Duration, microseconds.
    pub dur_us: f64,
    /// FLOPs of the call.
    pub flops: f64,
    /// Minimum bytes the op must move (weights, inputs, outputs once each).
    pub bytes: f64,
    /// The arithmetic the call's FLOPs ran on (which peak bounds them).
    pub unit: ComputeUnit,
}

/// What an op costs, computed only while profiling.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpCost {
    /// Shape of the call, for display.
    pub shape: String,
    /// FLOPs of the call.
    pub flops: f64,
    /// Minimum bytes the call must move.
    pub bytes: f64,
    /// The arithmetic its FLOPs run on: a matmul over integer activations is bounded by
    /// the 8-bit dot peak, not the f32 FMA one (against which the AVX2 kernels
    /// read 123–152% of it on host B).
    pub unit: ComputeUnit,
}

/// Turns recording on or off (events recorded so far are kept).
pub fn enable(on: bool) {
    epoch();
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether a profile is being recorded (costs are computed only then).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Removes and returns the events recorded so far.
pub fn take() -> Vec<OpEvent> {
    std::mem::take(&mut *EVENTS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Runs `f`, recording it as `op` when profiling is on.
#[inline]
pub fn record<T>(op: &'static str, cost: impl FnOnce() -> OpCost, f: impl FnOnce() -> T) -> T {
    if !enabled() {
        return f();
    }
    let start = Instant::now();
    let out = f();
    let end = Instant::now();
    let c = cost();
    let at = |t: Instant| t.duration_since(epoch()).as_secs_f64() * 1e6;
    let event = OpEvent {
        op,
        phase: phase_name(DECODE.load(Ordering::Relaxed)),
        shape: c.shape,
        start_us: at(start),
        dur_us: at(end) - at(start),
        flops: c.flops,
        bytes: c.bytes,
        unit: c.unit,
    };
    EVENTS.lock().unwrap_or_else(|p| p.into_inner()).push(event);
    out
}

fn phase_name(decode: bool) -> &'static str {
    if decode {
        "decode"
    } else {
        "prefill"
    }
}

/// Totals for one op name in one phase.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSummary {
    /// The op's name.
    pub op: &'static str,
    /// "prefill" or "decode".
    pub phase: &'static str,
    /// Calls recorded.
    pub calls: usize,
    /// Time over all calls, microseconds.
    pub total_us: f64,
    /// Minimum bytes over all calls.
    pub bytes: f64,
    /// The FLOPs per arithmetic they ran on (an op's calls can differ: a prefill
    /// matmul takes the integer path for a short chunk and f32 GEMM for a long one).
    pub flops_by_unit: Vec<(ComputeUnit, f64)>,
}

impl OpSummary {
    /// FLOPs over all calls, whatever they ran on.
    pub fn flops(&self) -> f64 {
        self.flops_by_unit.iter().map(|&(_, f)| f).sum()
    }
    /// The least time the FLOPs need, in µs, each unit's at its `peak` (GFLOP/s, or
    /// GOP/s for integer dots).
    pub fn compute_floor_us(&self, peak: impl Fn(ComputeUnit) -> f64) -> f64 {
        self.flops_by_unit
            .iter()
            .map(|&(unit, flops)| flops / peak(unit) / 1e3)
            .sum()
    }
    /// Achieved GB/s over the recorded time.
    pub fn gbps(&self) -> f64 {
        self.bytes / self.total_us / 1e3
    }
    /// Achieved GFLOP/s over the recorded time.
    pub fn gflops(&self) -> f64 {
        self.flops() / self.total_us / 1e3
    }
}

/// Per-(phase, op) totals, largest total time first.
pub fn summarize(events: &[OpEvent]) -> Vec<OpSummary> {
    let mut out: Vec<OpSummary> = Vec::new();
    for e in events {
        match out.iter_mut().find(|s| s.op == e.op && s.phase == e.phase) {
            Some(s) => {
                s.calls += 1;
                s.total_us += e.dur_us;
                s.bytes += e.bytes;
                match s.flops_by_unit.iter_mut().find(|(u, _)| *u == e.unit) {
                    Some((_, f)) => *f += e.flops,
                    None => s.flops_by_unit.push((e.unit, e.flops)),
                }
            }
            None => out.push(OpSummary {
                op: e.op,
                phase: e.phase,
                calls: 1,
                total_us: e.dur_us,
                bytes: e.bytes,
                flops_by_unit: vec![(e.unit, e.flops)],
            }),
        }
    }
    out.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
    out
}

/// The events as Chrome trace JSON (complete "X" events; opens in Perfetto or
/// chrome://tracing), each with its shape, FLOPs and bytes as arguments.
pub fn chrome_trace(events: &[OpEvent]) -> String {
    let list: Vec<serde_json::Value> = events
        .iter()
        .map(|e| {
            serde_json::json!({
                "name": e.op, "cat": e.phase, "ph": "X", "pid": 1, "tid": 1,
                "ts": e.start_us, "dur": e.dur_us,
                "args": {
                    "shape": e.shape, "flops": e.flops, "bytes": e.bytes,
                    "unit": format!("{:?}", e.unit),
                },
            })
        })
        .collect();
    serde_json::json!({ "traceEvents": list, "displayTimeUnit": "ms" }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(op: &'static str, dur_us: f64, bytes: f64) -> OpEvent {
        OpEvent {
            op,
            phase: "decode",
            shape: "1x2".into(),
            start_us: 0.0,
            dur_us,
            flops: 2.0 * bytes,
            bytes,
            unit: ComputeUnit::Fma,
        }
    }

    #[test]
    fn summary_keeps_each_units_flops_apart() {
        let int8 = |dur_us, bytes| OpEvent {
            unit: ComputeUnit::Int8Dot,
            ..ev("a", dur_us, bytes)
        };
        let s = summarize(&[ev("a", 1.0, 10.0), int8(2.0, 100.0), int8(3.0, 50.0)]);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].flops(), 320.0);
        assert_eq!(
            s[0].flops_by_unit,
            vec![(ComputeUnit::Fma, 20.0), (ComputeUnit::Int8Dot, 300.0)]
        );
        // 20 FLOPs at 10 GFLOP/s (2 ns) and 300 ops at 100 GOP/s (3 ns).
        let peak = |u| if u == ComputeUnit::Fma { 10.0 } else { 100.0 };
        assert!((s[0].compute_floor_us(peak) - 5e-3).abs() < 1e-12);
    }

    #[test]
    fn summary_totals_and_order() {
        let s = summarize(&[ev("a", 1.0, 10.0), ev("b", 5.0, 1e4), ev("a", 2.0, 20.0)]);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].op, s[0].calls), ("b", 1));
        assert_eq!((s[1].op, s[1].calls, s[1].total_us), ("a", 2, 3.0));
        // 1e4 bytes in 5 µs = 2 GB/s.
        assert!((s[0].gbps() - 2.0).abs() < 1e-12);
        assert!((s[0].gflops() - 4.0).abs() < 1e-12);
    }

    #[test]
    fn trace_is_valid_json_with_every_event() {
        let t = chrome_trace(&[ev("a", 1.0, 10.0), ev("b", 2.0, 3.0)]);
        let v: serde_json::Value = serde_json::from_str(&t).expect("json");
        let list = v["traceEvents"].as_array().expect("events");
        assert_eq!(list.len(), 2);
        assert_eq!(list[1]["name"], "b");
        assert_eq!(list[1]["ph"], "X");
        assert_eq!(list[0]["args"]["bytes"], 10.0);
    }

    #[test]
    fn recording_only_when_enabled() {
        // The one test that touches the global switch (tests run in parallel).
        enable(false);
        let _ = take();
        assert_eq!(record("x", OpCost::default, || 7), 7);
        assert!(take().is_empty());
        enable(true);
        record("y", OpCost::default, || ());
        enable(false);
        let got = take();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].op, "y");
        assert!(got[0].dur_us >= 0.0);
    }
}
