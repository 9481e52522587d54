//! The small-M f32-activation kernel (M ≤ `F32_BATCH_M` rows, a decode or a batching
//! step): each block's weights are expanded to f32 vectors with the format's own
//! arithmetic ([`Expand`], bit-identical to `dequantize` for the ggml formats) and
//! FMA'd into every activation row. Written once over the vector width ([`Lanes`]) and
//! instantiated for AVX2, AVX-512 and NEON.
//!
//! Accumulators: AVX2 keeps four per row for one or two rows (four independent FMA
//! chains), two for three or four rows (R·A accumulators + a weight + an activation ≤
//! 16 ymm); AVX-512 two per row; NEON four (32 q registers; a chunk is 8 vectors). Each activation-row count is its own instance, loops
//! fully unrolled. No closures call intrinsics here: a closure is not compiled with its
//! caller's `#[target_feature]`s, so its intrinsics became calls (Q4_0 ran 20× slower
//! that way). Before the explicit kernels, AVX2 machines ran the portable loop
//! (dequantize a block to a buffer, then FMA): 1×49152×576 Q4_0 at 5–8 % of DRAM.

use super::expand::Expand;
use crate::quant::{BlockFormat, QK};
use crate::quant::{BlockInt4G128, BlockInt4G32, BlockInt4G64};
use crate::quant::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::quant::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use crate::simd::lanes::Lanes;
#[cfg(target_arch = "aarch64")]
use crate::simd::lanes::Neon;
#[cfg(target_arch = "x86_64")]
use crate::simd::lanes::{Ymm, Zmm};
use std::any::TypeId;
use tessera_core::Isa;

/// Runs the kernel of `isa` (AVX2, AVX-512 or NEON) for the formats it knows; false
/// otherwise.
///
/// # Safety
/// `isa` is available. `x` holds 1..=M_CHUNK rows of at least `w.len()·B::BLOCK` floats
/// and `out` as many elements.
pub(super) unsafe fn row_dots<B: BlockFormat>(
    isa: Isa,
    w: &[B],
    x: &[&[f32]],
    out: &mut [f32],
) -> bool {
    macro_rules! cast_run {
        ($($t:ty),*) => {$(
            if TypeId::of::<B>() == TypeId::of::<$t>() {
                // SAFETY: B is $t (same TypeId), so the slice cast is an identity.
                let w = unsafe { std::slice::from_raw_parts(w.as_ptr() as *const $t, w.len()) };
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: forwarded contract; `isa` is available.
                    Isa::Avx512 => unsafe { dots_avx512::<$t>(w, x, out) },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as above.
                    Isa::Avx2 => unsafe { dots_avx2::<$t>(w, x, out) },
                    #[cfg(target_arch = "aarch64")]
                    // SAFETY: as above.
                    Isa::Neon => unsafe { dots_neon::<$t>(w, x, out) },
                    _ => return false,
                }
                return true;
            }
        )*};
    }
    cast_run!(BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0);
    cast_run!(BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K);
    cast_run!(BlockInt4G32, BlockInt4G64, BlockInt4G128);
    false
}

/// The 8-lane instance.
///
/// # Safety
/// AVX2, FMA and F16C; as [`row_dots`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_avx2<B: Expand>(w: &[B], x: &[&[f32]], out: &mut [f32]) {
    // SAFETY: forwarded contract (every arm); the slice patterns fix the row count.
    unsafe {
        match x {
            [a] => dots_m::<Ymm, B, 1, 4>(w, [a], out),
            [a, b] => dots_m::<Ymm, B, 2, 4>(w, [a, b], out),
            [a, b, c] => dots_m::<Ymm, B, 3, 2>(w, [a, b, c], out),
            [a, b, c, d] => dots_m::<Ymm, B, 4, 2>(w, [a, b, c, d], out),
            _ => unreachable!("1..=M_CHUNK activation rows"),
        }
    }
}

/// The 16-lane instance.
///
/// # Safety
/// AVX-512F/BW/VL/DQ, FMA and F16C; as [`row_dots`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn dots_avx512<B: Expand>(w: &[B], x: &[&[f32]], out: &mut [f32]) {
    // SAFETY: forwarded contract.
    unsafe { dots_wide::<Zmm, B>(w, x, out) }
}

/// The 16-lane instance's body (AVX-512's; `Soft<16>`'s in the tests): two
/// accumulators per row.
///
/// # Safety
/// `L`'s features, L::N = 16; as [`row_dots`].
#[cfg(any(target_arch = "x86_64", test))]
#[inline(always)]
unsafe fn dots_wide<L: Lanes, B: Expand>(w: &[B], x: &[&[f32]], out: &mut [f32]) {
    // SAFETY: forwarded contract (every arm); the slice patterns fix the row count.
    unsafe {
        match x {
            [a] => dots_m::<L, B, 1, 2>(w, [a], out),
            [a, b] => dots_m::<L, B, 2, 2>(w, [a, b], out),
            [a, b, c] => dots_m::<L, B, 3, 2>(w, [a, b, c], out),
            [a, b, c, d] => dots_m::<L, B, 4, 2>(w, [a, b, c, d], out),
            _ => unreachable!("1..=M_CHUNK activation rows"),
        }
    }
}

