//! GEMM micro-kernels: one MR×NR tile of C from packed panels of A and B.
//!
//! Packed layouts (written by `pack.rs`): an A panel is `[k][MR]`, a B panel `[k][NR]`,
//! so each k-step reads MR broadcasts and NR/lanes vector loads. For the bf16 kernel a
//! "k-step" is a pair of k values packed into one 32-bit lane, the operand shape of
//! `vdpbf16ps` (two products summed per f32 lane).
//!
//! Tile shapes: AVX-512 6×64 holds 24 zmm accumulators (of 32 registers), leaving room for
//! 4 B vectors and a broadcast; 24 independent FMA chains cover the 4-cycle FMA latency on
//! two FMA pipes 3× over, and each k-step does 24 FMAs per 10 loads (below Zen 5's 2
//! loads/cycle). AVX2 6×16 is the same idea with 12 ymm accumulators of 16 registers,
//! NEON 8×8 with 16 of 32 q registers: the f32 kernel is written once ([`lanes_f32`])
//! and instantiated per width, so a change to it (the C prefetch) reaches every host.

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::simd::lanes::Lanes;
#[cfg(target_arch = "aarch64")]
use crate::simd::lanes::Neon;
#[cfg(target_arch = "x86_64")]
use crate::simd::lanes::{Ymm, Zmm};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Writes `alpha·acc + beta·C` (C not read when beta == 0, as in BLAS) for one row segment.
#[inline(always)]
fn store_row(acc: &[f32], c: &mut [f32], alpha: f32, beta: f32) {
    if beta == 0.0 {
        c.iter_mut().zip(acc).for_each(|(c, &a)| *c = alpha * a);
    } else {
        c.iter_mut()
            .zip(acc)
            .for_each(|(c, &a)| *c = alpha * a + beta * *c);
    }
}

/// The portable micro-kernel: the scalar baseline, multiply then add (`mul_add` would
/// be a libm call without FMA).
///
/// # Safety
/// `a` holds `k·MR` and `b` `k·NR` readable elements; `c` is valid for writes of MR rows
/// of NR elements spaced `rs_c` apart.
#[inline(always)]
pub(super) unsafe fn portable<const MR: usize, const NR: usize>(
    k: usize,
    a: *const f32,
    b: *const f32,
    tile: TileOut,
) {
    let mut acc = [[0f32; NR]; MR];
    // SAFETY: the caller guarantees k·MR and k·NR readable elements.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(a, k * MR),
            std::slice::from_raw_parts(b, k * NR),
        )
    };
    for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] += ap[i] * bp[j];
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: the caller guarantees MR rows of NR writable elements at rs_c spacing.
        let c = unsafe { std::slice::from_raw_parts_mut(tile.c.add(i * tile.rs_c), NR) };
        store_row(row, c, tile.alpha, tile.beta);
    }
}

/// Where and how a kernel writes its tile: `alpha·acc + beta·C`, rows `rs_c` apart.
#[derive(Clone, Copy, Debug)]
pub(super) struct TileOut {
    pub c: *mut f32,
    pub rs_c: usize,
    pub alpha: f32,
    pub beta: f32,
}

/// Scalar 4×8: 32 accumulators fit x86-64's 16 SSE registers as 8 vectors when LLVM
/// vectorizes, and are cheap in plain registers elsewhere.
///
/// # Safety
/// As [`portable`].
pub(super) unsafe fn scalar_4x8(k: usize, a: *const f32, b: *const f32, t: TileOut) {
    // SAFETY: forwarded contract.
    unsafe { portable::<4, 8>(k, a, b, t) }
}

