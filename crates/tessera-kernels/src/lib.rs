//! Tessera's CPU kernels and the registry that verifies them.
//!
//! - [`ops`]: one module per op. Each holds its public function, its float64 reference,
//!   tolerance constants with their reasons, and its registry entry (test problems,
//!   bench problems, tuning space). [`ops::all`] lists them.
//! - [`registry`]: the contract every op implements (`OpSpec`, `ProblemCase`,
//!   `Instance`) and the harness that checks a variant against float64
//!   ([`registry::verify`]). The perf crate's bench/tune/regress are driven by the same
//!   description.
//! - [`quant`]: the weight formats (ggml blocks and K-quants bit-exact with llama.cpp,
//!   4-bit groups, per-channel INT8, FP8) with their quantizers and dequantizers.
//! - [`simd`]: portable bodies compiled once per ISA (`multiversion!`), and the few
//!   explicit AVX-512 paths that measurably beat them.
//! - [`pool`]: the persistent thread pool every parallel kernel runs on.
//! - [`tuning`]: the on-disk cache of tuned parameters the kernels read at run time.
//!
//! The instruction set is always an argument (`Isa`), chosen once by the caller, so every
//! path a CPU can run is testable on it.

#![warn(missing_docs)]

pub mod ops;
pub mod pool;
pub mod quant;
pub mod registry;
mod reuse;
pub mod simd;
pub mod tuning;
