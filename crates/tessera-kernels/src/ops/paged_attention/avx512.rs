//! Explicit AVX-512 decode kernels for f32, bf16 and f16 caches, head dims 64 and 128.
//!
//! A task covers every KV head of a run of tokens, so each token's cache record
//! (`kv_heads·d` elements) is read whole and in order: per-head tasks read one slice of
//! every record, a gapped stream that wastes adjacent-line prefetches and DRAM rows.
//! Per token and KV head the K row is loaded once and dotted with the group's queries;
//! 16 tokens' partial vectors are reduced together by a transpose-add tree ([`hadd16`]).
//! The V pass accumulates into the (L1-resident) output rows. Whole records a few tokens
//! ahead are prefetched, since each block can sit anywhere in the pool.

use super::cpu::softmax_pieces;
use super::ChunkAll;
use half::{bf16, f16};
use std::any::TypeId;
use std::arch::x86_64::*;
use tessera_core::Element;

/// Tokens ahead to prefetch into L1, from L2 where [`L2_AHEAD`] has brought them.
const PREFETCH_AHEAD: usize = 8;

/// Tokens ahead whose K and V records the K pass prefetches into L2 (24 KiB of f16
/// records at d 64 × 3 KV heads). L1 prefetches alone stall on the core's few L1 miss
/// buffers: with 16 tokens ahead into L1 (and V fetched only by its own pass), 16
/// sequences × 2048 f16 tokens read at ~14 GB/s; with L2 32 ahead and L1 8 ahead, ~20
/// GB/s (2.0 → 1.16 ms, 3 alternated rounds, host C; 16 × 192: 184 → 138 µs).
const L2_AHEAD: usize = 32;

/// Runs the explicit kernel when one exists for this element type and shape; false if not.
/// The caller has checked that the CPU supports AVX-512.
pub(super) fn chunk<T: Element>(
    job: &ChunkAll<'_, T>,
    scores: &mut [f32],
    o: &mut [f32],
    ml: &mut [(f32, f32)],
) -> bool {
    if !matches!(job.cache.d, 64 | 128) {
        return false;
    }
    let wide = job.cache.d == 128;
    if TypeId::of::<T>() == TypeId::of::<f32>() {
        // SAFETY: T is f32 (same TypeId), so the reference cast is an identity.
        let job = unsafe { &*(job as *const ChunkAll<'_, T> as *const ChunkAll<'_, f32>) };
        // SAFETY: AVX-512 presence checked by the caller; d checked above.
        unsafe {
            if wide {
                kernel_f32::<8>(job, scores, o, ml)
            } else {
                kernel_f32::<4>(job, scores, o, ml)
            }
        };
        true
    } else if TypeId::of::<T>() == TypeId::of::<bf16>() {
        // SAFETY: T is bf16 (same TypeId).
        let job = unsafe { &*(job as *const ChunkAll<'_, T> as *const ChunkAll<'_, bf16>) };
        // SAFETY: as above.
        unsafe {
            if wide {
                kernel_bf16::<8>(job, scores, o, ml)
            } else {
                kernel_bf16::<4>(job, scores, o, ml)
            }
        };
        true
    } else if TypeId::of::<T>() == TypeId::of::<f16>() {
        // SAFETY: T is f16 (same TypeId).
        let job = unsafe { &*(job as *const ChunkAll<'_, T> as *const ChunkAll<'_, f16>) };
        // SAFETY: as above.
        unsafe {
            if wide {
                kernel_f16::<8>(job, scores, o, ml)
            } else {
                kernel_f16::<4>(job, scores, o, ml)
            }
        };
        true
    } else {
        false
    }
}

