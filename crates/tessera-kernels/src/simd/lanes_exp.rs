//! e^x written once over [`Lanes`], for softmax rows (flash attention, paged decode
//! attention, the softmax op) and the sigmoid of SiLU, SwiGLU and GELU, on AVX-512,
//! AVX2 and NEON.
//!
//! Why not the portable [`super::exp`]: Rust never contracts its mul+add pairs into FMA,
//! and its range fix-ups are compare-and-blend pairs, ~30 operations per vector; here
//! the Cody–Waite reduction and the polynomial are FMAs and the range is handled by two
//! clamps, ~17. The last step is the width's [`Lanes::mul_exp2`]: AVX-512's `vscalefps`
//! builds 2ⁿ with exact overflow and gradual underflow and needs no clamp of n (the
//! zmm-only loops this replaced used it too; their commits record the same-run timings).
//!
//! Range: on AVX2 and NEON x is clamped to [−88, 89] and n = round(x·log₂e) to
//! [−127, 127], so 2ⁿ is always an exponent field: e^x underflows to 0 where n reaches
//! −127 (x ≲ −87.7, as FTZ hardware would), and x ≥ 88.73 (n capped, r ≥ 0.7)
//! overflows to +∞ in the final product. On AVX-512 ([`Lanes::SCALEF_EXP`]) x is
//! clamped to [−104, 89] and `vscalefps` underflows gradually and overflows to +∞.
//! A NaN lane stays NaN. Rows are vectors to their end: the last len mod N lanes are
//! one vector ([`Lanes::load_first`]), masked on AVX-512, padded elsewhere.

use super::lanes::Lanes;
use super::{C2, T_HI, T_LO};

const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// Clamp of x from above: past 89, +∞ anyway. From below: −88 where n is clamped to
/// −127 (the result is 0 there); −104 with `vscalefps` (below the least subnormal's log).
const X_HI: f32 = 89.0;
/// Taylor coefficients 1/k!, k = 2..7: degree 7 keeps r up to 0.7 (the top of the
/// range, where a clamped n is capped at 127) within ~5e-7 relative; with n unclamped
/// ([`Lanes::SCALEF_EXP`]) |r| ≤ ln2/2 everywhere and degree 6 suffices (r⁷/7! ≤ 1.2e-7,
/// below one ulp at 1), one FMA fewer.
const C: [f32; 6] = [
    1.0 / 2.0,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
];
/// Vectors in flight per loop step: independent chains overlap their latency.
const GROUP: usize = 4;

/// e^x per lane (see the module docs for the range).
///
/// # Safety
/// The CPU features of `L`.
#[inline(always)]
pub(crate) unsafe fn exp<L: Lanes>(x: L::F) -> L::F {
    // SAFETY: L's features per the caller.
    unsafe {
        let lo = if L::SCALEF_EXP { -104.0 } else { -88.0 };
        let x = L::clamp(x, L::splat_f(lo), L::splat_f(X_HI));
        let mut n = L::round(L::mul(x, L::splat_f(std::f32::consts::LOG2_E)));
        if !L::SCALEF_EXP {
            n = L::clamp(n, L::splat_f(-127.0), L::splat_f(127.0));
        }
        let r = L::fmadd(n, L::splat_f(-LN2_HI), x);
        let r = L::fmadd(n, L::splat_f(-LN2_LO), r);
        let c = if L::SCALEF_EXP { &C[..5] } else { &C[..] };
        let mut p = L::splat_f(c[c.len() - 1]);
        for &c in c[..c.len() - 1].iter().rev() {
            p = L::fmadd(p, r, L::splat_f(c));
        }
        let one = L::splat_f(1.0);
        p = L::fmadd(p, r, one);
        p = L::fmadd(p, r, one);
        L::mul_exp2(p, n)
    }
}

