//! `--backend`: which of the registry's backends a command runs, and opening the
//! devices it names. The CPU is always there; a device backend exists in this binary
//! only when built with its cargo feature (`wgpu`), and on this machine only when an
//! adapter opens. Named explicitly, a missing device is an error; under `all` it is a
//! printed note, so a report says plainly which columns it lacks.

use anyhow::{bail, Result};
use std::sync::OnceLock;
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

#[cfg(feature = "wgpu")]
static WGPU: OnceLock<std::sync::Arc<tessera_wgpu::WgpuDevice>> = OnceLock::new();
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
    if which == BackendArg::Cuda {
        bail!(
            "the CUDA backend is not in the registry yet: tessera-cuda's kernels run only \
             through its own tests (and no NVIDIA GPU has been available to verify them)"
        );
    }
    Ok(())
}

#[cfg(feature = "wgpu")]
fn open_wgpu() -> Result<String> {
    use tessera_core::device::Device;
    if let Some(d) = WGPU.get() {
        return Ok(d.name());
    }
    let d = std::sync::Arc::new(tessera_wgpu::WgpuDevice::new()?);
    tessera_core::device::install(d.clone());
    let name = d.name();
    let _ = WGPU.set(d);
    Ok(name)
}

#[cfg(not(feature = "wgpu"))]
fn open_wgpu() -> Result<String> {
    bail!("this tessera was built without the wgpu backend (build with --features wgpu)")
}

/// The open wgpu device's ceilings from its own probes (measured once, printed), or
/// None when no wgpu device is open.
pub fn wgpu_ceilings() -> Result<Option<Ceilings>> {
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
        };
        let _ = WGPU_CEILINGS.set(c);
        return Ok(Some(c));
    }
    Ok(WGPU_CEILINGS.get().copied())
}
