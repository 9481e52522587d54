//! The CPU flash-attention body: one (query head, query block) at a time.
//!
//! Per KV block of BC keys: S = Q·Kᵀ (a BR×BC tile), mask, online-softmax update of the
//! running max/sum and rescale of O, then O += P·V. The score tile never exceeds BR×BC,
//! so memory is O(seq·d), not O(seq²).
//!
//! The scores are in base 2: the queries carry log₂e with the softmax scale, so each
//! weight is 2^(s − max) (`simd::lanes_exp::exp2`: no range reduction by ln 2,
//! a degree-5 polynomial, 13 vector operations where e^x takes 20). At d = 64 a weight
//! costs one exp per 2·64 multiply-adds, and e^x was ~25% of the kernel's time on AVX2
//! (host B, 1 thread, causal 512 × 9 heads: 7.3 → 5.5 ms with the exp left out, a
//! noisy run); base 2 took the median of 8 alternated runs from 6.33 to 5.86 ms
//! (`tessera bench attention --problem prefill-512-causal --variant avx2 --set
//! threads=1`, 2026-11-29).
//!
//! Both products are outer-product tiles: each loaded K/V row feeds several query rows
//! through broadcast FMAs, with no horizontal reductions. [`Tiles`] supplies them: FMA
//! tiles written once over [`Lanes`] (`LaneTiles`) for d = 64/128, instantiated for
//! AVX-512, AVX2 and NEON with each width's register tile (LLVM does not contract the
//! portable mul+add into FMA and splits the tiles badly: the portable tiles on AVX2 ran
//! causal 512 × 9 heads at 10% of the FMA peak), the portable tiles elsewhere. Kᵀ is packed block-major,
//! `[kv_block][d][BC]`, so one block's tile is 16 KiB contiguous: row-major Kᵀ put its
//! rows `kv_len` floats apart, all in the same few L1 sets.

use crate::multiversion;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::simd::lanes::Lanes;
use crate::simd::{exp2, exp2_shifted_sum};

/// Query rows per block: the 64×64 score tile (16 KiB) and 64 output rows stay in L1/L2
/// while a block's K and V (32 KiB at d = 64) stream past.
pub const BR: usize = 64;
/// Keys per block: 4 zmm of scores per query row.
pub const BC: usize = 64;
/// Query rows sharing each loaded K/V row in a tile (4 × 4 zmm = 16 accumulators).
const ROWS: usize = 4;
/// A query block's rows are padded with zeros to a multiple of this, so the register
/// tiles (score tiles of 6 rows or fewer, P·V tiles of 4) run whole, without a per-row
/// test in their inner loops; the padded rows' results are never stored.
const Q_ROW_PAD: usize = 12;

/// Floats a [`QueryBlock`]'s `q` holds for `rows` query rows of `d` dims (the rows
/// padded with zeros to a multiple of [`Q_ROW_PAD`]).
pub const fn padded_q_len(rows: usize, d: usize) -> usize {
    rows.next_multiple_of(Q_ROW_PAD) * d
}

/// Pre-packed keys and values of one KV head, zero-padded to a whole number of BC blocks:
/// `kt[(j / BC)·d·BC + p·BC + j % BC]` (Kᵀ, block-major) and `v[j·d + p]`.
#[derive(Debug)]
pub struct PackedKv<'a> {
    pub kt: &'a [f32],
    pub v: &'a [f32],
    pub kv_len: usize,
    pub d: usize,
}

impl PackedKv<'_> {
    /// Index into `kt` of key `j`, dim `p`.
    #[inline(always)]
    pub fn kt_index(d: usize, j: usize, p: usize) -> usize {
        (j / BC) * d * BC + p * BC + j % BC
    }
}

/// The block of queries a task processes, already multiplied by the softmax scale and
/// by log₂e, so the scores are in base 2 ([module docs](self)).
#[derive(Debug)]
pub struct QueryBlock<'a> {
    /// `rows·d` scaled queries, then zeros to [`padded_q_len`]`(rows, d)`.
    pub q: &'a [f32],
    /// Index of the first query row in the sequence.
    pub first: usize,
    pub rows: usize,
    pub q_len: usize,
    pub causal: bool,
    pub window: Option<usize>,
}

type ScoreTile = [[f32; BC]; BR];

