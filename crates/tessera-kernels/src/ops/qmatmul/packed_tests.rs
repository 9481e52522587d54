//! Tests of the packed layouts and the integer kernels that read them (the activation
//! quantizer's own are in `quant_acts`).

use super::*;
use crate::ops::qmatmul::{qmatmul_int8, ActScales};
use crate::quant::{BlockQ4_0, BlockQ8K, BlockQ8_0, BLOCK_DTYPES};
use rand::{Rng, SeedableRng};
use tessera_core::{Isa, Result, TensorView, TensorViewMut};

/// `y [m, n]` (NaN-poisoned first) from `matmul(x [m, k], y)`.
fn apply(
    x: &[f32],
    (m, k, n): (usize, usize, usize),
    matmul: impl FnOnce(&TensorView<'_, f32>, &mut TensorViewMut<'_, f32>) -> Result<()>,
) -> Vec<f32> {
    let xv = TensorView::contiguous(x, &[m, k]).unwrap();
    let mut y = vec![f32::NAN; m * n];
    let mut yv = TensorViewMut::contiguous(&mut y, &[m, n]).unwrap();
    matmul(&xv, &mut yv).unwrap();
    y
}

/// Two paths that compute the same products but sum them in a different order (the
/// AVX-512 kernels reduce f16-metadata and f32-metadata blocks, or a stacked matrix and its
/// parts, through different register groupings): f32 rounding then differs in the 7th
/// digit (measured up to ~3e-7 relative on a Zen 4 host), so 1e-5 of the output norm is
/// far from any real error (a wrong scale or code moves outputs by whole percents). Per
/// output, the interleaved and tile kernels against the row-major one are held to it
/// times the rows' mean Σ|x| (weights in [−1, 1] there, so Σ|w·x| ≤ Σ|x|).
pub(in crate::ops::qmatmul) const REORDER_TOL: f64 = 1e-5;

/// Asserts `got` equals `want` within [`REORDER_TOL`] of `want`'s norm, finite where
/// `want` is.
fn assert_reordered_sum(got: &[f32], want: &[f32], at: &str) {
    assert_eq!(got.len(), want.len(), "{at}");
    assert!(got.iter().all(|v| v.is_finite()), "{at}: {got:?}");
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|&w| (w as f64).powi(2)).sum();
    let rel = (num / den.max(f64::MIN_POSITIVE)).sqrt();
    assert!(rel <= REORDER_TOL, "{at}: relative difference {rel:.2e}");
}

/// The AVX2 kernel multiplies codes unsigned with saturating i16 pair sums: every
/// format but the offset-128 ones must keep its codes below 64 (2·63·127 < 2¹⁵), on
/// data with outliers too.
#[test]
fn only_offset_128_formats_have_wide_codes() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (rows, cols) = (4, 512);
    let data: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let v: f32 = rng.random_range(-1.0..1.0);
            if i % 97 == 0 {
                v * 50.0
            } else {
                v
            }
        })
        .collect();
    for dtype in BLOCK_DTYPES {
        let p = crate::with_block_format!(dtype,
            B => PackedWeights::new(&QuantMatrix::<B>::quantize(rows, cols, &data).unwrap()),
            _ => unreachable!("{dtype} is a block format")
        );
        let mut codes = [0u8; QK];
        let mut widest = 0;
        for (r, b) in (0..rows).flat_map(|r| (0..cols / QK).map(move |b| (r, b))) {
            p.chunk_codes(r, b, &mut codes);
            widest = widest.max(*codes.iter().max().unwrap());
        }
        if p.signed_bytes() {
            // Full bytes interleave where an integer kernel reads them so: `vpdpbusd`,
            // `vpmaddubsw` (as magnitudes, signs on the activations) and `sdot`.
            let x86 = Isa::Avx2.is_available() && matches!(Isa::best(), Isa::Avx2 | Isa::Avx512);
            let sdot = CpuFeatures::get().neon_dotprod && Isa::best() == Isa::Neon;
            let want = if (x86 || sdot) && dtype != DType::I8 {
                CodeLayout::Bytes8
            } else {
                CodeLayout::Bytes
            };
            assert_eq!(p.layout, want, "{dtype}");
        } else if crate::with_block_format!(dtype, B => PackedWeights::five_bit::<B>(), _ => false)
        {
            // Interleaved for every instance: `vpmaddubsw`'s i16 sums need codes < 32.
            assert!(widest < 32, "{dtype}: code {widest}");
            assert_eq!(p.layout, CodeLayout::Bytes8, "{dtype}");
        } else {
            assert!(widest < 64, "{dtype}: code {widest}");
        }
    }
}

