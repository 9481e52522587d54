//! A small random Llama written to GGUF by the test: the engine's logits against the
//! independent float64 forward (prefill through both qmatmul regimes, then decode), and
//! the reader against truncated and corrupted copies of the file.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use tessera_core::DType;
use tessera_engine::gguf::{Gguf, Value};
use tessera_engine::kv_cache::KvCache;
use tessera_engine::llama::Llama;

const VOCAB: usize = 96;
const DIM: usize = 64;
const FFN: usize = 96;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const LAYERS: usize = 2;

/// The formats of a test model's matrices: a mix, as real files have.
struct Formats {
    dim: usize,
    ffn: usize,
    embd: DType,
    /// q, k, v, o, gate, up, down.
    layer: [DType; 7],
    output: DType,
}

const MIXED_32: Formats = Formats {
    dim: DIM,
    ffn: FFN,
    embd: DType::Q8_0,
    layer: [
        DType::Q4_1,
        DType::Q4_0,
        DType::Q8_0,
        DType::F32,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_1,
    ],
    output: DType::Q4_0,
};

/// Every K-quant, on rows of 256 and 512 weights (K-quants need whole super-blocks).
const MIXED_K: Formats = Formats {
    dim: 256,
    ffn: 512,
    embd: DType::Q6_K,
    layer: [
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q2_K,
        DType::Q5_K,
    ],
    output: DType::Q6_K,
};

fn model_bytes(tied: bool) -> Vec<u8> {
    model_bytes_with(tied, &MIXED_32)
}

fn model_bytes_with(tied: bool, f: &Formats) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut mat = |name: String, rows: usize, cols: usize, dtype: DType, scale: f32| {
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-scale..scale))
            .collect();
        RawTensor {
            name,
            dims: if rows == 1 {
                vec![cols]
            } else {
                vec![cols, rows]
            },
            dtype,
            bytes: encode(dtype, rows, cols, &w),
        }
    };
    let (dim, ffn) = (f.dim, f.ffn);
    let kv = dim / HEADS * KV_HEADS;
    let mut t = vec![mat("token_embd.weight".into(), VOCAB, dim, f.embd, 1.0)];
    for l in 0..LAYERS {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let [q, k, v, o, gate, up, down] = f.layer;
        t.push(mat(n("attn_norm"), 1, dim, DType::F32, 1.0));
        t.push(mat(n("attn_q"), dim, dim, q, 0.3));
        t.push(mat(n("attn_k"), kv, dim, k, 0.3));
        t.push(mat(n("attn_v"), kv, dim, v, 0.3));
        t.push(mat(n("attn_output"), dim, dim, o, 0.2));
        t.push(mat(n("ffn_norm"), 1, dim, DType::F32, 1.0));
        t.push(mat(n("ffn_gate"), ffn, dim, gate, 0.3));
        t.push(mat(n("ffn_up"), ffn, dim, up, 0.3));
        t.push(mat(n("ffn_down"), dim, ffn, down, 0.2));
    }
    t.push(mat("output_norm.weight".into(), 1, dim, DType::F32, 1.0));
    if !tied {
        t.push(mat("output.weight".into(), VOCAB, dim, f.output, 0.5));
    }
    let shape = ModelShape {
        layers: LAYERS,
        dim,
        ffn,
        heads: HEADS,
        kv_heads: KV_HEADS,
    };
    gguf_bytes_owned(&llama_metadata("llama", &shape), &t)
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tessera-{}-{name}", std::process::id()))
}

/// The engine computes in f32 from the same quantized weights: measured ~3e-7 relative
/// through these two layers; 1e-5 is the per-kernel tolerance scale and catches any real
/// mistake (a wrong RoPE pair or KV head moves logits by tens of percent).
const LOGIT_TOL: f64 = 1e-5;

#[test]
fn logits_match_float64_reference() {
    check_against_reference(&MIXED_32, "32");
}

