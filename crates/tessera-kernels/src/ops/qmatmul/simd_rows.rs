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
    // SAFETY: forwarded contract (every arm); the slice patterns fix the row count.
    unsafe {
        match x {
            [a] => dots_m::<Zmm, B, 1, 2>(w, [a], out),
            [a, b] => dots_m::<Zmm, B, 2, 2>(w, [a, b], out),
            [a, b, c] => dots_m::<Zmm, B, 3, 2>(w, [a, b, c], out),
            [a, b, c, d] => dots_m::<Zmm, B, 4, 2>(w, [a, b, c, d], out),
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