/// Both layouts of `dtype`'s weights: row-major, then interleaved where it applies.
fn layouts(dtype: DType, (rows, cols): (usize, usize), data: &[f32]) -> Vec<PackedWeights> {
    crate::with_block_format!(dtype, B => {
        let q = QuantMatrix::<B>::quantize(rows, cols, data).unwrap();
        std::iter::once(PackedWeights::row_major(&q))
            .chain(PackedWeights::interleaved(&q))
            .collect()
    }, _ => unreachable!("{dtype} is a block format"))
}

/// `p` with its metadata in the other width: f16 and factored → f32 always, f32 → f16
/// where every value is exact (None otherwise). None for split i8 scales too: only the
/// 6-bit kernel reads interleaved split-scale codes (`interleaved_kernel_matches_portable`
/// checks it against the row layout).
fn other_width(p: &PackedWeights) -> Option<PackedWeights> {
    let meta = match &p.meta {
        Meta::SplitI8(_) => return None,
        Meta::Factored(_) => {
            let nb = p.cols / QK;
            let (mut scales, mut mins) = (vec![0.0; p.stored_rows() * nb], vec![]);
            mins.resize(scales.len(), 0.0);
            for r in 0..p.stored_rows() {
                for b in 0..nb {
                    let at = p.meta_index(r, b, 0);
                    (scales[at], mins[at]) = p.scale_min(r, b, 0);
                }
            }
            Meta::F32 {
                scales: scales.into(),
                mins: mins.into(),
            }
        }
        Meta::F16 { scales, mins } => {
            let wide = |v: &[f16]| v.iter().map(|h| h.to_f32()).collect();
            Meta::F32 {
                scales: wide(scales),
                mins: wide(mins),
            }
        }
        Meta::F32 { scales, mins } => {
            let exact = |v: &[f32]| v.iter().all(|&x| f16::from_f32(x).to_f32() == x);
            if !exact(scales) || !exact(mins) {
                return None;
            }
            let half = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect();
            Meta::F16 {
                scales: half(scales),
                mins: half(mins),
            }
        }
    };
    Some(PackedWeights { meta, ..p.clone() })
}

/// f16 and factored metadata hold the same values as f32 (chosen only where exact), so
/// every kernel, in either layout, must give the same outputs from either form up to the
/// summation order ([`REORDER_TOL`]: the AVX-512 kernels group the two differently);
/// the 32-weight formats do get f16 here, interleaved Q4_K and
/// Q5_K get factored metadata and interleaved Q2_K/Q3_K/Q6_K split i8 scales.
#[test]
fn f16_metadata_matches_f32_metadata() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (rows, cols, m) = (7, 256, 3);
    let data: Vec<f32> = (0..rows * cols)
        .map(|_| rng.random_range(-2.0..2.0))
        .collect();
    let x: Vec<f32> = (0..m * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
    for dtype in BLOCK_DTYPES {
        let thirty_two = matches!(
            dtype,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0
        );
        let auto = crate::with_block_format!(dtype,
            B => PackedWeights::new(&QuantMatrix::<B>::quantize(rows, cols, &data).unwrap()),
            _ => unreachable!("{dtype} is a block format")
        );
        let is_f16 = matches!(auto.meta, Meta::F16 { .. });
        assert_eq!(is_f16, thirty_two, "{dtype}");
        for p in layouts(dtype, (rows, cols), &data) {
            let factored = matches!(p.meta, Meta::Factored(_));
            assert_eq!(
                factored,
                matches!(dtype, DType::Q4_K | DType::Q5_K) && p.layout.interleaved(),
                "{dtype}"
            );
            let split = matches!(p.meta, Meta::SplitI8(_));
            let split_format = matches!(dtype, DType::Q2_K | DType::Q3_K | DType::Q6_K);
            assert_eq!(split, split_format && p.layout.interleaved(), "{dtype}");
            let Some(q) = other_width(&p) else {
                assert!(!thirty_two, "{dtype}: its scales are f16 values");
                continue;
            };
            for isa in Isa::available() {
                let run = |w: &PackedWeights| {
                    apply(&x, (m, cols, rows), |x, y| qmatmul_int8(isa, 1, w, x, y))
                };
                let (a, b) = (run(&p), run(&q));
                let at = format!("{dtype} {isa} {:?}", p.layout);
                assert_reordered_sum(&a, &b, &at);
            }
        }
    }
}

