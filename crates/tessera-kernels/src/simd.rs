//! Compile one portable body once per ISA and dispatch on [`Isa`].
//!
//! Memory-bound kernels (norms, activations, decode attention, GEMV) are written once as
//! plain Rust over slices, shaped so LLVM vectorizes them (fixed-width chunk loops,
//! independent accumulators, branch-free selects, the polynomial [`exp`] below).
//! [`multiversion!`] instantiates that body inside `#[target_feature]` functions for
//! AVX-512 and AVX2 (NEON is baseline on aarch64) and picks one by the `Isa` argument —
//! the ISA decision is the caller's, made once, never a `cfg` inside a kernel.

/// Defines `fn NAME(isa: Isa, args...) -> R` running `body` compiled for `isa`.
#[macro_export]
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$g:ident : $bound:path>)? ($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        #[allow(unused_unsafe)]
        $vis fn $name $(<$g: $bound>)? (isa: tessera_core::Isa, $($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body $(<$g: $bound>)? ($($arg: $ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
            fn avx512 $(<$g: $bound>)? ($($arg: $ty),*) $(-> $ret)? { body $(::<$g>)? ($($arg),*) }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            fn avx2 $(<$g: $bound>)? ($($arg: $ty),*) $(-> $ret)? { body $(::<$g>)? ($($arg),*) }

            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: Isa::Avx512 is only ever chosen when the CPU has these features.
                tessera_core::Isa::Avx512 if isa.is_available() => unsafe { avx512 $(::<$g>)? ($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above for AVX2.
                tessera_core::Isa::Avx2 if isa.is_available() => unsafe { avx2 $(::<$g>)? ($($arg),*) },
                _ => body $(::<$g>)? ($($arg),*),
            }
        }
    };
}

/// Dot product with 16 independent lanes (one zmm, or two ymm), reduced as a tree.
#[inline(always)]
pub fn dot<T: tessera_core::Element>(a: &[f32], b: &[T]) -> f32 {
    const L: usize = 16;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; L];
    let (ac, bc) = (a.chunks_exact(L), b.chunks_exact(L));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..L {
            acc[l] += x[l] * y[l].to_f32();
        }
    }
    let tail: f32 = ar.iter().zip(br).map(|(x, y)| x * y.to_f32()).sum();
    hsum(acc) + tail
}

/// Max of a slice in 16 lanes (elementwise `vmaxps`; a plain fold would be a scalar
/// `maxnum` chain). NaN is skipped, as by `f32::max`.
#[inline(always)]
pub fn max(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = l.max(v);
        }
    }
    lanes.iter().fold(tail, |a, &b| a.max(b))
}

/// Sum of 16 lanes as a halving tree (4 shuffle+add steps, not 15 dependent adds); the
/// halves are whole arrays so LLVM sees vector adds, not a scalar pattern to re-pack.
#[inline(always)]
pub fn hsum(v: [f32; 16]) -> f32 {
    let mut h8 = [0f32; 8];
    for i in 0..8 {
        h8[i] = v[i] + v[i + 8];
    }
    let mut h4 = [0f32; 4];
    for i in 0..4 {
        h4[i] = h8[i] + h8[i + 4];
    }
    (h4[0] + h4[2]) + (h4[1] + h4[3])
}

/// e^x in f32, ≤ 2e-7 relative error wherever the result is a normal f32, written to
/// vectorize: Cody–Waite reduction x = n·ln2 + r, a degree-7 Horner polynomial for e^r,
/// and 2ⁿ built in the exponent bits. n is capped at 127 so the top of the range
/// (88.03 < x ≤ 88.72, where r reaches 0.7) stays finite and accurate; beyond it, +∞.
/// Results below f32's normal range (x < −87.3) flush to 0, as FTZ hardware would.
/// NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const HI: f32 = 88.722_83; // ln(f32::MAX)
    const LO: f32 = -87.336_55; // ln(f32::MIN_POSITIVE)
    let xc = x.clamp(LO, HI);
    let n = (xc * LOG2E + 0.5).floor().min(127.0);
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2ⁿ without a float→int conversion (which would not vectorize): adding 1.5·2²³ + 127
    // leaves n + 127 in the low mantissa bits; shifting by 23 moves it into the exponent.
    const MAGIC: f32 = 12_582_912.0 + 127.0;
    let scale = f32::from_bits((n + MAGIC).to_bits() << 23);
    let y = p * scale;
    let y = if x > HI { f32::INFINITY } else { y };
    if x < LO {
        0.0
    } else {
        y
    }
}

/// `v[i] = exp(v[i] − shift)` for all i, returning Σv (16 lanes, so both loops vectorize).
#[inline(always)]
pub fn exp_shifted_sum(v: &mut [f32], shift: f32) -> f32 {
    for x in v.iter_mut() {
        *x = exp(*x - shift);
    }
    let mut lanes = [0f32; 16];
    let chunks = v.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (l, x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    #[test]
    fn exp_accuracy_and_edges() {
        let mut worst = 0.0f64;
        let mut x = -87.3f32;
        while x < 88.0 {
            let rel = ((super::exp(x) as f64) - (x as f64).exp()).abs() / (x as f64).exp();
            worst = worst.max(rel);
            x += 0.013;
        }
        assert!(worst < 3e-7, "worst rel error {worst}");
        // Above 88.03 the reduced argument reaches 0.7 (n capped at 127): still < 1e-6.
        for x in [88.1f32, 88.5, 88.7, 88.72] {
            assert!(
                (super::exp(x) as f64 / (x as f64).exp() - 1.0).abs() < 1e-6,
                "{x}"
            );
        }
        assert_eq!(super::exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(super::exp(f32::INFINITY), f32::INFINITY);
        assert!(super::exp(f32::NAN).is_nan());
        assert_eq!(super::exp(0.0), 1.0);
    }
}