/// q/k/v in one format and gate/up in another, so each group stacks into one matmul.
const STACKED_32: Formats = Formats {
    layer: [
        DType::Q4_0,
        DType::Q4_0,
        DType::Q4_0,
        DType::F32,
        DType::Q4_1,
        DType::Q4_1,
        DType::Q8_0,
    ],
    ..MIXED_32
};

#[test]
fn stacked_projections_match_float64_reference() {
    check_against_reference(&STACKED_32, "stacked");
    let stacked = |formats: &Formats| {
        let path = temp("stacked-count.gguf");
        write(&path, &model_bytes_with(false, formats));
        let model = Llama::load(&Gguf::open(&path).expect("valid file")).expect("loads");
        let _ = std::fs::remove_file(&path);
        (model.stacked_projections(), model.cfg.n_layers)
    };
    let (groups, layers) = stacked(&STACKED_32);
    assert_eq!(groups, 2 * layers);
    assert_eq!(stacked(&MIXED_32).0, 0);
}

/// `LoadOptions::large_pages` places that load's packed weights in 2 MiB-page chunks and
/// nothing more: the loading thread's choice is back to heap memory afterwards, a load
/// without it packs onto the heap, and both compute the float64 reference's logits (and
/// the same ones: the same kernels run on the same values, only their addresses differ).
#[test]
fn large_pages_place_one_load_and_change_no_logit() {
    use tessera_engine::linear::Activations;
    use tessera_engine::weights::LoadOptions;
    let path = temp("large-pages.gguf");
    write(&path, &model_bytes_with(false, &STACKED_32));
    let g = Gguf::open(&path).expect("valid file");
    let tokens: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % VOCAB as u32).collect();
    let want = reference_logits(&g, &tokens);
    let logits = |large_pages: bool| {
        let cfg = tessera_engine::llama::Config::from_gguf(&g).expect("config");
        let opts = LoadOptions {
            activations: Activations::A16,
            large_pages,
            ..LoadOptions::default()
        };
        let model = Llama::from_source(cfg, &g, &opts).expect("loads");
        assert!(
            !tessera_core::huge::large_pages(),
            "the choice outlived the load"
        );
        // Every block-format matrix is packed in this mode (the f32 ones stay dense).
        let packed: usize = model
            .weight_formats()
            .iter()
            .filter(|(d, _, _)| tessera_kernels::quant::BLOCK_DTYPES.contains(d))
            .map(|(_, _, b)| b)
            .sum();
        assert!(packed > 0);
        let placed = model.large_page_bytes();
        assert_eq!(placed, if large_pages { packed } else { 0 });
        let mut cache = KvCache::new(&model.cfg, 32).expect("cache");
        let mut got = vec![model.forward(&tokens[..8], &mut cache).expect("prompt")];
        for i in 8..11 {
            got.push(
                model
                    .forward(&tokens[i..i + 1], &mut cache)
                    .expect("decode"),
            );
        }
        for (i, l) in (7..11).zip(&got) {
            let e = rel(l, &want[i]);
            assert!(
                e < A16_LOGIT_TOL,
                "large pages {large_pages}: position {i}: {e}"
            );
        }
        got
    };
    assert_eq!(logits(true), logits(false));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn k_quant_model_logits_match_float64_reference() {
    check_against_reference(&MIXED_K, "k");
}

