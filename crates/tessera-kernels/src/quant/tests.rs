//! Format tests: known-answer blocks worked out by hand from the GGUF definitions, byte
//! layout, round-trip error bounds on several distributions, and degenerate blocks.

use super::*;
use crate::registry::rng;
use half::f16;

/// A block's exact GGUF bytes.
fn bytes_of<B: BlockFormat>(b: &B) -> Vec<u8> {
    // SAFETY: B is plain old data without padding (see blocks_from_bytes).
    unsafe { std::slice::from_raw_parts(b as *const B as *const u8, std::mem::size_of::<B>()) }
        .to_vec()
}

#[test]
fn q4_0_known_block() {
    // −8..7 twice: the first largest magnitude is −8, so d = −8/−8 = 1 and q = x + 8.
    let x: [f32; QK] = std::array::from_fn(|j| (j % 16) as f32 - 8.0);
    let b = BlockQ4_0::quantize(&x);
    let mut want = vec![0x00, 0x3C]; // f16 1.0, little-endian
    want.extend((0..16u8).map(|j| j | (j << 4)));
    assert_eq!(bytes_of(&b), want);
    let mut y = [0f32; QK];
    b.dequantize(&mut y);
    assert_eq!(y, x);
    // A positive extreme gives a negative scale: 8 ↦ q 0 ↦ (0 − 8)·(−1) = 8.
    let mut x2 = [0f32; QK];
    x2[5] = 8.0;
    let b2 = BlockQ4_0::quantize(&x2);
    assert_eq!(b2.d, f16::from_f32(-1.0));
    b2.dequantize(&mut y);
    assert_eq!(y, x2);
}

#[test]
fn q4_1_known_block() {
    // 3, 3.5, …, 10.5 twice: m = 3, d = 7.5/15 = 0.5, q = 2(x − 3).
    let x: [f32; QK] = std::array::from_fn(|j| 3.0 + 0.5 * (j % 16) as f32);
    let b = BlockQ4_1::quantize(&x);
    let mut want = vec![0x00, 0x38, 0x00, 0x42]; // f16 0.5, f16 3.0
    want.extend((0..16u8).map(|j| j | (j << 4)));
    assert_eq!(bytes_of(&b), want);
    let mut y = [0f32; QK];
    b.dequantize(&mut y);
    assert_eq!(y, x);
}

#[test]
fn q5_known_blocks() {
    // Q5_0: −16..15, first extreme −16 → d = 1, q = x + 16 = j; fifth bits set for j ≥ 16.
    let x: [f32; QK] = std::array::from_fn(|j| j as f32 - 16.0);
    let b = BlockQ5_0::quantize(&x);
    let mut want = vec![0x00, 0x3C, 0x00, 0x00, 0xFF, 0xFF];
    want.extend((0..16u8).map(|j| j | (j << 4)));
    assert_eq!(bytes_of(&b), want);
    let mut y = [0f32; QK];
    b.dequantize(&mut y);
    assert_eq!(y, x);
    // Q5_1: 3, 3.25, …, 10.75 → m = 3, d = 0.25, q = j.
    let x: [f32; QK] = std::array::from_fn(|j| 3.0 + 0.25 * j as f32);
    let b = BlockQ5_1::quantize(&x);
    let mut want = vec![0x00, 0x34, 0x00, 0x42, 0x00, 0x00, 0xFF, 0xFF];
    want.extend((0..16u8).map(|j| j | (j << 4)));
    assert_eq!(bytes_of(&b), want);
    b.dequantize(&mut y);
    assert_eq!(y, x);
}

#[test]
fn q8_0_known_block() {
    // amax 4 (at −4): d = 4/127, q = round(x·31.75); 31.75·0.25 = 7.9375 per step.
    let x: [f32; QK] = std::array::from_fn(|j| (j as f32 - 16.0) * 0.25);
    let b = BlockQ8_0::quantize(&x);
    assert_eq!(b.d, f16::from_f32(4.0 / 127.0));
    let want_q: Vec<i8> = (0..32)
        .map(|j| ((j as f64 - 16.0) * 7.9375).round() as i8)
        .collect();
    assert_eq!(b.qs.to_vec(), want_q);
    assert_eq!(b.qs[0], -127);
    let mut y = [0f32; QK];
    b.dequantize(&mut y);
    for j in 0..QK {
        assert_eq!(y[j], b.qs[j] as f32 * b.d.to_f32());
    }
}

