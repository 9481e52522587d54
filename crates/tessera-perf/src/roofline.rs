//! The machine's roofline: compute ceilings (f32 FMA, bf16 dot, int8 dot) and bandwidth
//! ceilings (DRAM, L3, L2), measured by our own calibration kernels, cached per machine,
//! and drawn as an SVG with benchmarked kernels placed by arithmetic intensity and rate.
//!
//! Cache reads use buffers sized to sit in each level (per thread 256 KiB for L2; 8 MiB
//! in total for L3, a quarter of this part's 32 MiB so the hardware keeps it resident),
//! read over and over; DRAM uses the calibration module's 256 MiB probe.

use crate::calibrate::{self, Ceilings};
use serde::{Deserialize, Serialize};
use std::time::Instant;
use tessera_kernels::pool;

/// Every ceiling, GFLOP/s (GOP/s for int8) and GB/s.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Roofline {
    /// CPU, thread count and ISA: a cached roofline is used only on the machine that measured it.
    pub fingerprint: String,
    /// Threads the ceilings were measured on.
    pub threads: usize,
    /// f32 FMA peak, GFLOP/s.
    pub fma_gflops: f64,
    /// bf16 pair-dot peak (`vdpbf16ps`), GFLOP/s; 0 without AVX512_BF16.
    pub bf16_gflops: f64,
    /// `vpdpbusd` with AVX512_VNNI, else AVX2's `vpmaddubsw` + `vpaddw` (the
    /// interleaved integer kernel's inner step); 0 on other CPUs.
    pub int8_gops: f64,
    /// DRAM read bandwidth, GB/s.
    pub dram_gbps: f64,
    /// L3-resident read bandwidth, GB/s.
    pub l3_gbps: f64,
    /// L2-resident read bandwidth, GB/s.
    pub l2_gbps: f64,
}

/// Read bandwidth over `bytes_per_thread` re-read many times (cache-resident sizes).
pub fn cache_read(threads: usize, bytes_per_thread: usize) -> f64 {
    let n = bytes_per_thread / 4;
    let bufs: Vec<Vec<f32>> = (0..threads)
        .map(|t| (0..n).map(|i| ((i + t) % 7) as f32).collect())
        .collect();
    let passes = (64 << 20) / bytes_per_thread.max(1);
    let mut rates = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        pool::global().run(threads, threads, |i| {
            for _ in 0..passes {
                std::hint::black_box(calibrate::sum_slice(&bufs[i]));
            }
        });
        let bytes = (threads * passes * n * 4) as f64;
        rates.push(bytes / t.elapsed().as_secs_f64() / 1e9);
    }
    rates.iter().copied().fold(0.0, f64::max)
}

impl Roofline {
    /// Measures every ceiling (a few seconds).
    pub fn measure(threads: usize) -> Self {
        let threads = threads.clamp(1, pool::global().threads());
        let c: Ceilings = calibrate::measure(threads);
        Roofline {
            fingerprint: crate::regress::fingerprint(threads),
            threads,
            fma_gflops: c.fma_gflops,
            bf16_gflops: c.bf16_gflops,
            int8_gops: c.int8_gops,
            dram_gbps: c.dram_gbps,
            l3_gbps: cache_read(threads, (8 << 20) / threads),
            l2_gbps: cache_read(threads, 256 << 10),
        }
    }

    /// The cached roofline for this machine, or a fresh measurement saved to `path`.
    /// A cache from another machine, or unreadable, is replaced (with a message).
    pub fn cached(path: &std::path::Path, threads: usize, refresh: bool) -> Self {
        let here = crate::regress::fingerprint(threads.clamp(1, pool::global().threads()));
        if !refresh {
            match std::fs::read_to_string(path).map(|t| serde_json::from_str::<Roofline>(&t)) {
                Ok(Ok(r)) if r.fingerprint == here => return r,
                Ok(Ok(_)) => eprintln!("{}: made on another machine; measuring", path.display()),
                Ok(Err(e)) => eprintln!("{}: unreadable ({e}); measuring", path.display()),
                Err(_) => {}
            }
        }
        let r = Roofline::measure(threads);
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Ok(text) = serde_json::to_string_pretty(&r) {
            let _ = std::fs::write(path, text);
        }
        r
    }
}

/// A kernel placed on the plot.
#[derive(Clone, Debug)]
pub struct Point {
    /// Text next to the point.
    pub label: String,
    /// FLOP (or OP) per byte.
    pub intensity: f64,
    /// Achieved GFLOP/s.
    pub gflops: f64,
}

/// Log-log axes: intensity 1/64 … 1024 FLOP/B; rate over 14 octaves, 1/4 … 4096 GFLOP/s
/// unless a ceiling or a point is higher (a GPU's), then up to the octave above it.
const X_RANGE: (f64, f64) = (-6.0, 10.0);
const Y_OCTAVES: f64 = 14.0;
const W: f64 = 900.0;
const H: f64 = 620.0;
const MARGIN: (f64, f64, f64, f64) = (70.0, 30.0, 40.0, 60.0); // left, right, top, bottom
const LEGEND_W: f64 = 520.0;
/// Point colours, one per op (cycled).
const PALETTE: [&str; 8] = [
    "#d62828", "#1982c4", "#8ac926", "#6a4c93", "#ff924c", "#2a9d8f", "#b5179e", "#495057",
];