fn check_against_reference(formats: &Formats, label: &str) {
    use tessera_engine::linear::Activations;
    let modes = [
        (Activations::F32, LOGIT_TOL),
        (Activations::A16, A16_LOGIT_TOL),
    ];
    for (tied, (acts, tol)) in [true, false]
        .into_iter()
        .flat_map(|t| modes.map(|m| (t, m)))
    {
        let label = format!("{label} {}", acts.name());
        let path = temp(&format!("synthetic-{label}-{tied}.gguf"));
        write(&path, &model_bytes_with(tied, formats));
        let g = Gguf::open(&path).expect("valid file");
        let model = load_with(&g, acts);
        // A prefill past the batching sizes (the dequantize+GEMM path), then 3
        // single-token steps.
        let prefill = tessera_kernels::ops::qmatmul::F32_BATCH_M + 4;
        let tokens: Vec<u32> = (0..prefill as u32 + 3)
            .map(|i| (i * 37 + 5) % VOCAB as u32)
            .collect();
        let want = reference_logits(&g, &tokens);
        let mut cache = KvCache::new(&model.cfg, 64).expect("cache");
        let got = model
            .forward(&tokens[..prefill], &mut cache)
            .expect("prefill");
        assert!(
            rel(&got, &want[prefill - 1]) < tol,
            "{label}: prefill: {}",
            rel(&got, &want[prefill - 1])
        );
        for i in prefill..prefill + 3 {
            let got = model
                .forward(&tokens[i..i + 1], &mut cache)
                .expect("decode");
            assert!(
                rel(&got, &want[i]) < tol,
                "{label}: decode {i}: {}",
                rel(&got, &want[i])
            );
        }
        // A short prompt takes the small-M path.
        let mut cache = KvCache::new(&model.cfg, 8).expect("cache");
        let got = model
            .forward(&tokens[..5], &mut cache)
            .expect("short prefill");
        assert!(rel(&got, &want[4]) < tol, "{label}: short prefill");
        // Bad requests are errors, and leave the cache as it was.
        assert!(model.forward(&[VOCAB as u32], &mut cache).is_err());
        assert!(
            model.forward(&[1, 2, 3, 4], &mut cache).is_err(),
            "exceeds capacity 8"
        );
        assert_eq!(cache.len(), 5);
        let _ = std::fs::remove_file(&path);
    }
}

/// A prompt longer than `INT8_BATCH_M` keeps f32 activations in layers whose prefill is
/// faster through the GEMM (every format but the interleaved 4- and 5-bit ones, see
/// [`HEAD_ONLY_32`] and [`HEAD_ONLY_K`]) and sends only the last position through the output projection,
/// which quantizes that one input row: the float64 forward rounding the same row is
/// then matched to f32 accuracy (measured 5e-7), and any kernel mistake (a lane scale,
/// an offset, a saturated sum) shows.
const INT8_HEAD_TOL: f64 = 1e-5;
/// Short prompts and decode steps round every matmul input but the f32 one, so the logits
/// carry the method error itself: measured 1.5e-2 (32-weight formats) and 4.9e-2
/// (K-quants, Q2_K and Q3_K among them) against the exact forward here (AVX2). Compared with a rounding reference this
/// is not tighter (see `reference_logits_with`), so it is bounded against the exact
/// one, an order below what a kernel mistake gives.
const INT8_ACTS_VS_EXACT_TOL: f64 = 0.1;

/// [`MIXED_K`] without Q4_K and Q5_K in its layers, for the reason of [`HEAD_ONLY_32`].
const HEAD_ONLY_K: Formats = Formats {
    layer: [
        DType::Q6_K,
        DType::Q2_K,
        DType::Q6_K,
        DType::Q3_K,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q6_K,
    ],
    ..MIXED_K
};

/// [`MIXED_32`] without Q4_0/Q4_1 in its layers: their prefill takes the integer path
/// on AVX2 (where it is the faster one), which would round every layer's input; so
/// does the 5-bit formats', which [`FIVE_BIT_32`] covers.
const HEAD_ONLY_32: Formats = Formats {
    layer: [
        DType::Q8_0,
        DType::F32,
        DType::Q8_0,
        DType::F32,
        DType::Q8_0,
        DType::Q8_0,
        DType::F32,
    ],
    ..MIXED_32
};

