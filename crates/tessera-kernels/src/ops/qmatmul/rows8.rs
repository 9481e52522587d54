//! The integer kernel for weights interleaved eight rows at a time
//! ([`PackedWeights::interleaved`]): one chunk loop ([`chunk`]), instantiated through
//! [`RowLanes`] for AVX2 (`vpmaddubsw` on ymm, one group of 8 rows), AVX512_VNNI on ymm
//! (`vpdpbusd`, 8 rows) and AVX512_VNNI on zmm (16 rows: two adjacent groups, one per
//! 256-bit half); Q3_K/Q6_K's split scales go on to `avx2_planes8`.
//!
//! Why a layout of its own: the row kernel (`avx2_int8`) holds one row's chunk per ymm,
//! so every 32-weight chunk pays its own `vpmaddwd`, conversion and scale multiplies,
//! and 4-bit decode on AVX2 was bound by those instructions, not by DRAM
//! (docs/performance.md). Here a ymm holds 4 codes of each of 8 rows: one `vpmaddubsw`
//! (or `vpdpbusd`) against 4 activation bytes broadcast to every lane gives the 8 rows'
//! partial sums, 8 of them cover the chunk, and one conversion and one FMA finish the
//! chunk for all 8 rows, whose scales are one load. About 4 vector instructions per 32
//! weights instead of ~10, and the 8 i32 lanes are the 8 rows' dots, so no horizontal
//! sum either. Batches (M = 16, a batching step) are bound by these instructions, so
//! `vpdpbusd`'s one instruction for `vpmaddubsw` + `vpaddw` (+ `vpmaddwd` per chunk)
//! pays there: Q4_1 16×3072×576 172–219 µs against 207–273 on a Zen 4 host
//! (docs/performance.md, "Batching and serving").
//!
//! On AVX2 the 8 partial sums add in i16 (`vpaddw`, which wraps, unlike `vpmaddubsw`):
//! codes ≤ 15 and |q_x| ≤ 127 bound each pair sum by 2·15·127 = 3810, and 8·3810 =
//! 30480 < 2¹⁵. `vpdpbusd` sums in i32, so the VNNI instance also reads full-byte codes
//! ([`CodeLayout::Bytes8`]: Q8_0, Q8_K, up to 255·127·32 per chunk), which AVX2 never
//! gets (the packer interleaves them only on VNNI CPUs).
//!
//! Per chunk and row the value is `d·(S − offset·Σq_x)·d_x + m·(d_x·Σq_x)`: S and the
//! start value exact in i32, the minimum term from the activation's precomputed
//! d_x·Σq_x. The activation rows come as [`super::act_panel`] records, one per chunk
//! for up to 8 rows, so every activation load is a constant offset from one pointer.
//! Q3_K/Q6_K's split scales have their own kernel, `avx2_planes8`.

use super::act_panel::{PanelRows, DX_AT, INIT_AT, PANEL_SLOTS, RECORD_BYTES, SUMS_AT};
use super::avx2_int8::MetaElem;
use super::packed::{CodeLayout, Meta, PackedWeights, GROUP_PAIR_BYTES, ROWS8};
use super::M_CHUNK;
use crate::quant::QK;
use half::f16;
use std::arch::x86_64::*;

/// `out[8i + g] = Σ_k W[r0 + g, k]·x̂_i[k]` for the group of 8 rows starting at r0
/// (rows past `w.rows` are zero padding) and up to M_CHUNK activation rows, with
/// `vpmaddubsw`.
///
/// # Safety
/// AVX2, FMA and F16C; `w.layout.interleaved()` but not [`CodeLayout::Bytes8`] (full
/// bytes would saturate `vpmaddubsw`), and not [`Meta::SplitI8`] metadata; r0 a
/// multiple of 8 below `w.rows`; 1 ≤ acts.live() ≤ M_CHUNK, the rows quantized for
/// `w.cols` columns and `w`'s offset, starting at a slot that leaves M_CHUNK slots in
/// the panel; out.len() ≥ 8·acts.live().
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dots(w: &PackedWeights, r0: usize, acts: PanelRows<'_>, out: &mut [f32]) {
    debug_assert!(w.layout != CodeLayout::Bytes8);
    // SAFETY: forwarded contract.
    unsafe { dots_with::<Ymm<Maddubs>, M_CHUNK>(w, r0, acts, out) }
}

