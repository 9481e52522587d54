//! The W8A8 kernel for one scale per weight row and one per activation row (per-channel
//! INT8 weights against per-row activations, [`super::qmatmul_w8a8`]): one loop
//! ([`dots`]), instantiated through [`RowDot`] for AVX2 (`vpmaddubsw`), AVX512_VNNI
//! (`vpdpbusd` on ymm) and Arm's DotProd (`sdot` on NEON).
//!
//! The block-format kernel ([`super::avx2_int8`]) converts and scales every 32-weight
//! chunk because each chunk has its own scales: per (weight row, activation row, chunk)
//! that is a start-value add, an int→float convert, a scale multiply and the d_x
//! multiply-accumulate on top of the integer dot. With a single scale on each side, the
//! whole row's dot stays in i32 lanes and is scaled once per output, so the inner loop is
//! the integer dot alone: on AVX2 `vpsignb`, `vpmaddubsw`, `vpmaddwd`, `vpaddd`; on VNNI
//! one `vpdpbusd`; on NEON an `eor` and one `sdot` per 16 bytes. VNNI CPUs once ran W8A8
//! through the block kernel's per-chunk finish, and Arm CPUs through the portable loop.
//!
//! Codes are u = s + 128. AVX2 multiplies signed weights s as |s| × sign(q_x, s) (see
//! `avx2_int8`: pair sums ≤ 2·128·127 stay inside `vpmaddubsw`'s i16), and `sdot` takes
//! s (u with its top bit flipped) and q_x both signed, so their lanes sum Σ s·q_x.
//! `vpdpbusd` multiplies unsigned by signed bytes: it takes u as it is and sums Σ u·q_x,
//! and −128·Σq_x (the activation row's start value, [`QuantActs::row_init`]) is added
//! once after the reduction. Every add wraps (`vpaddd`, `vpdpbusd`, `sdot`, the
//! reductions, `wrapping_add`), so the i32 result is exact whenever the true dot fits:
//! it is at most K·128·127 in magnitude, below 2³¹ for K under [`MAX_COLS`].
//!
//! A call is a tile of R weight rows × M activation rows, R·M ≤ 8 accumulators ([`run`]
//! picks the tile from the number of activation rows). One weight row per call cost
//! about as long at decode with the row in L2 as DRAM takes to deliver it (the
//! reduction, the call and the output store paid per row), so compute did not hide
//! under memory. Four rows per call share the activation load, one reduction and one
//! call; each weight chunk's load (and its sign handling) serves the tile's M rows.
//! Such tiles are bound by the activation loads and the per-row call, not the dots:
//! VNNI gains 1.1–1.3× over `vpmaddubsw` at 16×3072×576, not 4× (host E, Intel AVX-512,
//! docs/performance.md's W8A8 row).

use super::packed::PackedWeights;
use super::quant_acts::QuantActs;
use super::{for_weight_rows, RowStore};
use crate::quant::QK;
#[cfg(target_arch = "aarch64")]
use std::arch::aarch64::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use tessera_core::TensorViewMut;

/// Columns below which a row's whole dot fits i32: K·128·127 ≤ 2³¹ − 1 (K < 132 104,
/// beyond any LLM's hidden size; wider rows take the block kernel).
pub(super) const MAX_COLS: usize = (i32::MAX as usize) / (128 * 127);

/// Accumulators a tile holds at most: with the activation chunks, the sign-split weight
/// chunk and two constants, that fills AVX2's 16 ymm registers.
const TILE_ACCUMULATORS: usize = 8;

/// The instruction a call's dots use; each needs its CPU features (see [`run`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Instr {
    /// `vpmaddubsw` + `vpmaddwd` (AVX2).
    #[cfg(target_arch = "x86_64")]
    Maddubs,
    /// `vpdpbusd` on ymm (AVX512_VNNI + AVX512VL).
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// `sdot` (NEON with DotProd).
    #[cfg(target_arch = "aarch64")]
    Sdot,
}