/// The f32 micro-kernel written once over [`Lanes`]: an MR×(NV·N) tile, each k-step
/// NV vector loads of packed B and MR broadcasts of packed A into MR·NV FMA chains.
/// Instantiated per width below with the tile that fills its register file.
///
/// The C tile is prefetched first: it is needed only after the k loop, and a miss
/// there stalls the stores (as BLIS's kernels do). Host B (Zen 3, AVX2), 2026-11-28,
/// `tessera bench qmatmul --dtype q4_1 --shape 512x1536x576 --variant avx2`, 8
/// alternated runs each: median 6.47 → 6.14 ms on two threads.
///
/// # Safety
/// As [`portable`] with NR = NV·N, and `L`'s CPU features are enabled in the caller.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
unsafe fn lanes_f32<L: Lanes, const MR: usize, const NV: usize>(
    k: usize,
    a: *const f32,
    b: *const f32,
    t: TileOut,
) {
    let nr = NV * L::N;
    // SAFETY: `L`'s features per the contract.
    unsafe { prefetch_tile::<L>(t, MR, nr) };
    // SAFETY: per the contract, `L`'s features are enabled; p < k, so packed B step p
    // (NR floats) and A step p (MR floats) exist; rows i < MR and columns < NR are
    // inside the tile.
    unsafe {
        let mut acc = [[L::zero(); NV]; MR];
        for p in 0..k {
            let bp = b.add(p * nr);
            let mut bv = [L::zero(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = L::load(bp.add(v * L::N));
            }
            let ap = a.add(p * MR);
            for (i, row) in acc.iter_mut().enumerate() {
                let av = L::splat_f(*ap.add(i));
                for v in 0..NV {
                    row[v] = L::fmadd(av, bv[v], row[v]);
                }
            }
        }
        store_tile::<L, MR, NV>(&acc, t);
    }
}

/// Pulls every 64-byte line of the mr×nr C tile toward L1: each row's first float,
/// each 16th after it, and its last, wherever the row starts.
///
/// # Safety
/// `L`'s CPU features (the addresses are only hints: any value is sound).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
unsafe fn prefetch_tile<L: Lanes>(t: TileOut, mr: usize, nr: usize) {
    for i in 0..mr {
        for line in 0..=nr.div_ceil(16) {
            let j = (16 * line).min(nr - 1);
            // SAFETY: a prefetch never faults (`wrapping_add`: no pointer arithmetic
            // out of bounds); `L`'s features per the contract.
            unsafe { L::prefetch_l1(t.c.wrapping_add(i * t.rs_c + j).cast()) };
        }
    }
}

/// Writes `alpha·acc + beta·C` over the MR×(NV·N) tile (C not read when beta == 0, as in
/// BLAS).
///
/// # Safety
/// `L`'s CPU features; `t.c` is valid for MR rows of NV·N floats `t.rs_c` apart.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
unsafe fn store_tile<L: Lanes, const MR: usize, const NV: usize>(
    acc: &[[L::F; NV]; MR],
    t: TileOut,
) {
    // SAFETY: per the contract; row i < MR, columns v·N..v·N + N < NV·N.
    unsafe {
        let alpha = L::splat_f(t.alpha);
        for (i, row) in acc.iter().enumerate() {
            for (v, &r) in row.iter().enumerate() {
                let c = t.c.add(i * t.rs_c + v * L::N);
                let r = L::mul(alpha, r);
                let r = if t.beta == 0.0 {
                    r
                } else {
                    L::fmadd(L::splat_f(t.beta), L::load(c), r)
                };
                L::store(c, r);
            }
        }
    }
}

/// AVX2+FMA 6×16: 12 ymm accumulators, 2 B vectors and a broadcast of 16 registers
/// (the portable version's accumulator array spilled: ~94 GFLOP/s at 2048³ on 2
/// cores, 40% of the AVX2 peak).
///
/// # Safety
/// As [`portable`], and the CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn avx2_6x16(k: usize, a: *const f32, b: *const f32, t: TileOut) {
    // SAFETY: forwarded contract; the features `Ymm` needs are enabled here.
    unsafe { lanes_f32::<Ymm, 6, 2>(k, a, b, t) }
}