/// Activation rows [`dots_vnni`] takes per pass over a group's codes. AVX-512VL's 32 ymm registers hold 8 rows' two running sums and
/// accumulators where AVX2's 16 hold 4 ([`M_CHUNK`]); each pass expands the codes once
/// and finishes each chunk's 8 rows with one load of their scales, so a 16-row batch
/// expands every code twice instead of four times.
pub(super) const VNNI_M: usize = 8;

/// [`dots`] with `vpdpbusd` on ymm registers (AVX512_VNNI + AVX512VL): the same loop,
/// one instruction per 4 activation bytes instead of `vpmaddubsw` + `vpaddw`, and no
/// `vpmaddwd` per chunk.
///
/// # Safety
/// As [`dots`] with [`VNNI_M`] for M_CHUNK, [`CodeLayout::Bytes8`] included, and the
/// CPU has AVX-512F/VL and AVX512_VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn dots_vnni(w: &PackedWeights, r0: usize, acts: PanelRows<'_>, out: &mut [f32]) {
    // SAFETY: forwarded contract.
    unsafe { dots_with::<Ymm<Vnni>, VNNI_M>(w, r0, acts, out) }
}

/// Rows [`dots_vnni16`] covers per call: two adjacent groups.
pub(super) const ROWS16: usize = 2 * ROWS8;

/// Activation rows from which [`dots_vnni16`] runs on zmm. A decode row (one) stays on
/// ymm: with 512-bit instructions in flight Intel cores lose port 1's vector ALU, and
/// one activation row leaves the code loads, inserts and nibble masks as many as the
/// dot products. Intel Xeon (AVX-512 + VNNI) host, Q4_1 3072×576, 3 alternated rounds:
/// M = 1 cold 31–52 µs ymm against 59–83 zmm; in cache M = 2 35–69 against 32–40,
/// M = 8 133–147 against 88–101 (docs/performance.md).
const ZMM_MIN_ROWS: usize = 2;

/// [`dots_vnni`] on zmm registers for the 16 rows of groups r0/8 and r0/8 + 1, each
/// lane one row: `out[16i + g] = Σ_k W[r0 + g, k]·x̂_i[k]`.
///
/// Why two groups per register rather than two chunk steps of one: the chunk's finish
/// (a conversion, a scale multiply, one or two FMAs per activation row) then serves 16
/// rows instead of 8, where with 8 rows in 16 lanes it would stay as costly as on ymm.
/// The second group's codes come in with one `vinserti64x4` per 32 bytes, shared by
/// the pass's activation rows. A last, odd group runs [`dots_vnni`] (its rows land in
/// the first 8 of each 16 outputs), and so does a pass of fewer than [`ZMM_MIN_ROWS`]
/// activation rows.
///
/// # Safety
/// As [`dots_vnni`], r0 a multiple of 16, out.len() ≥ 16·acts.live(), and the CPU has
/// AVX-512F/BW/DQ/VL and AVX512_VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
pub(super) unsafe fn dots_vnni16(
    w: &PackedWeights,
    r0: usize,
    acts: PanelRows<'_>,
    out: &mut [f32],
) {
    debug_assert!(r0.is_multiple_of(ROWS16) && out.len() >= ROWS16 * acts.live());
    let live = acts.live();
    if r0 + ROWS8 < w.rows && live >= ZMM_MIN_ROWS {
        // SAFETY: forwarded contract; group r0/8 + 1 holds row r0 + 8 < rows.
        return unsafe { dots_with::<Zmm, VNNI_M>(w, r0, acts, out) };
    }
    let mut eight = [0f32; ROWS8 * VNNI_M];
    for r in (r0..w.rows.min(r0 + ROWS16)).step_by(ROWS8) {
        // SAFETY: forwarded contract, for one group.
        unsafe { dots_vnni(w, r, acts, &mut eight) };
        let at = r - r0;
        for (o, e) in out
            .chunks_exact_mut(ROWS16)
            .zip(eight.chunks_exact(ROWS8))
            .take(live)
        {
            o[at..at + ROWS8].copy_from_slice(e);
        }
    }
}