/// 2^t per lane: the softmax weight of flash attention, whose scores carry log₂e in the
/// query's scale. Against [`exp`]: n = round(t) and f = t − n (exact) replace the
/// multiply by log₂e and the two-step Cody–Waite reduction, the polynomial is degree 5 on
/// |f| ≤ ½ (not 7 on |r| ≤ 0.7) and the clamp of n is the clamp of t: 13 vector
/// operations against 20. NaN stays NaN; −∞ gives 0.
///
/// # Safety
/// The CPU features of `L`.
#[inline(always)]
pub(crate) unsafe fn exp2<L: Lanes>(t: L::F) -> L::F {
    // SAFETY: L's features per the caller.
    unsafe {
        let t = L::clamp(t, L::splat_f(T_LO), L::splat_f(T_HI));
        let n = L::round(t);
        let f = L::fmadd(n, L::splat_f(-1.0), t);
        let mut p = L::splat_f(C2[C2.len() - 1]);
        for &c in C2[..C2.len() - 1].iter().rev() {
            p = L::fmadd(p, f, L::splat_f(c));
        }
        p = L::fmadd(p, f, L::splat_f(1.0));
        L::mul(p, L::exp2_int(n))
    }
}

/// `dst[i] = e^(src[i] − shift)` for i < len, returning the sum; the last len mod N
/// through one padded vector.
///
/// # Safety
/// The CPU features of `L`; `src` readable and `dst` writable for `len` floats (they may
/// be the same buffer).
#[inline(always)]
pub(crate) unsafe fn exp_shifted_sum<L: Lanes>(
    src: *const f32,
    dst: *mut f32,
    len: usize,
    shift: f32,
) -> f32 {
    // SAFETY: forwarded contract.
    unsafe { shifted_sum::<L, false>(src, dst, len, shift) }
}

/// [`exp_shifted_sum`] in base 2: `dst[i] = 2^(src[i] − shift)` through [`exp2`], the
/// tail as there.
///
/// # Safety
/// As [`exp_shifted_sum`].
#[inline(always)]
pub(crate) unsafe fn exp2_shifted_sum<L: Lanes>(
    src: *const f32,
    dst: *mut f32,
    len: usize,
    shift: f32,
) -> f32 {
    // SAFETY: forwarded contract.
    unsafe { shifted_sum::<L, true>(src, dst, len, shift) }
}

/// 2^x with `BASE2`, else e^x (a function, not a closure: a closure's intrinsics may stay
/// out of line, without the caller's target features).
///
/// # Safety
/// The CPU features of `L`.
#[inline(always)]
unsafe fn pow<L: Lanes, const BASE2: bool>(x: L::F) -> L::F {
    // SAFETY: L's features per the caller.
    unsafe {
        if BASE2 {
            exp2::<L>(x)
        } else {
            exp::<L>(x)
        }
    }
}

/// The loop of both: e^ or, with `BASE2`, 2^(x − shift) per element, and the sum.
///
/// # Safety
/// As [`exp_shifted_sum`].
#[inline(always)]
unsafe fn shifted_sum<L: Lanes, const BASE2: bool>(
    src: *const f32,
    dst: *mut f32,
    len: usize,
    shift: f32,
) -> f32 {
    // SAFETY: L's features per the caller; every access is at an offset below len (the
    // tail's through `load_first`/`store_first`).
    unsafe {
        let s = L::splat_f(shift);
        let neg_one = L::splat_f(-1.0);
        let mut acc = [L::zero(); GROUP];
        let mut i = 0;
        while i + L::N * GROUP <= len {
            let mut y = [L::zero(); GROUP];
            for (g, y) in y.iter_mut().enumerate() {
                *y = pow::<L, BASE2>(L::fmadd(s, neg_one, L::load(src.add(i + L::N * g))));
            }
            for (g, (a, &y)) in acc.iter_mut().zip(&y).enumerate() {
                L::store(dst.add(i + L::N * g), y);
                *a = L::add(*a, y);
            }
            i += L::N * GROUP;
        }
        while i + L::N <= len {
            let y = pow::<L, BASE2>(L::fmadd(s, neg_one, L::load(src.add(i))));
            L::store(dst.add(i), y);
            acc[0] = L::add(acc[0], y);
            i += L::N;
        }
        if i < len {
            // The last len − i (< N) as one vector padded with the shift (e^0, no
            // underflow to go through a slow path), the padding kept out of the sum: one
            // exp instead of up to N − 1 scalar ones (a score row's tail, every head).
            let rest = len - i;
            let x = L::load_first(src.add(i), rest, shift);
            let y = pow::<L, BASE2>(L::fmadd(s, neg_one, x));
            L::store_first(dst.add(i), y, rest);
            acc[1] = L::add(acc[1], L::keep_first(y, rest));
        }
        L::sum(L::add(L::add(acc[0], acc[1]), L::add(acc[2], acc[3])))
    }
}

