//! Every op: one module each, holding its public API, float64 reference, CPU
//! implementations and registry entry.

pub mod attention;
pub mod common;
pub mod gemm;
pub mod paged_attention;

use crate::registry::OpSpec;

/// The registry's contents, in report order.
pub fn registered() -> Vec<&'static dyn OpSpec> {
    vec![&gemm::GemmOp, &attention::AttentionOp, &paged_attention::PagedAttentionOp]
}
