//! Times the CUDA kernels on the issue's benchmark shapes and prints one JSON object per
//! line (kernel, shape, median ms over repeated launches, achieved TFLOP/s or GB/s).
//! `scripts/gpu-check.sh` runs it beside the PyTorch peers in the same session.

use half::bf16;
use std::time::Instant;
use tessera_core::device::{Device as _, DeviceCall, DeviceMatrix};
use tessera_core::DType;
use tessera_cuda::ops::{self, AttentionShape, GemmShape, PagedShape};
use tessera_cuda::{CudaBackend, CudaError, Device};

fn core_err(e: tessera_core::Error) -> CudaError {
    CudaError::NotAvailable(e.to_string())
}

/// Median seconds of `run` over `reps` timed launches after 3 warm-ups.
fn time(
    dev: &Device,
    reps: usize,
    mut run: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    for _ in 0..3 {
        run()?;
    }
    dev.synchronize()?;
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            run().and_then(|()| dev.synchronize())?;
            Ok(start.elapsed().as_secs_f64())
        })
        .collect::<Result<_, CudaError>>()?;
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn filled(n: usize, seed: u32) -> Vec<bf16> {
    (0..n)
        .map(|i| {
            bf16::from_f32(
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32
                    / (1u32 << 24) as f32
                    - 0.5,
            )
        })
        .collect()
}