/// The packed copy stands in for the blocks (`qmatmul_packed`, an engine's embedding
/// rows), so its rows must be the format's values bit for bit, and its prefill the
/// block path's in either layout (or exactly the integer path's, where that is the
/// faster prefill); with outliers, so K-quant sub-scales span their
/// range.
#[test]
fn packed_rows_are_the_formats_values() {
    use crate::ops::qmatmul::{engine_int8_isa, qmatmul, qmatmul_int8, qmatmul_packed};
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    // A prefill: more rows than the integer path's batch sizes.
    let (rows, cols, m) = (9, 512, super::super::INT8_BATCH_M + 16);
    let data: Vec<f32> = (0..rows * cols)
        .map(|i| rng.random_range(-1.0f32..1.0) * if i % 61 == 0 { 30.0 } else { 1.0 })
        .collect();
    let x: Vec<f32> = (0..m * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
    let isa = Isa::best();
    let mut int8_prefills = 0;
    for dtype in BLOCK_DTYPES {
        let (want, y_blocks) = crate::with_block_format!(dtype, B => {
            let q = QuantMatrix::<B>::quantize(rows, cols, &data).unwrap();
            let y = apply(&x, (m, cols, rows), |x, y| qmatmul(isa, 2, &q, x, y));
            (q.dequantize(), y)
        }, _ => unreachable!("{dtype} is a block format"));
        for p in layouts(dtype, (rows, cols), &data) {
            let at = format!("{dtype} {:?}", p.layout);
            let mut row = vec![f32::NAN; cols];
            for r in 0..rows {
                p.dequantize_row(r, &mut row);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&row),
                    bits(&want[r * cols..(r + 1) * cols]),
                    "{at} row {r}"
                );
            }
            let y = apply(&x, (m, cols, rows), |x, y| qmatmul_packed(isa, 2, &p, x, y));
            if super::super::int8_prefill_pays(isa, &p) {
                let y_int8 = apply(&x, (m, cols, rows), |x, y| {
                    qmatmul_int8(engine_int8_isa(isa, &p), 2, &p, x, y)
                });
                assert_eq!(y, y_int8, "{at}: prefill over packed rows, integer path");
                int8_prefills += 1;
            } else {
                assert_eq!(y, y_blocks, "{at}: prefill over packed rows");
            }
            let short = TensorView::contiguous(&x[..m * (cols - QK)], &[m, cols - QK]).unwrap();
            let mut y = vec![0f32; m * rows];
            let mut yv = TensorViewMut::contiguous(&mut y, &[m, rows]).unwrap();
            assert!(
                qmatmul_packed(isa, 2, &p, &short, &mut yv).is_err(),
                "{at}: K"
            );
            assert!(
                p.size_bytes() > 0 && p.size_bytes() < p.stored_rows() * cols * 2,
                "{at}"
            );
        }
    }
    // Interleaved Q4_0, Q4_1, Q4_K, the three group formats and Q5_0, Q5_1, Q5_K take
    // the integer path at prefill wherever AVX2 runs.
    assert!(
        int8_prefills == 9 || !Isa::Avx2.is_available(),
        "{int8_prefills}"
    );
}

