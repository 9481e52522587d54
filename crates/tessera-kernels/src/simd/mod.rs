//! Compile one portable body once per ISA and dispatch on [`Isa`].
//!
//! Memory-bound kernels (norms, activations, decode attention, GEMV) are written once as
//! plain Rust over slices, shaped so LLVM vectorizes them (fixed-width chunk loops,
//! independent accumulators, branch-free selects, the polynomial [`exp`] below).
//! `multiversion!` instantiates that body inside `#[target_feature]` functions for
//! AVX-512 and AVX2 (NEON is baseline on aarch64) and picks one by the `Isa` argument —
//! the ISA decision is the caller's, made once, never a `cfg` inside a kernel.
//!
//! Where LLVM's code is not good enough (e^x: no FMA contraction, one long chain per
//! vector) `lanes_exp` writes it once over `lanes::Lanes` for AVX-512, AVX2 and NEON,
//! and the `*_on(isa, ..)` functions here pick between those and the portable body.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) mod lanes;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod lanes_exp;
#[cfg(target_arch = "aarch64")]
pub(crate) mod lanes_neon;
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod lanes_soft;
#[cfg(target_arch = "x86_64")]
mod lanes_x86;

use tessera_core::Isa;

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

/// Max of a slice in 64 lanes (elementwise `vmaxps` on four independent vectors; a plain
/// fold would be a scalar `maxnum` chain). NaN is skipped, as by `f32::max`.
#[inline(always)]
pub fn max(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 64];
    let chunks = x.chunks_exact(64);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = l.max(v);
        }
    }
    // Halve as whole arrays (vector maxes), not a 64-long scalar chain: rows are often
    // only 64 wide (attention's score blocks).
    let mut w = 32;
    while w > 0 {
        for i in 0..w {
            lanes[i] = lanes[i].max(lanes[i + w]);
        }
        w /= 2;
    }
    lanes[0].max(tail)
}

/// Σ f(x) in 64 lanes: four independent vector add chains, so an L1-resident row sums at
/// load speed instead of one add latency (3–4 cycles) per vector.
#[inline(always)]
pub fn lane_sum(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0f32; 64];
    let chunks = x.chunks_exact(64);
    let tail: f32 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f(v);
        }
    }
    fold_lanes(lanes) + tail
}

/// The sum of [`lane_sum`]'s 64 lanes, in its fixed tree (lanes i, i+16, i+32, i+48, then
/// [`hsum`]): kernels that fuse another pass into the same lanes share it, and with it
/// `lane_sum`'s result bit for bit.
#[inline(always)]
pub fn fold_lanes(lanes: [f32; 64]) -> f32 {
    let mut l16 = [0f32; 16];
    for (i, l) in l16.iter_mut().enumerate() {
        *l = (lanes[i] + lanes[i + 16]) + (lanes[i + 32] + lanes[i + 48]);
    }
    hsum(l16)
}

