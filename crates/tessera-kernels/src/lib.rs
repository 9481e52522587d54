//! Tessera kernels.

pub mod ops;
pub mod pool;
pub mod quant;
pub mod registry;
pub mod simd;
pub mod tuning;