/// The 4-lane instance.
///
/// # Safety
/// NEON; as [`row_dots`].
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn dots_neon<B: Expand>(w: &[B], x: &[&[f32]], out: &mut [f32]) {
    // SAFETY: forwarded contract (every arm); the slice patterns fix the row count.
    unsafe {
        match x {
            [a] => dots_m::<Neon, B, 1, 4>(w, [a], out),
            [a, b] => dots_m::<Neon, B, 2, 4>(w, [a, b], out),
            [a, b, c] => dots_m::<Neon, B, 3, 4>(w, [a, b, c], out),
            [a, b, c, d] => dots_m::<Neon, B, 4, 4>(w, [a, b, c, d], out),
            _ => unreachable!("1..=M_CHUNK activation rows"),
        }
    }
}

/// M activation rows, A accumulators per row.
///
/// # Safety
/// `L`'s features; as [`row_dots`].
#[inline(always)]
unsafe fn dots_m<L: Lanes, B: Expand, const M: usize, const A: usize>(
    w: &[B],
    x: [&[f32]; M],
    out: &mut [f32],
) {
    let k = w.len() * B::BLOCK;
    assert!(x.iter().all(|r| r.len() >= k) && out.len() >= M);
    const { assert!(B::BLOCK == B::STEPS * QK && QK.is_multiple_of(L::N)) };
    let mut xp = [std::ptr::null::<f32>(); M];
    for i in 0..M {
        xp[i] = x[i].as_ptr();
    }
    // SAFETY: L's features per the contract.
    let mut acc = [[unsafe { L::zero() }; A]; M];
    for (b, blk) in w.iter().enumerate() {
        let prep = blk.prepare();
        for c in 0..B::STEPS {
            let base = b * B::BLOCK + c * QK;
            for j in 0..QK / L::N {
                // SAFETY: c < STEPS, j·N < 32; base + (j + 1)·N ≤ k ≤ each x row's
                // length (asserted above); L's features per the contract.
                unsafe {
                    let wv = blk.part::<L>(&prep, c, j * L::N);
                    for i in 0..M {
                        let v = L::load(xp[i].add(base + j * L::N));
                        acc[i][j % A] = L::fmadd(wv, v, acc[i][j % A]);
                    }
                }
            }
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        let mut v = a[0];
        for part in &a[1..] {
            // SAFETY: L's features per the contract.
            v = unsafe { L::add(v, *part) };
        }
        // SAFETY: as above.
        *o = unsafe { L::sum(v) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QuantMatrix;
    use crate::simd::lanes::Soft;
    use rand::{Rng, SeedableRng};

    /// AVX-512's instance ([`dots_wide`]) in software lanes against float64 dots with
    /// the dequantized weights, 1–4 activation rows, every format of the kernel.
    fn check<B: Expand>(rng: &mut impl Rng, seed: u64) {
        let k = 2 * B::BLOCK;
        let x: Vec<f32> = (0..3 * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let w = QuantMatrix::<B>::quantize(3, k, &x).expect("quantize");
        let acts: Vec<Vec<f32>> = (0..4)
            .map(|_| (0..k).map(|_| rng.random_range(-1.0..1.0)).collect())
            .collect();
        for r in 0..3 {
            let mut wr = vec![0f32; k];
            w.dequantize_row(r, &mut wr);
            for m in 1..=4 {
                let rows: Vec<&[f32]> = acts[..m].iter().map(|a| a.as_slice()).collect();
                // Each dot and Σ|w·x|, the scale the op's tolerance is relative to.
                let want: Vec<(f64, f64)> = rows
                    .iter()
                    .map(|a| {
                        let terms = a.iter().zip(&wr).map(|(&a, &b)| a as f64 * b as f64);
                        terms.fold((0.0, 0.0), |(s, t), p| (s + p, t + p.abs()))
                    })
                    .collect();
                let mut out = vec![f32::NAN; m];
                // SAFETY: Soft needs no CPU feature; m ≤ M_CHUNK rows of k floats.
                unsafe { dots_wide::<Soft<16>, B>(w.row(r), &rows, &mut out) };
                let err = out
                    .iter()
                    .zip(&want)
                    .map(|(&g, &(e, scale))| (g as f64 - e).abs() / scale)
                    .fold(0.0, |worst: f64, x| {
                        if x.is_nan() {
                            f64::INFINITY
                        } else {
                            worst.max(x)
                        }
                    });
                assert!(
                    err <= super::super::TOL.rel,
                    "{} row {r}, {m} rows: error {err:.2e} (seed {seed})",
                    B::DTYPE
                );
            }
        }
    }

    #[test]
    fn wide_instance_matches_f64_in_software_lanes() {
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        check::<BlockQ4_0>(&mut rng, seed);
        check::<BlockQ4_1>(&mut rng, seed);
        check::<BlockQ5_0>(&mut rng, seed);
        check::<BlockQ5_1>(&mut rng, seed);
        check::<BlockQ8_0>(&mut rng, seed);
        check::<BlockQ2K>(&mut rng, seed);
        check::<BlockQ3K>(&mut rng, seed);
        check::<BlockQ4K>(&mut rng, seed);
        check::<BlockQ5K>(&mut rng, seed);
        check::<BlockQ6K>(&mut rng, seed);
        check::<BlockQ8K>(&mut rng, seed);
        check::<BlockInt4G32>(&mut rng, seed);
        check::<BlockInt4G64>(&mut rng, seed);
        check::<BlockInt4G128>(&mut rng, seed);
    }
}
