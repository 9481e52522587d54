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
    verify::verify_backend(Backend::Cuda, 0x9e0).assert_complete("cuda", 40);
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