/// The body of [`dots`], [`dots_vnni`] and [`dots_vnni16`], inlined into each so it is
/// compiled with the caller's target features: the chunk loop is written once, its
/// register width and 4-byte dot product (`L`) per instruction set.
///
/// # Safety
/// As [`dots`] with MC (≥ M_CHUNK) for M_CHUNK, plus `L`'s own CPU features; for
/// `L::GROUPS` = 2, r0 a multiple of 16 with row r0 + 8 below the rows, and out
/// 16·acts.live() long.
#[inline(always)]
unsafe fn dots_with<L: RowLanes, const MC: usize>(
    w: &PackedWeights,
    r0: usize,
    acts: PanelRows<'_>,
    out: &mut [f32],
) {
    let nb = w.cols / QK;
    let group = r0 / ROWS8;
    let last = r0 + ROWS8 * (L::GROUPS - 1);
    debug_assert!(w.layout.interleaved() && r0.is_multiple_of(ROWS8) && last < w.rows);
    debug_assert_eq!(acts.chunks(), nb);
    // Group `group + j`'s metadata for j < L::GROUPS (the first again past them).
    let at = |j: usize| (group + j * (L::GROUPS - 1)) * nb * ROWS8;
    let rows = |j: usize| r0 + j * (L::GROUPS - 1) * ROWS8;
    // SAFETY: in each arm each group's metadata starts at these offsets (the packer sized
    // the arrays for every padded group); the rest is forwarded.
    unsafe {
        match &w.meta {
            Meta::F32 { scales, mins } => {
                debug_assert!(scales.len() >= at(1) + nb * ROWS8);
                let m = [0, 1].map(|j| Plain::of(scales, mins, at(j)));
                by_rows::<L, _, MC>(w, m, !mins.is_empty(), r0, acts, out)
            }
            Meta::F16 { scales, mins } => {
                debug_assert!(scales.len() >= at(1) + nb * ROWS8);
                let m = [0, 1].map(|j| Plain::of(scales, mins, at(j)));
                by_rows::<L, _, MC>(w, m, !mins.is_empty(), r0, acts, out)
            }
            Meta::Factored(f) => {
                debug_assert!(f.sc.len() >= at(1) + nb * ROWS8);
                let m = [0, 1].map(|j| {
                    let s = w.super_index(rows(j), 0);
                    Factored8 {
                        d: f.d.as_ptr().add(s),
                        neg_dmin: f.neg_dmin.as_ptr().add(s),
                        sc: f.sc.as_ptr().add(at(j)),
                        mn: f.mn.as_ptr().add(at(j)),
                    }
                });
                by_rows::<L, _, MC>(w, m, true, r0, acts, out)
            }
            Meta::SplitI8(_) => unreachable!("split scales run avx2_planes8 (IntKernel::reading)"),
        }
    }
}

/// The 4-byte dot products of a chunk: per i32 lane (one weight row), Σ u·q_x over 32
/// codes in 8 steps of 4, starting from the activation block's start value.
trait Dot4 {
    /// A running chunk sum.
    type Sum: Copy;
    /// # Safety
    /// The implementation's CPU features.
    unsafe fn start(init: i32) -> Self::Sum;
    /// Adds the 4-byte dots of codes `u` (< 16 for [`Maddubs`], any byte for [`Vnni`])
    /// and activation bytes `x`.
    ///
    /// # Safety
    /// As [`Dot4::start`].
    unsafe fn add(sum: Self::Sum, u: __m256i, x: __m256i) -> Self::Sum;
    /// The chunk's i32 sums from its two running sums (the first started from `init`),
    /// start value included.
    ///
    /// # Safety
    /// As [`Dot4::start`].
    unsafe fn finish(sums: [Self::Sum; 2], init: i32) -> __m256i;
}

/// AVX2: `vpmaddubsw` pairs into i16, added with `vpaddw` (bounded, see the module
/// docs), then `vpmaddwd` against ones into i32.
struct Maddubs;

impl Dot4 for Maddubs {
    type Sum = __m256i;
    #[inline(always)]
    unsafe fn start(_: i32) -> __m256i {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn add(sum: __m256i, u: __m256i, x: __m256i) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe { _mm256_add_epi16(sum, _mm256_maddubs_epi16(u, x)) }
    }
    #[inline(always)]
    unsafe fn finish([a, b]: [__m256i; 2], init: i32) -> __m256i {
        // SAFETY: AVX2 per the contract. The two i16 sums together obey the 8-step
        // bound of the module docs.
        unsafe {
            _mm256_add_epi32(
                _mm256_madd_epi16(_mm256_add_epi16(a, b), _mm256_set1_epi16(1)),
                _mm256_set1_epi32(init),
            )
        }
    }
}