/// One instruction set's integer dot over offset-128 weight codes, BYTES at a time.
trait RowDot {
    /// Bytes per vector; divides a 32-weight chunk.
    const BYTES: usize;
    /// Whether the lanes sum Σ u·q_x (unsigned codes), so −128·Σq_x is still to add.
    const OFFSET_SUMS: bool;
    /// i32 running sums.
    type Acc: Copy;
    /// BYTES activation codes.
    type X: Copy;
    /// BYTES weight codes as the dot takes them.
    type W: Copy;
    /// All zero.
    ///
    /// # Safety
    /// The implementation's CPU features (so for every method below).
    unsafe fn zero() -> Self::Acc;
    /// The BYTES activation codes at `p`. # Safety: as `zero`, and BYTES readable.
    unsafe fn acts(p: *const i8) -> Self::X;
    /// The BYTES weight codes at `p`, prepared. # Safety: as `acts`.
    unsafe fn weights(p: *const u8) -> Self::W;
    /// `acc` plus, per i32 lane, the dot of its 4 weight bytes with its 4 codes of `x`.
    /// # Safety: as `zero`.
    unsafe fn add(acc: Self::Acc, w: Self::W, x: Self::X) -> Self::Acc;
    /// Each accumulator's lanes summed, wrapping. # Safety: as `zero`.
    unsafe fn sums(acc: &[Self::Acc]) -> [i32; TILE_ACCUMULATORS];
    /// Asks for the line at `p` in L1 (never faults). # Safety: as `zero`.
    unsafe fn prefetch(p: *const u8);
}

/// AVX2: signed weights as |s| × sign(q_x, s), `vpmaddubsw` then `vpmaddwd` by ones.
#[cfg(target_arch = "x86_64")]
struct Maddubs;

#[cfg(target_arch = "x86_64")]
impl RowDot for Maddubs {
    const BYTES: usize = 32;
    const OFFSET_SUMS: bool = false;
    type Acc = __m256i;
    type X = __m256i;
    /// (|s|, s).
    type W = (__m256i, __m256i);
    #[inline(always)]
    unsafe fn zero() -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn acts(p: *const i8) -> __m256i {
        // SAFETY: AVX2 and 32 readable bytes, per the contract.
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> Self::W {
        // SAFETY: AVX2 and 32 readable bytes, per the contract.
        unsafe {
            let s = _mm256_xor_si256(
                _mm256_loadu_si256(p as *const __m256i),
                _mm256_set1_epi8(-128),
            );
            (_mm256_abs_epi8(s), s)
        }
    }
    #[inline(always)]
    unsafe fn add(acc: __m256i, (abs, s): Self::W, x: __m256i) -> __m256i {
        // SAFETY: AVX2 per the contract; |s| ≤ 128 keeps the pairs from saturating.
        unsafe {
            let pairs = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(x, s));
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
    #[inline(always)]
    unsafe fn sums(acc: &[__m256i]) -> [i32; TILE_ACCUMULATORS] {
        // SAFETY: AVX2 per the contract.
        unsafe { reduce_ymm(acc) }
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        // SAFETY: a prefetch never faults; SSE is baseline on x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
    }
}

/// AVX512_VNNI on ymm: `vpdpbusd` of the unsigned codes, accumulated in i32.
#[cfg(target_arch = "x86_64")]
struct Vnni;

#[cfg(target_arch = "x86_64")]
impl RowDot for Vnni {
    const BYTES: usize = 32;
    const OFFSET_SUMS: bool = true;
    type Acc = __m256i;
    type X = __m256i;
    type W = __m256i;
    #[inline(always)]
    unsafe fn zero() -> __m256i {
        // SAFETY: as Maddubs (VNNI CPUs have AVX2).
        unsafe { Maddubs::zero() }
    }
    #[inline(always)]
    unsafe fn acts(p: *const i8) -> __m256i {
        // SAFETY: as Maddubs.
        unsafe { Maddubs::acts(p) }
    }
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> __m256i {
        // SAFETY: 32 readable bytes, per the contract.
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }
    #[inline(always)]
    unsafe fn add(acc: __m256i, u: __m256i, x: __m256i) -> __m256i {
        // SAFETY: AVX512_VNNI + AVX512VL per the contract.
        unsafe { _mm256_dpbusd_epi32(acc, u, x) }
    }
    #[inline(always)]
    unsafe fn sums(acc: &[__m256i]) -> [i32; TILE_ACCUMULATORS] {
        // SAFETY: AVX2 per the contract.
        unsafe { reduce_ymm(acc) }
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        // SAFETY: as Maddubs.
        unsafe { Maddubs::prefetch(p) }
    }
}

/// Each ymm accumulator's lanes summed (wrapping): four at a time (missing ones zero)
/// summed pairwise into [Σ0, Σ1, Σ2, Σ3] per 128-bit half, then the halves added.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn reduce_ymm(acc: &[__m256i]) -> [i32; TILE_ACCUMULATORS] {
    // SAFETY: AVX2 per the contract, for every intrinsic below.
    unsafe {
        let zero = _mm256_setzero_si256();
        let at = |i: usize| acc.get(i).copied().unwrap_or(zero);
        let mut sums = [0i32; TILE_ACCUMULATORS];
        for (q, four) in sums
            .chunks_exact_mut(4)
            .enumerate()
            .take(acc.len().div_ceil(4))
        {
            let h = _mm256_hadd_epi32(
                _mm256_hadd_epi32(at(4 * q), at(4 * q + 1)),
                _mm256_hadd_epi32(at(4 * q + 2), at(4 * q + 3)),
            );
            let dots = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            // 4 i32 lanes into a 4-element slice.
            _mm_storeu_si128(four.as_mut_ptr() as *mut __m128i, dots);
        }
        sums
    }
}

/// NEON DotProd: signed weights s = u ^ 0x80 and signed codes, `sdot` into i32 lanes.
#[cfg(target_arch = "aarch64")]
struct Sdot;

#[cfg(target_arch = "aarch64")]
impl RowDot for Sdot {
    const BYTES: usize = 16;
    const OFFSET_SUMS: bool = false;
    type Acc = int32x4_t;
    type X = int8x16_t;
    type W = int8x16_t;
    #[inline(always)]
    unsafe fn zero() -> int32x4_t {
        // SAFETY: NEON per the contract.
        unsafe { vdupq_n_s32(0) }
    }
    #[inline(always)]
    unsafe fn acts(p: *const i8) -> int8x16_t {
        // SAFETY: NEON and 16 readable bytes, per the contract.
        unsafe { vld1q_s8(p) }
    }
    #[inline(always)]
    unsafe fn weights(p: *const u8) -> int8x16_t {
        // SAFETY: NEON and 16 readable bytes, per the contract.
        unsafe { vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p), vdupq_n_u8(0x80))) }
    }
    #[inline(always)]
    unsafe fn add(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
        // SAFETY: DotProd per the contract.
        unsafe { crate::simd::lanes_neon::sdot(acc, w, x) }
    }
    #[inline(always)]
    unsafe fn sums(acc: &[int32x4_t]) -> [i32; TILE_ACCUMULATORS] {
        let mut sums = [0i32; TILE_ACCUMULATORS];
        for (s, &a) in sums.iter_mut().zip(acc) {
            // SAFETY: NEON per the contract; `addv` wraps.
            *s = unsafe { vaddvq_s32(a) };
        }
        sums
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        // SAFETY: a prefetch never faults and touches no registers but its address.
        unsafe {
            std::arch::asm!("prfm pldl1keep, [{p}]", p = in(reg) p,
                options(nostack, preserves_flags, readonly))
        }
    }
}