/// The interleaved kernel against the portable integer kernel on the row-major
/// layout, over ragged groups (1, 7, 9, 17 rows: padding in the last group), odd
/// chunk counts (K = 96), every activation-row count of a call (1–4, and 6 = 4 + 2),
/// and 1 or 3 threads (groups split across tasks); NaN-poisoned outputs, and a NaN
/// activation reaching exactly its row. Every instance of the loop the CPU has:
/// `vpmaddubsw` (AVX2), `vpdpbusd` (the AVX-512 ISA with AVX512_VNNI), `sdot` (NEON
/// with DotProd).
#[test]
fn interleaved_kernel_matches_portable() {
    let f = CpuFeatures::get();
    let mut isas = Vec::new();
    for (isa, has, what) in [
        (Isa::Avx2, Isa::Avx2.is_available(), "vpmaddubsw (AVX2)"),
        (Isa::Avx512, f.avx512_vnni, "vpdpbusd (AVX512_VNNI)"),
        (Isa::Neon, f.neon_dotprod, "sdot (NEON DotProd)"),
    ] {
        if has {
            isas.push(isa);
        } else {
            eprintln!("the {what} instance skipped: this CPU lacks it");
        }
    }
    if isas.is_empty() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let mut formats = 0;
    for dtype in BLOCK_DTYPES {
        let ks: &[usize] = if dtype.block_size() == QK {
            &[96, 320]
        } else {
            &[256, 512]
        };
        for (&rows, &k) in [1, 7, 9, 17].iter().zip(ks.iter().cycle()) {
            let data: Vec<f32> = (0..rows * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            let [row_major, interleaved] = &layouts(dtype, (rows, k), &data)[..] else {
                continue;
            };
            formats += usize::from(rows == 1);
            for m in [1, 2, 3, 4, 6, 8, 13] {
                let mut x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
                let want = apply(&x, (m, k, rows), |x, y| {
                    qmatmul_int8(Isa::Scalar, 1, row_major, x, y)
                });
                let scale: f32 = x.iter().map(|v| v.abs()).sum::<f32>() / m as f32;
                for (&isa, threads) in isas.iter().flat_map(|i| [(i, 1), (i, 3)]) {
                    let got = apply(&x, (m, k, rows), |x, y| {
                        qmatmul_int8(isa, threads, interleaved, x, y)
                    });
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (g - w).abs() <= REORDER_TOL as f32 * scale,
                            "{dtype} {isa} {rows}x{k} m {m}: {g} vs {w}"
                        );
                    }
                }
                x[(m - 1) * k + k / 2] = f32::NAN;
                for &isa in &isas {
                    let got = apply(&x, (m, k, rows), |x, y| {
                        qmatmul_int8(isa, 2, interleaved, x, y)
                    });
                    let (before, last) = got.split_at((m - 1) * rows);
                    assert!(before.iter().all(|v| v.is_finite()), "{dtype} {isa} m {m}");
                    assert!(last.iter().all(|v| v.is_nan()), "{dtype} {isa} m {m}");
                }
            }
        }
    }
    // Q4_0, Q4_1, Q4_K, the three group formats, Q2_K, Q3_K, Q6_K, Q5_0, Q5_1, Q5_K,
    // Q8_0 and Q8_K.
    assert_eq!(formats, 14);
}