/// AVX512_VNNI on ymm: `vpdpbusd` accumulates the 4-byte dots in i32 directly.
struct Vnni;

impl Dot4 for Vnni {
    type Sum = __m256i;
    #[inline(always)]
    unsafe fn start(init: i32) -> __m256i {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_set1_epi32(init) }
    }
    #[inline(always)]
    unsafe fn add(sum: __m256i, u: __m256i, x: __m256i) -> __m256i {
        // SAFETY: AVX512_VNNI + AVX512VL per the contract.
        unsafe { _mm256_dpbusd_epi32(sum, u, x) }
    }
    #[inline(always)]
    unsafe fn finish([a, b]: [__m256i; 2], _: i32) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe { _mm256_add_epi32(a, b) }
    }
}

/// One register of row lanes and the chunk arithmetic on it: the 8 rows of one group on
/// ymm ([`Ymm`], with either dot product) or the 16 rows of two adjacent groups on zmm
/// ([`Zmm`]). [`chunk`] is written once over it.
trait RowLanes {
    /// 8-row groups one register covers (1 or 2).
    const GROUPS: usize;
    /// i32 lanes: codes and running sums.
    type I: Copy;
    /// f32 lanes: the rows' running dots.
    type F: Copy;
    /// Step codes: the 32 bytes at `p` of each group covered, the next group's
    /// `group_bytes` further on.
    ///
    /// # Safety
    /// The implementation's CPU features; the bytes are readable.
    unsafe fn codes(p: *const u8, group_bytes: usize) -> Self::I;
    /// Every byte's low nibble, or its high one when HI.
    ///
    /// # Safety
    /// As [`RowLanes::codes`], without the memory.
    unsafe fn nibbles<const HI: bool>(v: Self::I) -> Self::I;
    /// A running sum started at `init` (or at zero, where `finish` adds it).
    ///
    /// # Safety
    /// As [`RowLanes::nibbles`].
    unsafe fn start(init: i32) -> Self::I;
    /// Adds the 4-byte dots of codes `u` (< 16 on [`Maddubs`], any byte with
    /// `vpdpbusd`) and the activation bytes `x` (the same 4 in every lane).
    ///
    /// # Safety
    /// As [`RowLanes::nibbles`].
    unsafe fn add(sum: Self::I, u: Self::I, x: i32) -> Self::I;
    /// The chunk's i32 sums from its two running sums (the first started from `init`),
    /// start value included.
    ///
    /// # Safety
    /// As [`RowLanes::nibbles`].
    unsafe fn finish(sums: [Self::I; 2], init: i32) -> Self::I;
    /// Chunk c's scales (or minima, when MINS) of the groups covered, from their
    /// per-group metadata.
    ///
    /// # Safety
    /// As [`ChunkMeta::scales`], for the groups covered.
    unsafe fn meta<C: ChunkMeta, const MINS: bool>(m: &[C; 2], c: usize) -> Self::F;
    /// # Safety
    /// As [`RowLanes::nibbles`].
    unsafe fn zero() -> Self::F;
    /// `acc + s·d·dx`, s converted to f32.
    ///
    /// # Safety
    /// As [`RowLanes::nibbles`].
    unsafe fn scale_add(s: Self::I, d: Self::F, dx: f32, acc: Self::F) -> Self::F;
    /// `acc + m·sums`.
    ///
    /// # Safety
    /// As [`RowLanes::nibbles`].
    unsafe fn min_add(m: Self::F, sums: f32, acc: Self::F) -> Self::F;
    /// Writes the lanes to `out[..8·GROUPS]`.
    ///
    /// # Safety
    /// As [`RowLanes::nibbles`]; out holds 8·GROUPS floats.
    unsafe fn store(acc: Self::F, out: &mut [f32]);
}

/// One group's 8 rows on ymm, with dot product `D`.
struct Ymm<D>(std::marker::PhantomData<D>);

