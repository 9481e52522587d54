//! The raw launchers `gpu_bench` times against cuBLAS and torch (`tessera_cuda::ops`),
//! beside the registry: what they refuse. Their results are verified through the
//! registry (`tests/registry.rs`), where every CUDA kernel — the tensor-core GEMM, the
//! 16-bit flash attention (`cuda-flash`), paged decode attention, the block-format and
//! INT8 matmuls — runs the shared problems against float64. Without a GPU every test
//! says it was skipped and why, and passes.

use half::bf16;
use tessera_cuda::ops::{self, AttentionShape, GemmShape};
use tessera_cuda::Device;

fn device() -> Option<Device> {
    match Device::new(0) {
        Ok(d) => {
            eprintln!("CUDA device: {} ({})", d.name(), d.arch());
            Some(d)
        }
        Err(e) => {
            // Written to stderr directly: libtest captures eprintln! of passing tests,
            // and a skip must be visible in every run.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "CUDA device tests SKIPPED: {e}");
            None
        }
    }
}

/// The raw launcher `gpu_bench` times against cuBLAS refuses what its kernel cannot
/// take (its results are verified through the registry's GEMM).
#[test]
fn gemm_launcher_rejects_bad_shapes() {
    let Some(dev) = device() else { return };
    let (a, b) = (
        dev.upload(&[bf16::ONE; 8]).unwrap(),
        dev.upload(&[bf16::ONE; 8]).unwrap(),
    );
    let mut c = dev.zeros::<f32>(1).unwrap();
    let odd_k = GemmShape {
        m: 1,
        n: 1,
        k: 7,
        alpha: 1.0,
    };
    assert!(ops::gemm(&dev, &a, &b, &mut c, odd_k).is_err());
    let too_big = GemmShape {
        m: 2,
        n: 1,
        k: 8,
        alpha: 1.0,
    };
    assert!(ops::gemm(&dev, &a, &b, &mut c, too_big).is_err());
}

/// The flash launcher refuses head widths it has no kernel for and short buffers.
#[test]
fn flash_launcher_rejects_bad_shapes() {
    let Some(dev) = device() else { return };
    let buf = |n: usize| dev.upload(&vec![bf16::ZERO; n]).unwrap();
    let (q, k, v) = (buf(96), buf(96), buf(96));
    let mut o = buf(96);
    let shape = AttentionShape {
        batch: 1,
        sq: 3,
        sk: 3,
        heads: 1,
        kv_heads: 1,
        d: 32,
        causal: true,
        scale: 1.0,
    };
    let err = ops::flash_attention(&dev, &q, &k, &v, &mut o, shape).unwrap_err();
    assert!(err.to_string().contains("head dim 32"), "{err}");
    let d64 = AttentionShape { d: 64, ..shape };
    let err = ops::flash_attention(&dev, &q, &k, &v, &mut o, d64).unwrap_err();
    assert!(err.to_string().contains("holds 96 elements"), "{err}");
}
