//! The CUDA kernels through the registry: the same problems (ragged, strided, batched),
//! float64 references, tolerances, NaN poisoning and NaN propagation as the CPU and
//! wgpu variants. Without a GPU (or without NVRTC) the test says so and passes.

use std::sync::Arc;
use tessera_core::device::{self, Device};
use tessera_cuda::CudaBackend;
use tessera_kernels::registry::{verify, Backend};

fn device() -> Option<Arc<CudaBackend>> {
    match CudaBackend::new(0) {
        Ok(d) => Some(Arc::new(d)),
        Err(e) => {
            // Written to stderr directly: libtest captures eprintln! of passing tests.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "CUDA registry tests SKIPPED: {e}");
            None
        }
    }
}

#[test]
fn every_cuda_kernel_matches_float64() {
    let Some(dev) = device() else { return };
    eprintln!("CUDA device: {}", dev.name());
    device::install(dev.clone());
    let check = verify::verify_backend(Backend::Cuda, 0x9e0);
    check.assert_complete("cuda", 40);
    // The second attention kernel (bf16 queries and outputs) is a variant of its own.
    assert!(check.ran("attention", "cuda-flash"), "{:?}", check.groups);
}

#[test]
fn rows_write_at_their_offset() {
    let Some(dev) = device() else { return };
    verify::assert_row_offsets(&*dev);
}

#[test]
fn bad_calls_are_errors() {
    let Some(dev) = device() else { return };
    let x = dev.upload(&[1.0; 8]).unwrap();
    let out = dev.upload(&[0.0; 4]).unwrap();
    let call = device::DeviceCall::Rows {
        op: device::RowOp::Softmax,
        inputs: &[&x],
        gamma: None,
        out: &out,
        out_offset: 0,
        rows: 2,
        n: 4,
    };
    let err = dev.run(&call).unwrap_err().to_string();
    assert!(err.contains("out holds 4 elements"), "{err}");
    let table = dev.upload(&[0.0; 12]).unwrap();
    let out = dev.upload(&[0.0; 8]).unwrap();
    let call = device::DeviceCall::Embedding {
        table: device::DeviceMatrix {
            buf: &table,
            offset: 0,
            strides: [12, 4, 1],
        },
        vocab: 3,
        dim: 4,
        ids: &[0, 3],
        out: &out,
    };
    let err = dev.run(&call).unwrap_err().to_string();
    assert!(err.contains("token id 3"), "{err}");
    let err = dev
        .upload_blocks(tessera_core::DType::Q4_0, 2, 48, &[0; 36])
        .unwrap_err()
        .to_string();
    assert!(err.contains("not whole 32-weight blocks"), "{err}");
    let err = dev
        .upload_blocks(tessera_core::DType::I8, 2, 8, &[0; 20])
        .unwrap_err()
        .to_string();
    assert!(err.contains("20 bytes for 2x8 INT8 codes"), "{err}");
}

/// The flash call takes one 16-bit type for all four buffers and the head widths its
/// kernel is built for; anything else is an error before any launch.
#[test]
fn bad_flash_calls_are_errors() {
    use tessera_core::DType;
    let Some(dev) = device() else { return };
    let half = |n: usize, t: DType| dev.upload_half(t, &vec![0u16; n]).unwrap();
    let shape = |d: usize| device::FlashShape {
        q_len: 2,
        kv_len: 2,
        heads: 1,
        kv_heads: 1,
        d,
        scale: 1.0,
        causal: true,
    };
    let run = |bufs: [&device::DeviceBuffer; 4], d: usize| {
        let [q, k, v, out] = bufs;
        let call = device::FlashCall {
            q,
            k,
            v,
            out,
            shape: shape(d),
        };
        dev.run(&device::DeviceCall::FlashAttention(call))
            .unwrap_err()
            .to_string()
    };
    let (b64, b32) = (half(128, DType::BF16), half(64, DType::BF16));
    let err = run([&b32, &b32, &b32, &b32], 32);
    assert!(err.contains("head dim 32"), "{err}");
    let f16 = half(128, DType::F16);
    let err = run([&b64, &b64, &b64, &f16], 64);
    assert!(err.contains("one 16-bit type"), "{err}");
    let short = half(64, DType::BF16);
    let err = run([&b64, &short, &b64, &b64], 64);
    assert!(err.contains("K holds 64 elements"), "{err}");
    let causal_past_keys = device::FlashCall {
        q: &b64,
        k: &b32,
        v: &b32,
        out: &b64,
        shape: device::FlashShape {
            kv_len: 1,
            ..shape(64)
        },
    };
    let err = dev
        .run(&device::DeviceCall::FlashAttention(causal_past_keys))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("causal with 2 query rows over 1 keys"),
        "{err}"
    );
    let f32_out = dev.upload(&[0.0; 128]).unwrap();
    let err = run([&b64, &b64, &b64, &f32_out], 64);
    assert!(err.contains("buffer is not"), "{err}");
}