fn px(intensity: f64) -> f64 {
    let t = (intensity.log2() - X_RANGE.0) / (X_RANGE.1 - X_RANGE.0);
    MARGIN.0 + t.clamp(0.0, 1.0) * (W - MARGIN.0 - MARGIN.1)
}

fn py_in(y_range: (f64, f64), gflops: f64) -> f64 {
    let t = (gflops.max(1e-9).log2() - y_range.0) / (y_range.1 - y_range.0);
    H - MARGIN.3 - t.clamp(0.0, 1.0) * (H - MARGIN.2 - MARGIN.3)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The roofline as a standalone SVG document. Ceilings of 0 (a device has no L2/L3
/// probe, a CPU without AVX512_BF16 no bf16 dot) are left out.
pub fn svg(r: &Roofline, points: &[Point]) -> String {
    let top = r.fma_gflops.max(r.bf16_gflops).max(r.int8_gops);
    let highest = points.iter().map(|p| p.gflops).fold(top, f64::max);
    let y_hi = (highest.max(1.0).log2() + 1.0).ceil().max(12.0);
    let y_range = (y_hi - Y_OCTAVES, y_hi);
    let py = |gflops: f64| py_in(y_range, gflops);
    // The legend column needs room for one line per point.
    let (width, height) = (
        W + LEGEND_W,
        H.max(MARGIN.2 + 12.0 * (points.len() + 2) as f64),
    );
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    s += &format!(
        "<text x=\"{}\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">Roofline: {}{}</text>\n",
        W / 2.0,
        esc(&r.fingerprint),
        match r.threads {
            0 => String::new(),
            t => format!(" ({t} threads)"),
        }
    );
    // Grid and axis labels at powers of two (every other one labelled).
    for e in (X_RANGE.0 as i32)..=(X_RANGE.1 as i32) {
        let x = px(2f64.powi(e));
        s += &format!(
            "<line x1=\"{x:.1}\" y1=\"{}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#eee\"/>\n",
            MARGIN.2,
            H - MARGIN.3
        );
        if e % 2 == 0 {
            s += &format!(
                "<text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                H - MARGIN.3 + 16.0,
                2f64.powi(e)
            );
        }
    }
    for e in (y_range.0 as i32)..=(y_range.1 as i32) {
        let y = py(2f64.powi(e));
        s += &format!(
            "<line x1=\"{}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\n",
            MARGIN.0,
            W - MARGIN.1
        );
        if e % 2 == 0 {
            s += &format!(
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
                MARGIN.0 - 6.0,
                y + 4.0,
                2f64.powi(e)
            );
        }
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">arithmetic intensity (FLOP/byte, log₂)</text>\n",
        W / 2.0,
        H - 18.0
    );
    s += &format!(
        "<text x=\"18\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {})\">GFLOP/s (log₂)</text>\n",
        H / 2.0,
        H / 2.0
    );
    // Ceilings: each bandwidth rises until it meets the top compute roof.
    let xmin = 2f64.powf(X_RANGE.0);
    let bandwidths = [
        ("L2", r.l2_gbps, "#2a9d8f"),
        ("L3", r.l3_gbps, "#e9c46a"),
        ("DRAM", r.dram_gbps, "#e76f51"),
    ];
    let fastest = bandwidths.iter().map(|b| b.1).fold(0.0, f64::max);
    for (name, bw, color) in bandwidths {
        if bw <= 0.0 {
            continue;
        }
        let ridge = top / bw;
        s += &format!(
            "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-width=\"2\"/>\n",
            px(xmin), py(bw * xmin), px(ridge), py(top)
        );
        let lx = 2f64.powf(X_RANGE.0 + 1.0);
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\">{name} {bw:.0} GB/s</text>\n",
            px(lx) + 4.0,
            py(bw * lx) - 6.0
        );
    }
    for (name, peak, color) in [
        ("f32 FMA", r.fma_gflops, "#264653"),
        ("bf16 dot", r.bf16_gflops, "#6a4c93"),
        ("int8 dot (GOP/s)", r.int8_gops, "#1982c4"),
    ] {
        if peak <= 0.0 {
            continue;
        }
        let x0 = px(peak / fastest.max(1e-9));
        s += &format!(
            "<line x1=\"{x0:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{color}\" stroke-width=\"2\" stroke-dasharray=\"6 3\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"{color}\">{name} {peak:.0}</text>\n",
            W - MARGIN.1,
            W - MARGIN.1 - 4.0,
            py(peak) - 5.0,
            y = py(peak)
        );
    }
    // Points are numbered on the plot and named in a legend to the right (dozens of
    // labels next to their points overlap into an unreadable block).
    let op_of = |p: &Point| p.label.split(' ').next().unwrap_or("").to_string();
    let mut ops: Vec<String> = Vec::new();
    for p in points {
        if !ops.contains(&op_of(p)) {
            ops.push(op_of(p));
        }
    }
    for (i, p) in points.iter().enumerate() {
        let (x, y) = (px(p.intensity), py(p.gflops));
        let op = ops.iter().position(|o| *o == op_of(p)).unwrap_or(0);
        let color = PALETTE[op % PALETTE.len()];
        s += &format!(
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4\" fill=\"{color}\"><title>{} — {:.2} FLOP/B, {:.1} GFLOP/s</title></circle>\n<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\" fill=\"{color}\">{}</text>\n",
            esc(&p.label), p.intensity, p.gflops, x + 5.0, y - 4.0, i + 1
        );
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" fill=\"{color}\">{:>2}. {} — {:.1} GFLOP/s at {:.2} FLOP/B</text>\n",
            W + 10.0,
            MARGIN.2 + 12.0 * (i + 1) as f64,
            i + 1,
            esc(&p.label),
            p.gflops,
            p.intensity
        );
    }
    s + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Roofline {
        Roofline {
            fingerprint: "test cpu <x>".into(),
            threads: 2,
            fma_gflops: 450.0,
            bf16_gflops: 850.0,
            int8_gops: 1800.0,
            dram_gbps: 40.0,
            l3_gbps: 200.0,
            l2_gbps: 600.0,
        }
    }

    /// A device's roofline: one memory ceiling, no cache probes, rates far above a
    /// CPU's; the axis reaches them and nothing is drawn for the absent ceilings.
    #[test]
    fn device_svg_skips_absent_ceilings_and_reaches_gpu_rates() {
        let r = Roofline {
            fingerprint: "NVIDIA H100 (cuda)".into(),
            threads: 0,
            fma_gflops: 60_000.0,
            bf16_gflops: 0.0,
            int8_gops: 0.0,
            dram_gbps: 2968.0,
            l3_gbps: 0.0,
            l2_gbps: 0.0,
        };
        let pts = [Point {
            label: "gemm 4096³ bf16 cuda".into(),
            intensity: 683.0,
            gflops: 254_000.0,
        }];
        let s = svg(&r, &pts);
        assert!(s.contains("DRAM 2968 GB/s") && s.contains("f32 FMA 60000"));
        assert!(!s.contains("L2 ") && !s.contains("L3 ") && !s.contains("bf16 dot"));
        assert!(!s.contains("threads") && !s.contains("NaN") && !s.contains("inf"));
        // 254 TFLOP/s is below the top of the axis (2^19 = 524288 GFLOP/s labelled).
        assert!(s.contains(">262144<"), "the rate axis reaches 2^18");
    }

    #[test]
    fn svg_is_well_formed_and_labelled() {
        let pts = [Point {
            label: "gemm 2048³ & co".into(),
            intensity: 340.0,
            gflops: 400.0,
        }];
        let s = svg(&sample(), &pts);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        for needle in [
            "DRAM 40 GB/s",
            "L2 600 GB/s",
            "f32 FMA 450",
            "int8 dot",
            "gemm 2048³ &amp; co",
            "test cpu &lt;x&gt;",
        ] {
            assert!(s.contains(needle), "missing {needle}");
        }
        // Every opened element is closed (a cheap well-formedness check).
        assert_eq!(s.matches("<circle").count(), s.matches("</circle>").count());
        assert_eq!(s.matches("<text").count(), s.matches("</text>").count());
    }

    #[test]
    fn axes_are_monotone_and_clamped() {
        let py = |g| py_in((-2.0, 12.0), g);
        assert!(px(1.0) < px(2.0) && py(10.0) > py(100.0));
        assert_eq!(px(1e-9), MARGIN.0);
        assert_eq!(py(1e9), MARGIN.2);
    }

    #[test]
    fn cache_keyed_by_machine() {
        let dir = std::env::temp_dir().join(format!("tessera-roofline-{}", std::process::id()));
        let path = dir.join("roofline.json");
        // A cache from "another machine" must not be used: cached() measures instead,
        // and replaces the file with this machine's fingerprint.
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&path, serde_json::to_string(&sample()).unwrap()).unwrap();
        let r = Roofline::cached(&path, 1, false);
        assert_ne!(r.fingerprint, "test cpu <x>");
        // Now the cache is this machine's and is returned as is (up to JSON's last digit).
        let again = Roofline::cached(&path, 1, false);
        assert_eq!(again.fingerprint, r.fingerprint);
        assert!((again.l2_gbps / r.l2_gbps - 1.0).abs() < 1e-12);
        // A corrupt cache is replaced, never a crash.
        std::fs::write(&path, "{ not json").unwrap();
        assert_eq!(Roofline::cached(&path, 1, false).fingerprint, r.fingerprint);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