/// `dst[i] = x·σ(a·x + b·x³)·t[i]` with x = `src[i]` and t = `times` (1 without it):
/// SiLU, tanh-GELU, and SwiGLU with its product in the same pass. As x → −∞ the
/// e^… term overflows to +∞ and the result is −0; the last len mod N through one
/// padded vector.
///
/// # Safety
/// The CPU features of `L`; `times`, when given, and `dst` as long as `src`.
#[inline(always)]
pub(crate) unsafe fn x_sigmoid<L: Lanes>(
    src: &[f32],
    arg: super::SigmoidArg,
    times: Option<&[f32]>,
    dst: &mut [f32],
) {
    let len = src.len();
    debug_assert!(dst.len() == len && times.is_none_or(|t| t.len() == len));
    // SAFETY: L's features per the caller; every access is below len.
    unsafe {
        let (neg_a, neg_b, one) = (L::splat_f(-arg.a), L::splat_f(-arg.b), L::splat_f(1.0));
        let mut i = 0;
        while i + L::N <= len {
            let x = L::load(src.as_ptr().add(i));
            // −(a·x + b·x³) as ((−b·x)·x)·x − a·x: with b = 0 no x² (which overflows for
            // |x| > 1.8e19) ever meets the zero.
            let z = L::fmadd(L::mul(L::mul(neg_b, x), x), x, L::mul(neg_a, x));
            let mut y = L::div(x, L::add(one, exp::<L>(z)));
            if let Some(t) = times {
                y = L::mul(y, L::load(t.as_ptr().add(i)));
            }
            L::store(dst.as_mut_ptr().add(i), y);
            i += L::N;
        }
        if i < len {
            // The last len − i (< N) as one vector padded with zeros (whose e^0 and
            // products are finite), only the live lanes stored.
            let rest = len - i;
            let x = L::load_first(src.as_ptr().add(i), rest, 0.0);
            let z = L::fmadd(L::mul(L::mul(neg_b, x), x), x, L::mul(neg_a, x));
            let mut y = L::div(x, L::add(one, exp::<L>(z)));
            if let Some(t) = times {
                y = L::mul(y, L::load_first(t.as_ptr().add(i), rest, 0.0));
            }
            L::store_first(dst.as_mut_ptr().add(i), y, rest);
        }
    }
}

/// Max of `v` skipping NaN (−∞ when empty or all NaN): [`GROUP`] independent vector
/// chains and one horizontal max, the tail one vector padded with −∞.
///
/// # Safety
/// The CPU features of `L`.
#[inline(always)]
pub(crate) unsafe fn max<L: Lanes>(v: &[f32]) -> f32 {
    let (p, len) = (v.as_ptr(), v.len());
    // SAFETY: L's features per the caller; every load is below len.
    unsafe {
        let mut acc = [L::splat_f(f32::NEG_INFINITY); GROUP];
        let mut i = 0;
        while i + L::N * GROUP <= len {
            for (g, a) in acc.iter_mut().enumerate() {
                *a = L::max_keep(L::load(p.add(i + L::N * g)), *a);
            }
            i += L::N * GROUP;
        }
        while i + L::N <= len {
            acc[0] = L::max_keep(L::load(p.add(i)), acc[0]);
            i += L::N;
        }
        if i < len {
            let tail = L::load_first(p.add(i), len - i, f32::NEG_INFINITY);
            acc[1] = L::max_keep(tail, acc[1]);
        }
        let m = acc.iter().fold(acc[0], |m, &a| L::max_keep(a, m));
        L::hmax(m)
    }
}