macro_rules! decode_kernel {
    ($kernel:ident, $vpass:ident, $t:ty, $load:expr) => {
        /// # Safety
        /// AVX-512F/BW and FMA are available; d = 16·NV; `ml` has one slot per head.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
        unsafe fn $kernel<const NV: usize>(
            job: &ChunkAll<'_, $t>,
            scores: &mut [f32],
            o: &mut [f32],
            ml: &mut [(f32, f32)],
        ) {
            let c = job.cache;
            let (d, kvh_n, heads) = (16 * NV, c.kv_heads, ml.len());
            let g = heads / kvh_n;
            let n = job.records.len();
            let rec_len = kvh_n * d;
            let load = $load;
            let qp = job.q.as_ptr();
            let mut partial = vec![0f32; heads * 256];
            for (i, &at) in job.records.iter().enumerate() {
                prefetch_record::<_, _MM_HINT_T1>(&c.k, job.records, i + L2_AHEAD, rec_len);
                prefetch_record::<_, _MM_HINT_T0>(&c.k, job.records, i + PREFETCH_AHEAD, rec_len);
                // The V pass's records too, into L2: that pass does too little per
                // token for its own prefetch to cover a DRAM miss.
                prefetch_record::<_, _MM_HINT_T1>(&c.v, job.records, i + L2_AHEAD, rec_len);
                let rec = c.k[at..at + rec_len].as_ptr();
                for kvh in 0..kvh_n {
                    let k: [__m512; NV] = std::array::from_fn(|v| {
                        // SAFETY: rec addresses kv_heads·d elements of a validated record.
                        unsafe { load(rec.add(kvh * d + 16 * v)) }
                    });
                    for h in kvh * g..(kvh + 1) * g {
                        // SAFETY: job.q holds heads·d floats; partial holds heads·256.
                        unsafe {
                            let mut acc = _mm512_mul_ps(_mm512_loadu_ps(qp.add(h * d)), k[0]);
                            for v in 1..NV {
                                acc = _mm512_fmadd_ps(
                                    _mm512_loadu_ps(qp.add(h * d + 16 * v)),
                                    k[v],
                                    acc,
                                );
                            }
                            _mm512_storeu_ps(
                                partial.as_mut_ptr().add(h * 256 + (i % 16) * 16),
                                acc,
                            );
                        }
                    }
                }
                if i % 16 == 15 || i + 1 == n {
                    let done = i % 16 + 1;
                    for h in 0..heads {
                        // SAFETY: partial holds 16 vectors per head.
                        let pv: [__m512; 16] = std::array::from_fn(|j| unsafe {
                            _mm512_loadu_ps(partial.as_ptr().add(h * 256 + j * 16))
                        });
                        let mut sums = [0f32; 16];
                        // SAFETY: sums holds 16 floats.
                        unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), hadd16(&pv)) };
                        scores[h * n + i + 1 - done..h * n + i + 1].copy_from_slice(&sums[..done]);
                    }
                }
            }
            softmax_pieces(scores, n, ml);
            // V pass, a tile of V_TILE tokens at a time; within a tile one KV head at a
            // time with its heads' outputs in registers (up to V_HEADS heads × NV
            // vectors), carried between tiles through `o`. Accumulating through `o` on
            // every token put a store→load→FMA chain on each (~80 ns per token measured);
            // one pass per KV head over the whole chunk re-read every V record from L2.
            let mut from = 0;
            while from < n {
                let tile = from..(from + V_TILE).min(n);
                for kvh in 0..kvh_n {
                    let mut h0 = kvh * g;
                    while h0 < (kvh + 1) * g {
                        let hb = ((kvh + 1) * g - h0).min(V_HEADS);
                        let part = VPart {
                            kvh,
                            h0,
                            n,
                            tile: tile.clone(),
                        };
                        // SAFETY: forwarded contract; hb ≤ V_HEADS heads from h0 exist.
                        unsafe {
                            match hb {
                                1 => $vpass::<NV, 1>(job, &part, scores, o),
                                2 => $vpass::<NV, 2>(job, &part, scores, o),
                                _ => $vpass::<NV, 3>(job, &part, scores, o),
                            }
                        }
                        h0 += hb;
                    }
                }
                from = tile.end;
            }
        }

        /// Σ_t p[h, t]·V[t, kvh] over the part's tile for heads h0..h0+H, added in
        /// registers to what `o` holds from earlier tiles (nothing before the first).
        ///
        /// # Safety
        /// As for the kernel; heads h0..h0+H belong to `part.kvh`.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
        unsafe fn $vpass<const NV: usize, const H: usize>(
            job: &ChunkAll<'_, $t>,
            part: &VPart,
            scores: &[f32],
            o: &mut [f32],
        ) {
            let c = job.cache;
            let d = 16 * NV;
            let load = $load;
            let (n, h0) = (part.n, part.h0);
            let mut acc = [[_mm512_setzero_ps(); NV]; H];
            if part.tile.start > 0 {
                for hh in 0..H {
                    for v in 0..NV {
                        let src = &o[(h0 + hh) * d + 16 * v..][..16];
                        // SAFETY: src holds 16 floats.
                        acc[hh][v] = unsafe { _mm512_loadu_ps(src.as_ptr()) };
                    }
                }
            }
            for i in part.tile.clone() {
                let at = job.records[i];
                if part.kvh == 0 {
                    let rec_len = c.kv_heads * d;
                    prefetch_record::<_, _MM_HINT_T0>(
                        &c.v,
                        job.records,
                        i + PREFETCH_AHEAD,
                        rec_len,
                    );
                }
                let rec = c.v[at + part.kvh * d..][..d].as_ptr();
                let vr: [__m512; NV] = std::array::from_fn(|v| {
                    // SAFETY: rec addresses d elements of a validated record.
                    unsafe { load(rec.add(16 * v)) }
                });
                for hh in 0..H {
                    let p = _mm512_set1_ps(scores[(h0 + hh) * n + i]);
                    for v in 0..NV {
                        acc[hh][v] = _mm512_fmadd_ps(p, vr[v], acc[hh][v]);
                    }
                }
            }
            for hh in 0..H {
                for v in 0..NV {
                    let dst = &mut o[(h0 + hh) * d + 16 * v..][..16];
                    // SAFETY: dst holds 16 floats.
                    unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), acc[hh][v]) };
                }
            }
        }
    };
}

