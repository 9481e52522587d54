//! Every registered op, every dtype, every ISA variant this machine runs, checked against
//! its float64 reference on fresh random ragged problems (one harness for all; see
//! `registry::verify`).

use tessera_kernels::registry::verify::assert_op_verified;

macro_rules! verify_ops {
    ($($test:ident => $op:literal),* $(,)?) => {
        $(#[test] fn $test() {
            let op = tessera_kernels::ops::find($op).expect(concat!("op '", $op, "' is registered"));
            assert_op_verified(op);
        })*

        #[test]
        fn every_registered_op_has_a_test() {
            let tested = [$($op),*];
            for op in tessera_kernels::ops::all() {
                assert!(tested.contains(&op.name()), "op '{}' has no verify test", op.name());
            }
        }
    };
}

verify_ops! {
    gemm => "gemm",
    attention => "attention",
    paged_attention => "paged_attention",
    varlen_attention => "varlen_attention",
    softmax => "softmax",
    layer_norm => "layer_norm",
    rms_norm => "rms_norm",
    rms_norm_residual => "rms_norm_residual",
    rope => "rope",
    rope_neox => "rope_neox",
    silu => "silu",
    gelu => "gelu",
    swiglu => "swiglu",
    add => "add",
    embedding => "embedding",
    argmax => "argmax",
    qmatmul => "qmatmul",
    qmatmul_i8 => "qmatmul_i8",
    qmatmul_fp8 => "qmatmul_fp8",
}