#[test]
fn blocks_view_bytes_in_place_and_reject_bad_lengths() {
    let x: [f32; QK] = std::array::from_fn(|j| (j as f32).sin());
    let blocks = [BlockQ4_1::quantize(&x), BlockQ4_1::quantize(&x.map(|v| -v))];
    let bytes: Vec<u8> = blocks.iter().flat_map(bytes_of).collect();
    let view: &[BlockQ4_1] = blocks_from_bytes(&bytes).expect("40 aligned bytes");
    assert_eq!(view, &blocks);
    assert!(
        blocks_from_bytes::<BlockQ4_1>(&bytes[..39]).is_err(),
        "ragged length"
    );
    // The same 40 bytes at an odd address (the f16 fields would be misaligned).
    let mut shifted = [0u8; 41];
    let start = usize::from((shifted.as_ptr() as usize).is_multiple_of(2));
    shifted[start..start + 40].copy_from_slice(&bytes);
    assert!(
        blocks_from_bytes::<BlockQ4_1>(&shifted[start..start + 40]).is_err(),
        "misaligned"
    );
    assert!(QuantMatrix::from_blocks(2, 32, blocks.to_vec()).is_ok());
    assert!(QuantMatrix::from_blocks(1, 32, blocks.to_vec()).is_err());
    assert!(QuantMatrix::from_blocks(2, 48, blocks.to_vec()).is_err());
    assert!(QuantMatrix::<BlockQ4_0>::quantize(1, 33, &[0.5; 33]).is_err());
    assert!(QuantMatrix::<BlockQ4_0>::quantize(2, 32, &[0.5; 32]).is_err());
}

/// Per-element bound relative to the block's scale, for each format: the rounding step
/// (½·d; Q4_0/Q5_0 up to d at the clipped end, since −max maps to the top code) plus the f16
/// rounding of the stored scale (2⁻¹¹ relative, times |q| ≤ 127) and of Q4_1's minimum.
fn bound<B: BlockFormat>(x: &[f32; QK]) -> f64 {
    let amax = x.iter().fold(0f64, |a, &v| a.max(v.abs() as f64));
    let (min, max) = x.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &v| {
        (lo.min(v as f64), hi.max(v as f64))
    });
    let u = 2f64.powi(-11);
    use tessera_core::DType::*;
    match B::DTYPE {
        Q4_0 => amax / 8.0 * (1.0 + 8.0 * u) + 1e-30,
        Q5_0 => amax / 16.0 * (1.0 + 16.0 * u) + 1e-30,
        Q4_1 => (max - min) / 15.0 * (0.5 + 16.0 * u) + min.abs() * u,
        Q5_1 => (max - min) / 31.0 * (0.5 + 32.0 * u) + min.abs() * u,
        _ => amax / 127.0 * (0.5 + 128.0 * u),
    }
}

fn round_trips<B: BlockFormat>() {
    use super::error::{sample, Dist};
    let mut r = rng(0x9a17);
    for name in [Dist::Uniform, Dist::Normal, Dist::Outliers] {
        for _ in 0..400 {
            let x: [f32; QK] = sample(name, QK, &mut r).try_into().expect("QK values");
            let mut y = [0f32; QK];
            B::quantize(&x).dequantize(&mut y);
            let b = bound::<B>(&x);
            for (a, q) in x.iter().zip(&y) {
                let e = (*a as f64 - *q as f64).abs();
                assert!(e <= b, "{} {name:?}: |{a} − {q}| = {e} > {b}", B::DTYPE);
            }
        }
    }
}

#[test]
fn round_trip_error_within_format_bounds() {
    round_trips::<BlockQ4_0>();
    round_trips::<BlockQ4_1>();
    round_trips::<BlockQ5_0>();
    round_trips::<BlockQ5_1>();
    round_trips::<BlockQ8_0>();
}

