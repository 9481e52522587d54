//! Every op: one module each, holding its public API, float64 reference, CPU
//! implementations and registry entry.

pub mod add;
pub mod argmax;
pub mod attention;
pub mod common;
pub mod embedding;
pub mod gelu;
pub mod gemm;
pub mod layer_norm;
pub mod paged_attention;
pub mod qmatmul;
pub mod rms_norm;
pub mod rope;
pub mod rowwise;
pub mod silu;
pub mod softmax;
pub mod swiglu;
pub mod varlen_attention;

use crate::registry::OpSpec;
use rowwise::RowOpSpec;

/// Every registered op, in report order. The list lives here, with the ops, so the
/// registry (the `OpSpec` contract and its harness) does not depend on them.
pub fn all() -> Vec<&'static dyn OpSpec> {
    vec![
        &gemm::GemmOp,
        &attention::AttentionOp,
        &paged_attention::PagedAttentionOp,
        &varlen_attention::VarlenAttentionOp,
        const { &RowOpSpec::<softmax::Softmax>::new() },
        const { &RowOpSpec::<layer_norm::LayerNorm>::new() },
        const { &RowOpSpec::<rms_norm::RmsNorm>::new() },
        const { &RowOpSpec::<rms_norm::RmsNormResidual>::new() },
        const { &RowOpSpec::<rope::RopeDesc<false>>::new() },
        const { &RowOpSpec::<rope::RopeDesc<true>>::new() },
        const { &RowOpSpec::<silu::Silu>::new() },
        const { &RowOpSpec::<gelu::Gelu>::new() },
        const { &RowOpSpec::<swiglu::SwiGlu>::new() },
        const { &RowOpSpec::<add::Add>::new() },
        &embedding::EmbeddingOp,
        &qmatmul::QMatmulOp,
        &qmatmul::QMatmulI8Op,
        &qmatmul::QMatmulFp8Op,
        const { &RowOpSpec::<argmax::Argmax>::new() },
    ]
}

/// The registered op with this name.
pub fn find(name: &str) -> Option<&'static dyn OpSpec> {
    all().into_iter().find(|o| o.name() == name)
}