impl<D: Dot4<Sum = __m256i>> RowLanes for Ymm<D> {
    const GROUPS: usize = 1;
    type I = __m256i;
    type F = __m256;
    #[inline(always)]
    unsafe fn codes(p: *const u8, _: usize) -> __m256i {
        // SAFETY: AVX per the contract; 32 readable bytes.
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }
    #[inline(always)]
    unsafe fn nibbles<const HI: bool>(v: __m256i) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe {
            let v = if HI { _mm256_srli_epi16::<4>(v) } else { v };
            _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
        }
    }
    #[inline(always)]
    unsafe fn start(init: i32) -> __m256i {
        // SAFETY: forwarded contract.
        unsafe { D::start(init) }
    }
    #[inline(always)]
    unsafe fn add(sum: __m256i, u: __m256i, x: i32) -> __m256i {
        // SAFETY: forwarded contract.
        unsafe { D::add(sum, u, _mm256_set1_epi32(x)) }
    }
    #[inline(always)]
    unsafe fn finish(sums: [__m256i; 2], init: i32) -> __m256i {
        // SAFETY: forwarded contract.
        unsafe { D::finish(sums, init) }
    }
    #[inline(always)]
    unsafe fn meta<C: ChunkMeta, const MINS: bool>(m: &[C; 2], c: usize) -> __m256 {
        // SAFETY: forwarded contract.
        unsafe {
            if MINS {
                m[0].mins(c)
            } else {
                m[0].scales(c)
            }
        }
    }
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn scale_add(s: __m256i, d: __m256, dx: f32, acc: __m256) -> __m256 {
        // SAFETY: AVX and FMA per the contract.
        unsafe {
            _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(s),
                _mm256_mul_ps(d, _mm256_set1_ps(dx)),
                acc,
            )
        }
    }
    #[inline(always)]
    unsafe fn min_add(m: __m256, sums: f32, acc: __m256) -> __m256 {
        // SAFETY: FMA per the contract.
        unsafe { _mm256_fmadd_ps(m, _mm256_set1_ps(sums), acc) }
    }
    #[inline(always)]
    unsafe fn store(acc: __m256, out: &mut [f32]) {
        // SAFETY: per the contract.
        unsafe { store_group(&[acc], out) }
    }
}

/// Two adjacent groups' 16 rows on zmm with `vpdpbusd` (AVX-512F/BW/DQ and
/// AVX512_VNNI): lanes 0–7 the first group's rows, 8–15 the second's.
struct Zmm;

impl RowLanes for Zmm {
    const GROUPS: usize = 2;
    type I = __m512i;
    type F = __m512;
    #[inline(always)]
    unsafe fn codes(p: *const u8, group_bytes: usize) -> __m512i {
        // SAFETY: AVX-512F per the contract; 32 readable bytes at each address.
        unsafe {
            let lo = _mm256_loadu_si256(p as *const __m256i);
            let hi = _mm256_loadu_si256(p.add(group_bytes) as *const __m256i);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        }
    }
    #[inline(always)]
    unsafe fn nibbles<const HI: bool>(v: __m512i) -> __m512i {
        // SAFETY: AVX-512F/BW per the contract.
        unsafe {
            let v = if HI { _mm512_srli_epi16::<4>(v) } else { v };
            _mm512_and_si512(v, _mm512_set1_epi8(0x0F))
        }
    }
    #[inline(always)]
    unsafe fn start(init: i32) -> __m512i {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_set1_epi32(init) }
    }
    #[inline(always)]
    unsafe fn add(sum: __m512i, u: __m512i, x: i32) -> __m512i {
        // SAFETY: AVX512_VNNI per the contract.
        unsafe { _mm512_dpbusd_epi32(sum, u, _mm512_set1_epi32(x)) }
    }
    #[inline(always)]
    unsafe fn finish([a, b]: [__m512i; 2], _: i32) -> __m512i {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn meta<C: ChunkMeta, const MINS: bool>(m: &[C; 2], c: usize) -> __m512 {
        // SAFETY: forwarded contract; AVX-512DQ for the insert.
        unsafe {
            let [lo, hi] = if MINS {
                [m[0].mins(c), m[1].mins(c)]
            } else {
                [m[0].scales(c), m[1].scales(c)]
            };
            _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi)
        }
    }
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn scale_add(s: __m512i, d: __m512, dx: f32, acc: __m512) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe {
            _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(s),
                _mm512_mul_ps(d, _mm512_set1_ps(dx)),
                acc,
            )
        }
    }
    #[inline(always)]
    unsafe fn min_add(m: __m512, sums: f32, acc: __m512) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_fmadd_ps(m, _mm512_set1_ps(sums), acc) }
    }
    #[inline(always)]
    unsafe fn store(acc: __m512, out: &mut [f32]) {
        debug_assert!(out.len() >= 16);
        // SAFETY: AVX-512F per the contract; out holds 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) }
    }
}

