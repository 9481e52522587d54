//! ggml's block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the K-quants with Q8_K) against
//! llama.cpp's ggml, bit for bit: `tests/data/ggml_blocks_reference.json` holds inputs,
//! the blocks ggml's reference quantizer wrote for them and what ggml's dequantizer gives
//! (scripts/ggml_blocks_reference.c; no Tessera code involved), plus random block bytes
//! dequantized by ggml. The K-quants' error bounds and edge cases follow.

use serde_json::Value;
use tessera_core::DType;
use tessera_kernels::quant::{blocks_from_bytes, BlockFormat, QuantMatrix};
use tessera_kernels::with_block_format;

const DATA: &str = include_str!("data/ggml_blocks_reference.json");

struct Case {
    dtype: DType,
    kind: String,
    input: Option<Vec<f32>>,
    blocks: Vec<u8>,
    dequantized: Vec<f32>,
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|h| f32::from_bits(u32::from_str_radix(h.as_str().expect("hex"), 16).expect("hex")))
        .collect()
}

fn cases() -> Vec<Case> {
    let v: Value = serde_json::from_str(DATA).expect("valid JSON");
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let hex = c["blocks"].as_str().expect("blocks");
            Case {
                dtype: c["format"]
                    .as_str()
                    .expect("format")
                    .parse()
                    .expect("dtype"),
                kind: c["kind"].as_str().expect("kind").into(),
                input: (!c["input"].is_null()).then(|| floats(&c["input"])),
                blocks: (0..hex.len() / 2)
                    .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                    .collect(),
                dequantized: floats(&c["dequantized"]),
            }
        })
        .collect()
}

/// Bytes of a block slice, as a file would hold them.
fn bytes_of<B: BlockFormat>(b: &[B]) -> Vec<u8> {
    // SAFETY: block types are repr(C) plain-old-data without padding.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, std::mem::size_of_val(b)) }
        .to_vec()
}

/// Copies bytes into storage aligned for B (the JSON's bytes are not).
fn blocks_of<B: BlockFormat>(bytes: &[u8]) -> Vec<B> {
    let mut aligned = vec![0u64; bytes.len().div_ceil(8)];
    // SAFETY: the u64 buffer is at least bytes.len() long.
    let dst =
        unsafe { std::slice::from_raw_parts_mut(aligned.as_mut_ptr() as *mut u8, bytes.len()) };
    dst.copy_from_slice(bytes);
    blocks_from_bytes::<B>(dst).expect("whole blocks").to_vec()
}

fn same_bits(a: &[f32], b: &[f32]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
}

fn check<B: BlockFormat>(c: &Case) {
    let label = format!("{} {}", c.dtype, c.kind);
    let blocks = blocks_of::<B>(&c.blocks);
    let cols = blocks.len() * B::BLOCK;
    let m = QuantMatrix::from_blocks(1, cols, blocks).expect("shape");
    let deq = m.dequantize();
    if let Some(i) = same_bits(&deq, &c.dequantized) {
        panic!(
            "{label}: dequantized[{i}] = {} but ggml gives {}",
            deq[i], c.dequantized[i]
        );
    }
    if let Some(x) = &c.input {
        let q = QuantMatrix::<B>::quantize(1, x.len(), x).expect("quantizable");
        let ours = bytes_of(q.blocks());
        if let Some(i) = ours.iter().zip(&c.blocks).position(|(a, b)| a != b) {
            panic!(
                "{label}: quantized byte {i} (block {}, offset {}) is {:#04x}, ggml wrote {:#04x}",
                i / B::DTYPE.size_bytes(),
                i % B::DTYPE.size_bytes(),
                ours[i],
                c.blocks[i]
            );
        }
    }
}

#[test]
fn block_formats_match_ggml_bit_for_bit() {
    let cases = cases();
    assert_eq!(cases.len(), 66, "11 formats × 6 kinds");
    for c in &cases {
        with_block_format!(c.dtype, B => check::<B>(c), _ => panic!("{} is not a block format", c.dtype));
    }
}

