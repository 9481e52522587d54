//! The CPU flash-attention body: one (query head, query block) at a time.
//!
//! Per KV block of BC keys: S = Q·Kᵀ (a BR×BC tile), mask, online-softmax update of the
//! running max/sum and rescale of O, then O += P·V. The score tile never exceeds BR×BC,
//! so memory is O(seq·d), not O(seq²).
//!
//! Both products are outer-product tiles: each loaded K/V row feeds several query rows
//! through broadcast FMAs, with no horizontal reductions. [`Tiles`] supplies them: explicit
//! AVX-512 FMA tiles for d = 64/128 (LLVM does not contract the portable mul+add into FMA
//! and splits the tiles badly), the portable tiles elsewhere. Kᵀ is packed block-major,
//! `[kv_block][d][BC]`, so one block's tile is 16 KiB contiguous: row-major Kᵀ put its
//! rows `kv_len` floats apart, all in the same few L1 sets.

use crate::multiversion;
use crate::simd::{exp, exp_shifted_sum};

/// Query rows per block: the 64×64 score tile (16 KiB) and 64 output rows stay in L1/L2
/// while a block's K and V (32 KiB at d = 64) stream past.
pub const BR: usize = 64;
/// Keys per block: 4 zmm of scores per query row.
pub const BC: usize = 64;
/// Query rows sharing each loaded K/V row in a tile (4 × 4 zmm = 16 accumulators).
const ROWS: usize = 4;

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

/// The block of queries a task processes (already multiplied by the softmax scale).
#[derive(Debug)]
pub struct QueryBlock<'a> {
    /// `rows·d` scaled queries.
    pub q: &'a [f32],
    /// Index of the first query row in the sequence.
    pub first: usize,
    pub rows: usize,
    pub q_len: usize,
    pub causal: bool,
    pub window: Option<usize>,
}

type ScoreTile = [[f32; BC]; BR];