/// The 32-weight 5-bit formats (interleaved a byte per code) between Q8_0 and f32
/// layers.
const FIVE_BIT_32: Formats = Formats {
    layer: [
        DType::Q5_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::F32,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q5_0,
    ],
    ..MIXED_32
};

#[test]
fn int8_activations_match_float64_reference() {
    use tessera_engine::weights::LoadOptions;
    let opts = LoadOptions {
        activations: tessera_engine::linear::Activations::Int8,
        ..LoadOptions::default()
    };
    // (formats, label, whether every layer's prefill keeps f32 activations on any CPU)
    for (formats, label, f32_prefill) in [
        (&HEAD_ONLY_32, "32 head", true),
        (&MIXED_32, "32", false),
        (&FIVE_BIT_32, "32 five-bit", false),
        (&STACKED_32, "32 stacked", false),
        (&HEAD_ONLY_K, "k head", true),
        (&MIXED_K, "k", false),
    ] {
        let path = temp(&format!("int8-acts-{label}.gguf"));
        write(&path, &model_bytes_with(false, formats));
        let g = Gguf::open(&path).expect("valid file");
        let cfg = tessera_engine::llama::Config::from_gguf(&g).expect("config");
        let model = Llama::from_source(cfg, &g, &opts).expect("loads");
        // A prefill longer than the integer path's batch sizes (the head sees one row).
        let prefill = tessera_kernels::ops::qmatmul::INT8_BATCH_M + 6;
        let tokens: Vec<u32> = (0..prefill as u32 + 3)
            .map(|i| (i * 37 + 5) % VOCAB as u32)
            .collect();
        let exact = reference_logits(&g, &tokens);
        let rounded_head = reference_logits_with(&g, &tokens[..prefill], RefActs::Int8Blocks);
        let mut cache = KvCache::new(&model.cfg, 128).expect("cache");
        let got = model
            .forward(&tokens[..prefill], &mut cache)
            .expect("prefill");
        let e = rel(&got, &rounded_head[prefill - 1]);
        if f32_prefill {
            assert!(e < INT8_HEAD_TOL, "{label}: prefill head {e}");
        } else {
            // Q4_0/Q4_1/Q4_K and 5-bit layers may round their inputs at prefill too (on
            // AVX2 they do).
            let e = rel(&got, &exact[prefill - 1]);
            assert!(e < INT8_ACTS_VS_EXACT_TOL, "{label}: prefill {e}");
        }

        let mut cache = KvCache::new(&model.cfg, 64).expect("cache");
        let mut got = vec![model.forward(&tokens[..12], &mut cache).expect("prompt")];
        for i in 12..23 {
            got.push(
                model
                    .forward(&tokens[i..i + 1], &mut cache)
                    .expect("decode"),
            );
        }
        let worst = (11..23)
            .zip(&got)
            .map(|(i, g)| rel(g, &exact[i]))
            .fold(0f64, f64::max);
        eprintln!("{label}: int8 activations: prefill {e:.1e} vs the head-rounding reference; {worst:.1e} vs exact after every matmul rounds");
        assert!(worst < INT8_ACTS_VS_EXACT_TOL, "{label}: {worst}");
        // The integer path really ran: f32 activations give ~1e-7 here.
        assert!(worst > 1e-5, "{label}: {worst} (f32 path?)");
        let _ = std::fs::remove_file(&path);
    }
}