/// A group's 8 rows' scales and minima for chunk c, in f32.
trait ChunkMeta: Copy {
    /// # Safety
    /// AVX2 and F16C; chunk c is in the group.
    unsafe fn scales(self, c: usize) -> __m256;
    /// # Safety
    /// As [`ChunkMeta::scales`], for a format with minima.
    unsafe fn mins(self, c: usize) -> __m256;
}

/// Scales and minima stored per chunk, 8 rows contiguous, in f32 or f16.
#[derive(Clone, Copy)]
struct Plain<E> {
    scales: *const E,
    /// `scales` again for formats without a minimum (never read then).
    mins: *const E,
}

impl<E: MetaElem> Plain<E> {
    /// # Safety
    /// `at` is within `scales` (and `mins`, unless empty).
    unsafe fn of(scales: &[E], mins: &[E], at: usize) -> Self {
        // SAFETY: per the contract.
        let scales = unsafe { scales.as_ptr().add(at) };
        let mins = if mins.is_empty() {
            scales
        } else {
            // SAFETY: per the contract.
            unsafe { mins.as_ptr().add(at) }
        };
        Plain { scales, mins }
    }
}

impl<E: MetaElem> ChunkMeta for Plain<E> {
    #[inline(always)]
    unsafe fn scales(self, c: usize) -> __m256 {
        // SAFETY: per the contract.
        unsafe { E::load8(self.scales.add(ROWS8 * c)) }
    }
    #[inline(always)]
    unsafe fn mins(self, c: usize) -> __m256 {
        // SAFETY: per the contract.
        unsafe { E::load8(self.mins.add(ROWS8 * c)) }
    }
}

/// Q4_K's own fields ([`super::packed::Factored`]): per chunk 8 rows' 6-bit sc and mn
/// bytes, per super-block of 8 chunks their f16 d and −dmin. Widening each and one
/// multiply (exact) cost ~10 more vector instructions per 256 weights than two f32
/// loads (~25 % more), and save 5.5 of every 24 bytes streamed per 32 weights: 0.88×
/// on the LM head, a wash on prefill (docs/performance.md).
#[derive(Clone, Copy)]
struct Factored8 {
    d: *const f16,
    neg_dmin: *const f16,
    sc: *const u8,
    mn: *const u8,
}

impl Factored8 {
    /// `base[8s..8s+8]` (f16, super-block s = c/8) times `bytes[8c..8c+8]`.
    ///
    /// # Safety
    /// AVX2 and F16C; both ranges are readable.
    #[inline(always)]
    unsafe fn product(base: *const f16, bytes: *const u8, c: usize) -> __m256 {
        // SAFETY: per the contract.
        unsafe {
            let ints = _mm_loadl_epi64(bytes.add(ROWS8 * c) as *const __m128i);
            let small = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(ints));
            _mm256_mul_ps(f16::load8(base.add(ROWS8 * (c / 8))), small)
        }
    }
}

impl ChunkMeta for Factored8 {
    #[inline(always)]
    unsafe fn scales(self, c: usize) -> __m256 {
        // SAFETY: per the contract.
        unsafe { Self::product(self.d, self.sc, c) }
    }
    #[inline(always)]
    unsafe fn mins(self, c: usize) -> __m256 {
        // SAFETY: per the contract.
        unsafe { Self::product(self.neg_dmin, self.mn, c) }
    }
}

/// Chunk pairs the codes are prefetched ahead: 2–3 KiB. The hardware prefetcher alone
/// left decode up at 0.80× and the LM head at 0.87× of this (docs/performance.md); 4
/// pairs ahead was slower, 16 no different.
const PREFETCH_PAIRS: usize = 8;

