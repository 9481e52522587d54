//! The one CUDA kernel no registry call reaches, against a float64 reference computed
//! here from the very inputs the kernel sees: bf16 flash attention, which takes bf16
//! queries and writes bf16 outputs where a device attention call carries f32 (the
//! registry's bf16 attention runs the paged kernel over a bf16 cache instead). Outputs
//! are poisoned with NaN before each launch. Everything else — the tensor-core GEMM
//! (the registry's `x·Wᵀ` problems), decode attention over bf16/f16 paged caches, the
//! block-format and INT8 matmuls — runs through the registry in `tests/registry.rs`,
//! with its references and tolerances. Without a GPU every test says it was skipped and
//! why, and passes.

use half::bf16;
use rand::{rngs::StdRng, Rng, SeedableRng};
use tessera_cuda::ops::{self, AttentionShape, GemmShape};
use tessera_cuda::Device;

/// bf16 output and P rounded to bf16 before P·V: ~2⁻⁹ relative per term.
const TOL_ATTENTION: f64 = 1e-2;

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