/// Quantize → dequantize errors, relative to the block's largest magnitude, stay within
/// what each format's level spacing allows.
#[test]
fn k_quant_round_trip_error_bounds() {
    // Worst |error| / max|x| of a super-block. A rounding quantizer would stay within half
    // a level step (Q8_K: 1/254); the K-quant fits minimise a weighted squared error and
    // accept clipping an extreme value by up to about one step of a sub-block's range
    // (Q2_K 2/3·½, Q3_K 1/4, Q4_K 2/15, Q5_K 2/31, Q6_K 1/32 of max|x|, the last two less
    // in practice because the data rarely spans the full range in every sub-block).
    // Measured worst over these 48 super-blocks per kind: 0.335, 0.267, 0.100, 0.040,
    // 0.016, 0.0039.
    let bounds = [
        (DType::Q2_K, 0.40),
        (DType::Q3_K, 0.30),
        (DType::Q4_K, 0.14),
        (DType::Q5_K, 0.065),
        (DType::Q6_K, 0.032),
        (DType::Q8_K, 0.0040),
    ];
    let mut rng = tessera_kernels::registry::rng(42);
    for (dtype, bound) in bounds {
        for kind in ["normal", "uniform", "outliers"] {
            let x = sample(kind, 4096, &mut rng);
            let y = with_block_format!(dtype,
                B => QuantMatrix::<B>::quantize(4, 1024, &x).expect("quantizable").dequantize(),
                _ => unreachable!()
            );
            for (bx, by) in x.chunks(256).zip(y.chunks(256)) {
                let amax = bx.iter().fold(0f32, |m, v| m.max(v.abs()));
                let worst = bx
                    .iter()
                    .zip(by)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(
                    worst <= bound * amax,
                    "{dtype} {kind}: error {worst} > {bound}·{amax}"
                );
                assert!(
                    by.iter().all(|v| v.is_finite()),
                    "{dtype} {kind}: non-finite"
                );
            }
        }
    }
}

fn sample(kind: &str, n: usize, rng: &mut tessera_kernels::registry::Rng) -> Vec<f32> {
    use rand::Rng as _;
    (0..n)
        .map(|_| {
            let u: f32 = rng.random_range(-1.0..1.0);
            match kind {
                "uniform" => u,
                "outliers" if rng.random_range(0..50) == 0 => 30.0 * u,
                _ => u * u * u.signum() * 0.1,
            }
        })
        .collect()
}

#[test]
fn k_quant_constant_blocks_keep_their_value_and_nonfinite_input_poisons() {
    for dtype in [
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
    ] {
        for v in [0.0f32, 3.25, -1e-30, 1e-30, -7.0] {
            let x = vec![v; 256];
            let y = with_block_format!(dtype,
                B => QuantMatrix::<B>::quantize(1, 256, &x).expect("ok").dequantize(),
                _ => unreachable!()
            );
            // A constant block dequantizes to its value: its scale (or minimum) carries it
            // to f16 precision, 2⁻¹¹ relative (values below f16's range round to 0).
            let tol = |v: f32| v.abs() * 2f32.powi(-10) + 1e-7;
            assert!(
                y.iter().all(|&d| (d - v).abs() <= tol(v)),
                "{dtype} constant {v}: {:?}",
                &y[..4]
            );
        }
        let mut x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
        x[77] = f32::NAN;
        let y = with_block_format!(dtype,
            B => QuantMatrix::<B>::quantize(1, 256, &x).expect("ok").dequantize(),
            _ => unreachable!()
        );
        assert!(
            y.iter().all(|v| v.is_nan()),
            "{dtype}: NaN input must poison the block"
        );
    }
}

#[test]
fn k_quant_shapes_are_checked() {
    assert!(
        QuantMatrix::<tessera_kernels::quant::BlockQ4K>::quantize(1, 288, &[0.5; 288]).is_err()
    );
    assert!(
        QuantMatrix::<tessera_kernels::quant::BlockQ6K>::quantize(2, 256, &[0.5; 256]).is_err()
    );
    let b = blocks_of::<tessera_kernels::quant::BlockQ4K>(&[0u8; 288]);
    assert!(QuantMatrix::from_blocks(1, 256, b.clone()).is_err());
    assert!(QuantMatrix::from_blocks(2, 256, b).is_ok());
    let mut odd = vec![0u64; 40];
    // SAFETY: 320 bytes of a u64 buffer.
    let bytes = unsafe { std::slice::from_raw_parts_mut(odd.as_mut_ptr() as *mut u8, 320) };
    assert!(blocks_from_bytes::<tessera_kernels::quant::BlockQ4K>(&bytes[..145]).is_err());
}