/// Rows of the 16-lane tile (AVX-512's f32 and bf16 kernels).
#[cfg(any(target_arch = "x86_64", test))]
pub(super) const WIDE_MR: usize = 6;
/// 16-lane vectors per row of that tile (64 columns).
#[cfg(any(target_arch = "x86_64", test))]
pub(super) const WIDE_NV: usize = 4;

/// AVX-512 6×64: 24 zmm accumulators of 32 registers, 4 B vectors and a broadcast;
/// 24 independent FMA chains cover the 4-cycle latency on two FMA pipes 3× over, and
/// each k-step does 24 FMAs per 10 loads (below Zen 5's 2 loads/cycle).
///
/// # Safety
/// As [`portable`], and the CPU must support AVX-512F/BW/VL/DQ, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(super) unsafe fn avx512_f32_6x64(k: usize, a: *const f32, b: *const f32, t: TileOut) {
    // SAFETY: forwarded contract; the features `Zmm` needs are enabled here.
    unsafe { lanes_f32::<Zmm, WIDE_MR, WIDE_NV>(k, a, b, t) }
}

/// [`avx512_f32_6x64`]'s tile in software lanes (`Soft<16>`): AVX-512's instance of
/// [`lanes_f32`] on any host, for the tests that drive it through the GEMM drivers.
///
/// # Safety
/// As [`portable`] with MR = 6, NR = 64.
#[cfg(test)]
pub(super) unsafe fn soft_6x64(k: usize, a: *const f32, b: *const f32, t: TileOut) {
    // SAFETY: forwarded contract; `Soft` needs no CPU feature.
    unsafe { lanes_f32::<crate::simd::lanes::Soft<16>, WIDE_MR, WIDE_NV>(k, a, b, t) }
}

/// NEON 8×8: 16 q-register accumulators of 32.
///
/// # Safety
/// As [`portable`].
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
pub(super) unsafe fn neon_8x8(k: usize, a: *const f32, b: *const f32, t: TileOut) {
    // SAFETY: forwarded contract; NEON is enabled on this function.
    unsafe { lanes_f32::<Neon, 8, 2>(k, a, b, t) }
}

/// bf16 6×64 with `vdpbf16ps`: each packed u32 is a pair of bf16 k-values, each
/// instruction does 32 multiply-adds (two per lane) into f32 accumulators; the tile and
/// the C prefetch of [`lanes_f32`]'s zmm instance.
///
/// # Safety
/// `a` holds `k·6` and `b` `k·64` packed pairs; `t.c` is valid for 6 rows of 64 floats
/// spaced `t.rs_c` apart; the CPU has what `Isa::Avx512` means (AVX-512F/BW/VL/DQ,
/// AVX2, FMA, F16C: `Zmm`'s features) and AVX512_BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,avx512bf16")]
pub(super) unsafe fn avx512_bf16_6x64(k: usize, a: *const u32, b: *const u32, t: TileOut) {
    const MR: usize = WIDE_MR;
    const NV: usize = WIDE_NV;
    // SAFETY: `Zmm`'s features are enabled here.
    unsafe { prefetch_tile::<Zmm>(t, MR, 16 * NV) };
    let pairs = |v: __m512i| -> __m512bh {
        // SAFETY: a plain reinterpretation of 512 bits.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    };
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    for p in 0..k {
        // SAFETY: p < k, so the 64 packed B and 6 packed A pairs of step p exist.
        unsafe {
            let bp = b.add(p * 16 * NV);
            let bv: [_; NV] =
                std::array::from_fn(|v| pairs(_mm512_loadu_si512(bp.add(16 * v).cast())));
            let ap = a.add(p * MR);
            for (i, row) in acc.iter_mut().enumerate() {
                let av = pairs(_mm512_set1_epi32(*ap.add(i) as i32));
                for (v, acc) in row.iter_mut().enumerate() {
                    *acc = _mm512_dpbf16_ps(*acc, av, bv[v]);
                }
            }
        }
    }
    // SAFETY: the contract's tile; `Zmm`'s features are enabled here.
    unsafe { store_tile::<Zmm, MR, NV>(&acc, t) }
}