fn degenerate<B: BlockFormat>() {
    let mut y = [0f32; QK];
    for x in [[0.0f32; QK], [3.25; QK], [-1e-30; QK], [1e-30; QK]] {
        B::quantize(&x).dequantize(&mut y);
        assert!(
            y.iter().all(|v| v.is_finite()),
            "{}: {x:?} → {y:?}",
            B::DTYPE
        );
        // Equal values come back within the f16 rounding of the scale/minimum.
        for (a, b) in x.iter().zip(&y) {
            assert!(
                (a - b).abs() <= a.abs() * 1e-3 + 1e-7,
                "{}: {a} → {b}",
                B::DTYPE
            );
        }
    }
    // Non-finite input poisons the block rather than hiding inside a finite code.
    let mut x = [0.5f32; QK];
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        x[7] = bad;
        B::quantize(&x).dequantize(&mut y);
        assert!(y.iter().all(|v| v.is_nan()), "{} with {bad}", B::DTYPE);
    }
    // A finite block whose scale overflows f16 is an error at the matrix level.
    let err = QuantMatrix::<B>::quantize(1, QK, &[1e9; QK]);
    assert!(
        err.is_err() || B::DTYPE == tessera_core::DType::Q4_1,
        "{}",
        B::DTYPE
    );
    let huge: Vec<f32> = (0..QK).map(|j| if j == 0 { -1e9 } else { 1e9 }).collect();
    assert!(
        QuantMatrix::<B>::quantize(1, QK, &huge).is_err(),
        "{}",
        B::DTYPE
    );
}

#[test]
fn degenerate_blocks_stay_finite() {
    degenerate::<BlockQ4_0>();
    degenerate::<BlockQ4_1>();
    degenerate::<BlockQ5_0>();
    degenerate::<BlockQ5_1>();
    degenerate::<BlockQ8_0>();
}

#[test]
fn matrix_round_trip_keeps_row_layout() {
    let (rows, cols) = (3, 64);
    let data: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
        .collect();
    let q = QuantMatrix::<BlockQ8_0>::quantize(rows, cols, &data).expect("valid");
    assert_eq!(q.row(1).len(), 2);
    assert_eq!(q.size_bytes(), rows * 2 * 34);
    let back = q.dequantize();
    for (a, b) in data.iter().zip(&back) {
        assert!((a - b).abs() <= 0.5 / 127.0 * 1.1);
    }
}

#[test]
fn block_dtypes_are_exactly_the_block_formats_and_all_dispatch() {
    use super::BLOCK_DTYPES;
    use tessera_core::DType;
    let blocky: Vec<DType> = DType::ALL
        .into_iter()
        .filter(|d| d.block_size() > 1)
        .collect();
    assert_eq!(BLOCK_DTYPES.to_vec(), blocky);
    for d in BLOCK_DTYPES {
        let (dtype, block) =
            crate::with_block_format!(d, B => (B::DTYPE, B::BLOCK), _ => panic!("{d}"));
        assert_eq!((dtype, block), (d, d.block_size()));
    }
}

/// The factored forms the interleaved layouts store ([`BlockFormat::factored_scales`],
/// [`BlockFormat::split_scales`]) must multiply back to exactly the (d, m) that
/// [`BlockFormat::unsigned`] gives, on blocks with outliers so the small integers span
/// their range; and `SPLIT_I8_SCALES` must say exactly which formats give split scales.
fn factored_forms_are_exact<B: BlockFormat>() {
    use rand::Rng as _;
    let mut r = rng(41);
    let x: Vec<f32> = (0..4 * B::BLOCK)
        .map(|i| r.random_range(-1.0f32..1.0) * if i % 37 == 0 { 20.0 } else { 1.0 })
        .collect();
    let mut u = [0u8; QK];
    for xb in x.chunks_exact(B::BLOCK) {
        let b = B::quantize(xb);
        assert_eq!(
            b.split_scales().is_some(),
            B::SPLIT_I8_SCALES,
            "{}",
            B::DTYPE
        );
        for c in 0..B::BLOCK / QK {
            let halves = b.unsigned(c, &mut u);
            if let Some(f) = b.factored_scales() {
                let (sc, mn) = f.chunks[c];
                let got = (
                    f.d.to_f32() * f32::from(sc),
                    f.neg_dmin.to_f32() * f32::from(mn),
                );
                assert_eq!(got, halves[0], "{} chunk {c}", B::DTYPE);
            }
            if let Some(s) = b.split_scales() {
                assert_eq!(s.mins.is_some(), B::HAS_MIN, "{}", B::DTYPE);
                for (h, &want) in halves.iter().enumerate() {
                    let j = 2 * c + h;
                    let got = (
                        s.d.to_f32() * f32::from(s.sc[j]),
                        s.mins.map_or(0.0, |(n, mn)| n.to_f32() * f32::from(mn[j])),
                    );
                    assert_eq!(got, want, "{} chunk {c} half {h}", B::DTYPE);
                }
            }
        }
    }
}

#[test]
fn factored_scales_multiply_back_exactly() {
    for d in super::BLOCK_DTYPES {
        crate::with_block_format!(d, B => factored_forms_are_exact::<B>(), _ => panic!("{d}"));
    }
}