/// `y = x̂·Wᵀ` over `acts`, the tile chosen by their count: decode takes four weight
/// rows per call, prefill one weight row against eight activation rows.
///
/// # Safety
/// The CPU has `instr`'s features (AVX2; AVX2 + AVX512_VNNI + AVX512VL; NEON + DotProd);
/// `w` has offset-128 codes and one scale per row
/// ([`PackedWeights::one_scale_per_row`]); `w.cols < MAX_COLS`; every `acts[i]` was
/// quantized with one scale per row for `w.cols` columns and `w`'s offset; y is
/// `[acts.len(), w.rows]`.
pub(super) unsafe fn run(
    threads: usize,
    instr: Instr,
    w: &PackedWeights,
    acts: &[QuantActs],
    act_block: usize,
    y: &mut TensorViewMut<'_, f32>,
) {
    // SAFETY: forwarded contract.
    unsafe {
        match acts.len() {
            0 => {}
            1 => tiles::<4, 1>(threads, instr, w, acts, act_block, y),
            2 => tiles::<4, 2>(threads, instr, w, acts, act_block, y),
            3 | 4 => tiles::<2, 4>(threads, instr, w, acts, act_block, y),
            _ => tiles::<1, 8>(threads, instr, w, acts, act_block, y),
        }
    }
}