/// Asks for every cache line of `x` to be brought towards L1 (a hint: no-op off x86-64).
/// For gathers whose next address the hardware prefetcher cannot guess.
#[inline(always)]
pub fn prefetch<T>(x: &[T]) {
    #[cfg(target_arch = "x86_64")]
    for at in lines(x.as_ptr().cast(), std::mem::size_of_val(x)) {
        // SAFETY: prefetch is a hint that never faults, whatever the address.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// The start of every 64-byte line holding one of the `bytes` bytes at `p`: from the
/// line of the first byte to that of the last, so a run starting mid-line gets the line
/// its length alone would leave out.
fn lines(p: *const u8, bytes: usize) -> impl Iterator<Item = *const u8> {
    let skew = p as usize % 64;
    let first = p.wrapping_sub(skew);
    let span = if bytes == 0 { 0 } else { skew + bytes };
    (0..span)
        .step_by(64)
        .map(move |line| first.wrapping_add(line))
}

/// Asks for every cache line of `x` ready for writing (`prefetchw`: the line arrives
/// owned, so the stores that follow find it instead of each waiting for its own
/// read-for-ownership), a hint; where the CPU lacks PRFCHW, a read prefetch; on aarch64
/// `prfm pstl1keep`. For scattered stores into memory that left the caches, whose
/// misses a store buffer serves a few at a time.
#[inline]
pub fn prefetch_for_write<T>(x: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    let owned = tessera_core::CpuFeatures::get().prefetchw;
    #[cfg(not(target_arch = "x86_64"))]
    let owned = true;
    for at in lines(x.as_mut_ptr().cast(), std::mem::size_of_val(x)) {
        prefetch_line_for_write(at, owned);
    }
}

/// The line holding `at` asked for ready for writing, as [`prefetch_for_write`] does
/// for each of its lines; `owned`: the CPU has PRFCHW (`CpuFeatures::prefetchw`; read
/// once by the caller, off its loop), else x86-64 asks with a read prefetch.
#[inline(always)]
pub(crate) fn prefetch_line_for_write(at: *const u8, owned: bool) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW (which `owned` says the CPU has) and PREFETCHT0 are hints: they
    // neither fault nor change memory, whatever the address.
    unsafe {
        if owned {
            std::arch::asm!("prefetchw [{}]", in(reg) at,
                options(nostack, readonly, preserves_flags));
        } else {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast());
        }
    }
    // SAFETY: PRFM never faults and touches no register but its address operand.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        let _ = owned;
        std::arch::asm!("prfm pstl1keep, [{0}]", in(reg) at,
            options(nostack, readonly, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (at, owned);
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

/// 2^f on [−½, ½]: a degree-5 relative fit (coefficients of f¹..f⁵; the constant term is
/// exactly 1), 2.4e-7 relative error evaluated in f32 (fitted with numpy's least squares
/// reweighted toward the worst points, Lawson's method, then checked in f32 on 200,001
/// points). Shared by [`exp2`] and the lanes' version.
pub(crate) const C2: [f32; 5] = [
    0.693_146_94,
    0.240_221_2,
    0.055_507_13,
    0.009_675_542,
    0.001_327_647_1,
];
/// Clamp of t for 2^t: n = round(t) stays in [−127, 128], whose 2ⁿ is an exponent field
/// at both ends: −127 is 0 (t < −126.5 underflows, as FTZ hardware would) and 128 is +∞
/// (t ≥ 127.5 overflows, a little before f32's own limit at 128).
pub(crate) const T_LO: f32 = -127.0;
pub(crate) const T_HI: f32 = 128.0;

/// 2^x in f32, written to vectorize: the lanes' softmax `exp2` (`lanes_exp.rs`) in portable
/// Rust (n = ⌊x + ½⌋, f = x − n, the same degree-5 fit, 2ⁿ in the exponent bits), ≤ 3e-7
/// relative error wherever the result is a normal f32. x < −126.5 gives 0, x ≥ 127.5
/// +∞, NaN stays NaN.
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    let t = x.clamp(T_LO, T_HI);
    let n = (t + 0.5).floor();
    let f = t - n;
    let p = 1.0 + f * (C2[0] + f * (C2[1] + f * (C2[2] + f * (C2[3] + f * C2[4]))));
    // n + 127 in [0, 255] into the exponent field, as in `exp`: 0 is 0.0, 255 is +∞.
    const MAGIC: f32 = 12_582_912.0 + 127.0;
    p * f32::from_bits((n + MAGIC).to_bits() << 23)
}

/// `v[i] = exp(v[i] − shift)` for all i, returning Σv (16 lanes, so both loops vectorize).
#[inline(always)]
pub fn exp_shifted_sum(v: &mut [f32], shift: f32) -> f32 {
    pow_shifted_sum(v, shift, exp)
}

/// `v[i] = 2^(v[i] − shift)` for all i, returning Σv: [`exp_shifted_sum`] in base 2.
#[inline(always)]
pub fn exp2_shifted_sum(v: &mut [f32], shift: f32) -> f32 {
    pow_shifted_sum(v, shift, exp2)
}

/// `v[i] = pow(v[i] − shift)`, returning Σv (`pow` a function item, inlined).
#[inline(always)]
fn pow_shifted_sum(v: &mut [f32], shift: f32, pow: impl Fn(f32) -> f32) -> f32 {
    for x in v.iter_mut() {
        *x = pow(*x - shift);
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

multiversion! {
    fn exp_shifted_sum_portable(src: &[f32], shift: f32, dst: &mut [f32]) -> f32 {
        dst.copy_from_slice(src);
        exp_shifted_sum(dst, shift)
    }
}

/// `dst[i] = e^(src[i] − shift)`, returning Σdst (equal lengths; panics otherwise).
pub fn exp_shifted_sum_on(isa: Isa, src: &[f32], shift: f32, dst: &mut [f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && isa.is_available() {
        assert_eq!(src.len(), dst.len(), "exp_shifted_sum_on: lengths differ");
        // SAFETY: AVX-512 (what `Isa::Avx512` means) was detected.
        return unsafe { lanes_exp::exp_shifted_sum_zmm(src, shift, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && isa.is_available() {
        assert_eq!(src.len(), dst.len(), "exp_shifted_sum_on: lengths differ");
        // SAFETY: AVX2, FMA and F16C (what `Isa::Avx2` means) were detected.
        return unsafe { lanes_exp::exp_shifted_sum_ymm(src, shift, dst) };
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        assert_eq!(src.len(), dst.len(), "exp_shifted_sum_on: lengths differ");
        return lanes_exp::exp_shifted_sum_neon(src, shift, dst);
    }
    exp_shifted_sum_portable(isa, src, shift, dst)
}

multiversion! {
    /// `dst[i] = src[i]` widened to f32 (bf16/f16 → f32 is exact), vectorized per ISA.
    pub fn widen<T: tessera_core::Element>(src: &[T], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
}

multiversion! {
    fn max_portable(x: &[f32]) -> f32 {
        max(x)
    }
}

/// Max of a slice skipping NaN (−∞ when empty or all NaN).
pub fn max_on(isa: Isa, x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && isa.is_available() {
        // SAFETY: AVX-512 (what `Isa::Avx512` means) was detected.
        return unsafe { lanes_exp::max_zmm(x) };
    }
    max_portable(isa, x)
}

/// The argument of the sigmoid in `x·σ(a·x + b·x³)`: SiLU is (1, 0); tanh-GELU is
/// (2c, 2c·0.044715) with c = √(2/π), since 0.5·(1 + tanh(y)) = σ(2y).
#[derive(Clone, Copy, Debug)]
pub struct SigmoidArg {
    /// Coefficient of x in the sigmoid's argument.
    pub a: f32,
    /// Coefficient of x³ in the sigmoid's argument.
    pub b: f32,
}

/// `x·σ(a·x + b·x³)` for one value: the scalar path and the vector paths' tails.
#[inline(always)]
fn x_sigmoid_scalar(x: f32, arg: SigmoidArg) -> f32 {
    x / (1.0 + exp(-(arg.a * x + arg.b * x * x * x)))
}

multiversion! {
    fn x_sigmoid_portable(src: &[f32], arg: SigmoidArg, dst: &mut [f32]) {
        for (o, &x) in dst.iter_mut().zip(src) {
            *o = x_sigmoid_scalar(x, arg);
        }
    }
}

/// `dst[i] = x·σ(a·x + b·x³)·t[i]` with x = `src[i]` and t = `times` (1 without it;
/// SwiGLU's up projection), equal lengths (panics otherwise). As x → −∞ the e^… term
/// overflows to +∞ and the result is −0, never NaN. AVX-512, AVX2 and NEON run one pass
/// written once over `Lanes` (`lanes_exp::x_sigmoid`, the product included); the
/// portable path multiplies in a second pass.
pub fn x_sigmoid_on(
    isa: Isa,
    src: &[f32],
    arg: SigmoidArg,
    times: Option<&[f32]>,
    dst: &mut [f32],
) {
    assert_eq!(src.len(), dst.len(), "x_sigmoid_on: lengths differ");
    if let Some(t) = times {
        assert_eq!(t.len(), dst.len(), "x_sigmoid_on: lengths differ");
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && isa.is_available() {
        // SAFETY: AVX-512 (what `Isa::Avx512` means) was detected; lengths checked above.
        unsafe { lanes_exp::x_sigmoid_zmm(src, arg, times, dst) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && isa.is_available() {
        // SAFETY: AVX2, FMA and F16C (what `Isa::Avx2` means) were detected; lengths
        // checked above.
        unsafe { lanes_exp::x_sigmoid_ymm(src, arg, times, dst) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        lanes_exp::x_sigmoid_neon(src, arg, times, dst);
        return;
    }
    x_sigmoid_portable(isa, src, arg, dst);
    if let Some(t) = times {
        mul_in_place(isa, dst, t);
    }
}

multiversion! {
    fn mul_in_place(out: &mut [f32], by: &[f32]) {
        for (o, &b) in out.iter_mut().zip(by) {
            *o *= b;
        }
    }
}

#[cfg(test)]
mod tests {
    /// A write prefetch is a hint: every element of the slice (empty, shorter than a
    /// line, ragged and starting mid-line) reads back as it was, and memory around it
    /// is untouched.
    #[test]
    fn prefetch_for_write_leaves_memory_as_it_was() {
        let mut buf: Vec<u16> = (0..200u16).map(|i| i.wrapping_mul(40503)).collect();
        let want = buf.clone();
        for (from, len) in [(0, 0), (3, 1), (5, 33), (7, 150), (0, 200)] {
            super::prefetch_for_write(&mut buf[from..from + len]);
            assert_eq!(buf, want, "{from}..+{len}");
        }
    }

    /// The lines of a run cover each of its bytes, start on line boundaries and are
    /// as few as cover it: aligned and ragged starts and ends, empty runs.
    #[test]
    fn lines_cover_every_byte_of_a_run() {
        let buf = [0u8; 512];
        let base = buf.as_ptr().wrapping_add(64 - buf.as_ptr() as usize % 64);
        for skew in [0, 1, 16, 63] {
            for bytes in [0, 1, 48, 63, 64, 65, 384, 385] {
                let p = base.wrapping_add(skew);
                let got: Vec<usize> = super::lines(p, bytes).map(|l| l as usize).collect();
                assert!(got.iter().all(|l| l % 64 == 0), "{skew} + {bytes}");
                let want = if bytes == 0 {
                    0
                } else {
                    (skew + bytes).div_ceil(64)
                };
                assert_eq!(got.len(), want, "{skew} + {bytes}");
                for b in 0..bytes {
                    let a = p as usize + b;
                    assert!(
                        got.iter().any(|&l| (l..l + 64).contains(&a)),
                        "{skew} + {bytes}: byte {b}"
                    );
                }
            }
        }
    }

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

    /// 2^x against f64 over the normal range in small steps (every reduced argument in
    /// [−½, ½) is reached many times), integers exact, and the edges: underflow to 0
    /// below −126.5, +∞ from 127.5, ±∞ and NaN.
    #[test]
    fn exp2_accuracy_and_edges() {
        let mut worst = 0.0f64;
        let mut x = -125.9f32;
        while x < 127.4 {
            let want = (x as f64).exp2();
            worst = worst.max(((super::exp2(x) as f64) - want).abs() / want);
            x += 0.0037;
        }
        assert!(worst < 3e-7, "worst rel error {worst}");
        for n in -126..=127 {
            assert_eq!(super::exp2(n as f32), (n as f64).exp2() as f32, "2^{n}");
        }
        for x in [-126.6f32, -127.0, -200.0, f32::NEG_INFINITY, f32::MIN] {
            assert_eq!(super::exp2(x), 0.0, "2^{x}");
        }
        for x in [127.5f32, 128.0, 1e6, f32::INFINITY, f32::MAX] {
            assert_eq!(super::exp2(x), f32::INFINITY, "2^{x}");
        }
        assert!(super::exp2(f32::NAN).is_nan());
        // The softmax shape: weights of a row in (0, 1], the max itself exactly 1.
        let mut row = [-3.5f32, 0.0, -0.25, -140.0, f32::NEG_INFINITY, -1.0];
        let sum = super::exp2_shifted_sum(&mut row, 0.0);
        let want = [0.088_388_35f32, 1.0, 0.840_896_4, 0.0, 0.0, 0.5];
        for (got, want) in row.iter().zip(want) {
            assert!((got - want).abs() <= 3e-7 * want, "{row:?}");
        }
        assert!((sum - want.iter().sum::<f32>()).abs() < 1e-6, "{sum}");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_exp_matches_f64_and_edges() {
        use tessera_core::Isa;
        if !Isa::Avx512.is_available() {
            return;
        }
        let mut xs: Vec<f32> = (0..13_700).map(|i| -87.3 + i as f32 * 0.013).collect();
        xs.extend([
            88.5,
            88.72,
            88.73,
            89.0,
            1e9,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        xs.extend([-1e9, -103.0, -90.0, f32::NAN, 0.0, -0.0, 7.0]); // 14 + 7: ragged tail
        let mut out = vec![f32::NAN; xs.len()];
        let sum = super::exp_shifted_sum_on(Isa::Avx512, &xs, 0.0, &mut out);
        let mut worst = 0.0f64;
        for (&x, &y) in xs.iter().zip(&out) {
            let want = (x as f64).exp();
            if x.is_nan() {
                assert!(y.is_nan());
            } else if want > f32::MAX as f64 {
                assert_eq!(y, f32::INFINITY, "{x}");
            } else if want < f32::MIN_POSITIVE as f64 {
                assert!((y as f64 - want).abs() <= 1.5e-45, "{x}: {y} vs {want}");
            } else {
                worst = worst.max((y as f64 - want).abs() / want);
            }
        }
        assert!(worst < 3e-7, "worst rel error {worst}");
        assert!(sum.is_nan(), "a NaN input reaches the sum");
    }
}
