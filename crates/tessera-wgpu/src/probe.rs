//! The adapter's own ceilings, measured with WGSL kernels: streaming read bandwidth and
//! the FMA rate, so device benchmarks report % of what this adapter can do (as the CPU
//! roofline uses `calibrate`).

use crate::context::{Buf, WgpuDevice};
use std::time::Instant;
use tessera_core::device::Device;
use tessera_core::Result;

const PROBE: &str = include_str!("shaders/probe.wgsl");

/// Measured ceilings of one adapter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceCeilings {
    /// Read bandwidth of a large buffer, GB/s (best of several runs).
    pub read_gbps: f64,
    /// f32 FMA throughput, GFLOP/s (an FMA counts 2).
    pub fma_gflops: f64,
}

/// Runs both probes (a second or so on a software adapter).
pub fn measure(dev: &WgpuDevice) -> Result<DeviceCeilings> {
    // 64 MiB read (or the largest binding), summed per invocation into a small output.
    let len = ((64usize << 20) / 4).min(dev.max_binding as usize / 4);
    let src = dev.upload(&vec![1.0f32; len])?;
    let threads = 65535usize.min(len / 256) * 64;
    let out = dev.upload(&vec![0.0f32; threads])?;
    let (s, o) = (&src.get::<Buf>()?.buffer, &out.get::<Buf>()?.buffer);
    let read = dev.pipeline("read_sum", PROBE)?;
    let per = (len / threads) as u32;
    let params = [len as u32, per, threads as u32, 0];
    let grid = [(threads / 64) as u32, 1, 1];
    // Each timed launch is submitted and waited for on its own.
    let go = |pipeline, params: &[u32]| -> Result<()> {
        dev.launch(pipeline, params, &[Some(s), Some(o)], grid)?;
        dev.submit(true)
    };
    go(&read, &params)?;
    let best = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            f()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let t_read = best(&|| go(&read, &params))?;
    let fma = dev.pipeline("fma_chain", PROBE)?;
    // Chains long enough for ~50 ms a launch: 4096 steps ran 7 s a launch on lavapipe.
    let t_short = {
        let t = Instant::now();
        go(&fma, &[0, 64, threads as u32, 0])?;
        t.elapsed().as_secs_f64()
    };
    let iters = ((64.0 * 0.05 / t_short.max(1e-6)) as u32).clamp(64, 4096);
    let fparams = [0, iters, threads as u32, 0];
    go(&fma, &fparams)?;
    let t_fma = best(&|| go(&fma, &fparams))?;
    // 8 independent chains of `iters` FMAs per invocation.
    let flops = 2.0 * 8.0 * iters as f64 * threads as f64;
    Ok(DeviceCeilings {
        read_gbps: (len * 4) as f64 / t_read / 1e9,
        fma_gflops: flops / t_fma / 1e9,
    })
}
