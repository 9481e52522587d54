//! The CUDA kernels the registry does not reach (its ops are f32): the bf16 tensor-core
//! GEMM at every ragged shape, bf16 flash attention, decode attention over a bf16 paged
//! cache and the INT8 matvec, each against a float64 reference computed here from the
//! very inputs the kernel sees (bf16-rounded where it takes bf16). Outputs are poisoned
//! with NaN before each launch. The registry's ops run in `tests/registry.rs`. Without
//! a GPU every test says it was skipped and why, and passes.

use half::bf16;
use rand::{rngs::StdRng, Rng, SeedableRng};
use tessera_cuda::ops::{self, AttentionShape, GemmShape, PagedShape};
use tessera_cuda::Device;

/// f32 accumulation of products that are exact in f32 (bf16·bf16), relative to ‖ref‖.
const TOL_GEMM: f64 = 1e-5;
/// bf16 output and P rounded to bf16 before P·V: ~2⁻⁹ relative per term.
const TOL_ATTENTION: f64 = 1e-2;
/// f32 accumulation with the fast `__expf` (2 ulp): well under 1e-4.
const TOL_F32: f64 = 1e-4;

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

fn rel(out: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len());
    assert!(
        out.iter().all(|v| v.is_finite()),
        "non-finite (unwritten?) output"
    );
    let num: f64 = out
        .iter()
        .zip(reference)
        .map(|(a, b)| (a - b).powi(2))
        .sum();
    let den: f64 = reference.iter().map(|b| b * b).sum();
    (num / den.max(1e-300)).sqrt()
}

