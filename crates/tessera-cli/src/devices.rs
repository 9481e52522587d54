//! `--backend`: which of the registry's backends a command runs, and opening the
//! devices it names. The CPU is always there; a device backend exists in this binary
//! only when built with its cargo feature (`wgpu`, `cuda`), and on this machine only
//! when its device opens. Named explicitly, a missing device is an error; under `all` it is a
//! printed note, so a report says plainly which columns it lacks.

use anyhow::Result;
use std::sync::{Arc, OnceLock};
use tessera_core::device::{Device, DeviceKind};
use tessera_kernels::registry::Variant;
use tessera_perf::calibrate::Ceilings;

/// The backends a command runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// The CPU and every device that opens.
    All,
    /// The CPU's ISA variants only.
    Cpu,
    /// The wgpu device (Vulkan, Metal, DX12; Mesa's lavapipe without a GPU).
    Wgpu,
    /// The CUDA device.
    Cuda,
}

impl BackendArg {
    /// Whether `v` runs under this selection.
    pub fn keeps(self, v: &Variant) -> bool {
        match self {
            BackendArg::All => true,
            BackendArg::Cpu => v.backend.device_kind().is_none(),
            BackendArg::Wgpu => v.backend.family() == "wgpu",
            BackendArg::Cuda => v.backend.family() == "cuda",
        }
    }
}

/// Where `tessera run` runs the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    /// The CPU kernels.
    Cpu,
    /// The wgpu device (Vulkan, Metal, DX12; Mesa's lavapipe without a GPU).
    Wgpu,
    /// The CUDA device.
    Cuda,
}

impl DeviceArg {
    /// The device kind, None for the CPU.
    pub fn kind(self) -> Option<DeviceKind> {
        match self {
            DeviceArg::Cpu => None,
            DeviceArg::Wgpu => Some(DeviceKind::Wgpu),
            DeviceArg::Cuda => Some(DeviceKind::Cuda),
        }
    }
}

/// Opens (once) and returns the device of `kind`, or the error saying why it cannot.
pub fn open_device(kind: DeviceKind) -> Result<Arc<dyn Device>> {
    let name = match kind {
        DeviceKind::Wgpu => open_wgpu()?,
        DeviceKind::Cuda => open_cuda()?,
    };
    eprintln!("{kind}: {name}");
    tessera_core::device::get(kind)
        .ok_or_else(|| anyhow::anyhow!("the {kind} device opened but is not installed"))
}

#[cfg(feature = "wgpu")]
static WGPU: OnceLock<Arc<tessera_wgpu::WgpuDevice>> = OnceLock::new();
static WGPU_CEILINGS: OnceLock<Ceilings> = OnceLock::new();

/// Opens and installs the devices `which` needs.
pub fn open(which: BackendArg) -> Result<()> {
    if matches!(which, BackendArg::Wgpu | BackendArg::All) {
        match open_wgpu() {
            Ok(name) => eprintln!("wgpu: {name}"),
            Err(e) if which == BackendArg::Wgpu => return Err(e),
            Err(e) => eprintln!("tessera: wgpu variants not run: {e}"),
        }
    }
    if matches!(which, BackendArg::Cuda | BackendArg::All) {
        match open_cuda() {
            Ok(name) => eprintln!("cuda: {name}"),
            Err(e) if which == BackendArg::Cuda => return Err(e),
            Err(e) => eprintln!("tessera: cuda variants not run: {e}"),
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
static CUDA: OnceLock<Arc<tessera_cuda::CudaBackend>> = OnceLock::new();
static CUDA_CEILINGS: OnceLock<Ceilings> = OnceLock::new();

#[cfg(feature = "cuda")]
fn open_cuda() -> Result<String> {
    if let Some(d) = CUDA.get() {
        return Ok(d.name());
    }
    let d = Arc::new(tessera_cuda::CudaBackend::new(0)?);
    tessera_core::device::install(d.clone());
    let name = d.name();
    let _ = CUDA.set(d);
    Ok(name)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda() -> Result<String> {
    anyhow::bail!("this tessera was built without the CUDA backend (build with --features cuda)")
}

/// The ceilings device benchmarks are a percentage of: the CUDA device's (copy
/// bandwidth, CUDA-core FMA and tensor-core bf16 rates from its probes) when `which`
/// is `cuda`, else the wgpu device's; None when that device is not open.
pub fn device_ceilings(which: BackendArg) -> Result<Option<Ceilings>> {
    if which == BackendArg::Cuda {
        return cuda_ceilings();
    }
    wgpu_ceilings()
}

fn cuda_ceilings() -> Result<Option<Ceilings>> {
    #[cfg(feature = "cuda")]
    if let Some(d) = CUDA.get() {
        if let Some(c) = CUDA_CEILINGS.get() {
            return Ok(Some(*c));
        }
        let p = tessera_cuda::probe::measure(d)?;
        eprintln!(
            "cuda ceilings: copy {:.1} GB/s (read + written), f32 FMA {:.1} GFLOP/s, \
             bf16 mma.sync {:.1} GFLOP/s",
            p.copy_gbps, p.fma_gflops, p.mma_bf16_gflops
        );
        let c = Ceilings {
            threads: 0,
            fma_gflops: p.fma_gflops,
            bf16_gflops: p.mma_bf16_gflops,
            int8_gops: p.fma_gflops,
            dram_gbps: p.copy_gbps,
            // A driver reporting no L2 sizes the rotation from the host's LLC instead
            // (Some(0) would time a single instance from cache).
            cache_bytes: (p.l2_bytes > 0).then_some(p.l2_bytes),
        };
        let _ = CUDA_CEILINGS.set(c);
        return Ok(Some(c));
    }
    Ok(CUDA_CEILINGS.get().copied())
}

#[cfg(feature = "wgpu")]
fn open_wgpu() -> Result<String> {
    if let Some(d) = WGPU.get() {
        return Ok(d.name());
    }
    let d = Arc::new(tessera_wgpu::WgpuDevice::new()?);
    tessera_core::device::install(d.clone());
    let name = d.name();
    let _ = WGPU.set(d);
    Ok(name)
}

#[cfg(not(feature = "wgpu"))]
fn open_wgpu() -> Result<String> {
    anyhow::bail!("this tessera was built without the wgpu backend (build with --features wgpu)")
}

/// The open wgpu device's ceilings from its own probes (measured once, printed), or
/// None when no wgpu device is open.
fn wgpu_ceilings() -> Result<Option<Ceilings>> {
    #[cfg(feature = "wgpu")]
    if let Some(d) = WGPU.get() {
        if let Some(c) = WGPU_CEILINGS.get() {
            return Ok(Some(*c));
        }
        let p = tessera_wgpu::probe::measure(d)?;
        eprintln!(
            "wgpu ceilings: read {:.1} GB/s, f32 FMA {:.1} GFLOP/s",
            p.read_gbps, p.fma_gflops
        );
        let c = Ceilings {
            threads: 0,
            fma_gflops: p.fma_gflops,
            bf16_gflops: p.fma_gflops,
            int8_gops: p.fma_gflops,
            dram_gbps: p.read_gbps,
            // wgpu reports no cache size: the host's LLC stands in. It is the cache
            // lavapipe runs in; a discrete GPU's L2 can be larger (72 MB on an RTX 4090).
            cache_bytes: None,
        };
        let _ = WGPU_CEILINGS.set(c);
        return Ok(Some(c));
    }
    Ok(WGPU_CEILINGS.get().copied())
}