/// The two tile products of a block.
trait Tiles {
    /// `s[r][c] = q_r · k_{c0+c}` for r < rows.
    fn scores(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, c0: usize, s: &mut ScoreTile);
    /// `out[r] += Σ_c s[r][c]·v_{c0+c}` for r < rows.
    fn pv(kv: &PackedKv<'_>, rows: usize, c0: usize, s: &ScoreTile, out: &mut [f32]);
    /// `v[i] = e^(v[i] − shift)`, returning Σv.
    #[inline(always)]
    fn exp_shifted_sum(v: &mut [f32], shift: f32) -> f32 {
        exp_shifted_sum(v, shift)
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
    #[cfg(target_arch = "x86_64")]
    if isa == tessera_core::Isa::Avx512 && isa.is_available() && matches!(kv.d, 64 | 128) {
        // SAFETY: AVX-512 (F, and the FMA it implies on every AVX-512 CPU) was detected.
        unsafe { avx512::attend(kv, qb, out) };
        return;
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
    let mut c0 = lo - lo % BC;
    while c0 < hi {
        let bc = BC.min(kv.kv_len - c0);
        T::scores(kv, qb, c0, &mut s);
        for r in 0..qb.rows {
            let (a, b) = range(qb.first + r);
            let row = &mut s[r];
            if c0 < a || c0 + bc > b {
                for (c, v) in row[..bc].iter_mut().enumerate() {
                    if c0 + c < a || c0 + c >= b {
                        *v = f32::NEG_INFINITY;
                    }
                }
            }
            let block_max = T::max(&row[..bc]);
            let m_new = m[r].max(block_max);
            // max() skips NaN, but a NaN score still reaches the sum through exp. Only a
            // row with no finite score needs the explicit scan.
            if m_new == f32::NEG_INFINITY {
                if row[..bc].iter().any(|v| v.is_nan()) {
                    l[r] = f32::NAN;
                }
                row.fill(0.0); // nothing visible yet in this row
                continue;
            }
            let corr = exp(m[r] - m_new);
            let sum = T::exp_shifted_sum(&mut row[..bc], m_new);
            row[bc..].fill(0.0); // padded keys: zero weight (their V rows are zero too)
            l[r] = l[r] * corr + sum;
            m[r] = m_new;
            if corr != 1.0 {
                for o in out[r * d..(r + 1) * d].iter_mut() {
                    *o *= corr;
                }
            }
        }
        T::pv(kv, qb.rows, c0, &s, out);
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
    fn scores(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, c0: usize, s: &mut ScoreTile) {
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
    fn pv(kv: &PackedKv<'_>, rows: usize, c0: usize, s: &ScoreTile, out: &mut [f32]) {
        let d = kv.d;
        for r in 0..rows {
            let o = &mut out[r * d..(r + 1) * d];
            for c in 0..BC {
                let pr = s[r][c];
                let vrow = &kv.v[(c0 + c) * d..(c0 + c + 1) * d];
                for (x, &v) in o.iter_mut().zip(vrow) {
                    *x += pr * v;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! Explicit AVX-512 FMA tiles for head dims 64 and 128.

    use super::{attend_body, PackedKv, QueryBlock, ScoreTile, Tiles, BC, ROWS};
    /// Query rows per score tile: 6 × 4 zmm = 24 accumulators + 4 Kᵀ vectors.
    const SROWS: usize = 6;
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU supports AVX-512F and FMA; `kv.d` is 64 or 128.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    pub(super) unsafe fn attend(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, out: &mut [f32]) {
        attend_body::<Avx512>(kv, qb, out)
    }

    struct Avx512;

    impl Tiles for Avx512 {
        #[inline(always)]
        fn scores(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, c0: usize, s: &mut ScoreTile) {
            let block = &kv.kt[(c0 / BC) * kv.d * BC..][..kv.d * BC];
            let mut r0 = 0;
            while r0 < qb.rows {
                let nr = SROWS.min(qb.rows - r0);
                // SAFETY: only reached from `attend` (AVX-512F + FMA present); the block
                // holds d·BC floats and q holds rows·d, both checked by the slicing above.
                unsafe {
                    score_rows(
                        block,
                        &qb.q[r0 * kv.d..(r0 + nr) * kv.d],
                        kv.d,
                        &mut s[r0..r0 + nr],
                    )
                };
                r0 += nr;
            }
        }

        #[inline(always)]
        fn pv(kv: &PackedKv<'_>, rows: usize, c0: usize, s: &ScoreTile, out: &mut [f32]) {
            let v = &kv.v[c0 * kv.d..(c0 + BC) * kv.d];
            let mut r0 = 0;
            while r0 < rows {
                let nr = ROWS.min(rows - r0);
                let o = &mut out[r0 * kv.d..(r0 + nr) * kv.d];
                // SAFETY: as in `scores`; `v` holds BC rows of d, `o` nr rows of d.
                unsafe {
                    match kv.d {
                        64 => pv_rows::<4>(v, &s[r0..r0 + nr], o),
                        _ => pv_rows::<8>(v, &s[r0..r0 + nr], o),
                    }
                }
                r0 += nr;
            }
        }

        #[inline(always)]
        fn exp_shifted_sum(v: &mut [f32], shift: f32) -> f32 {
            // SAFETY: only reached from `attend` (AVX-512F present).
            unsafe { crate::simd::avx512::exp_shifted_sum(v, shift) }
        }

        #[inline(always)]
        fn max(v: &[f32]) -> f32 {
            // SAFETY: as above.
            unsafe { crate::simd::avx512::max(v) }
        }
    }

    /// Up to 4 query rows × 64 keys: 16 zmm accumulators; per dim p, 4 Kᵀ loads feed 16 FMAs.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn score_rows(block: &[f32], q: &[f32], d: usize, s: &mut [[f32; BC]]) {
        let nr = s.len();
        let mut acc = [[_mm512_setzero_ps(); 4]; SROWS];
        for p in 0..d {
            // SAFETY: block holds d rows of BC = 64 floats.
            let k: [__m512; 4] = std::array::from_fn(|v| unsafe {
                _mm512_loadu_ps(block.as_ptr().add(p * BC + 16 * v))
            });
            for (i, a) in acc.iter_mut().enumerate() {
                let qv = _mm512_set1_ps(if i < nr { q[i * d + p] } else { 0.0 });
                for v in 0..4 {
                    a[v] = _mm512_fmadd_ps(qv, k[v], a[v]);
                }
            }
        }
        for (i, row) in s.iter_mut().enumerate() {
            for v in 0..4 {
                // SAFETY: row has 64 floats.
                unsafe { _mm512_storeu_ps(row.as_mut_ptr().add(16 * v), acc[i][v]) };
            }
        }
    }

    /// Up to 4 output rows of d = 16·NV: accumulators in registers across the BC keys.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn pv_rows<const NV: usize>(v: &[f32], s: &[[f32; BC]], o: &mut [f32]) {
        let (nr, d) = (s.len(), 16 * NV);
        let mut acc = [[_mm512_setzero_ps(); NV]; ROWS];
        for (i, a) in acc.iter_mut().enumerate().take(nr) {
            for x in 0..NV {
                // SAFETY: o holds nr rows of d floats.
                a[x] = unsafe { _mm512_loadu_ps(o.as_ptr().add(i * d + 16 * x)) };
            }
        }
        for c in 0..BC {
            // SAFETY: v holds BC rows of d floats.
            let vr: [__m512; NV] =
                std::array::from_fn(|x| unsafe { _mm512_loadu_ps(v.as_ptr().add(c * d + 16 * x)) });
            for (i, a) in acc.iter_mut().enumerate() {
                let p = _mm512_set1_ps(if i < nr { s[i][c] } else { 0.0 });
                for x in 0..NV {
                    a[x] = _mm512_fmadd_ps(p, vr[x], a[x]);
                }
            }
        }
        for (i, a) in acc.iter().enumerate().take(nr) {
            for x in 0..NV {
                // SAFETY: as above.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(i * d + 16 * x), a[x]) };
            }
        }
    }
}