fn main() -> Result<(), CudaError> {
    let dev = Device::new(0)?;
    eprintln!("{} ({})", dev.name(), dev.arch());
    // GEMM 4096³ bf16.
    let n = 4096;
    let (a, b) = (
        dev.upload(&filled(n * n, 1))?,
        dev.upload(&filled(n * n, 2))?,
    );
    let mut c = dev.zeros::<f32>(n * n)?;
    let s = GemmShape {
        m: n,
        n,
        k: n,
        alpha: 1.0,
    };
    let t = time(&dev, 20, || ops::gemm(&dev, &a, &b, &mut c, s))?;
    println!(
        r#"{{"kernel":"gemm_bf16","shape":"4096x4096x4096","ms":{:.4},"tflops":{:.1}}}"#,
        t * 1e3,
        2.0 * (n as f64).powi(3) / t / 1e12
    );
    drop((a, b, c));
    // Attention forward: seq 4096, 32 heads, d 128, causal, bf16.
    let (seq, heads, d) = (4096, 32, 128);
    let s = AttentionShape {
        batch: 1,
        sq: seq,
        sk: seq,
        heads,
        kv_heads: heads,
        d,
        causal: true,
        scale: 1.0 / (d as f32).sqrt(),
    };
    let q = dev.upload(&filled(seq * heads * d, 3))?;
    let k = dev.upload(&filled(seq * heads * d, 4))?;
    let v = dev.upload(&filled(seq * heads * d, 5))?;
    let mut o = dev.zeros::<bf16>(seq * heads * d)?;
    let t = time(&dev, 20, || {
        ops::flash_attention(&dev, &q, &k, &v, &mut o, s)
    })?;
    // Causal: half of the 4·seq²·d·heads FLOPs (the convention FlashAttention reports).
    let flops = 2.0 * (seq * seq * d * heads) as f64;
    println!(
        r#"{{"kernel":"flash_attention_bf16","shape":"1x4096x32x128 causal","ms":{:.4},"tflops":{:.1}}}"#,
        t * 1e3,
        flops / t / 1e12
    );
    drop((q, k, v, o));
    // Paged decode: 32 sequences × 4096 tokens, 32 heads over 8 KV heads, d 128.
    let (seqs, len, heads, kv_heads, block_size) = (32, 4096, 32, 8, 16);
    let blocks_per = len / block_size;
    let num_blocks = seqs * blocks_per;
    let cache = num_blocks * block_size * kv_heads * d;
    let (kc, vc) = (
        dev.upload(&filled(cache, 6))?,
        dev.upload(&filled(cache, 7))?,
    );
    let tables: Vec<u32> = (0..num_blocks as u32).collect();
    let lens = vec![len; seqs];
    let q = dev.upload(&vec![0.01f32; seqs * heads * d])?;
    let mut out = dev.zeros::<f32>(seqs * heads * d)?;
    let s = PagedShape {
        heads,
        kv_heads,
        d,
        block_size,
        num_blocks,
        scale: 0.088,
        chunk: 0,
    };
    let t = time(&dev, 20, || {
        ops::paged_attention(&dev, &q, &kc, &vc, &tables, &lens, &mut out, s)
    })?;
    let bytes = 2.0 * cache as f64 * 2.0;
    println!(
        r#"{{"kernel":"paged_attention","shape":"32x4096 tokens, 32/8 heads, d128","ms":{:.4},"gbs":{:.0}}}"#,
        t * 1e3,
        bytes / t / 1e9
    );
    drop((kc, vc, q, out));
    // Quantized matmul through the backend (weights split on upload, as the registry
    // and engine run it): one activation row (decode) and 16 (a batched step), on a
    // 4096×4096 and a 16384×4096 matrix (the latter for the bandwidth figure). Bytes
    // are the GGUF blocks' (codes and f16 scales) plus x and y.
    let backend = CudaBackend::new(0)?;
    // The default model's decode shapes come first: its LM head (49152×576), MLP
    // up (1536×576) and down (576×1536).
    for (rows, cols) in [
        (49152, 576),
        (1536, 576),
        (576, 1536),
        (4096, 4096),
        (16384, 4096),
    ] {
        let x = dev.upload(&vec![0.5f32; cols])?;
        let mut y = dev.zeros::<f32>(rows)?;
        for f in [DType::Q4_0, DType::Q4_1, DType::Q8_0] {
            let bytes = rows * cols / 32 * f.size_bytes();
            let raw: Vec<u8> = (0..bytes).map(|i| (i * 7 + 3) as u8).collect();
            let w = backend
                .upload_blocks(f, rows, cols, &raw)
                .map_err(core_err)?;
            for m in [1usize, 16] {
                let xs = backend.upload(&vec![0.5f32; m * cols]).map_err(core_err)?;
                let ys = backend.upload(&vec![0.0f32; m * rows]).map_err(core_err)?;
                let call = DeviceCall::QMatmul {
                    w: &w,
                    x: DeviceMatrix {
                        buf: &xs,
                        offset: 0,
                        strides: [0, cols, 1],
                    },
                    y: DeviceMatrix {
                        buf: &ys,
                        offset: 0,
                        strides: [0, rows, 1],
                    },
                    m,
                };
                // 20 launches queued per timed run: the kernel's time, not a launch's
                // round trip to the host.
                let t = time(&dev, 20, || {
                    (0..20).try_for_each(|_| backend.enqueue(&call).map_err(core_err))
                })? / 20.0;
                let moved = bytes + 4 * m * (rows + cols);
                println!(
                    r#"{{"kernel":"qmatmul_{}_m{m}","shape":"{rows}x{cols}","ms":{:.4},"gbs":{:.0}}}"#,
                    f.to_string().to_lowercase(),
                    t * 1e3,
                    moved as f64 / t / 1e9
                );
            }
        }
        let w = dev.upload(&vec![3i8; rows * cols])?;
        let sc = dev.upload(&vec![0.01f32; rows])?;
        let t = time(&dev, 20, || {
            (0..20).try_for_each(|_| ops::qmatvec_i8(&dev, &w, &sc, &x, &mut y, (rows, cols)))
        })? / 20.0;
        println!(
            r#"{{"kernel":"qmatvec_i8","shape":"{rows}x{cols}","ms":{:.4},"gbs":{:.0}}}"#,
            t * 1e3,
            (rows * cols) as f64 / t / 1e9
        );
    }
    Ok(())
}