/// Heads whose V sums one register pass keeps (3 × NV ≤ 24 of the 32 zmm).
const V_HEADS: usize = 3;

/// Tokens per V tile: every KV head's pass over a tile finds its records in L1 (32 tokens
/// of d 64 × 3 KV heads are 12 KiB in f16, 24 KiB in f32).
const V_TILE: usize = 32;

/// What a V pass needs from its kernel: the KV head, its first query head, the chunk
/// length and the tile of the chunk's tokens it covers.
struct VPart {
    kvh: usize,
    h0: usize,
    n: usize,
    tile: std::ops::Range<usize>,
}

/// Prefetches the whole record of the chunk's token `i` (if the chunk has one) with the
/// given locality hint.
#[inline(always)]
fn prefetch_record<T, const HINT: i32>(buf: &[T], records: &[usize], i: usize, rec_len: usize) {
    if let Some(&at) = records.get(i) {
        let p = buf.as_ptr().wrapping_add(at) as *const i8;
        for line in (0..rec_len * std::mem::size_of::<T>()).step_by(64) {
            // SAFETY: prefetch never faults; the address lies inside `buf`.
            unsafe { _mm_prefetch::<HINT>(p.wrapping_add(line)) };
        }
    }
}

/// `[Σ v₀, Σ v₁, …, Σ v₁₅]`: the horizontal sums of 16 vectors in 4 shuffle+add levels
/// (pairs within 128-bit lanes, then quads, then across lanes), ~45 ops for 16 sums
/// where 16 separate reductions take ~130.
#[target_feature(enable = "avx512f")]
fn hadd16(v: &[__m512; 16]) -> __m512 {
    // Level 1: per 128-bit lane, [a0+a2, b0+b2, a1+a3, b1+b3] for each pair (a, b).
    let p: [__m512; 8] = std::array::from_fn(|i| {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
    });
    // Level 2: per 128-bit lane, the lane-partial sums of four vectors, in order.
    let q: [__m512; 4] = std::array::from_fn(|i| {
        let (a, b) = (_mm512_castps_pd(p[2 * i]), _mm512_castps_pd(p[2 * i + 1]));
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        )
    });
    // Levels 3–4: add the four 128-bit lanes of each quad together.
    let x = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(q[0], q[1]),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(q[0], q[1]),
    );
    let y = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(q[2], q[3]),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(q[2], q[3]),
    );
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
    )
}

decode_kernel!(kernel_f32, vpass_f32, f32, |p: *const f32| {
    // SAFETY: callers pass pointers to 16 readable elements of a cache record.
    unsafe { _mm512_loadu_ps(p) }
});
decode_kernel!(kernel_bf16, vpass_bf16, bf16, |p: *const bf16| {
    // bf16 → f32 is a 16-bit left shift of the zero-extended bits.
    // SAFETY: as above (16 bf16 = 32 bytes).
    let h = unsafe { _mm256_loadu_si256(p as *const __m256i) };
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
});
decode_kernel!(kernel_f16, vpass_f16, f16, |p: *const f16| {
    // SAFETY: as above (16 f16 = 32 bytes); F16C is enabled on the kernel.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
});
