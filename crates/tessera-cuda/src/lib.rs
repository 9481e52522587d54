//! Tessera's CUDA backend: kernels kept as `.cu` sources, one per op, compiled at run
//! time by NVRTC through `cudarc` with dynamic loading, so `cargo build` needs no CUDA
//! toolkit and a machine without CUDA still builds and runs everything else.
//!
//! - [`nvrtc`]: compilation to CUBIN for the device's real architecture, cached on disk.
//! - [`Device`]: a context, its stream, modules loaded once per kernel source.
//! - [`ops`]: one launcher per kernel (typed parameter structs), on device buffers;
//!   [`checks`]: their argument checks as pure functions, tested without a GPU.
//!
//! cudarc panics when a CUDA library is missing, so every entry point checks for the
//! library first ([`nvrtc_available`], [`driver_available`]) and turns absence into
//! [`CudaError::NotAvailable`].
//!
//! Status: every kernel is compile-checked (CUBIN for sm_80 and sm_90, in CI, which has
//! no GPU); on an H100 (`scripts/gpu-check.sh`, docs/performance.md) every registry
//! variant verifies against float64 and runs clean under compute-sanitizer, and the
//! engine dispatches to them with `tessera run --device cuda`.

#![warn(missing_docs)]

mod backend;
pub mod checks;
mod device;
pub mod nvrtc;
pub mod ops;
pub mod probe;

pub use backend::{CudaBackend, MAX_HEAD_DIM};
pub use device::{driver_available, Device};
pub use nvrtc::{
    compile_cached, compile_cubin, default_cache_dir, nvrtc_available, nvrtc_version, Origin,
};

/// The kernel sources, by name (one file per op under `kernels/`).
pub const KERNELS: [(&str, &str); 11] = [
    ("rms_norm", include_str!("../kernels/rms_norm.cu")),
    ("rope", include_str!("../kernels/rope.cu")),
    ("swiglu", include_str!("../kernels/swiglu.cu")),
    ("add", include_str!("../kernels/add.cu")),
    ("softmax", include_str!("../kernels/softmax.cu")),
    ("embedding", include_str!("../kernels/embedding.cu")),
    ("gemm", include_str!("../kernels/gemm.cu")),
    (
        "flash_attention",
        include_str!("../kernels/flash_attention.cu"),
    ),
    (
        "paged_attention",
        include_str!("../kernels/paged_attention.cu"),
    ),
    ("qmatvec", include_str!("../kernels/qmatvec.cu")),
    ("probe", include_str!("../kernels/probe.cu")),
];

/// The header the tensor-core kernels share (`#include "common.cuh"`).
const COMMON: &str = include_str!("../kernels/common.cuh");

/// A kernel's complete source: the file with the shared header inlined (NVRTC is given
/// one translation unit, no project include path).
pub fn kernel_source(name: &str) -> Option<String> {
    KERNELS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| src.replace("#include \"common.cuh\"", COMMON))
}

/// Architectures every kernel must compile for: Ampere and Hopper.
pub const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// Everything the CUDA backend can fail at, each with what to fix.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No driver, no device, or no NVRTC library on this machine.
    #[error("CUDA not available: {0}")]
    NotAvailable(String),
    /// A kernel source did not compile.
    #[error("NVRTC failed to compile {kernel} for {arch}: {message}\n{log}")]
    Compile {
        /// The kernel's source file.
        kernel: String,
        /// The target architecture (`sm_90`).
        arch: String,
        /// NVRTC's error.
        message: String,
        /// The compiler's log.
        log: String,
    },
    /// A driver call failed.
    #[error("CUDA driver call failed ({what}): {message}")]
    Driver {
        /// The call.
        what: String,
        /// The driver's error.
        message: String,
    },
    /// Arguments whose shapes do not fit together.
    #[error("{op}: {message}")]
    Shape {
        /// The op that checked.
        op: &'static str,
        /// What does not fit.
        message: String,
    },
}

impl CudaError {
    pub(crate) fn driver(what: impl Into<String>, e: impl std::fmt::Debug) -> Self {
        CudaError::Driver {
            what: what.into(),
            message: format!("{e:?}"),
        }
    }
    pub(crate) fn shape(op: &'static str, message: impl Into<String>) -> Self {
        CudaError::Shape {
            op,
            message: message.into(),
        }
    }
}
