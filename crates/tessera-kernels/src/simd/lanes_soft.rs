//! [`Lanes`] in plain Rust at any width: `Soft<16>` runs AVX-512's instances of the
//! kernels written over `Lanes` on a host without AVX-512 (tests only).
//!
//! Why: the algorithms written once over [`Lanes`] (the GEMM micro-kernel, the flash
//! attention tiles, paged decode attention, block-format expansion, the small-M
//! matmul) take their tile shapes, tail handling and key-span skips from the width. A
//! CI host without AVX-512 runs their ymm and NEON instances, never the 16-lane one
//! whose indexing is different (six rows × 64 keys, 16-lane chunks of a block). Here
//! each method is the per-lane meaning of the `Ymm`/`Zmm` intrinsics (rounding ties to
//! even, NaN rules of `vmaxps`/`vminps`), so the 16-lane structure is checked against
//! float64 everywhere. What this cannot check is the intrinsics themselves in
//! `lanes_x86`'s `Zmm`: those run only on an AVX-512 host (`tessera verify`).

use super::lanes::Lanes;
use half::{bf16, f16};

/// N lanes as arrays.
pub(crate) struct Soft<const N: usize>;

/// `vmaxps(a, b)`: `b` when either is NaN.
fn x86_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `vminps(a, b)`: `b` when either is NaN.
fn x86_min(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

impl<const N: usize> Lanes for Soft<N> {
    const N: usize = N;
    // Zmm's at 16 lanes (`vscalefps`, see `mul_exp2`), Ymm's below.
    const SCALEF_EXP: bool = N == 16;
    type I = [i32; N];
    type F = [f32; N];
    unsafe fn widen_u8(p: *const u8) -> [i32; N] {
        // SAFETY: N bytes readable at p (the contract).
        std::array::from_fn(|j| unsafe { *p.add(j) } as i32)
    }
    unsafe fn widen_i8(p: *const u8) -> [i32; N] {
        // SAFETY: as widen_u8.
        std::array::from_fn(|j| unsafe { *p.add(j) } as i8 as i32)
    }
    unsafe fn splat_i(v: i32) -> [i32; N] {
        [v; N]
    }
    unsafe fn splat_f(v: f32) -> [f32; N] {
        [v; N]
    }
    unsafe fn splat_f16(v: f16) -> [f32; N] {
        [v.to_f32(); N]
    }
    unsafe fn field(v: [i32; N], shift: u32, mask: i32) -> [i32; N] {
        v.map(|x| ((x as u32).checked_shr(shift).unwrap_or(0) as i32) & mask)
    }
    unsafe fn or_shifted(v: [i32; N], top: [i32; N], shift: u32) -> [i32; N] {
        std::array::from_fn(|j| v[j] | ((top[j] as u32).checked_shl(shift).unwrap_or(0) as i32))
    }
    unsafe fn or_where(v: [i32; N], bits: u32, val: i32) -> [i32; N] {
        std::array::from_fn(|j| if bits >> j & 1 == 1 { v[j] | val } else { v[j] })
    }
    unsafe fn add_i(a: [i32; N], b: [i32; N]) -> [i32; N] {
        std::array::from_fn(|j| a[j].wrapping_add(b[j]))
    }
    unsafe fn sub_i(a: [i32; N], b: [i32; N]) -> [i32; N] {
        std::array::from_fn(|j| a[j].wrapping_sub(b[j]))
    }
    unsafe fn to_f32(v: [i32; N]) -> [f32; N] {
        v.map(|x| x as f32)
    }
    unsafe fn mul(a: [f32; N], b: [f32; N]) -> [f32; N] {
        std::array::from_fn(|j| a[j] * b[j])
    }
    unsafe fn div(a: [f32; N], b: [f32; N]) -> [f32; N] {
        std::array::from_fn(|j| a[j] / b[j])
    }
    unsafe fn fmadd(a: [f32; N], b: [f32; N], c: [f32; N]) -> [f32; N] {
        std::array::from_fn(|j| a[j].mul_add(b[j], c[j]))
    }
    unsafe fn clamp(v: [f32; N], lo: [f32; N], hi: [f32; N]) -> [f32; N] {
        // As `min(hi, max(lo, v))` in the x86 operand order: a NaN lane stays NaN.
        std::array::from_fn(|j| x86_min(hi[j], x86_max(lo[j], v[j])))
    }
    unsafe fn round(v: [f32; N]) -> [f32; N] {
        v.map(f32::round_ties_even)
    }
    unsafe fn exp2_int(n: [f32; N]) -> [f32; N] {
        v_exp2_int(n)
    }
    unsafe fn mul_exp2(p: [f32; N], n: [f32; N]) -> [f32; N] {
        if N == 16 {
            // `vscalefps`: p·2ⁿ rounded once, overflowing to ∞ and underflowing
            // gradually; f64 holds the exact product for every n the exp passes.
            std::array::from_fn(|j| (p[j] as f64 * (n[j] as f64).exp2()) as f32)
        } else {
            let e = v_exp2_int(n);
            std::array::from_fn(|j| p[j] * e[j])
        }
    }
    unsafe fn zero() -> [f32; N] {
        [0.0; N]
    }
    unsafe fn load(p: *const f32) -> [f32; N] {
        // SAFETY: N floats readable at p (the contract).
        std::array::from_fn(|j| unsafe { p.add(j).read_unaligned() })
    }
    unsafe fn add(a: [f32; N], b: [f32; N]) -> [f32; N] {
        std::array::from_fn(|j| a[j] + b[j])
    }
    unsafe fn sum(v: [f32; N]) -> f32 {
        v.iter().sum()
    }
    unsafe fn max_keep(v: [f32; N], acc: [f32; N]) -> [f32; N] {
        std::array::from_fn(|j| x86_max(v[j], acc[j]))
    }
    unsafe fn hmax(v: [f32; N]) -> f32 {
        v.into_iter().fold(f32::NEG_INFINITY, f32::max)
    }
    unsafe fn store(p: *mut f32, v: [f32; N]) {
        for (j, x) in v.into_iter().enumerate() {
            // SAFETY: N floats writable at p (the contract).
            unsafe { p.add(j).write_unaligned(x) };
        }
    }
    unsafe fn load_f16(p: *const f16) -> [f32; N] {
        // SAFETY: N halves readable at p (the contract).
        std::array::from_fn(|j| unsafe { p.add(j).read_unaligned() }.to_f32())
    }
    unsafe fn load_bf16(p: *const bf16) -> [f32; N] {
        // SAFETY: N values readable at p (the contract).
        std::array::from_fn(|j| unsafe { p.add(j).read_unaligned() }.to_f32())
    }
    unsafe fn transpose_sums(p: *const f32) -> [f32; N] {
        std::array::from_fn(|r| {
            (0..N)
                // SAFETY: N·N floats readable at p (the contract).
                .map(|c| unsafe { p.add(r * N + c).read_unaligned() })
                .sum()
        })
    }
    unsafe fn prefetch_l1(_: *const u8) {}
    unsafe fn prefetch_l2(_: *const u8) {}
}

/// 2ⁿ built in the exponent bits as the x86 instances do (`vcvtps2dq`, add 127, shift
/// left 23): n = −127 gives +0.
fn v_exp2_int<const N: usize>(n: [f32; N]) -> [f32; N] {
    n.map(|x| {
        let e = (x.round_ties_even() as i32).wrapping_add(127);
        f32::from_bits((e as u32).wrapping_shl(23))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_lanes_follow_the_x86_rules() {
        type S = Soft<16>;
        // SAFETY: Soft needs no CPU feature; every pointer below covers N elements.
        unsafe {
            let nan = f32::NAN;
            let mut v = [0f32; 16];
            v[3] = nan;
            let c = S::clamp(v, [-1.0; 16], [1.0; 16]);
            assert!(c[3].is_nan() && c[0] == 0.0, "clamp keeps NaN");
            let m = S::max_keep(v, [0.5; 16]);
            assert_eq!((m[3], m[0]), (0.5, 0.5), "max_keep skips NaN");
            assert_eq!(S::round([2.5; 16])[0], 2.0, "ties to even");
            assert_eq!(S::exp2_int([-127.0; 16])[0], 0.0);
            assert_eq!(S::exp2_int([3.0; 16])[0], 8.0);
            let f = S::field([-1; 16], 28, 0xF);
            assert_eq!(f[0], 0xF, "logical shift");
            let w = S::or_where([0; 16], 0b1000_0000_0000_0010, 4);
            assert_eq!((w[1], w[15], w[0]), (4, 4, 0));
            let p: Vec<f32> = (0..256).map(|i| i as f32).collect();
            let t = S::transpose_sums(p.as_ptr());
            assert_eq!(t[1], (16..32).sum::<i32>() as f32);
        }
    }
}