/// Prefetches the group's chunk pair `pair + PREFETCH_PAIRS` (of `pair_bytes` each):
/// every cache line of it, as the kernel reads all of them.
#[inline(always)]
pub(super) fn prefetch_pair(codes: *const u8, pair: usize, pair_bytes: usize) {
    // Past the group's last pair this reads the next group's codes (stored next), or
    // past the allocation, which a prefetch may do: it never faults, and
    // `wrapping_add` keeps the address arithmetic defined.
    let ahead = codes.wrapping_add((pair + PREFETCH_PAIRS) * pair_bytes);
    for line in (0..pair_bytes).step_by(64) {
        // SAFETY: a prefetch only hints the cache; SSE is baseline on x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast()) };
    }
}

/// One monomorphized loop per code width (nibbles or bytes), minimum / no minimum and
/// activation-row count: 1 to 4 exactly, more (up to MC) as MC with the last row
/// repeated and its extra outputs dropped.
#[inline(always)]
unsafe fn by_rows<L: RowLanes, C: ChunkMeta, const MC: usize>(
    w: &PackedWeights,
    meta: [C; 2],
    min: bool,
    r0: usize,
    acts: PanelRows<'_>,
    out: &mut [f32],
) {
    macro_rules! arms {
        ($($bytes:literal, $min:literal;)*) => {
            match (w.layout == CodeLayout::Bytes8, min, acts.live()) {
                (_, _, 0) => {}
                $(
                    ($bytes, $min, 1) => dots_m::<L, $bytes, $min, C, 1>(w, meta, r0, acts, out),
                    ($bytes, $min, 2) => dots_m::<L, $bytes, $min, C, 2>(w, meta, r0, acts, out),
                    ($bytes, $min, 3) => dots_m::<L, $bytes, $min, C, 3>(w, meta, r0, acts, out),
                    ($bytes, $min, 4) => dots_m::<L, $bytes, $min, C, 4>(w, meta, r0, acts, out),
                    ($bytes, $min, _) => dots_m::<L, $bytes, $min, C, MC>(w, meta, r0, acts, out),
                )*
            }
        };
    }
    // SAFETY: forwarded contract; each arm gets at most its count of rows.
    unsafe { arms!(false, false; false, true; true, false; true, true;) }
}

/// The first group's codes, each covered group's metadata, and the distance from one
/// group's codes to the next's.
struct Group<C> {
    codes: *const u8,
    meta: [C; 2],
    group_bytes: usize,
}

/// A pass's activation records: chunk c of slot `first + i` has its codes at
/// `codes + c·RECORD_BYTES + 32·i` and its start value, d_x and minimum term at
/// `meta + c·RECORD_BYTES + {INIT_AT, DX_AT, SUMS_AT} + 4·i`.
#[derive(Clone, Copy)]
struct ActRecords {
    codes: *const u8,
    meta: *const u8,
}

impl ActRecords {
    #[inline(always)]
    unsafe fn four(self, c: usize, i: usize, t: usize) -> i32 {
        // SAFETY: the caller's chunk and slot are inside the panel.
        unsafe {
            self.codes
                .add(c * RECORD_BYTES + QK * i + 4 * t)
                .cast::<i32>()
                .read_unaligned()
        }
    }
    #[inline(always)]
    unsafe fn meta<T: Copy>(self, c: usize, at: usize, i: usize) -> T {
        // SAFETY: as `four`; the field is 4 bytes, 4-byte aligned (records are words).
        unsafe {
            self.meta
                .add(c * RECORD_BYTES + at + 4 * i)
                .cast::<T>()
                .read()
        }
    }
}

