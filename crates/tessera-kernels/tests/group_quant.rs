//! The AWQ/GPTQ-style 4-bit group formats: layout, error bound, degenerate groups.

use tessera_core::DType;
use tessera_kernels::quant::{BlockFormat, BlockInt4G128, BlockInt4G32, QuantMatrix};
use tessera_kernels::with_block_format;

const GROUPS: [DType; 3] = [DType::Int4G32, DType::Int4G64, DType::Int4G128];

#[test]
fn layout_and_zero_point_are_as_documented() {
    // Range [−1.5, 6]: scale 0.5, zero 3; value v ↦ code v/0.5 + 3.
    let x: Vec<f32> = (0..32).map(|j| -1.5 + 0.25 * (j % 31) as f32).collect();
    let b = BlockInt4G32::quantize(&x);
    assert_eq!((b.scale.to_f32(), b.zero, b.reserved), (0.5, 3, 0));
    for (j, &v) in x.iter().enumerate() {
        let code = ((v / 0.5).round_ties_even() + 3.0) as u8;
        let byte = b.qs[j % 16];
        let stored = if j < 16 { byte & 0xF } else { byte >> 4 };
        assert_eq!(stored, code, "weight {j}");
    }
    let mut y = [0f32; 32];
    b.dequantize(&mut y);
    for (j, (&v, &d)) in x.iter().zip(&y).enumerate() {
        // Codes are exact at multiples of 0.5; the 0.25 steps round half to even.
        assert!((v - d).abs() <= 0.25, "weight {j}: {v} → {d}");
    }
}

#[test]
fn round_trip_within_half_a_step() {
    let mut rng = tessera_kernels::registry::rng(9);
    use rand::Rng as _;
    for dtype in GROUPS {
        let g = dtype.block_size();
        let x: Vec<f32> = (0..64 * g)
            .map(|i| {
                let u: f32 = rng.random_range(-1.0..1.0);
                // Some groups shifted off zero, some with an outlier.
                u + if (i / g) % 3 == 1 { 2.0 } else { 0.0 }
                    + if i % 97 == 0 { 8.0 * u } else { 0.0 }
            })
            .collect();
        let (y, scales) = with_block_format!(dtype, B => {
            let m = QuantMatrix::<B>::quantize(64, g, &x).expect("quantizable");
            let mut u = [0u8; 32];
            let s: Vec<f32> = m.blocks().iter().map(|b| b.unsigned(0, &mut u)[0].0).collect();
            (m.dequantize(), s)
        }, _ => unreachable!());
        for (grp, ((xs, ys), s)) in x.chunks(g).zip(y.chunks(g)).zip(&scales).enumerate() {
            // Half a step, plus the stored scale's f16 rounding over 15 steps.
            let bound = 0.5 * s * (1.0 + 16.0 * 2f32.powi(-11));
            for (a, b) in xs.iter().zip(ys) {
                assert!(
                    (a - b).abs() <= bound,
                    "{dtype} group {grp}: {a} → {b} (scale {s})"
                );
            }
        }
    }
}

#[test]
fn degenerate_groups_and_nonfinite_input() {
    for dtype in GROUPS {
        let g = dtype.block_size();
        for v in [0.0f32, 3.25, -7.0, 1e-30] {
            let y = with_block_format!(dtype,
                B => QuantMatrix::<B>::quantize(1, g, &vec![v; g]).expect("ok").dequantize(),
                _ => unreachable!());
            // A constant group dequantizes to its value: its scale carries it to f16
            // precision, 2⁻¹¹ relative (values below f16's range round to 0).
            let tol = |v: f32| v.abs() * 2f32.powi(-10) + 1e-7;
            assert!(
                y.iter().all(|&d| (d - v).abs() <= tol(v)),
                "{dtype} constant {v}: {:?}",
                &y[..4]
            );
            if v == 0.0 {
                assert!(y.iter().all(|&d| d == 0.0), "{dtype}: zeros stay exact");
            }
        }
        let mut x = vec![0.5f32; g];
        x[g - 1] = f32::INFINITY;
        let y = with_block_format!(dtype,
            B => QuantMatrix::<B>::quantize(1, g, &x).expect("ok").dequantize(),
            _ => unreachable!());
        assert!(y.iter().all(|d| d.is_nan()), "{dtype}: ∞ poisons its group");
    }
    assert!(QuantMatrix::<BlockInt4G128>::quantize(1, 64, &[0.5; 64]).is_err());
    assert!(
        QuantMatrix::<BlockInt4G128>::quantize(1, 128, &[1e6; 128]).is_err(),
        "scale overflows f16"
    );
}