/// [`run`] in R × M tiles. A last, short activation chunk is padded by repeating its
/// last row, and a last weight group past N reads the last row; the driver drops both.
///
/// # Safety
/// As [`run`].
unsafe fn tiles<const R: usize, const M: usize>(
    threads: usize,
    instr: Instr,
    w: &PackedWeights,
    acts: &[QuantActs],
    act_block: usize,
    y: &mut TensorViewMut<'_, f32>,
) {
    // Whole tiles per activation block: a block of 4 (K = 1536) would run 1×8 tiles
    // half empty.
    let shape = (w.rows(), acts.len(), act_block.next_multiple_of(M));
    for_weight_rows::<M, R>(threads, shape, RowStore::Each, y, |r, m0, mc, out| {
        let a: [&QuantActs; M] = std::array::from_fn(|i| &acts[m0 + i.min(mc - 1)]);
        // SAFETY: `run`'s contract (the features `instr` needs); the driver starts every
        // group below N.
        unsafe {
            match instr {
                #[cfg(target_arch = "x86_64")]
                Instr::Maddubs => dots_maddubs::<R, M>(w, r, &a, out),
                #[cfg(target_arch = "x86_64")]
                Instr::Vnni => dots_vnni::<R, M>(w, r, &a, out),
                #[cfg(target_arch = "aarch64")]
                Instr::Sdot => dots_sdot::<R, M>(w, r, &a, out),
            }
        }
    });
}

/// [`dots`] with `vpmaddubsw`.
///
/// # Safety
/// AVX2; as [`dots`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dots_maddubs<const R: usize, const M: usize>(
    w: &PackedWeights,
    row: usize,
    acts: &[&QuantActs; M],
    out: &mut [f32],
) {
    // SAFETY: forwarded contract.
    unsafe { dots::<Maddubs, R, M>(w, row, acts, out) }
}

/// [`dots`] with `vpdpbusd`.
///
/// # Safety
/// AVX2, AVX512_VNNI and AVX512VL; as [`dots`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
unsafe fn dots_vnni<const R: usize, const M: usize>(
    w: &PackedWeights,
    row: usize,
    acts: &[&QuantActs; M],
    out: &mut [f32],
) {
    // SAFETY: forwarded contract.
    unsafe { dots::<Vnni, R, M>(w, row, acts, out) }
}

/// [`dots`] with `sdot`.
///
/// # Safety
/// NEON with DotProd; as [`dots`].
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,dotprod")]
unsafe fn dots_sdot<const R: usize, const M: usize>(
    w: &PackedWeights,
    row: usize,
    acts: &[&QuantActs; M],
    out: &mut [f32],
) {
    // SAFETY: forwarded contract.
    unsafe { dots::<Sdot, R, M>(w, row, acts, out) }
}

