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
//! loads/cycle). AVX2 6×16 is the same idea with 12 ymm accumulators of 16 registers.

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

/// The portable micro-kernel, compiled once per ISA by the callers below. `FUSED` picks
/// `mul_add` (one rounding, a single instruction where FMA exists) or mul-then-add
/// (the scalar baseline, where `mul_add` would be a libm call).
///
/// # Safety
/// `a` holds `k·MR` and `b` `k·NR` readable elements; `c` is valid for writes of MR rows
/// of NR elements spaced `rs_c` apart.
#[inline(always)]
pub(super) unsafe fn portable<const MR: usize, const NR: usize, const FUSED: bool>(
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
                acc[i][j] = if FUSED {
                    ap[i].mul_add(bp[j], acc[i][j])
                } else {
                    acc[i][j] + ap[i] * bp[j]
                };
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
    unsafe { portable::<4, 8, false>(k, a, b, t) }
}

/// AVX2+FMA 6×16: 12 ymm accumulators, 2 B vectors and a broadcast of 16 registers.
/// Explicit, since LLVM spilled the portable version's accumulator array (~94 GFLOP/s
/// at 2048³ on 2 cores, 40% of the AVX2 peak).
///
/// # Safety
/// As [`portable`], and the CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn avx2_6x16(k: usize, a: *const f32, b: *const f32, t: TileOut) {
    const MR: usize = 6;
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for p in 0..k {
        // SAFETY: p < k, so packed B step p (16 floats) and A step p (MR floats) exist.
        unsafe {
            let bp = b.add(p * 16);
            let bv = [_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8))];
            let ap = a.add(p * MR);
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*ap.add(i));
                row[0] = _mm256_fmadd_ps(av, bv[0], row[0]);
                row[1] = _mm256_fmadd_ps(av, bv[1], row[1]);
            }
        }
    }
    let alpha = _mm256_set1_ps(t.alpha);
    for (i, row) in acc.iter().enumerate() {
        for (v, &r) in row.iter().enumerate() {
            // SAFETY: row i < MR, columns 8v..8v+8 < 16: inside the tile.
            unsafe {
                let c = t.c.add(i * t.rs_c + v * 8);
                let r = if t.beta == 0.0 {
                    _mm256_mul_ps(alpha, r)
                } else {
                    _mm256_fmadd_ps(
                        _mm256_set1_ps(t.beta),
                        _mm256_loadu_ps(c),
                        _mm256_mul_ps(alpha, r),
                    )
                };
                _mm256_storeu_ps(c, r);
            }
        }
    }
}

/// NEON 8×8 (16 q-register accumulators of 32).
///
/// # Safety
/// As [`portable`].
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
pub(super) unsafe fn neon_8x8(k: usize, a: *const f32, b: *const f32, t: TileOut) {
    // SAFETY: forwarded contract; NEON is enabled on this function.
    unsafe { portable::<8, 8, true>(k, a, b, t) }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store_zmm(acc: __m512, c: *mut f32, alpha: __m512, beta: f32) {
    // SAFETY: the caller passes 16 writable (and, for beta != 0, readable) floats at c.
    unsafe {
        let r = if beta == 0.0 {
            _mm512_mul_ps(alpha, acc)
        } else {
            _mm512_fmadd_ps(
                _mm512_set1_ps(beta),
                _mm512_loadu_ps(c),
                _mm512_mul_ps(alpha, acc),
            )
        };
        _mm512_storeu_ps(c, r);
    }
}

/// Generates an MR×(16·NV) AVX-512 kernel whose k-step broadcasts MR packed A elements
/// and loads NV vectors of packed B.
#[cfg(target_arch = "x86_64")]
macro_rules! avx512_kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $elem:ty, $mr:literal, $nv:literal, $bcast:expr, $load:expr, $fma:expr) => {
        $(#[$doc])*
        /// # Safety
        /// `a` holds `k·MR` and `b` `k·16·NV` packed elements; `t.c` is valid for MR rows of
        /// 16·NV floats spaced `t.rs_c` apart; the CPU has the enabled features.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(k: usize, a: *const $elem, b: *const $elem, t: TileOut) {
            const MR: usize = $mr;
            const NV: usize = $nv;
            // Pull the C tile toward L1 now; it is needed only after the k loop, and a cold
            // miss there would stall the stores (as BLIS's kernels do).
            for i in 0..MR {
                for line in 0..NV {
                    // SAFETY: prefetch never faults; the address is inside the tile anyway.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(t.c.add(i * t.rs_c + line * 16) as *const i8) };
                }
            }
            let mut acc = [[_mm512_setzero_ps(); NV]; MR];
            for p in 0..k {
                // SAFETY: p < k, so the 16·NV packed B and MR packed A elements of step p exist.
                unsafe {
                    let bp = b.add(p * 16 * NV);
                    let bv: [_; NV] = std::array::from_fn(|v| $load(bp.add(16 * v)));
                    let ap = a.add(p * MR);
                    for (i, row) in acc.iter_mut().enumerate() {
                        let av = $bcast(ap.add(i));
                        for (v, acc) in row.iter_mut().enumerate() {
                            *acc = $fma(*acc, av, bv[v]);
                        }
                    }
                }
            }
            let alpha = _mm512_set1_ps(t.alpha);
            for (i, row) in acc.iter().enumerate() {
                for (v, &r) in row.iter().enumerate() {
                    // SAFETY: row i < MR, columns v·16..v·16+16 < 16·NV: inside the tile.
                    unsafe { store_zmm(r, t.c.add(i * t.rs_c + v * 16), alpha, t.beta) };
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
avx512_kernel!(
    /// f32 6×64 with `vfmadd231ps`.
    avx512_f32_6x64,
    "avx512f",
    f32,
    6,
    4,
    |p: *const f32| _mm512_set1_ps(*p),
    |p: *const f32| _mm512_loadu_ps(p),
    |acc, a, b| _mm512_fmadd_ps(a, b, acc)
);

#[cfg(target_arch = "x86_64")]
avx512_kernel!(
    /// bf16 6×64 with `vdpbf16ps`: each packed u32 is a pair of bf16 k-values, each
    /// instruction does 32 multiply-adds (two per lane) into f32 accumulators.
    avx512_bf16_6x64,
    "avx512f,avx512bf16",
    u32,
    6,
    4,
    |p: *const u32| std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*p as i32)),
    |p: *const u32| std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p as *const __m512i)),
    |acc, a, b| _mm512_dpbf16_ps(acc, a, b)
);
