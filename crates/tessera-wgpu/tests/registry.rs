//! The wgpu kernels through the registry: the same problems (ragged, strided, batched),
//! float64 references, tolerances, NaN poisoning and NaN propagation as the CPU
//! variants. Without any adapter the test says so and passes, unless
//! `TESSERA_REQUIRE_WGPU=1` (CI, which installs Mesa's lavapipe) makes that a failure.

use std::sync::Arc;
use tessera_core::device::{self, Device};
use tessera_core::DType;
use tessera_kernels::registry::{verify, Backend};
use tessera_wgpu::WgpuDevice;

fn device() -> Option<Arc<WgpuDevice>> {
    match WgpuDevice::new() {
        Ok(d) => Some(Arc::new(d)),
        Err(e) if std::env::var("TESSERA_REQUIRE_WGPU").as_deref() == Ok("1") => {
            panic!("TESSERA_REQUIRE_WGPU=1 but no adapter: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no wgpu adapter on this machine ({e})");
            None
        }
    }
}

#[test]
fn every_wgpu_kernel_matches_float64() {
    let Some(dev) = device() else { return };
    eprintln!("adapter: {}", dev.name());
    device::install(dev.clone());
    verify::verify_backend(Backend::Wgpu, 0x9e0).assert_complete("wgpu", 40);
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
    // RoPE: 3 rows are not whole tokens of 2 heads; a table short of 2 tokens × 4.
    let (table, rotated, xs) = (
        dev.upload(&[0.5; 4]).unwrap(),
        dev.upload(&[0.0; 8]).unwrap(),
        [&x],
    );
    let rope = |rows, heads| device::DeviceCall::Rows {
        op: device::RowOp::Rope {
            heads,
            half_split: false,
        },
        inputs: &xs,
        gamma: Some(&table),
        out: &rotated,
        out_offset: 0,
        rows,
        n: 2,
    };
    let err = dev.run(&rope(3, 2)).unwrap_err().to_string();
    assert!(err.contains("not whole tokens"), "{err}");
    let err = dev.run(&rope(4, 1)).unwrap_err().to_string();
    assert!(err.contains("cos/sin table holds 4 elements"), "{err}");
    // Paged attention: a cache of 2 blocks × 2 positions × 1 KV head × 2 wide.
    let (cache, q, o) = (
        dev.upload(&[0.0; 8]).unwrap(),
        dev.upload(&[0.0; 2]).unwrap(),
        dev.upload(&[0.0; 2]).unwrap(),
    );
    let paged_rows = |tables: &[u32], lens: &[usize], q_lens: &[usize], d| {
        let call = device::DeviceCall::PagedAttention(device::PagedCall {
            q: &q,
            k: &cache,
            v: &cache,
            out: &o,
            shape: device::PagedShape {
                block_tables: tables,
                max_blocks: 2,
                context_lens: lens,
                q_lens,
                heads: 1,
                kv_heads: 1,
                d,
                block_size: 2,
                scale: 1.0,
                causal: true,
                window: None,
            },
        });
        dev.run(&call).map_err(|e| e.to_string())
    };
    let paged = |tables: &[u32], lens: &[usize], d| paged_rows(tables, lens, &[1], d);
    paged(&[1, 0], &[4], 2).expect("a valid call");
    let err = paged(&[1, 2], &[4], 2).unwrap_err();
    assert!(err.contains("block id 2 ≥ 2 blocks"), "{err}");
    let err = paged(&[1, 0], &[5], 2).unwrap_err();
    assert!(err.contains("does not fit 1..=4"), "{err}");
    let err = paged(&[1, 0], &[0], 2).unwrap_err();
    assert!(err.contains("over a context of 0"), "{err}");
    let err = paged_rows(&[1, 0], &[1], &[2], 2).unwrap_err();
    assert!(err.contains("2 query rows over a context of 1"), "{err}");
    let err = paged_rows(&[1, 0], &[4], &[1, 1], 2).unwrap_err();
    assert!(err.contains("1 context lengths but 2 query runs"), "{err}");
    let err = paged(&[1, 0], &[4], 300).unwrap_err();
    assert!(err.contains("width 300"), "{err}");
    // No 16-bit flash kernel here (nor a claim to one): a clear refusal.
    assert!(!dev.supports(device::FLASH_ATTENTION_OP, tessera_core::DType::BF16));
    let flash = device::DeviceCall::FlashAttention(device::FlashCall {
        q: &q,
        k: &cache,
        v: &cache,
        out: &o,
        shape: device::FlashShape {
            q_len: 1,
            kv_len: 4,
            heads: 1,
            kv_heads: 1,
            d: 2,
            scale: 1.0,
            causal: true,
        },
    });
    let err = dev.run(&flash).unwrap_err().to_string();
    assert!(err.contains("no 16-bit flash attention kernel"), "{err}");
    // Embedding: an id past the vocabulary, a table view past its buffer.
    let table = |strides| device::DeviceMatrix {
        buf: &cache,
        offset: 0,
        strides,
    };
    let gather = |ids: &[u32], strides| {
        let call = device::DeviceCall::Embedding {
            table: table(strides),
            vocab: 4,
            dim: 2,
            ids,
            out: &rotated,
        };
        dev.run(&call).map_err(|e| e.to_string())
    };
    gather(&[3, 0, 1], [0, 2, 1]).expect("a valid gather");
    let err = gather(&[3, 4], [0, 2, 1]).unwrap_err();
    assert!(err.contains("token id 4 at position 1"), "{err}");
    let err = gather(&[0], [0, 3, 1]).unwrap_err();
    assert!(err.contains("reaches element 11"), "{err}");
    // Half storage: only f16/bf16, and only where a call reads it (GEMM operands).
    let err = dev.upload_half(DType::F32, &[0; 4]).unwrap_err();
    assert!(err.to_string().contains("dtype"), "{err}");
    let half = dev.upload_half(DType::F16, &[0; 8]).unwrap();
    let call = device::DeviceCall::Rows {
        op: device::RowOp::Softmax,
        inputs: &[&half],
        gamma: None,
        out: &rotated,
        out_offset: 0,
        rows: 2,
        n: 4,
    };
    let err = dev.run(&call).unwrap_err().to_string();
    assert!(err.contains("another element type"), "{err}");
    let err = dev.upload_blocks(DType::Q4_0, 2, 32, &[0; 10]).unwrap_err();
    assert!(err.to_string().contains("bytes for 2"), "{err}");
    let err = dev
        .upload_blocks(DType::Q5_K, 1, 256, &[0; 176])
        .unwrap_err();
    assert!(err.to_string().contains("dtype"), "{err}");
}
