//! Tessera's core layer: the types every other crate speaks.
//!
//! Nothing here computes; it describes data. Kernels take typed, validated views
//! ([`TensorView`], [`TensorViewMut`]) so that once a view exists its every index is
//! known to be in bounds, and the hot loops can index without checks. Every way a
//! caller can get a shape, stride or length wrong is an [`Error`], never a panic.

#![warn(missing_docs)]

pub mod aligned;
pub mod cache;
pub mod device;
pub mod dtype;
pub mod error;
pub mod huge;
pub mod isa;
pub mod layout;
pub mod tensor;

pub use aligned::AlignedVec;
pub use cache::CacheSizes;
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use huge::HugeBuf;
pub use isa::{CpuFeatures, Isa};
pub use layout::{Layout, MAX_RANK};
pub use tensor::{Tensor, TensorView, TensorViewMut};

pub use half::{bf16, f16};