fn randn(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

fn widen(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

#[test]
fn gemm_bf16_ragged_shapes() {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(1);
    for (m, n, k) in [(1, 7, 8), (33, 127, 40), (130, 257, 72), (256, 256, 512)] {
        let a = to_bf16(&randn(&mut rng, m * k));
        let b = to_bf16(&randn(&mut rng, n * k));
        let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
        let mut dc = dev.upload(&vec![f32::NAN; m * n]).unwrap();
        let s = GemmShape {
            m,
            n,
            k,
            alpha: 0.5,
        };
        ops::gemm(&dev, &da, &db, &mut dc, s).unwrap();
        let c = dev.download(&dc).unwrap();
        let (a, b) = (widen(&a), widen(&b));
        let reference: Vec<f64> = (0..m * n)
            .map(|i| {
                0.5 * (0..k)
                    .map(|p| a[i / n * k + p] * b[i % n * k + p])
                    .sum::<f64>()
            })
            .collect();
        let e = rel(&f64s(&c), &reference);
        assert!(e < TOL_GEMM, "{m}×{n}×{k}: {e:.2e}");
    }
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

/// Float64 attention over bf16-valued inputs, layouts as the kernel's.
fn attention_reference(q: &[f64], k: &[f64], v: &[f64], s: AttentionShape) -> Vec<f64> {
    let (d, group) = (s.d, s.heads / s.kv_heads);
    let mut out = vec![0f64; s.batch * s.sq * s.heads * d];
    for b in 0..s.batch {
        for h in 0..s.heads {
            for i in 0..s.sq {
                let qi = &q[((b * s.sq + i) * s.heads + h) * d..][..d];
                let visible = if s.causal {
                    (i + s.sk - s.sq + 1).min(s.sk)
                } else {
                    s.sk
                };
                let kv = |t: usize| ((b * s.sk + t) * s.kv_heads + h / group) * d;
                let scores: Vec<f64> = (0..visible)
                    .map(|t| s.scale as f64 * (0..d).map(|c| qi[c] * k[kv(t) + c]).sum::<f64>())
                    .collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = w.iter().sum();
                let o = &mut out[((b * s.sq + i) * s.heads + h) * d..][..d];
                for (t, wt) in w.iter().enumerate() {
                    for c in 0..d {
                        o[c] += wt / z * v[kv(t) + c];
                    }
                }
            }
        }
    }
    out
}

#[test]
fn flash_attention_causal_gqa_both_head_dims() {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(2);
    for (batch, sq, sk, heads, kv_heads, d, causal) in [
        (1, 1, 1, 1, 1, 64, false),
        (2, 33, 33, 4, 2, 64, true),
        (1, 7, 130, 8, 1, 128, true),
        (1, 127, 127, 2, 2, 128, false),
    ] {
        let s = AttentionShape {
            batch,
            sq,
            sk,
            heads,
            kv_heads,
            d,
            causal,
            scale: 1.0 / (d as f32).sqrt(),
        };
        let q = to_bf16(&randn(&mut rng, batch * sq * heads * d));
        let k = to_bf16(&randn(&mut rng, batch * sk * kv_heads * d));
        let v = to_bf16(&randn(&mut rng, batch * sk * kv_heads * d));
        let (dq, dk, dv) = (
            dev.upload(&q).unwrap(),
            dev.upload(&k).unwrap(),
            dev.upload(&v).unwrap(),
        );
        let mut dout = dev.upload(&vec![bf16::NAN; q.len()]).unwrap();
        ops::flash_attention(&dev, &dq, &dk, &dv, &mut dout, s).unwrap();
        let out = widen(&dev.download(&dout).unwrap());
        let reference = attention_reference(&widen(&q), &widen(&k), &widen(&v), s);
        let e = rel(&out, &reference);
        assert!(e < TOL_ATTENTION, "{s:?}: {e:.2e}");
    }
}

#[test]
fn paged_attention_matches_dense_reference() {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(3);
    let (heads, kv_heads, d, block_size, num_blocks) = (8, 2, 128, 16, 64);
    let lens = [1usize, 17, 300, 129];
    let max_blocks = 300usize.div_ceil(block_size);
    // Each sequence gets distinct, shuffled blocks.
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.random_range(0..=i));
    }
    let mut tables = vec![0u32; lens.len() * max_blocks];
    let mut next = 0;
    for (s, &len) in lens.iter().enumerate() {
        for j in 0..len.div_ceil(block_size) {
            tables[s * max_blocks + j] = ids[next];
            next += 1;
        }
    }
    let cache = num_blocks * block_size * kv_heads * d;
    let (kc, vc) = (
        to_bf16(&randn(&mut rng, cache)),
        to_bf16(&randn(&mut rng, cache)),
    );
    let q = randn(&mut rng, lens.len() * heads * d);
    let scale = 1.0 / (d as f32).sqrt();
    let s = PagedShape {
        heads,
        kv_heads,
        d,
        block_size,
        num_blocks,
        scale,
        chunk: 64,
    };
    let (dq, dk, dv) = (
        dev.upload(&q).unwrap(),
        dev.upload(&kc).unwrap(),
        dev.upload(&vc).unwrap(),
    );
    let mut dout = dev.upload(&vec![f32::NAN; q.len()]).unwrap();
    ops::paged_attention(&dev, &dq, &dk, &dv, &tables, &lens, &mut dout, s).unwrap();
    let out = f64s(&dev.download(&dout).unwrap());
    let (kc, vc) = (widen(&kc), widen(&vc));
    let mut reference = vec![0f64; q.len()];
    for (seq, &len) in lens.iter().enumerate() {
        for h in 0..heads {
            let qh = &q[(seq * heads + h) * d..][..d];
            let row = |t: usize| {
                let blk = tables[seq * max_blocks + t / block_size] as usize;
                ((blk * block_size + t % block_size) * kv_heads + h / (heads / kv_heads)) * d
            };
            let sc: Vec<f64> = (0..len)
                .map(|t| scale as f64 * (0..d).map(|c| qh[c] as f64 * kc[row(t) + c]).sum::<f64>())
                .collect();
            let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = sc.iter().map(|x| (x - mx).exp()).sum();
            for (t, x) in sc.iter().enumerate() {
                for c in 0..d {
                    reference[(seq * heads + h) * d + c] += (x - mx).exp() / z * vc[row(t) + c];
                }
            }
        }
    }
    let e = rel(&out, &reference);
    assert!(e < TOL_F32, "{e:.2e}");
    let mut bad = tables.clone();
    bad[0] = num_blocks as u32;
    assert!(ops::paged_attention(&dev, &dq, &dk, &dv, &bad, &lens, &mut dout, s).is_err());
}

#[test]
fn qmatvec_int8() {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(4);
    for (n, k) in [(1, 32), (7, 64), (127, 576), (33, 1536)] {
        let x = randn(&mut rng, k);
        let dx = dev.upload(&x).unwrap();
        let check = |w: &[f64], y: &[f32], what: &str| {
            let reference: Vec<f64> = (0..n)
                .map(|r| (0..k).map(|c| w[r * k + c] * x[c] as f64).sum())
                .collect();
            let e = rel(&f64s(y), &reference);
            assert!(e < TOL_F32, "{what} {n}×{k}: {e:.2e}");
        };
        let q: Vec<i8> = (0..n * k).map(|_| rng.random_range(-127i8..=127)).collect();
        let scales: Vec<f32> = (0..n).map(|_| rng.random_range(0.001f32..0.01)).collect();
        let vals: Vec<f64> = (0..n * k)
            .map(|i| q[i] as f64 * scales[i / k] as f64)
            .collect();
        let mut dy = dev.upload(&vec![f32::NAN; n]).unwrap();
        let (dw, ds) = (dev.upload(&q).unwrap(), dev.upload(&scales).unwrap());
        ops::qmatvec_i8(&dev, &dw, &ds, &dx, &mut dy, (n, k)).unwrap();
        check(&vals, &dev.download(&dy).unwrap(), "int8");
    }
}
