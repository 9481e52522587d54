//! The CPU flash-attention body: one (query head, query block) at a time.
//!
//! Tiles are outer products so every inner loop is a broadcast-FMA along a contiguous row
//! (keys for S = Q·Kᵀ, head dim for O += P·V): no horizontal reductions. 4 query rows
//! share each loaded K/V row (16 zmm accumulators at BC = 64). The score tile never
//! exceeds BR×BC, so memory is O(seq·d), not O(seq²).

use crate::multiversion;
use crate::simd::exp;

/// Query rows per block: 4 micro-rows × 16, so a block's score tile (64×64×4 B = 16 KiB)
/// and output rows stay in L1 with the K/V rows being streamed.
pub const BR: usize = 64;
/// Keys per block: 4 zmm of scores per query row.
pub const BC: usize = 64;
const ROWS: usize = 4;

/// Pre-packed keys and values of one KV head: `kt[p·kv_len + j]` (Kᵀ) and `v[j·d + p]`.
#[derive(Debug)]
pub struct PackedKv<'a> {
    pub kt: &'a [f32],
    pub v: &'a [f32],
    pub kv_len: usize,
    pub d: usize,
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
            scores(kv, qb, c0, bc, &mut s);
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
                let mut sum = 0f32;
                for v in row[..bc].iter_mut() {
                    *v = exp(*v - m_new);
                    sum += *v;
                }
                if nan {
                    sum = f32::NAN;
                }
                l[r] = l[r] * corr + sum;
                m[r] = m_new;
                for o in out[r * d..(r + 1) * d].iter_mut() {
                    *o *= corr;
                }
            }
            accumulate_pv(kv, qb.rows, c0, bc, &s, out);
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
#[inline(always)]
fn scores(kv: &PackedKv<'_>, qb: &QueryBlock<'_>, c0: usize, bc: usize, s: &mut [[f32; BC]; BR]) {
    let d = kv.d;
    let mut r0 = 0;
    while r0 < qb.rows {
        let nr = ROWS.min(qb.rows - r0);
        let mut acc = [[0f32; BC]; ROWS];
        for p in 0..d {
            let krow = &kv.kt[p * kv.kv_len + c0..p * kv.kv_len + c0 + bc];
            for (i, a) in acc.iter_mut().enumerate().take(nr) {
                let qv = qb.q[(r0 + i) * d + p];
                for (x, &k) in a.iter_mut().zip(krow) {
                    *x += qv * k;
                }
            }
        }
        s[r0..r0 + nr].copy_from_slice(&acc[..nr]);
        r0 += nr;
    }
}

/// `out[r] += Σ_c s[r][c]·v_{c0+c}` (s now holds probabilities).
#[inline(always)]
fn accumulate_pv(kv: &PackedKv<'_>, rows: usize, c0: usize, bc: usize, s: &[[f32; BC]; BR], out: &mut [f32]) {
    let d = kv.d;
    for r in 0..rows {
        let o = &mut out[r * d..(r + 1) * d];
        for c in 0..bc {
            let pr = s[r][c];
            let vrow = &kv.v[(c0 + c) * d..(c0 + c + 1) * d];
            for (x, &v) in o.iter_mut().zip(vrow) {
                *x += pr * v;
            }
        }
    }
}
