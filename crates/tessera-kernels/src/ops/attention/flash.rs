//! The CPU flash-attention body: one (query head, query block) at a time.
//!
//! Tiles are outer products so every inner loop is a broadcast-FMA along a contiguous row
//! (keys for S = Q·Kᵀ, head dim for O += P·V): no horizontal reductions. 4 query rows
//! share each loaded K/V row (16 zmm accumulators at BC = 64). The score tile never
//! exceeds BR×BC, so memory is O(seq·d), not O(seq²).

use crate::multiversion;
use crate::simd::{exp, exp_shifted_sum};

/// Query rows per block: 4 micro-rows × 16, so a block's score tile (64×64×4 B = 16 KiB)
/// and output rows stay in L1 with the K/V rows being streamed.
pub const BR: usize = 64;
/// Keys per block: 4 zmm of scores per query row.
pub const BC: usize = 64;
const ROWS: usize = 4;

/// Pre-packed keys and values of one KV head: `kt[p·kv_pad + j]` (Kᵀ) and `v[j·d + p]`,
/// both zero-padded to `kv_pad` = kv_len rounded up to BC keys.
#[derive(Debug)]
pub struct PackedKv<'a> {
    pub kt: &'a [f32],
    pub v: &'a [f32],
    pub kv_len: usize,
    pub kv_pad: usize,
    pub d: usize,
}

/// Probabilities past the block's real keys must be 0 (their padded V rows are 0, but
/// 0·NaN would not be): clear them.
#[inline(always)]
fn row_zero_tail(s: &mut [[f32; BC]; BR], rows: usize, bc: usize) {
    if bc < BC {
        for row in s[..rows].iter_mut() {
            row[bc..].fill(0.0);
        }
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

multiversion! {
    /// Writes `rows·d` outputs for one query block against one KV head.
    pub fn attend_block(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, out: &mut [f32]) {
        let d = kv.d;
        let mut m = [f32::NEG_INFINITY; BR];
        let mut l = [0f32; BR];
        let mut s = [[0f32; BC]; BR];
        out[..qb.rows * d].fill(0.0);
        let range = |i: usize| super::reference::key_range(i, qb.q_len, kv.kv_len, qb.causal, qb.window);
        let lo = range(qb.first).0;
        let hi = range(qb.first + qb.rows - 1).1;
        let mut c0 = lo - lo % BC;
        while c0 < hi {
            let bc = BC.min(kv.kv_len - c0);
            scores(kv, qb, c0, &mut s);
            for r in 0..qb.rows {
                let (a, b) = range(qb.first + r);
                let row = &mut s[r];
                for (c, v) in row[..bc].iter_mut().enumerate() {
                    let j = c0 + c;
                    if j < a || j >= b {
                        *v = f32::NEG_INFINITY;
                    }
                }
                let block_max = row[..bc].iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y));
                let nan = row[..bc].iter().any(|v| v.is_nan());
                let m_new = m[r].max(block_max);
                if m_new == f32::NEG_INFINITY && !nan {
                    row[..bc].fill(0.0); // nothing visible yet in this row
                    continue;
                }
                let corr = exp(m[r] - m_new);
                let mut sum = exp_shifted_sum(&mut row[..bc], m_new);
                if nan {
                    sum = f32::NAN;
                }
                l[r] = l[r] * corr + sum;
                m[r] = m_new;
                for o in out[r * d..(r + 1) * d].iter_mut() {
                    *o *= corr;
                }
            }
            row_zero_tail(&mut s, qb.rows, bc);
            accumulate_pv(kv, qb.rows, c0, &s, out);
            c0 += BC;
        }
        for r in 0..qb.rows {
            let inv = 1.0 / l[r];
            for o in out[r * d..(r + 1) * d].iter_mut() {
                *o *= inv;
            }
        }
    }
}

/// `s[r][c] = q_r · k_{c0+c}` for every row, ROWS rows at a time sharing each Kᵀ row.
/// Kᵀ rows are padded to whole BC blocks, so every slice has the constant length BC and
/// the 4×64 accumulator tile lives in 16 zmm registers.
#[inline(always)]
fn scores(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, c0: usize, s: &mut [[f32; BC]; BR]) {
    let d = kv.d;
    let mut r0 = 0;
    while r0 < qb.rows {
        let nr = ROWS.min(qb.rows - r0);
        let mut acc = [[0f32; BC]; ROWS];
        for p in 0..d {
            let krow: &[f32; BC] = kv.kt[p * kv.kv_pad + c0..][..BC]
                .try_into()
                .expect("padded to BC");
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

/// `out[r] += Σ_c s[r][c]·v_{c0+c}` (s now holds probabilities; padded V rows are zero).
#[inline(always)]
fn accumulate_pv(kv: &PackedKv<'_>, rows: usize, c0: usize, s: &[[f32; BC]; BR], out: &mut [f32]) {
    match kv.d {
        64 => pv_tile::<64, 4>(kv, rows, c0, s, out),
        128 => pv_tile::<128, 2>(kv, rows, c0, s, out),
        d => {
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
}

/// The P·V tile for a compile-time head dim: R output rows of D floats held in registers
/// (R·D/16 = 16 zmm), each V row loaded once for R rows.
#[inline(always)]
fn pv_tile<const D: usize, const R: usize>(
    kv: &PackedKv<'_>,
    rows: usize,
    c0: usize,
    s: &[[f32; BC]; BR],
    out: &mut [f32],
) {
    let mut r0 = 0;
    while r0 < rows {
        let nr = R.min(rows - r0);
        let mut acc = [[0f32; D]; R];
        for (i, a) in acc.iter_mut().enumerate().take(nr) {
            a.copy_from_slice(&out[(r0 + i) * D..(r0 + i + 1) * D]);
        }
        for c in 0..BC {
            let vrow: &[f32; D] = kv.v[(c0 + c) * D..][..D].try_into().expect("D-wide rows");
            for i in 0..R {
                let pr = if i < nr { s[r0 + i][c] } else { 0.0 };
                for x in 0..D {
                    acc[i][x] += pr * vrow[x];
                }
            }
        }
        for (i, a) in acc.iter().enumerate().take(nr) {
            out[(r0 + i) * D..(r0 + i + 1) * D].copy_from_slice(a);
        }
        r0 += nr;
    }
}