/// Per query row of a block, the keys `[lo, hi)` of the current KV block it may see
/// (block-relative); every other key of the block is masked. A tile whose rows see none
/// of a run of keys skips that run: on the causal diagonal, a 6-row score tile needs
/// the first ⌈(r + 6)/16⌉ of 4 key chunks, a 4-row P·V tile the first r + 4 keys.
type KeySpans = [(usize, usize); BR];

/// The keys any of rows `r0..r0 + nr` may see: the union of their spans (empty as
/// `(BC, 0)` when none sees any).
#[inline(always)]
fn rows_span(spans: &KeySpans, r0: usize, nr: usize) -> (usize, usize) {
    spans[r0..r0 + nr]
        .iter()
        .fold((BC, 0), |(lo, hi), &(a, b)| {
            if a < b {
                (lo.min(a), hi.max(b))
            } else {
                (lo, hi)
            }
        })
}

/// One KV block's P·V operands for a query block.
#[derive(Clone, Copy)]
struct PvBlock<'a> {
    /// Query rows (the tile's first `rows`).
    rows: usize,
    /// The block's first key.
    c0: usize,
    /// The block's softmax weights, `[row][key]`.
    p: &'a ScoreTile,
    /// Per row, the factor for the output so far (the running max moved).
    rescale: &'a [f32; BR],
    /// Per row, the keys of the block it sees (weights elsewhere are 0).
    spans: &'a KeySpans,
}

/// The two tile products of a block.
trait Tiles {
    /// `s[r][c] = q_r · k_{c0+c}` for r < rows and c in `spans[r]`; other entries may
    /// be left as they were (the caller masks them).
    fn scores(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, keys: (usize, &KeySpans), s: &mut ScoreTile);
    /// `out[r] = out[r]·rescale[r] + Σ_c s[r][c]·v_{c0+c}` for r < rows (the online
    /// softmax's correction of the earlier blocks rides on the tile's load of `out`).
    fn pv(kv: &PackedKv<'_>, pv: PvBlock<'_>, out: &mut [f32]);
    /// `v[i] = 2^(v[i] − shift)`, returning Σv (the scores are in base 2).
    #[inline(always)]
    fn exp2_shifted_sum(v: &mut [f32], shift: f32) -> f32 {
        exp2_shifted_sum(v, shift)
    }
    /// Max of `v`, skipping NaN.
    #[inline(always)]
    fn max(v: &[f32]) -> f32 {
        crate::simd::max(v)
    }
}