/// `out[i·R + g] = scale_w[row + g] · d_x(i) · Σ_k s_k·q_x,i[k]` for as many outputs
/// as `out` holds (≤ R·M). Weight rows past the last are read as the last. Inlined into
/// each instance so it compiles with its features.
///
/// # Safety
/// As [`run`], D's features, and `row < w.rows`.
#[inline(always)]
unsafe fn dots<D: RowDot, const R: usize, const M: usize>(
    w: &PackedWeights,
    row: usize,
    acts: &[&QuantActs; M],
    out: &mut [f32],
) {
    const { assert!(R * M <= TILE_ACCUMULATORS && QK.is_multiple_of(D::BYTES)) };
    let k = w.cols;
    debug_assert!(row < w.rows && out.len() <= R * M && k < MAX_COLS);
    debug_assert!(acts.iter().all(|a| a.q.len() >= k));
    let rows: [usize; R] = std::array::from_fn(|g| (row + g).min(w.rows - 1));
    // SAFETY: every rows[g] < rows, and 8-bit rows are `cols` bytes long.
    let quants: [*const u8; R] =
        std::array::from_fn(|g| unsafe { w.quants.as_ptr().add(rows[g] * k) });
    let xs: [*const i8; M] = std::array::from_fn(|i| acts[i].q.as_ptr());
    // The next tile's R rows are contiguous; R·32 bytes of them are fetched per chunk of
    // this tile, so the prefetches run one tile ahead of the loads.
    let next = w.quants.as_ptr().wrapping_add((row + R) * k);
    // SAFETY: D's features, per the contract.
    let mut acc = [[unsafe { D::zero() }; M]; R];
    for b in 0..k / QK {
        // SAFETY: chunk b's 32 bytes lie inside every weight row and activation row
        // (all k long); prefetching never faults; D's features per the contract.
        unsafe {
            for line in (0..R * QK).step_by(64) {
                D::prefetch(next.wrapping_add(R * QK * b + line));
            }
            for part in 0..QK / D::BYTES {
                let at = QK * b + D::BYTES * part;
                // A loop, not `array::from_fn`: a closure would not carry D's target
                // features, and its intrinsics could stay out-of-line calls.
                let mut x = [D::acts(xs[0].add(at)); M];
                for (xi, p) in x.iter_mut().zip(&xs).skip(1) {
                    *xi = D::acts(p.add(at));
                }
                for g in 0..R {
                    let wc = D::weights(quants[g].add(at));
                    for i in 0..M {
                        acc[g][i] = D::add(acc[g][i], wc, x[i]);
                    }
                }
            }
        }
    }
    // SAFETY: D's features, per the contract.
    let sums = unsafe { D::sums(acc.as_flattened()) };
    for (j, o) in out.iter_mut().enumerate() {
        let (i, g) = (j / R, j % R);
        let mut dot = sums[g * M + i];
        if D::OFFSET_SUMS {
            // −128·Σq_x (the codes' offset is 128).
            dot = dot.wrapping_add(acts[i].row_init);
        }
        let dx = acts[i].d8.first().map_or(0.0, |d| d[0]);
        *o = dot as f32 * w.row_scale(rows[g]) * dx;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::qmatmul::qmatmul_w8a8;
    use crate::quant::Int8Matrix;
    use tessera_core::{Isa, TensorView, TensorViewMut};

    /// Per-channel INT8 with per-row activations takes this kernel on every ISA whose
    /// CPU has one of its instructions (the registry's W8A8 variants then run it), and
    /// per-block activation scales never do.
    #[test]
    fn per_row_int8_takes_this_kernel_where_the_cpu_has_its_instruction() {
        use crate::ops::qmatmul::{ActScales, IntKernel};
        use tessera_core::CpuFeatures;
        let w = PackedWeights::from_int8(&Int8Matrix::quantize(4, 64, &[0.5; 256]).unwrap());
        let f = CpuFeatures::get();
        for isa in Isa::available() {
            let want: Option<Instr> = match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 if f.avx512_vnni => Some(Instr::Vnni),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 | Isa::Avx2 => Some(Instr::Maddubs),
                #[cfg(target_arch = "aarch64")]
                Isa::Neon if f.neon_dotprod => Some(Instr::Sdot),
                _ => None,
            };
            let chosen = |act| IntKernel::for_isa(isa).reading(&w).for_scales(&w, act);
            let got = match chosen(ActScales::PerRow) {
                IntKernel::RowScaled(i) => Some(i),
                _ => None,
            };
            eprintln!("{isa:?}: row-scaled instruction {got:?} ({})", f.summary());
            assert_eq!(got, want, "{isa:?}");
            assert!(!matches!(
                chosen(ActScales::PerBlock),
                IntKernel::RowScaled(_)
            ));
        }
    }

    /// Rows of the largest magnitude (codes ±127 against ±127) sum to K·127² in i32:
    /// just below [`MAX_COLS`] that is within 1% of 2³¹ and must not wrap; at and above
    /// it the block kernel takes over. The VNNI instance's Σ u·q (u = s + 128) passes 2³¹
    /// on the way for +1 rows (255·127·K) and must come back through its start value.
    /// Every instance must give K (the dot of equal ±1 rows).
    #[test]
    fn whole_row_sums_do_not_overflow_near_the_bound() {
        let isas: Vec<Isa> = [Isa::Avx2, Isa::Avx512, Isa::Neon]
            .into_iter()
            .filter(|i| i.is_available())
            .collect();
        if isas.is_empty() {
            eprintln!("skipped: no AVX2 and no NEON");
            return;
        }
        let below = MAX_COLS / QK * QK;
        for isa in isas {
            for sign in [-1.0f32, 1.0] {
                for k in [below, below + QK] {
                    let w = PackedWeights::from_int8(
                        &Int8Matrix::quantize(1, k, &vec![sign; k]).unwrap(),
                    );
                    let x = vec![sign; k];
                    let xv = TensorView::contiguous(&x, &[1, k]).unwrap();
                    let mut y = [f32::NAN];
                    let mut yv = TensorViewMut::contiguous(&mut y, &[1, 1]).unwrap();
                    qmatmul_w8a8(isa, 1, &w, &xv, &mut yv).unwrap();
                    let e = (y[0] / k as f32 - 1.0).abs();
                    assert!(e < 1e-5, "{isa:?}, sign {sign}, K = {k}: {}", y[0]);
                }
            }
        }
    }
}