/// Metadata of the wrong type or that does not add up is an error, not a default: a
/// string θ once ran with θ = 10 000 and answered in another language.
#[test]
fn wrong_typed_or_inconsistent_metadata_is_an_error() {
    let shape = ModelShape {
        layers: LAYERS,
        dim: DIM,
        ffn: FFN,
        heads: HEADS,
        kv_heads: KV_HEADS,
    };
    let good = model_bytes(true);
    let g = Gguf::open(&{
        let p = temp("meta-good.gguf");
        write(&p, &good);
        p
    })
    .expect("valid");
    let tensors = raw_tensors(&g);
    let path = temp("meta-bad.gguf");
    for (key, value, want) in [
        (
            "rope.freq_base",
            Value::String("100000".into()),
            "rope.freq_base",
        ),
        (
            "attention.layer_norm_rms_epsilon",
            Value::String("1e-5".into()),
            "epsilon",
        ),
        ("block_count", Value::U32(1), "more layers"),
        (
            "attention.head_count",
            Value::U32(7),
            "7 attention heads do not divide the width",
        ),
    ] {
        let mut meta = llama_metadata("llama", &shape);
        let k = format!("llama.{key}");
        meta.iter_mut().find(|(n, _)| *n == k).expect("key").1 = value;
        write(&path, &gguf_bytes_owned(&meta, &tensors));
        let g = Gguf::open(&path).expect("the file itself is well formed");
        let e = tessera_engine::llama::Config::from_gguf(&g)
            .and_then(|c| Llama::from_source(c, &g, &Default::default()))
            .expect_err(key);
        assert!(e.to_string().contains(want), "{key}: {e}");
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn truncated_and_corrupted_files_are_errors() {
    let good = model_bytes(true);
    let path = temp("corrupt.gguf");
    // Every truncation point in the header region and a spread through the data.
    let cuts: Vec<usize> = (0..1200).chain((1200..good.len()).step_by(997)).collect();
    for &cut in &cuts {
        write(&path, &good[..cut]);
        assert!(
            Gguf::open(&path).is_err(),
            "truncated at {cut} of {}",
            good.len()
        );
    }
    // Single-byte corruption anywhere in the header never panics (it may stay valid).
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for _ in 0..400 {
        let mut b = good.clone();
        let i = rng.random_range(0..1200.min(b.len()));
        b[i] = rng.random();
        write(&path, &b);
        if let Ok(g) = Gguf::open(&path) {
            let _ = Llama::load(&g); // may fail, must not panic
        }
    }
    // Absurd counts: a tensor count of 2⁶³.
    let mut b = good.clone();
    b[8..16].copy_from_slice(&(1u64 << 63).to_le_bytes());
    write(&path, &b);
    let e = Gguf::open(&path).expect_err("absurd count").to_string();
    assert!(e.contains("tensor count"), "{e}");
    // Bad magic and version.
    let mut b = good.clone();
    b[0] = b'X';
    write(&path, &b);
    assert!(Gguf::open(&path)
        .expect_err("magic")
        .to_string()
        .contains("magic"));
    let mut b = good;
    b[4] = 9;
    write(&path, &b);
    assert!(Gguf::open(&path)
        .expect_err("version")
        .to_string()
        .contains("version"));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn overlapping_and_out_of_range_tensors_are_errors() {
    let t = |name: &str, dims: Vec<usize>| RawTensor {
        name: name.into(),
        dims,
        dtype: DType::F32,
        bytes: vec![0; 128],
    };
    let meta = [("general.architecture", Value::String("llama".into()))];
    let good = gguf_bytes(&meta, &[t("a", vec![32]), t("b", vec![32])]);
    let path = temp("overlap.gguf");
    write(&path, &good);
    let g = Gguf::open(&path).expect("two tensors");
    assert_eq!(g.tensors.len(), 2);
    // Point b's offset at a's bytes: find b's offset field (the last 8 header bytes before
    // the padding are b's offset, 128).
    let pos = good
        .windows(8)
        .rposition(|w| w == 128u64.to_le_bytes())
        .expect("b's offset");
    let mut b = good.clone();
    b[pos..pos + 8].copy_from_slice(&0u64.to_le_bytes());
    write(&path, &b);
    assert!(Gguf::open(&path)
        .expect_err("overlap")
        .to_string()
        .contains("overlap"));
    let mut b = good;
    b[pos..pos + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    write(&path, &b);
    assert!(Gguf::open(&path).is_err(), "beyond the file");
    let _ = std::fs::remove_file(&path);
}