/// Writes `rows·d` outputs for one query block against one KV head.
pub fn attend_block(
    isa: tessera_core::Isa,
    kv: &PackedKv<'_>,
    qb: &QueryBlock<'_>,
    out: &mut [f32],
) {
    use tessera_core::Isa;
    assert!(
        qb.q.len() >= padded_q_len(qb.rows, kv.d) && qb.rows <= BR,
        "query block of {} rows: {} floats, not the padded {}",
        qb.rows,
        qb.q.len(),
        padded_q_len(qb.rows, kv.d)
    );
    if isa.is_available() && matches!(kv.d, 64 | 128) {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 (F/BW/VL/DQ, with AVX2, FMA and F16C) was detected.
            Isa::Avx512 => return unsafe { x86::attend_zmm(kv, qb, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2 (with FMA and F16C, as `Isa::Avx2` means) was detected.
            Isa::Avx2 => return unsafe { x86::attend_ymm(kv, qb, out) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: d checked above.
            Isa::Neon => return unsafe { attend_neon(kv, qb, out) },
            _ => {}
        }
    }
    attend_portable(isa, kv, qb, out);
}

multiversion! {
    fn attend_portable(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, out: &mut [f32]) {
        attend_body::<Portable>(kv, qb, out)
    }
}

#[inline(always)]
fn attend_body<T: Tiles>(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, out: &mut [f32]) {
    let d = kv.d;
    let mut m = [f32::NEG_INFINITY; BR];
    let mut l = [0f32; BR];
    let mut s: ScoreTile = [[0f32; BC]; BR];
    out[..qb.rows * d].fill(0.0);
    let range =
        |i: usize| super::reference::key_range(i, qb.q_len, kv.kv_len, qb.causal, qb.window);
    let lo = range(qb.first).0;
    let hi = range(qb.first + qb.rows - 1).1;
    // Per row, the factor its running output and sum take for the block's new max.
    let mut rescale = [1f32; BR];
    let mut c0 = lo - lo % BC;
    let mut spans: KeySpans = [(BC, 0); BR];
    while c0 < hi {
        let bc = BC.min(kv.kv_len - c0);
        for (r, span) in spans.iter_mut().enumerate().take(qb.rows) {
            let (a, b) = range(qb.first + r);
            let lo = a.saturating_sub(c0).min(bc);
            *span = (lo, b.saturating_sub(c0).clamp(lo, bc));
        }
        T::scores(kv, qb, (c0, &spans), &mut s);
        // Two passes over the rows, each of short iterations with no chain from one row
        // to the next, so the core overlaps rows (one pass with the max, the exps and
        // their sums per row ran ~37% of the kernel's samples in a chain per row).
        // First the mask and the new max; the scalar exp only where the max moved.
        for r in 0..qb.rows {
            let row = &mut s[r];
            let (lo, hi) = spans[r];
            if lo > 0 || hi < bc {
                // Keys c0 + c visible for c in [lo, hi): two fills, not a compare per key
                // (AVX2 made that a masked store per vector, ~10% of the kernel). They
                // also cover what `scores` skipped.
                row[..lo].fill(f32::NEG_INFINITY);
                row[hi..bc].fill(f32::NEG_INFINITY);
            }
            let m_new = m[r].max(T::max(&row[..bc]));
            // Equal maxima (−∞ included: nothing visible yet, output and sum still 0)
            // leave the row as it is; from −∞, e^−∞ = 0 zeroes nothing that is not 0.
            rescale[r] = if m_new == m[r] {
                1.0
            } else {
                exp2(m[r] - m_new)
            };
            m[r] = m_new;
        }
        // Then the weights e^(s − max) and the running sums.
        for r in 0..qb.rows {
            let row = &mut s[r];
            // max() skips NaN, but a NaN score still reaches the sum through exp. Only a
            // row with no finite score needs the explicit scan.
            if m[r] == f32::NEG_INFINITY {
                if row[..bc].iter().any(|v| v.is_nan()) {
                    l[r] = f32::NAN;
                }
                row.fill(0.0); // nothing visible yet in this row
                continue;
            }
            let sum = T::exp2_shifted_sum(&mut row[..bc], m[r]);
            row[bc..].fill(0.0); // padded keys: zero weight (their V rows are zero too)
            l[r] = l[r] * rescale[r] + sum;
        }
        let block = PvBlock {
            rows: qb.rows,
            c0,
            p: &s,
            rescale: &rescale,
            spans: &spans,
        };
        T::pv(kv, block, out);
        c0 += BC;
    }
    for r in 0..qb.rows {
        let inv = 1.0 / l[r];
        for o in out[r * d..(r + 1) * d].iter_mut() {
            *o *= inv;
        }
    }
}

/// Tiles in plain Rust (vectorized by LLVM for the ISA they are compiled into).
struct Portable;

impl Tiles for Portable {
    #[inline(always)]
    fn scores(
        kv: &PackedKv<'_>,
        qb: &QueryBlock<'_>,
        (c0, _): (usize, &KeySpans),
        s: &mut ScoreTile,
    ) {
        let d = kv.d;
        let block = &kv.kt[(c0 / BC) * d * BC..][..d * BC];
        let mut r0 = 0;
        while r0 < qb.rows {
            let nr = ROWS.min(qb.rows - r0);
            let mut acc = [[0f32; BC]; ROWS];
            for p in 0..d {
                let krow: &[f32; BC] = block[p * BC..][..BC].try_into().expect("BC-wide rows");
                for i in 0..ROWS {
                    let qv = if i < nr { qb.q[(r0 + i) * d + p] } else { 0.0 };
                    for c in 0..BC {
                        acc[i][c] += qv * krow[c];
                    }
                }
            }
            s[r0..r0 + nr].copy_from_slice(&acc[..nr]);
            r0 += nr;
        }
    }

    #[inline(always)]
    fn pv(kv: &PackedKv<'_>, b: PvBlock<'_>, out: &mut [f32]) {
        let (d, c0) = (kv.d, b.c0);
        for r in 0..b.rows {
            let o = &mut out[r * d..(r + 1) * d];
            for x in o.iter_mut() {
                *x *= b.rescale[r];
            }
            for c in 0..BC {
                let pr = b.p[r][c];
                let vrow = &kv.v[(c0 + c) * d..(c0 + c + 1) * d];
                for (x, &v) in o.iter_mut().zip(vrow) {
                    *x += pr * v;
                }
            }
        }
    }
}

/// The score and P·V tiles written once over [`Lanes`], with the register tile shape
/// per width: SR query rows × SV vectors of keys in the score tile, PR output rows × PV
/// vectors of the head dim in the P·V tile. Only reached from the `target_feature`
/// entries below, which instantiate it for their width, and from the tests over
/// `Soft<16>` (software lanes, which need no CPU feature).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
struct LaneTiles<L, const SR: usize, const SV: usize, const PR: usize, const PV: usize>(
    std::marker::PhantomData<L>,
);

/// The 16-lane tile shape, AVX-512's (and `Soft<16>`'s in the tests): scores 6 rows × 4
/// vectors (all 64 keys: 24 accumulators + 4 Kᵀ vectors); P·V 4 rows × the head dim
/// (PV = d/16 vectors).
#[cfg(any(target_arch = "x86_64", all(test, target_arch = "aarch64")))]
type WideTiles<L, const PV: usize> = LaneTiles<L, 6, 4, 4, PV>;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl<L: Lanes, const SR: usize, const SV: usize, const PR: usize, const PV: usize> Tiles
    for LaneTiles<L, SR, SV, PR, PV>
{
    #[inline(always)]
    fn exp2_shifted_sum(v: &mut [f32], shift: f32) -> f32 {
        // SAFETY: only reached from the width's entry (its CPU features checked by
        // `attend_block`).
        unsafe { L::exp2_shifted_sum(v, shift) }
    }

    #[inline(always)]
    fn max(v: &[f32]) -> f32 {
        // SAFETY: only reached from the width's entry (its CPU features checked by
        // `attend_block`).
        unsafe { L::row_max(v) }
    }

    #[inline(always)]
    fn scores(
        kv: &PackedKv<'_>,
        qb: &QueryBlock<'_>,
        (c0, spans): (usize, &KeySpans),
        s: &mut ScoreTile,
    ) {
        let d = kv.d;
        let block = &kv.kt[(c0 / BC) * d * BC..][..d * BC];
        const { assert!(Q_ROW_PAD.is_multiple_of(SR)) };
        for cc in (0..BC).step_by(L::N * SV) {
            let mut r0 = 0;
            while r0 < qb.rows {
                let nr = SR.min(qb.rows - r0);
                let (lo, hi) = rows_span(spans, r0, nr);
                if cc >= hi || cc + L::N * SV <= lo {
                    r0 += nr; // none of these rows sees these keys
                    continue;
                }
                // All SR rows: the block's rows are zero-padded to a multiple of SR.
                let q = &qb.q[r0 * d..(r0 + SR) * d];
                // SAFETY: only reached from the width's entry (its CPU features checked
                // by `attend_block`); block holds d rows of BC floats, cc + N·SV ≤ BC;
                // q holds SR rows of d floats (i < SR, p < d).
                unsafe {
                    let mut acc = [[L::zero(); SV]; SR];
                    for p in 0..d {
                        // Loops, not closures: a closure's intrinsics may stay out of
                        // line, without the entry's target features.
                        let mut k = [L::zero(); SV];
                        for (v, kv) in k.iter_mut().enumerate() {
                            *kv = L::load(block.as_ptr().add(p * BC + cc + L::N * v));
                        }
                        for (i, a) in acc.iter_mut().enumerate() {
                            let qv = L::splat_f(*q.as_ptr().add(i * d + p));
                            for v in 0..SV {
                                a[v] = L::fmadd(qv, k[v], a[v]);
                            }
                        }
                    }
                    for (row, a) in s[r0..r0 + nr].iter_mut().zip(&acc) {
                        for (v, &x) in a.iter().enumerate() {
                            L::store(row.as_mut_ptr().add(cc + L::N * v), x);
                        }
                    }
                }
                r0 += nr;
            }
        }
    }

    #[inline(always)]
    fn pv(kv: &PackedKv<'_>, b: PvBlock<'_>, out: &mut [f32]) {
        let (d, rows, c0, s) = (kv.d, b.rows, b.c0, b.p);
        debug_assert!(d.is_multiple_of(L::N * PV) && BC.is_multiple_of(L::N * SV));
        // Rows past `rows` (up to the next multiple of PR, inside the tile) hold scores
        // of no query: they feed accumulators that are never stored.
        const { assert!(BR.is_multiple_of(PR)) };
        let v = &kv.v[c0 * d..(c0 + BC) * d];
        let mut r0 = 0;
        while r0 < rows {
            let nr = PR.min(rows - r0);
            let keys = rows_span(b.spans, r0, nr);
            let o = &mut out[r0 * d..(r0 + nr) * d];
            for dc in (0..d).step_by(L::N * PV) {
                // SAFETY: as in `scores`; v holds BC rows of d floats, o nr rows of d,
                // dc + N·PV ≤ d (d a multiple of N·PV at every instantiation); s has
                // BR rows and r0 + PR ≤ BR (r0 a multiple of PR, BR one too).
                unsafe {
                    let srows = s.as_ptr().add(r0);
                    let mut acc = [[L::zero(); PV]; PR];
                    for (i, a) in acc.iter_mut().enumerate().take(nr) {
                        let f = L::splat_f(b.rescale[r0 + i]);
                        for (x, ax) in a.iter_mut().enumerate() {
                            *ax = L::mul(L::load(o.as_ptr().add(i * d + dc + L::N * x)), f);
                        }
                    }
                    // Keys outside every row's span weigh 0 for each of them.
                    for c in keys.0..keys.1 {
                        let mut vr = [L::zero(); PV];
                        for (x, vx) in vr.iter_mut().enumerate() {
                            *vx = L::load(v.as_ptr().add(c * d + dc + L::N * x));
                        }
                        for (i, a) in acc.iter_mut().enumerate() {
                            let p = L::splat_f(*(*srows.add(i)).as_ptr().add(c));
                            for x in 0..PV {
                                a[x] = L::fmadd(p, vr[x], a[x]);
                            }
                        }
                    }
                    for (i, a) in acc.iter().enumerate().take(nr) {
                        for (x, &ax) in a.iter().enumerate() {
                            L::store(o.as_mut_ptr().add(i * d + dc + L::N * x), ax);
                        }
                    }
                }
            }
            r0 += nr;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The x86 entries: zmm (AVX-512F) and ymm (AVX2 + FMA) instances of [`LaneTiles`],
    //! the zmm one with AVX-512's `exp` and max.

    use super::{
        attend_body, KeySpans, LaneTiles, PackedKv, PvBlock, QueryBlock, ScoreTile, Tiles,
        WideTiles,
    };
    use crate::simd::lanes::{Ymm, Zmm};

    /// Zmm: [`WideTiles`].
    type ZmmTiles<const PV: usize> = WideTiles<Zmm, PV>;
    /// Ymm (16 registers): scores 6 rows × 2 ymm (12 accumulators, 2 Kᵀ vectors, the
    /// query broadcast), four passes over the 64 keys; P·V 4 rows × 2 ymm per pass over
    /// the head dim (6 rows, 12 accumulators, measured no faster: host B, 2026-11-29, 1
    /// thread, 8 alternated runs, median 6.4 against 5.9 ms at 512 × 9 heads).
    type YmmTiles = LaneTiles<Ymm, 6, 2, 4, 2>;

    /// The zmm tiles with AVX-512's own max.
    struct Avx512<const PV: usize>;

    impl<const PV: usize> Tiles for Avx512<PV> {
        #[inline(always)]
        fn scores(
            kv: &PackedKv<'_>,
            qb: &QueryBlock<'_>,
            keys: (usize, &KeySpans),
            s: &mut ScoreTile,
        ) {
            ZmmTiles::<PV>::scores(kv, qb, keys, s)
        }
        #[inline(always)]
        fn pv(kv: &PackedKv<'_>, b: PvBlock<'_>, out: &mut [f32]) {
            ZmmTiles::<PV>::pv(kv, b, out)
        }
        #[inline(always)]
        fn exp2_shifted_sum(v: &mut [f32], shift: f32) -> f32 {
            ZmmTiles::<PV>::exp2_shifted_sum(v, shift)
        }
        #[inline(always)]
        fn max(v: &[f32]) -> f32 {
            // SAFETY: only reached from `attend_zmm` (AVX-512F/BW/VL/DQ present).
            unsafe { <Zmm as crate::simd::lanes::Lanes>::row_max(v) }
        }
    }

    /// # Safety
    /// The CPU supports AVX-512F/BW/VL/DQ, FMA and F16C; `kv.d` is 64 or 128.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    pub(super) unsafe fn attend_zmm(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, out: &mut [f32]) {
        match kv.d {
            64 => attend_body::<Avx512<4>>(kv, qb, out),
            _ => attend_body::<Avx512<8>>(kv, qb, out),
        }
    }

    /// # Safety
    /// The CPU supports AVX2, FMA and F16C; `kv.d` is 64 or 128.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_ymm(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, out: &mut [f32]) {
        attend_body::<YmmTiles>(kv, qb, out)
    }
}

/// # Safety
/// `kv.d` is 64 or 128 (NEON is baseline on aarch64).
#[cfg(target_arch = "aarch64")]
unsafe fn attend_neon(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, out: &mut [f32]) {
    // Scores 6 rows × 4 q registers (24 accumulators of 32), P·V 4 rows × 4.
    attend_body::<LaneTiles<crate::simd::lanes::Neon, 6, 4, 4, 4>>(kv, qb, out)
}

#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests {
    use super::*;
    use crate::registry::verify::rel_error_finite;
    use crate::simd::lanes::Soft;
    use rand::{Rng, SeedableRng};

    /// AVX-512's tiles ([`WideTiles`]) in software lanes, and each ISA this host runs,
    /// against float64 on query blocks that start at 0, in the middle and at a ragged
    /// end, causal (bottom-right aligned, with a cached prefix), windowed and not, at
    /// d = 64 and 128: the 16-lane key chunks, span skips on the diagonal and P·V
    /// passes otherwise never run on a host without AVX-512.
    #[test]
    fn wide_tiles_match_f64_in_software_lanes() {
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let cases = [
            (150, 150, true, None),
            (70, 203, true, None),
            (64, 64, true, Some(37)),
            (150, 150, true, Some(20)),
            (40, 300, true, Some(100)),
            (100, 91, false, None),
        ];
        for d in [64, 128] {
            for &(q_len, kv_len, causal, window) in &cases {
                let mut rand_vec = |n: usize| -> Vec<f32> {
                    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
                };
                let (q, k, v) = (
                    rand_vec(q_len * d),
                    rand_vec(kv_len * d),
                    rand_vec(kv_len * d),
                );
                let kv_pad = kv_len.next_multiple_of(BC);
                let (mut kt, mut vv) = (vec![0f32; kv_pad * d], vec![0f32; kv_pad * d]);
                for j in 0..kv_len {
                    for p in 0..d {
                        kt[PackedKv::kt_index(d, j, p)] = k[j * d + p];
                    }
                }
                vv[..kv_len * d].copy_from_slice(&v);
                let kv = PackedKv {
                    kt: &kt,
                    v: &vv,
                    kv_len,
                    d,
                };
                let scale = 1.0 / (d as f32).sqrt();
                let row = |x: &[f32], j: usize| -> Vec<f64> {
                    x[j * d..][..d].iter().map(|&x| x as f64).collect()
                };
                let mut firsts: Vec<usize> = (0..q_len).step_by(BR).collect();
                firsts.truncate(3);
                for first in firsts {
                    let rows = BR.min(q_len - first);
                    let mut qbuf = vec![0f32; padded_q_len(rows, d)];
                    for (i, x) in qbuf[..rows * d].iter_mut().enumerate() {
                        *x = q[first * d + i] * scale * std::f32::consts::LOG2_E;
                    }
                    let block = QueryBlock {
                        q: &qbuf,
                        first,
                        rows,
                        q_len,
                        causal,
                        window,
                    };
                    let want: Vec<f64> = (first..first + rows)
                        .flat_map(|i| {
                            let range = super::super::reference::key_range(
                                i, q_len, kv_len, causal, window,
                            );
                            super::super::reference::attend(
                                &row(&q, i),
                                range,
                                |j| row(&k, j),
                                |j| row(&v, j),
                                scale as f64,
                            )
                        })
                        .collect();
                    let check = |what: &str, out: &[f32]| {
                        let got: Vec<f64> = out.iter().map(|&x| x as f64).collect();
                        let err = rel_error_finite(&got, &want);
                        assert!(
                            err <= super::super::TOL_F32.rel,
                            "{what}: d {d} q {q_len} kv {kv_len} causal {causal} window \
                             {window:?} block at {first}: error {err:.2e} (seed {seed})"
                        );
                    };
                    let mut out = vec![f32::NAN; rows * d];
                    match d {
                        64 => attend_body::<WideTiles<Soft<16>, 4>>(&kv, &block, &mut out),
                        _ => attend_body::<WideTiles<Soft<16>, 8>>(&kv, &block, &mut out),
                    }
                    check("Soft<16>", &out);
                    for isa in tessera_core::Isa::available() {
                        let mut out = vec![f32::NAN; rows * d];
                        attend_block(isa, &kv, &block, &mut out);
                        check(isa.name(), &out);
                    }
                }
            }
        }
    }
}