/// [`exp_shifted_sum`] on AVX2 (`Ymm`).
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `src.len() == dst.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exp_shifted_sum_ymm(src: &[f32], shift: f32, dst: &mut [f32]) -> f32 {
    debug_assert_eq!(src.len(), dst.len());
    let len = src.len().min(dst.len());
    // SAFETY: AVX2/FMA/F16C per the caller; both slices hold len floats.
    unsafe { exp_shifted_sum::<super::lanes::Ymm>(src.as_ptr(), dst.as_mut_ptr(), len, shift) }
}

/// [`exp_shifted_sum`] on NEON.
#[cfg(target_arch = "aarch64")]
pub(crate) fn exp_shifted_sum_neon(src: &[f32], shift: f32, dst: &mut [f32]) -> f32 {
    let len = src.len().min(dst.len());
    // SAFETY: NEON is baseline on aarch64; both slices hold len floats.
    unsafe { exp_shifted_sum::<super::lanes::Neon>(src.as_ptr(), dst.as_mut_ptr(), len, shift) }
}

/// [`x_sigmoid`] on AVX2 (`Ymm`).
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `times`, when given, and `dst` as long as `src`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn x_sigmoid_ymm(
    src: &[f32],
    arg: super::SigmoidArg,
    times: Option<&[f32]>,
    dst: &mut [f32],
) {
    // SAFETY: AVX2/FMA/F16C and the lengths per the caller.
    unsafe { x_sigmoid::<super::lanes::Ymm>(src, arg, times, dst) }
}

/// [`x_sigmoid`] on AVX-512 (`Zmm`).
///
/// # Safety
/// The CPU supports AVX-512F/BW/VL/DQ (with AVX2, FMA and F16C: `Isa::Avx512`);
/// `times`, when given, and `dst` as long as `src`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
pub(crate) unsafe fn x_sigmoid_zmm(
    src: &[f32],
    arg: super::SigmoidArg,
    times: Option<&[f32]>,
    dst: &mut [f32],
) {
    // SAFETY: the AVX-512 features and the lengths per the caller.
    unsafe { x_sigmoid::<super::lanes::Zmm>(src, arg, times, dst) }
}

/// [`exp_shifted_sum`] on AVX-512 (`Zmm`), from `src` into `dst`.
///
/// # Safety
/// As [`x_sigmoid_zmm`] for the CPU; `src.len() == dst.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
pub(crate) unsafe fn exp_shifted_sum_zmm(src: &[f32], shift: f32, dst: &mut [f32]) -> f32 {
    debug_assert_eq!(src.len(), dst.len());
    let len = src.len().min(dst.len());
    // SAFETY: the AVX-512 features per the caller; both slices hold len floats.
    unsafe { exp_shifted_sum::<super::lanes::Zmm>(src.as_ptr(), dst.as_mut_ptr(), len, shift) }
}

/// [`max`] on AVX-512 (`Zmm`).
///
/// # Safety
/// As [`x_sigmoid_zmm`] for the CPU.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
pub(crate) unsafe fn max_zmm(v: &[f32]) -> f32 {
    // SAFETY: the AVX-512 features per the caller.
    unsafe { max::<super::lanes::Zmm>(v) }
}

