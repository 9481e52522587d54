//! The GPU's own ceilings, measured with `kernels/probe.cu`: streaming copy bandwidth
//! (bytes read plus bytes written, as METHOD.md counts a device-to-device copy), the
//! f32 FMA rate of the CUDA cores and the bf16 rate of the tensor cores through
//! `mma.sync` m16n8k16 (the instruction our gemm and flash kernels issue; Hopper's
//! `wgmma` goes faster, and cuBLAS's figure in the same run shows by how much), so
//! device benchmarks report % of what this card does rather than of a datasheet.

use crate::ops::cfg;
use crate::{CudaBackend, CudaError};
use cudarc::driver::PushKernelArg;
use std::time::Instant;

/// Measured ceilings of one GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuCeilings {
    /// Copy bandwidth of a 1 GiB buffer, read + written bytes, GB/s (best of 5).
    pub copy_gbps: f64,
    /// f32 FMA throughput on the CUDA cores, GFLOP/s (an FMA counts 2; best of 5).
    pub fma_gflops: f64,
    /// bf16 `mma.sync` throughput on the tensor cores, f32 accumulators, GFLOP/s (a
    /// multiply-add counts 2; best of 5).
    pub mma_bf16_gflops: f64,
    /// L2 cache bytes, as the driver reports them.
    pub l2_bytes: usize,
}

fn best_of(
    backend: &CudaBackend,
    mut run: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    run()?;
    backend.gpu().synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        run()?;
        backend.gpu().synchronize()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// Runs both probes (well under a second on a data-centre GPU).
pub fn measure(backend: &CudaBackend) -> Result<GpuCeilings, CudaError> {
    let gpu = backend.gpu();
    let launch_err = |e| CudaError::driver("launch probe", e);
    // Copy: 1 GiB as float4s.
    let n4 = (1usize << 30) / 16;
    let src = gpu.zeros::<f32>(4 * n4)?;
    let dst = gpu.zeros::<f32>(4 * n4)?;
    let copy = gpu.function("probe", "probe_copy")?;
    let n = n4 as i64;
    let secs = best_of(backend, || {
        let mut l = gpu.stream().launch_builder(&copy);
        l.arg(&src).arg(&dst).arg(&n);
        // SAFETY: matches probe_copy; both buffers hold n float4s.
        unsafe { l.launch(cfg((65536, 1, 1), 256)) }
            .map(|_| ())
            .map_err(launch_err)
    })?;
    let copy_gbps = 2.0 * (n4 * 16) as f64 / secs / 1e9;
    // FMA: 1M threads × 4096 iterations × 8 chains.
    let (blocks, threads, iters) = (4096u32, 256u32, 4096i32);
    let out = gpu.zeros::<f32>((blocks * threads) as usize)?;
    let fma = gpu.function("probe", "probe_fma")?;
    let (a, b) = (0.999f32, 1e-3f32);
    let secs = best_of(backend, || {
        let mut l = gpu.stream().launch_builder(&fma);
        l.arg(&out).arg(&iters).arg(&a).arg(&b);
        // SAFETY: matches probe_fma; `out` holds one float per thread.
        unsafe { l.launch(cfg((blocks, 1, 1), threads)) }
            .map(|_| ())
            .map_err(launch_err)
    })?;
    let flops = 2.0 * 8.0 * iters as f64 * (blocks * threads) as f64;
    Ok(GpuCeilings {
        copy_gbps,
        fma_gflops: flops / secs / 1e9,
        mma_bf16_gflops: mma_bf16(backend)?,
        l2_bytes: gpu.l2_bytes()?,
    })
}

/// The tensor-core probe: 1024 blocks of 8 warps, each warp 8 independent 16×8×16 tiles
/// per iteration. Its output is checked, so a probe that skipped work cannot report a rate.
fn mma_bf16(backend: &CudaBackend) -> Result<f64, CudaError> {
    const TILES_PER_WARP: f64 = 8.0;
    const TILE_FLOPS: f64 = 2.0 * 16.0 * 8.0 * 16.0;
    let gpu = backend.gpu();
    let (blocks, threads, iters) = (1024u32, 256u32, 256i32);
    let out = gpu.zeros::<f32>((blocks * threads) as usize)?;
    let mma = gpu.function("probe", "probe_mma_bf16")?;
    let secs = best_of(backend, || {
        let mut l = gpu.stream().launch_builder(&mma);
        l.arg(&out).arg(&iters);
        // SAFETY: matches probe_mma_bf16; `out` holds one float per thread.
        unsafe { l.launch(cfg((blocks, 1, 1), threads)) }
            .map(|_| ())
            .map_err(|e| CudaError::driver("launch probe", e))
    })?;
    // Every operand is 2^-10: each thread's 8 tiles × 4 accumulators end at
    // iters · 16 · 2^-20 apiece, exact in f32.
    let expect = 32.0 * iters as f32 * 16.0 / (1u32 << 20) as f32;
    if let Some(bad) = gpu.download(&out)?.into_iter().find(|&x| x != expect) {
        return Err(CudaError::driver(
            "tensor-core probe",
            format!("a thread summed {bad}, expected {expect}"),
        ));
    }
    let warps = f64::from(blocks * threads / 32);
    Ok(warps * f64::from(iters) * TILES_PER_WARP * TILE_FLOPS / secs / 1e9)
}