/// Byte codes at their largest against activation codes at ±127, where the AVX2
/// instance's i16 running sums come nearest to wrapping (`rows8`'s module docs): 5-bit
/// codes at 31 reach 4·2·31·127 = 31 496 of 32 767 and stay exact only if each sum
/// widens to i32 on its own; full bytes at 255 (q = 127 in AVX2's signed form) make
/// pairs of 2·127·127 = 32 258 (−128, stored 0, has its own test below). Every instance
/// the CPU has must match the portable loop on them.
#[test]
fn byte_codes_at_their_bound_do_not_wrap() {
    let isas: Vec<Isa> = [Isa::Avx2, Isa::Avx512, Isa::Neon]
        .into_iter()
        .filter(|&isa| match isa {
            Isa::Avx512 => CpuFeatures::get().avx512_vnni,
            Isa::Neon => CpuFeatures::get().neon_dotprod,
            _ => isa.is_available(),
        })
        .collect();
    if isas.is_empty() {
        eprintln!("skipped: this CPU has none of the interleaved kernels' instructions");
        return;
    }
    let (rows, k) = (9, 512);
    // Each 32-block: one value at `odd`, the rest at `high`, so every 5-bit format's
    // codes sit at 31 (−1, 0.96) and every full-byte format's at 255 but for the one.
    let block = |odd: f32, high: f32| -> Vec<f32> {
        (0..rows * k)
            .map(|i| if i % QK == 5 { odd } else { high })
            .collect()
    };
    let (mut five_bit, mut full) = (0, 0);
    for dtype in BLOCK_DTYPES {
        let (is_five, is_full) = crate::with_block_format!(dtype,
            B => (PackedWeights::five_bit::<B>(), B::OFFSET == 128 && !B::SPLIT16),
            _ => (false, false));
        // Q8_K maps its largest value to −127 (its scale takes that value's sign), so
        // its codes reach 255 on the values of the other sign: whichever data puts
        // them there.
        let (candidates, top) = match (is_five, is_full) {
            (true, _) => (vec![block(-1.0, 0.96)], 31),
            (_, true) => (vec![block(-1.0, 1.0), block(1.0, -0.999)], 255),
            _ => continue,
        };
        five_bit += usize::from(is_five);
        full += usize::from(is_full);
        let mut at_top = None;
        for data in &candidates {
            let [row_major, interleaved] = &layouts(dtype, (rows, k), data)[..] else {
                panic!("{dtype}: byte codes interleave");
            };
            let mut codes = [0u8; QK];
            interleaved.chunk_codes(0, 0, &mut codes);
            if codes.iter().filter(|&&u| u == top).count() == QK - 1 {
                at_top = Some((row_major.clone(), interleaved.clone()));
            }
        }
        let Some((row_major, interleaved)) = at_top else {
            panic!("{dtype}: no data put the codes at {top}");
        };
        for sign in [1.0f32, -1.0] {
            for m in [1, 3, 4, 5, 8, 9] {
                let x = vec![sign; m * k];
                let want = apply(&x, (m, k, rows), |x, y| {
                    qmatmul_int8(Isa::Scalar, 1, &row_major, x, y)
                });
                let scale = k as f32;
                for &isa in &isas {
                    let got = apply(&x, (m, k, rows), |x, y| {
                        qmatmul_int8(isa, 1, &interleaved, x, y)
                    });
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (g - w).abs() <= REORDER_TOL as f32 * scale,
                            "{dtype} {isa} m {m} sign {sign}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
    assert_eq!(five_bit, 3, "Q5_0, Q5_1 and Q5_K");
    assert_eq!(full, 2, "Q8_0 and Q8_K");
}

/// Full-range 8-bit codes against full-range activations: rows and activation rows
/// of ±max in several sign patterns, where a plain unsigned×signed multiply would
/// saturate (2·255·127 > 2¹⁵), must match the portable integer kernel.
#[test]
fn full_byte_codes_do_not_saturate() {
    if !Isa::Avx2.is_available() {
        eprintln!("skipped: no AVX2");
        return;
    }
    let k = 256;
    // Pattern p's sign at j: all +, all −, pairs alternating, singles alternating.
    let sign = |p: usize, j: usize| match p {
        0 => 1.0f32,
        1 => -1.0,
        2 => [1.0, -1.0][(j / 2) % 2],
        _ => [1.0, -1.0][j % 2],
    };
    let pattern = |n: usize| -> Vec<f32> { (0..n * k).map(|i| sign(i / k % 4, i % k)).collect() };
    let (w, x) = (pattern(4), pattern(4));
    let q8_0 = PackedWeights::new(&QuantMatrix::<BlockQ8_0>::quantize(4, k, &w).unwrap());
    let q8_k = PackedWeights::new(&QuantMatrix::<BlockQ8K>::quantize(4, k, &w).unwrap());
    for w in [&q8_0, &q8_k] {
        let run = |isa| apply(&x, (4, k, 4), |x, y| qmatmul_int8(isa, 1, w, x, y));
        let (fast, portable) = (run(Isa::Avx2), run(Isa::Scalar));
        for (f, p) in fast.iter().zip(&portable) {
            assert!(
                (f - p).abs() <= 1e-5 * p.abs().max(1.0),
                "{fast:?} vs {portable:?}"
            );
        }
        // Equal patterns dot to ±k: the saturating cases are really there.
        assert!(
            (portable[0] - k as f32).abs() < 1e-2 * k as f32,
            "{portable:?}"
        );
    }
}

/// Q8_0 codes at −128 (stored byte 0), which this crate's quantizer never writes but a
/// file may hold: AVX2 multiplies |q| = 128 by activation bytes at ±127, a pair of
/// 2·128·127 = 32 512, the nearest to `vpmaddubsw`'s saturation at 2¹⁵ any code comes
/// (`rows8`'s module docs). Activations of ±1 quantize exactly to ±127 (d_x = 1/127), so
/// every output is Σ d·q·x exactly, computed here in f64 from the blocks, and every
/// layout and instance the CPU has must give it within f32 rounding.
#[test]
fn full_byte_codes_at_minus_128_are_exact() {
    let (rows, k) = (17, 256);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5128);
    // Mostly −128, with 127s and small codes in random places, and random scales.
    let blocks: Vec<BlockQ8_0> = (0..rows * k / QK)
        .map(|_| BlockQ8_0 {
            d: half::f16::from_f32(rng.random_range(0.001f32..0.01)),
            qs: std::array::from_fn(|_| match rng.random_range(0..8) {
                0 => 127,
                1 => rng.random_range(-3..=3),
                _ => i8::MIN,
            }),
        })
        .collect();
    let want_row = |r: usize, sign: f64| -> f64 {
        blocks[r * k / QK..(r + 1) * k / QK]
            .iter()
            .map(|b| b.d.to_f64() * b.qs.iter().map(|&q| q as f64 * sign).sum::<f64>())
            .sum()
    };
    let q = QuantMatrix::<BlockQ8_0>::from_blocks(rows, k, blocks.clone()).unwrap();
    let packed: Vec<PackedWeights> = std::iter::once(PackedWeights::row_major(&q))
        .chain(PackedWeights::interleaved(&q))
        .collect();
    assert_eq!(packed.len(), 2, "Q8_0 interleaves");
    let isas = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon]
        .into_iter()
        .filter(|isa| isa.is_available());
    for isa in isas {
        for w in &packed {
            for (m, sign) in [(1, 1.0), (3, -1.0), (5, 1.0), (8, -1.0), (16, 1.0)] {
                let x = vec![sign as f32; m * k];
                let got = apply(&x, (m, k, rows), |x, y| qmatmul_int8(isa, 1, w, x, y));
                for (i, &g) in got.iter().enumerate() {
                    let want = want_row(i % rows, sign);
                    // f32 accumulation over k/32 block terms of up to 32·128·0.01.
                    let tol = 1e-5 * (k as f64 * 128.0 * 0.01);
                    assert!(
                        (g as f64 - want).abs() <= tol,
                        "{isa} {:?} m {m} row {i}: {g} vs {want}",
                        w.layout
                    );
                }
            }
        }
    }
}

/// Decode-size calls reuse a thread's activation buffers: a sequence of calls with
/// different K, M and offsets (Q4_0 offset 8, Q8_0 128) must give, bit for bit, what
/// each call gives on a fresh thread, whose buffers are new.
#[test]
fn reused_activation_buffers_give_fresh_results() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let calls: Vec<(DType, usize, usize)> = vec![
        (DType::Q4_0, 4, 256),
        (DType::Q8_0, 1, 64),
        (DType::Q4_0, 2, 96),
        (DType::Q8_0, 6, 256),
        (DType::Q4_0, 1, 32),
    ];
    let cases: Vec<(PackedWeights, Vec<f32>, usize)> = calls
        .iter()
        .map(|&(dtype, m, k)| {
            let data: Vec<f32> = (0..5 * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            (layouts(dtype, (5, k), &data).remove(0), x, m)
        })
        .collect();
    let run = |(w, x, m): &(PackedWeights, Vec<f32>, usize)| {
        apply(x, (*m, w.cols(), 5), |x, y| {
            qmatmul_int8(Isa::best(), 1, w, x, y)
        })
    };
    let in_sequence: Vec<Vec<f32>> = cases.iter().map(run).collect();
    for (case, got) in cases.iter().zip(&in_sequence) {
        let fresh = std::thread::scope(|s| s.spawn(|| run(case)).join().unwrap());
        assert_eq!(got, &fresh, "{} m {}", case.0.dtype(), case.2);
    }
}

/// A stacked matrix is its parts' rows: every row dequantizes to the same bits, and the
/// integer matmul gives each part's outputs up to summation order ([`REORDER_TOL`]; bit
/// for bit on AVX2, not on AVX-512) at decode and prefill sizes, in
/// both layouts of every format, with a ragged last part (padding in its group), and
/// with f16 and f32 metadata mixed.
#[test]
fn stacked_matrices_give_their_parts_outputs() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let cols = 512;
    let heights = [16, 8, 9];
    let isa = Isa::best();
    for dtype in BLOCK_DTYPES {
        let parts_of = |layout: usize, rng: &mut rand::rngs::StdRng| -> Vec<PackedWeights> {
            heights
                .iter()
                .filter_map(|&rows| {
                    let data: Vec<f32> = (0..rows * cols)
                        .map(|_| rng.random_range(-1.0..1.0))
                        .collect();
                    layouts(dtype, (rows, cols), &data).into_iter().nth(layout)
                })
                .collect()
        };
        for layout in 0..2 {
            let mut parts = parts_of(layout, &mut rng);
            if parts.len() < heights.len() {
                continue; // no interleaved layout for this format
            }
            // f16 and f32 metadata mixed (a format's parts share any other kind).
            if matches!(parts[1].meta, Meta::F16 { .. } | Meta::F32 { .. }) {
                if let Some(p) = other_width(&parts[1]) {
                    parts[1] = p;
                }
            }
            let at = format!("{dtype} {:?}", parts[0].layout);
            let refs: Vec<&PackedWeights> = parts.iter().collect();
            let s = PackedWeights::stack(&refs).unwrap();
            assert_eq!(s.rows(), heights.iter().sum::<usize>(), "{at}");
            let (mut want, mut got) = (vec![0f32; cols], vec![f32::NAN; cols]);
            let mut r0 = 0;
            for p in &parts {
                for r in 0..p.rows() {
                    p.dequantize_row(r, &mut want);
                    s.dequantize_row(r0 + r, &mut got);
                    assert_eq!(want, got, "{at}: row {r} of a part at {r0}");
                }
                r0 += p.rows();
            }
            for m in [1, 3, 20] {
                let x: Vec<f32> = (0..m * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
                let n = s.rows();
                let y = apply(&x, (m, cols, n), |x, y| qmatmul_int8(isa, 2, &s, x, y));
                let mut r0 = 0;
                for p in &parts {
                    let yp = apply(&x, (m, cols, p.rows()), |x, y| {
                        qmatmul_int8(isa, 2, p, x, y)
                    });
                    for i in 0..m {
                        assert_reordered_sum(
                            &y[i * n + r0..i * n + r0 + p.rows()],
                            &yp[i * p.rows()..(i + 1) * p.rows()],
                            &format!("{at}: m = {m}, part at {r0}"),
                        );
                    }
                    r0 += p.rows();
                }
            }
        }
    }
}

/// Weights packed into large-page chunks (`tessera serve`'s default) are the same
/// weights: every format and layout, alone and stacked, dequantizes to the same values
/// and multiplies to the same outputs as when packed into plain heap memory.
#[test]
fn weights_in_large_page_chunks_are_the_same_weights() {
    use tessera_core::huge;
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let (rows, cols) = (24, 512);
    let packed = |on: bool, data: &[f32], dtype: DType| {
        huge::with_large_pages(on, || {
            let alone = layouts(dtype, (rows, cols), data);
            let stacked: Vec<PackedWeights> = alone
                .iter()
                .map(|p| PackedWeights::stack(&[p, p]).unwrap())
                .collect();
            alone.into_iter().chain(stacked).collect::<Vec<_>>()
        })
    };
    let x: Vec<f32> = (0..3 * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
    for dtype in BLOCK_DTYPES {
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        for (heap, chunked) in packed(false, &data, dtype)
            .iter()
            .zip(&packed(true, &data, dtype))
        {
            let at = format!("{dtype} {:?}, {} rows", heap.layout, heap.rows());
            assert!(chunked.in_large_pages() && !heap.in_large_pages(), "{at}");
            let (mut want, mut got) = (vec![0f32; cols], vec![f32::NAN; cols]);
            for r in 0..heap.rows() {
                heap.dequantize_row(r, &mut want);
                chunked.dequantize_row(r, &mut got);
                assert_eq!(want, got, "{at}: row {r}");
            }
            let n = heap.rows();
            let mul = |w: &PackedWeights| {
                apply(&x, (3, cols, n), |x, y| {
                    qmatmul_int8(Isa::best(), 2, w, x, y)
                })
            };
            assert_reordered_sum(&mul(chunked), &mul(heap), &at);
        }
    }
}

/// What cannot stack is an error, not a wrong matrix.
#[test]
fn mismatched_matrices_do_not_stack() {
    let data = vec![0.5f32; 9 * 64];
    let q4 = |rows| {
        PackedWeights::interleaved(
            &QuantMatrix::<BlockQ4_0>::quantize(rows, 64, &data[..rows * 64]).unwrap(),
        )
        .unwrap()
    };
    let q8 =
        PackedWeights::new(&QuantMatrix::<BlockQ8_0>::quantize(8, 64, &data[..8 * 64]).unwrap());
    let wide = PackedWeights::interleaved(
        &QuantMatrix::<BlockQ4_0>::quantize(8, 32, &data[..8 * 32]).unwrap(),
    )
    .unwrap();
    assert!(PackedWeights::stack(&[]).is_err());
    assert!(PackedWeights::stack(&[&q4(8), &q8]).is_err(), "formats");
    assert!(PackedWeights::stack(&[&q4(8), &wide]).is_err(), "K");
    assert!(
        PackedWeights::stack(&[&q4(9), &q4(8)]).is_err(),
        "a padded group inside"
    );
    assert_eq!(PackedWeights::stack(&[&q4(8), &q4(9)]).unwrap().rows(), 17);
}

/// A batching step over weights larger than a thread's L2 runs all its activation rows
/// in one block (`act_block_rows`): the same outputs as the scalar kernel, for row
/// counts that fill one pass, several, and part of one. Skipped (and said) where the
/// host reports no L2 size.
#[test]
fn weights_past_the_l2_give_the_same_outputs() {
    let Some(l2) = tessera_core::CacheSizes::get().l2 else {
        eprintln!("skipped: this host reports no L2 size, so no block covers every row");
        return;
    };
    let k = 256;
    // Q8_0: 34 bytes a block; past the L2 on each of two threads.
    let rows = (3 * l2 / (k / QK * 34)).next_multiple_of(16) + 3;
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let data: Vec<f32> = (0..rows * k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let layouts = layouts(DType::Q8_0, (rows, k), &data);
    let packed = layouts.last().unwrap();
    assert!(
        packed.size_bytes() > 2 * l2,
        "{} bytes",
        packed.size_bytes()
    );
    for m in [9, 16, 27] {
        let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let want = apply(&x, (m, k, rows), |x, y| {
            qmatmul_int8(Isa::Scalar, 1, &layouts[0], x, y)
        });
        let scale: f32 = x.iter().map(|v| v.abs()).sum::<f32>() / m as f32;
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            for threads in [1, 2] {
                let got = apply(&x, (m, k, rows), |x, y| {
                    qmatmul_int8(isa, threads, packed, x, y)
                });
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= REORDER_TOL as f32 * scale,
                        "{isa} m {m} threads {threads} output {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

/// A batching step whose outputs outgrow a thread's L2 asks for its output lines ahead
/// of the stores (`prefetch_outputs`): outputs against float64 over the dequantized
/// weights and the activations as quantized (`QuantActs::dequantized`, the values the
/// integer kernels multiply exactly), on every ISA the host has, 1 and 2 threads, with
/// a ragged last weight-row group. Skipped (and said) where the host reports no L2.
#[test]
fn outputs_past_the_l2_are_right() {
    /// Relative to Σ|w·x|: the kernels' exact integer sums meet f32 only in each
    /// block's scale product and the running sum over K/32 blocks.
    const F32_FINISH_TOL: f64 = 1e-5;
    let caches = tessera_core::CacheSizes::get();
    let Some(l2) = caches.l2 else {
        eprintln!("skipped: this host reports no L2 size, so no output set outgrows it");
        return;
    };
    let (m, k) = (16, 64);
    // Each of two threads writes m × rows/2 outputs of 4 bytes: past the L2.
    let rows = (l2 / (2 * m)).next_multiple_of(16) + 16 + 5;
    assert!(super::super::prefetch_outputs(
        m,
        m * (rows / 2) * 4,
        caches
    ));
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let data: Vec<f32> = (0..rows * k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let packed = layouts(DType::Q8_0, (rows, k), &data).pop().unwrap();
    let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let xq: Vec<Vec<f64>> = x
        .chunks(k)
        .map(|r| QuantActs::with_scales(r, packed.offset(), ActScales::PerBlock).dequantized(k))
        .collect();
    let mut w = vec![0f32; k];
    let want: Vec<(f64, f64)> = (0..rows)
        .flat_map(|r| {
            packed.dequantize_row(r, &mut w);
            let w: Vec<f64> = w.iter().map(|&v| v as f64).collect();
            xq.iter()
                .map(|a| {
                    let dot = a.iter().zip(&w).map(|(a, w)| a * w).sum::<f64>();
                    let mag = a.iter().zip(&w).map(|(a, w)| (a * w).abs()).sum::<f64>();
                    (dot, mag)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
        for threads in [1, 2] {
            let got = apply(&x, (m, k, rows), |x, y| {
                qmatmul_int8(isa, threads, &packed, x, y)
            });
            for i in 0..m {
                for r in 0..rows {
                    let (g, (dot, mag)) = (got[i * rows + r] as f64, want[r * m + i]);
                    assert!(
                        (g - dot).abs() <= F32_FINISH_TOL * mag.max(f64::MIN_POSITIVE),
                        "{isa} threads {threads} ({i}, {r}): {g} vs {dot}"
                    );
                }
            }
        }
    }
}