/// [`x_sigmoid`] on NEON; `times`, when given, and `dst` as long as `src` (checked by the
/// caller).
#[cfg(target_arch = "aarch64")]
pub(crate) fn x_sigmoid_neon(
    src: &[f32],
    arg: super::SigmoidArg,
    times: Option<&[f32]>,
    dst: &mut [f32],
) {
    // SAFETY: NEON is baseline on aarch64; the lengths per the caller.
    unsafe { x_sigmoid::<super::lanes::Neon>(src, arg, times, dst) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Relative error allowed where e^x is a normal f32: the polynomial's truncation at
    /// r = 0.7 (~5e-7) plus a few roundings.
    const TOL: f64 = 1e-6;

    /// A width's `x_sigmoid` over slices.
    type XSigmoid = fn(&[f32], crate::simd::SigmoidArg, Option<&[f32]>, &mut [f32]);

    /// One width's entries under test.
    struct Width {
        name: &'static str,
        exp_sum: fn(&[f32], f32, &mut [f32]) -> f32,
        exp2_sum: fn(&[f32], f32, &mut [f32]) -> f32,
        max: fn(&[f32]) -> f32,
        x_sigmoid: XSigmoid,
    }

    /// Flash attention's base-2 sums on zmm (the ops call them through `Zmm`'s
    /// `exp2_shifted_sum`; the other zmm entries are the crate's own wrappers).
    ///
    /// # Safety
    /// AVX-512 (`Isa::Avx512`); equal lengths (checked).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
    unsafe fn zmm_exp2_sum(s: &[f32], shift: f32, d: &mut [f32]) -> f32 {
        assert_eq!(s.len(), d.len());
        // SAFETY: the features per the caller; equal lengths.
        unsafe {
            exp2_shifted_sum::<crate::simd::lanes::Zmm>(s.as_ptr(), d.as_mut_ptr(), s.len(), shift)
        }
    }

    /// This host's widths: AVX2 if the CPU has it, NEON on Arm.
    #[cfg(target_arch = "x86_64")]
    fn widths() -> Vec<Width> {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn ymm_max(v: &[f32]) -> f32 {
            // SAFETY: AVX2 (with FMA and F16C) per the caller.
            unsafe { max::<crate::simd::lanes::Ymm>(v) }
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn ymm_exp2_sum(s: &[f32], shift: f32, d: &mut [f32]) -> f32 {
            assert_eq!(s.len(), d.len());
            // SAFETY: AVX2 (with FMA and F16C) per the caller; equal lengths.
            unsafe {
                exp2_shifted_sum::<crate::simd::lanes::Ymm>(
                    s.as_ptr(),
                    d.as_mut_ptr(),
                    s.len(),
                    shift,
                )
            }
        }
        if !tessera_core::Isa::Avx2.is_available() {
            println!("lanes_exp: no AVX2 on this CPU, nothing to check here");
            return Vec::new();
        }
        let mut widths = Vec::new();
        if tessera_core::Isa::Avx512.is_available() {
            // The closures' SAFETY: AVX-512 (`Isa::Avx512`) was detected just above; the
            // tests pass equal lengths.
            widths.push(Width {
                name: "zmm",
                // SAFETY: see above.
                exp_sum: |s, shift, d| unsafe { exp_shifted_sum_zmm(s, shift, d) },
                // SAFETY: see above.
                exp2_sum: |s, shift, d| unsafe { zmm_exp2_sum(s, shift, d) },
                // SAFETY: see above.
                max: |v| unsafe { max_zmm(v) },
                // SAFETY: see above.
                x_sigmoid: |s, a, t, d| unsafe { x_sigmoid_zmm(s, a, t, d) },
            });
        } else {
            println!("lanes_exp: no AVX-512 on this CPU, its instances not checked here");
        }
        // The closures' SAFETY: AVX2 (with FMA and F16C) was detected just above; the
        // tests pass equal lengths.
        widths.push(Width {
            name: "ymm",
            // SAFETY: see above.
            exp_sum: |s, shift, d| unsafe { exp_shifted_sum_ymm(s, shift, d) },
            // SAFETY: see above.
            exp2_sum: |s, shift, d| unsafe { ymm_exp2_sum(s, shift, d) },
            // SAFETY: see above.
            max: |v| unsafe { ymm_max(v) },
            // SAFETY: see above.
            x_sigmoid: |s, a, t, d| unsafe { x_sigmoid_ymm(s, a, t, d) },
        });
        widths
    }

    #[cfg(target_arch = "aarch64")]
    fn widths() -> Vec<Width> {
        vec![Width {
            name: "neon",
            exp_sum: exp_shifted_sum_neon,
            exp2_sum: |s, shift, d| {
                assert_eq!(s.len(), d.len());
                // SAFETY: NEON is baseline on aarch64; equal lengths.
                unsafe {
                    exp2_shifted_sum::<crate::simd::lanes::Neon>(
                        s.as_ptr(),
                        d.as_mut_ptr(),
                        s.len(),
                        shift,
                    )
                }
            },
            // SAFETY: NEON is baseline on aarch64.
            max: |v| unsafe { max::<crate::simd::lanes::Neon>(v) },
            x_sigmoid: x_sigmoid_neon,
        }]
    }

    /// Every lane against f64's exp: random x over the whole range, the range's edges
    /// (underflow to 0, overflow to +∞, ±∞, NaN), ragged lengths for the scalar tail.
    #[test]
    fn exp_matches_f64_over_the_range() {
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut xs: Vec<f32> = (0..4093).map(|_| rng.random_range(-104.0..92.0)).collect();
        xs.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            0.346,
            -0.347,
            88.0,
            88.03,
            88.5,
            88.72,
            88.73,
            89.0,
            100.0,
            -87.3,
            -87.33,
            -87.5,
            -87.7,
            -88.0,
            -100.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN,
        ]);
        for Width {
            name, exp_sum: f, ..
        } in widths()
        {
            for len in [xs.len(), 37, 8, 3, 0] {
                let src = &xs[xs.len() - len..];
                let mut dst = vec![f32::NAN; len];
                let sum = f(src, 0.0, &mut dst);
                let mut want_sum = 0.0f64;
                for (&x, &y) in src.iter().zip(&dst) {
                    let want = (x as f64).exp();
                    let ctx = format!("{name}: e^{x} = {y}, want {want:e} (seed {seed})");
                    if x.is_nan() {
                        assert!(y.is_nan(), "{ctx}");
                    } else if want > f32::MAX as f64 * (1.0 + TOL) {
                        assert_eq!(y, f32::INFINITY, "{ctx}");
                    } else if want < f32::MIN_POSITIVE as f64 {
                        // Below the normal range: 0 or the (less precise) subnormal.
                        assert!((0.0..=f32::MIN_POSITIVE).contains(&y), "{ctx}");
                    } else {
                        assert!(((y as f64 - want) / want).abs() <= TOL, "{ctx}");
                    }
                    want_sum += y as f64;
                }
                if want_sum.is_finite() {
                    let err = (sum as f64 - want_sum).abs() / want_sum.max(f64::MIN_POSITIVE);
                    assert!(
                        err <= 1e-5,
                        "{name}: sum {sum} against {want_sum} (seed {seed})"
                    );
                }
            }
        }
    }

    /// 2^(x − shift) per lane against f64, as flash attention calls it: random scores
    /// below a shift (the running max) across the range where the weight is normal and
    /// past it (underflow to 0), the max itself (exactly 1), −∞ (masked keys: 0), NaN,
    /// and ragged lengths for the scalar tail; the sum against the f64 sum of the lanes.
    #[test]
    fn exp2_weights_match_f64() {
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let shift = rng.random_range(-20.0f32..20.0);
        let mut xs: Vec<f32> = (0..4093)
            .map(|_| shift - rng.random_range(0.0..140.0))
            .collect();
        xs.extend([
            shift,
            shift - 0.5,
            shift - 126.0,
            shift - 127.0,
            f32::NEG_INFINITY,
        ]);
        for Width {
            name, exp2_sum: f, ..
        } in widths()
        {
            for len in [xs.len(), 37, 8, 3, 0] {
                let src = &xs[xs.len() - len..];
                let mut dst = vec![f32::NAN; len];
                let sum = f(src, shift, &mut dst);
                let mut want_sum = 0.0f64;
                for (&x, &y) in src.iter().zip(&dst) {
                    let want = ((x - shift) as f64).exp2();
                    let ctx =
                        format!("{name}: 2^({x} − {shift}) = {y}, want {want:e} (seed {seed})");
                    if want < f32::MIN_POSITIVE as f64 {
                        assert!((0.0..=f32::MIN_POSITIVE).contains(&y), "{ctx}");
                    } else {
                        assert!(((y as f64 - want) / want).abs() <= 4e-7, "{ctx}");
                    }
                    want_sum += y as f64;
                }
                let err = (sum as f64 - want_sum).abs() / want_sum.max(f64::MIN_POSITIVE);
                assert!(
                    err <= 1e-5,
                    "{name}: sum {sum} against {want_sum} (seed {seed})"
                );
            }
            let mut nan = [0.0f32, f32::NAN, -1.0];
            assert!(f(&nan.clone(), 0.0, &mut nan).is_nan(), "{name}: NaN lost");
            assert!(
                nan[1].is_nan() && nan[0] == 1.0 && nan[2] == 0.5,
                "{name}: {nan:?}"
            );
        }
    }

    /// The row max equals f32::max's fold (max is exact, so equality is the contract):
    /// NaN anywhere is skipped, −∞ and all-NaN rows give −∞, ragged lengths reach the
    /// scalar tail, and the largest value may sit in any lane.
    #[test]
    fn row_max_skips_nan_at_every_length() {
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for Width { name, max: f, .. } in widths() {
            for len in 0..70 {
                for trial in 0..4 {
                    let mut v: Vec<f32> = (0..len).map(|_| rng.random_range(-50.0..50.0)).collect();
                    for x in v.iter_mut() {
                        match rng.random_range(0..10) {
                            0 => *x = f32::NAN,
                            1 if trial > 1 => *x = f32::NEG_INFINITY,
                            _ => {}
                        }
                    }
                    if trial == 3 {
                        v.iter_mut().for_each(|x| *x = f32::NAN);
                    }
                    let want = v.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    let got = f(&v);
                    assert!(
                        got == want,
                        "{name}: max {got}, want {want}: {v:?} (seed {seed})"
                    );
                }
            }
        }
    }

    /// x·σ(a·x + b·x³)·t against f64 for SiLU and tanh-GELU, with and without the
    /// product, over the range and its edges (±∞, NaN, overflow of the exp to −0) and
    /// ragged lengths for the scalar tail. Where e^z leaves f32's range (z > 88) the
    /// result may flush to ±0 (|x·σ| < 1e-36 there). The allowed relative error grows with |z|, the
    /// sigmoid's argument: its f32 rounding (a few ulp) becomes |z|·ulp in e^z.
    #[test]
    fn x_sigmoid_matches_f64() {
        use crate::simd::SigmoidArg;
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut xs: Vec<f32> = (0..1021).map(|_| rng.random_range(-100.0..100.0)).collect();
        xs.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            3.0,
            -3.0,
            88.8,
            -88.8,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN,
        ]);
        let ts: Vec<f32> = (0..xs.len()).map(|_| rng.random_range(-4.0..4.0)).collect();
        let c = (2.0 / std::f64::consts::PI).sqrt() as f32;
        let args = [
            ("silu", SigmoidArg { a: 1.0, b: 0.0 }),
            (
                "gelu",
                SigmoidArg {
                    a: 2.0 * c,
                    b: 2.0 * c * 0.044715,
                },
            ),
        ];
        for Width {
            name, x_sigmoid: f, ..
        } in widths()
        {
            for (op, arg) in args {
                for with_t in [false, true] {
                    // 8 and 16: the edge values in vector lanes of every width, not the tail.
                    for len in [xs.len(), 37, 16, 8, 7, 0] {
                        let (src, t) = (&xs[xs.len() - len..], &ts[ts.len() - len..]);
                        let mut dst = vec![f32::NAN; len];
                        f(src, arg, with_t.then_some(t), &mut dst);
                        for ((&x, &tv), &y) in src.iter().zip(t).zip(&dst) {
                            let xd = x as f64;
                            let z = -(arg.a as f64 * xd + arg.b as f64 * xd * xd * xd);
                            let tv = if with_t { tv as f64 } else { 1.0 };
                            let want = xd / (1.0 + z.exp()) * tv;
                            let ctx = format!(
                                "{name} {op}: x {x}, t {tv}: {y}, want {want:e} (seed {seed})"
                            );
                            if want.is_nan() {
                                assert!(y.is_nan(), "{ctx}");
                            } else if want.abs() < f32::MIN_POSITIVE as f64 || z > 88.0 {
                                // e^z past f32's range: the result is ±0 or the tiny value.
                                assert!((y as f64).abs() <= want.abs() * 1.01, "{ctx}");
                            } else if want.abs() > f32::MAX as f64 {
                                assert_eq!(y, f32::INFINITY.copysign(want as f32), "{ctx}");
                            } else {
                                let tol = 2e-6 * (1.0 + z.abs().min(100.0));
                                assert!(((y as f64 - want) / want).abs() <= tol, "{ctx}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// The shift is subtracted before the exp (a softmax row: max 0, the rest below).
    #[test]
    fn shifted_rows_sum_like_a_softmax() {
        for Width {
            name, exp_sum: f, ..
        } in widths()
        {
            let src: Vec<f32> = (0..67).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
            let m = src.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let mut dst = vec![0.0; src.len()];
            let sum = f(&src, m, &mut dst);
            let want: f64 = src.iter().map(|&x| ((x - m) as f64).exp()).sum();
            assert!(
                ((sum as f64 - want) / want).abs() <= 1e-6,
                "{name}: {sum} against {want}"
            );
            assert!(dst.iter().all(|&y| (0.0..=1.0).contains(&y)), "{name}");
        }
    }
}
