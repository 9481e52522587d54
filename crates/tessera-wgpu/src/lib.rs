//! Tessera's portable GPU backend: WGSL kernels run through `wgpu` on Vulkan, Metal or
//! DX12 devices, Mesa's software Vulkan (lavapipe) included, which is how CI verifies
//! them on machines without a GPU.
//!
//! [`WgpuDevice`] implements [`tessera_core::device::Device`]; installed with
//! [`tessera_core::device::install`], its kernels appear in the registry as `wgpu`
//! variants and are verified and benchmarked by the same harness, problems, float64
//! references and tolerances as the CPU kernels.
//!
//! - `context`: adapter, device, queue, buffers, the pipeline cache and launches.
//! - `kernels`: each [`DeviceCall`](tessera_core::device::DeviceCall) as a pipeline, its uniform parameters and its
//!   workgroup grid (the WGSL sources are in `src/shaders/`).
//! - `paged`: decode attention over a paged KV cache (block tables shipped per launch).
//! - ggml blocks are split for the quantized matmul by `tessera_core::device::blocks`.
//! - [`probe`]: the adapter's own ceilings (bandwidth and FMA), for the roofline.

#![warn(missing_docs)]

mod context;
mod kernels;
mod paged;
pub mod probe;

pub use context::WgpuDevice;
