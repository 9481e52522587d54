//! The decode kernel's dispatch: the [`Lanes`](crate::simd::lanes::Lanes) kernel where
//! the ISA, cache type and head dim have one, else the portable body compiled per ISA.

use super::{ChunkAll, ChunkJob};
use crate::multiversion;
use crate::simd::dot;
use tessera_core::{Element, Isa};

/// One chunk of one sequence, all heads: the lanes kernel where it exists (AVX-512,
/// AVX2 or NEON; f32/bf16/f16/i8 cache; d = 64/128), else the portable body once per KV head.
pub(super) fn chunk<T: Element>(
    isa: Isa,
    job: &ChunkAll<'_, T>,
    scores: &mut [f32],
    o: &mut [f32],
    ml: &mut [(f32, f32)],
) {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if super::lanes_kernel::chunk(isa, job, scores, o, ml) {
        return;
    }
    let (d, n) = (job.cache.d, job.records.len());
    let g = ml.len() / job.cache.kv_heads;
    for kvh in 0..job.cache.kv_heads {
        let group = ChunkJob {
            cache: job.cache,
            records: job.records,
            kvh,
            q: &job.q[kvh * g * d..(kvh + 1) * g * d],
        };
        let heads = kvh * g..(kvh + 1) * g;
        chunk_body(
            isa,
            &group,
            &mut scores[heads.start * n..heads.end * n],
            &mut o[heads.start * d..heads.end * d],
            &mut ml[heads],
        );
    }
}

/// Per head: max score, then scores → e^{s−max} in place, and their sum. A NaN score
/// reaches the sum through exp (max() skips it), so no separate scan is needed.
#[inline(always)]
pub(super) fn softmax_pieces(scores: &mut [f32], n: usize, ml: &mut [(f32, f32)]) {
    for (h, slot) in ml.iter_mut().enumerate() {
        let s = &mut scores[h * n..(h + 1) * n];
        let m = crate::simd::max(s);
        *slot = (m, crate::simd::exp_shifted_sum(s, m));
    }
}

multiversion! {
    /// Scores, softmax pieces and weighted values of the chunk's tokens for every head of
    /// a group; `o` gets `group·d` un-normalised outputs, `ml` gets (max, sum) per head.
    fn chunk_body<T: Element>(job: &ChunkJob<'_, T>, scores: &mut [f32], o: &mut [f32], ml: &mut [(f32, f32)]) {
        let c = job.cache;
        let (d, g) = (c.d, ml.len());
        let n = job.records.len();
        let row = |i: usize| job.records[i] + job.kvh * d;
        match d {
            64 => key_scores::<T, 64>(job, scores, g),
            128 => key_scores::<T, 128>(job, scores, g),
            _ => {
                for i in 0..n {
                    let (k, ks) = (&c.k[row(i)..row(i) + d], c.row_scale(c.k_scales, row(i), d));
                    for h in 0..g {
                        scores[h * n + i] = dot(&job.q[h * d..(h + 1) * d], k) * ks;
                    }
                }
            }
        }
        softmax_pieces(scores, n, ml);
        match (d, g) {
            (64, 1..=4) => weighted_values::<T, 64>(job, scores, o, g),
            (128, 1..=2) => weighted_values::<T, 128>(job, scores, o, g),
            _ => {
                o.fill(0.0);
                for i in 0..n {
                    let (v, vs) = (&c.v[row(i)..row(i) + d], c.row_scale(c.v_scales, row(i), d));
                    for h in 0..g {
                        let p = scores[h * n + i] * vs;
                        for (x, &vv) in o[h * d..(h + 1) * d].iter_mut().zip(v) {
                            *x += p * vv.to_f32();
                        }
                    }
                }
            }
        }
    }
}

/// `scores[h][t] = q_h · k_t` for a compile-time head dim: each key row is loaded once as
/// D/16 vectors and dotted with every head of the group into 16-lane accumulators.
#[inline(always)]
fn key_scores<T: Element, const D: usize>(job: &ChunkJob<'_, T>, scores: &mut [f32], g: usize) {
    let c = job.cache;
    let n = job.records.len();
    for (i, &rec) in job.records.iter().enumerate() {
        let off = rec + job.kvh * D;
        let k: &[T; D] = c.k[off..off + D].try_into().expect("D-wide rows");
        let ks = c.row_scale(c.k_scales, off, D);
        for h in 0..g {
            let q: &[f32; D] = job.q[h * D..(h + 1) * D].try_into().expect("D-wide rows");
            let mut lanes = [0f32; 16];
            for blk in 0..D / 16 {
                for l in 0..16 {
                    lanes[l] += q[blk * 16 + l] * k[blk * 16 + l].to_f32();
                }
            }
            scores[h * n + i] = crate::simd::hsum(lanes) * ks;
        }
    }
}

/// `o[h] = Σ_t p[h][t]·v_t` for a compile-time head dim: up to 4 (D = 64) or 2 (D = 128)
/// heads' outputs stay in 16 zmm registers while the chunk's V rows stream past once.
#[inline(always)]
fn weighted_values<T: Element, const D: usize>(
    job: &ChunkJob<'_, T>,
    scores: &[f32],
    o: &mut [f32],
    g: usize,
) {
    const MAX_G: usize = 4;
    let c = job.cache;
    let n = job.records.len();
    let mut acc = [[0f32; D]; MAX_G];
    for (i, &rec) in job.records.iter().enumerate() {
        let off = rec + job.kvh * D;
        let v: &[T; D] = c.v[off..off + D].try_into().expect("D-wide rows");
        let vs = c.row_scale(c.v_scales, off, D);
        for (h, a) in acc.iter_mut().enumerate().take(g) {
            let p = scores[h * n + i] * vs;
            for x in 0..D {
                a[x] += p * v[x].to_f32();
            }
        }
    }
    for (h, a) in acc.iter().enumerate().take(g) {
        o[h * D..(h + 1) * D].copy_from_slice(a);
    }
}