/// The loop over the chunks of the groups `L` covers for M activation rows
/// (`acts.live()` real ones, the rest of the M slots zero or later rows, their outputs
/// dropped).
#[inline(always)]
unsafe fn dots_m<L: RowLanes, const BYTES: bool, const MIN: bool, C: ChunkMeta, const M: usize>(
    w: &PackedWeights,
    meta: [C; 2],
    r0: usize,
    acts: PanelRows<'_>,
    out: &mut [f32],
) {
    let nb = w.cols / QK;
    let group = r0 / ROWS8;
    let live = acts.live();
    let (records, slot) = acts.first_record();
    let lanes = ROWS8 * L::GROUPS;
    debug_assert!((1..=M).contains(&live) && slot + M <= PANEL_SLOTS);
    debug_assert!(out.len() >= lanes * live);
    debug_assert!(w.quants.len() >= (group + L::GROUPS) * w.group_bytes());
    debug_assert!(records.len() >= nb * RECORD_BYTES);
    let g = Group {
        // SAFETY: the group's codes start here (checked above).
        codes: unsafe { w.quants.as_ptr().add(group * w.group_bytes()) },
        meta,
        group_bytes: w.group_bytes(),
    };
    // SAFETY: slot < PANEL_SLOTS, inside the first record.
    let rows = unsafe {
        ActRecords {
            codes: records.as_ptr().add(QK * slot),
            meta: records.as_ptr().add(4 * slot),
        }
    };
    // SAFETY: `L`'s features per the contract.
    let mut acc = [unsafe { L::zero() }; M];
    let mut c = 0;
    // SAFETY: chunks c (and c + 1) < nb exist in the groups and in every activation row.
    unsafe {
        while c + 1 < nb {
            let pair_bytes = if BYTES {
                2 * BYTES_CHUNK
            } else {
                GROUP_PAIR_BYTES
            };
            for j in 0..L::GROUPS {
                prefetch_pair(g.codes.add(j * g.group_bytes), c / 2, pair_bytes);
            }
            chunk::<L, BYTES, false, MIN, C, M>(&g, rows, c, &mut acc);
            chunk::<L, BYTES, true, MIN, C, M>(&g, rows, c + 1, &mut acc);
            c += 2;
        }
        if c < nb {
            chunk::<L, BYTES, false, MIN, C, M>(&g, rows, c, &mut acc);
        }
        for (a, o) in acc[..live].iter().zip(out.chunks_exact_mut(lanes)) {
            L::store(*a, o);
        }
    }
}

/// Writes the group's dots, lane g of `acc[i]` (row r0 + g against activation row i),
/// to `out[8i + g]`, the layout the driver reads.
///
/// # Safety
/// AVX.
#[inline(always)]
pub(super) unsafe fn store_group(acc: &[__m256], out: &mut [f32]) {
    for (a, o) in acc.iter().zip(out.chunks_exact_mut(ROWS8)) {
        // SAFETY: AVX per the contract; `o` holds 8 floats.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *a) };
    }
}

/// Bytes of a [`CodeLayout::Bytes8`] group's chunk: 8 rows × 32 codes.
const BYTES_CHUNK: usize = ROWS8 * QK;

/// Adds chunk c (the high nibbles of its pair when HI; its own 256 bytes when BYTES) of
/// the covered groups' rows, against every activation row, to `acc`.
///
/// # Safety
/// `L`'s CPU features; chunk c exists in the groups and in every row of `rows`.
#[inline(always)]
unsafe fn chunk<
    L: RowLanes,
    const BYTES: bool,
    const HI: bool,
    const MIN: bool,
    C: ChunkMeta,
    const M: usize,
>(
    g: &Group<C>,
    rows: ActRecords,
    c: usize,
    acc: &mut [L::F; M],
) {
    // SAFETY: per the contract.
    unsafe {
        let base = if BYTES {
            g.codes.add(c * BYTES_CHUNK)
        } else {
            g.codes.add((c / 2) * GROUP_PAIR_BYTES)
        };
        // Two running sums per activation row, even and odd steps: `vpdpbusd`
        // accumulates in place, and one chain of 8 would wait on its latency.
        let mut sums = [[L::start(0); 2]; M];
        for i in 0..M {
            sums[i][0] = L::start(rows.meta::<i32>(c, INIT_AT, i));
        }
        for t in 0..QK / 4 {
            let v = L::codes(base.add(QK * t), g.group_bytes);
            let u = if BYTES { v } else { L::nibbles::<HI>(v) };
            for i in 0..M {
                let k = if M >= 8 { 0 } else { t % 2 };
                sums[i][k] = L::add(sums[i][k], u, rows.four(c, i, t));
            }
        }
        let d = L::meta::<C, false>(&g.meta, c);
        let m = if MIN {
            L::meta::<C, true>(&g.meta, c)
        } else {
            d
        };
        for i in 0..M {
            let s = L::finish(sums[i], rows.meta::<i32>(c, INIT_AT, i));
            acc[i] = L::scale_add(s, d, rows.meta::<f32>(c, DX_AT, i), acc[i]);
            if MIN {
                acc[i] = L::min_add(m, rows.meta::<f32>(c, SUMS_AT, i), acc[i]);
            }
        }
    }
}
