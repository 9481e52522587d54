//! The decode kernel for f32, f16, bf16 and scaled i8 caches at head dims 64 and 128,
//! written once over [`Lanes`] and instantiated for AVX-512 (zmm), AVX2 (ymm) and NEON.
//! An i8 cache's codes are widened like any element; a row's scale multiplies its
//! partial dots once (K) and joins its probabilities (V), never each loaded vector.
//!
//! A task covers every KV head of a run of tokens, so each token's cache record
//! (`kv_heads·d` elements) is read whole and in order: per-head tasks read one slice of
//! every record, a gapped stream that wastes adjacent-line prefetches and DRAM rows.
//! KT tokens at a time, each K vector of a KV head is loaded once and dotted with the
//! group's queries (KT × up to four heads of independent FMA chains);
//! N tokens' partial vectors are reduced together by one transpose-add tree
//! ([`Lanes::transpose_sums`]). The V pass runs in tiles of [`V_TILE`] tokens, one KV head
//! at a time, its heads' outputs in registers. Records are prefetched twice: into L2 far
//! ahead, each pass its own (K by the K pass, V by the V pass, the V pass's first records
//! during the K pass's last steps), and into L1 just ahead, so each pass's compute hides
//! its own stream; when the K pass fetched V too, the V pass had nothing to hide.

use super::ChunkAll;
use crate::simd::lanes::Lanes;
use half::{bf16, f16};
use std::any::TypeId;
use tessera_core::{Element, Isa};

/// Tokens ahead to prefetch into L1, from L2 where [`L2_AHEAD`] has brought them.
const PREFETCH_AHEAD: usize = 8;

/// Tokens ahead whose records each pass prefetches into L2 (12 KiB of f16 K or V at d
/// 64 × 3 KV heads). L1 prefetches alone stall on the core's few L1 miss buffers: with 16
/// tokens ahead into L1 only, 16 sequences × 2048 f16 tokens read at ~14 GB/s; with the
/// K pass prefetching K and V into L2 32 ahead and L1 8 ahead, ~20 GB/s (2.0 → 1.16 ms,
/// 3 alternated rounds, host C; 16 × 192: 184 → 138 µs). Each pass fetching its own
/// records into L2 instead (host C, AMD Zen 4, 2026-12-02, `tessera bench
/// paged_attention --shape S --dtype f16 --variant avx512`, cold, 3–4 alternated rounds,
/// medians): 16 × 192 171 → 156 µs, 16 × 1024 746 → 688 and 769 → 700, one sequence of
/// 128 14.3 → 11.1, of 512 28.3 → 23.7; one thread 16 × 192 248 → 235 (AVX2 281 → 267).
/// In the engine's 16-stream step (`bench-serve --acts int8 --profile`, 2 alternated
/// runs) attention was within noise: 162–170 µs per layer against 165–166. A chunk's
/// first L2_AHEAD records are asked for together at its start (host C, 2026-12-03, a
/// noisy hour: `--shape 16x192x9x3x64`, 6 alternated rounds, median 136 against 147
/// µs, lower in 4; the engine's 16-stream step, 4 alternated runs, attention 4.16–4.75
/// ms a step against 4.24–5.24, lower in 3). On host H (Intel AVX-512, 2026-12-04,
/// `--shape 16x192x9x3x64`, 3 alternated rounds, fastest samples): no prefetch at all
/// 188–191 µs cold against 137–139 (63–64 in cache against 72–75); without the L1
/// prefetch, or with L2_AHEAD 16 or 64, cold within noise (135–142), in cache 67–70;
/// blocks in order instead of shuffled 129–130. Cold it sits nearer the sum of its time
/// in cache and a cold read of its bytes (88 µs, `--peers`) than their maximum. On one
/// thread (host H, 2026-12-04 evening, `--shape 16x1024x9x3x64 --set threads=1
/// --peers`) the kernel reads its 12.6 MB at 8.9 GB/s (1.42 ms, median) where a plain
/// sequential read of as many bytes takes 437 µs (28.8 GB/s: one core can stream the
/// whole DRAM rate); timing-only builds of 16 × 192 (wrong outputs, 3 alternated
/// rounds): without the K pass's dots 112–125 µs cold (in cache 55–58), without the
/// transpose-add 129–130 (62–65), against 127–139 (69–76); an L2 prefetch of each
/// record's first line only, cold unchanged; that and no K-pass L1 prefetch, 5–8% slower;
/// the bench's pool partly in 2 MiB pages, unchanged. So less compute barely moves the
/// cold time: this access pattern (16-token blocks of 6 KiB, scattered) runs at ~9 GB/s
/// a core, as a limit on the misses a core keeps in flight would give (an inference:
/// this guest has no counters). Longer sequential runs help less than that suggests
/// (host H, 2026-12-05, timing-only builds, 3 alternated rounds, fastest samples): with
/// every sequence's blocks consecutive in the pool instead of shuffled, 16 × 1024 on one
/// thread 1.15–1.19 ms against 1.37–1.39, 16 × 192 on two 123–130 µs against 137–139; one KV
/// head (`16x3072x3x1x64`, the same bytes, each sequence one run) no faster; and with
/// the blocks consecutive but no software prefetch, 1.57–1.59 ms and 165–170 µs: the
/// hardware streamer does not keep up with this loop even on one long run. Nor do the
/// matmuls before it have misses to spare (host H, 2026-12-05, timing-only build of the
/// engine: after each layer's attention, the next layer's K and V blocks prefetched into
/// L2, k lines per chunk pair of the AMX kernel, between its own work; `bench-serve
/// --requests 16 --concurrency 16 --prompt-tokens 128 --gen-tokens 128 --acts int8
/// --profile F`, 3 alternated rounds): attention per layer 174–209 µs → 140–165 at k = 8
/// to 10 (100 with its blocks all in cache: the call run twice), but the matmuls slowed
/// as much (gate/up 78–96 → 91–130 µs), decode 995–1034 tok/s against 901–1041.
const L2_AHEAD: usize = 32;

/// Heads whose V sums one register pass keeps.
const V_HEADS: usize = 3;

/// Heads of a group whose key dots one K step computes (KT tokens × K_HEADS chains): a
/// group of up to 4 query heads (SmolLM2's 3, Llama 3's 4) converts each key vector
/// once; larger groups once per 4 heads.
const K_HEADS: usize = 4;

/// Tokens per V tile: every KV head's pass over a tile finds its records in L1 (32 tokens
/// of d 64 × 3 KV heads are 12 KiB in f16, 24 KiB in f32).
const V_TILE: usize = 32;

/// Runs the kernel when `isa` has an instantiation and the cache type and head dim have
/// one; false if not (the caller then runs the portable body).
pub(super) fn chunk<T: Element>(
    isa: Isa,
    job: &ChunkAll<'_, T>,
    scores: &mut [f32],
    o: &mut [f32],
    ml: &mut [(f32, f32)],
) -> bool {
    let cache_type = [
        TypeId::of::<f32>(),
        TypeId::of::<f16>(),
        TypeId::of::<bf16>(),
        TypeId::of::<i8>(),
    ];
    if !matches!(job.cache.d, 64 | 128) || !cache_type.contains(&TypeId::of::<T>()) {
        return false;
    }
    let args = (job, scores, o, ml);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512 (checked); d and T checked above.
        Isa::Avx512 if isa.is_available() => unsafe { zmm(args) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above for AVX2.
        Isa::Avx2 if isa.is_available() => unsafe { ymm(args) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: NEON is baseline on aarch64; d and T checked above.
        Isa::Neon => unsafe { neon(args) },
        _ => return false,
    }
    true
}

/// One call's arguments: the task, its score rows, its output rows and (max, sum) slots.
type Args<'s, 'a, T> = (
    &'s ChunkAll<'a, T>,
    &'s mut [f32],
    &'s mut [f32],
    &'s mut [(f32, f32)],
);

/// # Safety
/// AVX-512F/BW/VL/DQ, AVX2, FMA and F16C are available; d ∈ {64, 128}; T is a cache type.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn zmm<T: Element>(args: Args<'_, '_, T>) {
    // SAFETY: forwarded contract.
    unsafe { wide::<crate::simd::lanes::Zmm, T>(args) }
}

/// The 16-lane instance: AVX-512's, and `Soft<16>`'s in the tests.
///
/// # Safety
/// L's features, L::N = 16; d ∈ {64, 128}; T is a cache type.
#[cfg(any(target_arch = "x86_64", test))]
#[inline(always)]
unsafe fn wide<L: Lanes, T: Element>((job, s, o, ml): Args<'_, '_, T>) {
    // SAFETY: forwarded contract; d = 16·NV, CV divides NV, 3·CV + CV + 1 ≤ 32 registers;
    // K steps of 4 tokens: up to 16 chains, 4 keys and a query, 21 registers.
    unsafe {
        match job.cache.d {
            64 => kernel::<L, T, 4, 4, 4>(job, s, o, ml),
            _ => kernel::<L, T, 8, 4, 4>(job, s, o, ml),
        }
    }
}

/// # Safety
/// AVX2, FMA and F16C are available; d ∈ {64, 128}; T is a cache type.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ymm<T: Element>((job, s, o, ml): Args<'_, '_, T>) {
    use crate::simd::lanes::Ymm;
    // SAFETY: forwarded contract; d = 8·NV, CV divides NV, 3·CV + 3 + 1 ≤ 16 registers;
    // K steps of 2 tokens: up to 8 chains, 2 keys and a query (4 tokens measured no
    // faster).
    // CV = 4 fills all 16 and LLVM then spills one accumulator, a store→load→FMA chain
    // on every token: CV = 2 ran 16×192 f16 (1 thread, in cache) in 235 µs against 268–272
    // (min/p10 of 11 alternated runs, host B).
    unsafe {
        match job.cache.d {
            64 => kernel::<Ymm, T, 8, 2, 2>(job, s, o, ml),
            _ => kernel::<Ymm, T, 16, 2, 2>(job, s, o, ml),
        }
    }
}

/// # Safety
/// d ∈ {64, 128}; T is a cache type.
#[cfg(target_arch = "aarch64")]
unsafe fn neon<T: Element>((job, s, o, ml): Args<'_, '_, T>) {
    use crate::simd::lanes::Neon;
    // SAFETY: forwarded contract; d = 4·NV, CV divides NV, 3·CV + CV + 1 ≤ 32 registers;
    // K steps of 4 tokens as for zmm.
    unsafe {
        match job.cache.d {
            64 => kernel::<Neon, T, 16, 4, 4>(job, s, o, ml),
            _ => kernel::<Neon, T, 32, 4, 4>(job, s, o, ml),
        }
    }
}

/// N cache elements at `p` as f32 lanes (T is resolved at compile time); an i8 cache's
/// codes as they are (the caller applies the row's scale).
///
/// # Safety
/// L's features; N elements readable at `p`; T is f32, f16, bf16 or i8.
#[inline(always)]
unsafe fn load_row<L: Lanes, T: Element>(p: *const T) -> L::F {
    let t = TypeId::of::<T>();
    // SAFETY: forwarded contract; each cast matches T's TypeId.
    unsafe {
        if t == TypeId::of::<f32>() {
            L::load(p.cast())
        } else if t == TypeId::of::<f16>() {
            L::load_f16(p.cast())
        } else if t == TypeId::of::<i8>() {
            L::to_f32(L::widen_i8(p.cast()))
        } else {
            L::load_bf16(p.cast())
        }
    }
}

/// Prefetches the whole record of the chunk's token `i` (if the chunk has one) into L2
/// or L1, and for an i8 cache the line holding its first scale (a block's records and
/// their scales are consecutive, so the next token's asks for a line the scales spill
/// into).
#[inline(always)]
fn prefetch_record<L: Lanes, T>(
    (buf, scales): (&[T], &[f32]),
    records: &[usize],
    i: usize,
    (rec_len, d): (usize, usize),
    l2: bool,
) {
    let ask = |p: *const u8| {
        // SAFETY: a prefetch never faults; L's features are the caller's.
        unsafe {
            if l2 {
                L::prefetch_l2(p)
            } else {
                L::prefetch_l1(p)
            }
        }
    };
    if let Some(&at) = records.get(i) {
        let p = buf.as_ptr().wrapping_add(at) as *const u8;
        for line in (0..rec_len * std::mem::size_of::<T>()).step_by(64) {
            ask(p.wrapping_add(line));
        }
        if !scales.is_empty() {
            ask(scales.as_ptr().wrapping_add(at / d) as *const u8);
        }
    }
}

/// Scores, softmax pieces and weighted values of one chunk, every head: d = N·NV; the
/// K pass takes KT tokens a step ([`key_dots`]); the V pass keeps up to [`V_HEADS`]
/// heads × CV vectors in registers.
///
/// # Safety
/// L's features; d = L::N·NV; CV divides NV; KT divides L::N; T is f32, f16, bf16 or i8.
#[inline(always)]
unsafe fn kernel<L: Lanes, T: Element, const NV: usize, const CV: usize, const KT: usize>(
    job: &ChunkAll<'_, T>,
    scores: &mut [f32],
    o: &mut [f32],
    ml: &mut [(f32, f32)],
) {
    let c = job.cache;
    let (d, kvh_n, heads) = (L::N * NV, c.kv_heads, ml.len());
    let g = heads / kvh_n;
    let n = job.records.len();
    let rec_len = kvh_n * d;
    let shape = (rec_len, d);
    let (kb, vb) = ((c.k, c.k_scales), (c.v, c.v_scales));
    let qp = job.q.as_ptr();
    // Per head, N tokens' partial vectors (N×N floats), reduced together.
    let tile = L::N * L::N;
    let mut partial = vec![0f32; heads * tile];
    const { assert!(L::N.is_multiple_of(KT)) };
    // The V pass's first L2_AHEAD records are fetched during the K pass's last steps.
    let v_lead_from = n.saturating_sub(L2_AHEAD);
    // The chunk's first L2_AHEAD records at once: the loop below asks for record
    // i + L2_AHEAD, so these were otherwise never fetched ahead into L2.
    for i in 0..L2_AHEAD.min(n) {
        prefetch_record::<L, T>(kb, job.records, i, shape, true);
    }
    // KT tokens at a time (KT divides N, so a step never straddles two transposes).
    for t0 in (0..n).step_by(KT) {
        for i in t0..t0 + KT {
            prefetch_record::<L, T>(kb, job.records, i + L2_AHEAD, shape, true);
            if let Some(j) = i.checked_sub(v_lead_from) {
                prefetch_record::<L, T>(vb, job.records, j, shape, true);
            }
            prefetch_record::<L, T>(kb, job.records, i + PREFETCH_AHEAD, shape, false);
        }
        // Past the chunk's end the last token stands in: its dots land in transpose
        // rows that are dropped below.
        let mut recs = [c.k.as_ptr(); KT];
        let mut at = [0; KT];
        for (t, (r, a)) in recs.iter_mut().zip(&mut at).enumerate() {
            *a = job.records[(t0 + t).min(n - 1)];
            *r = c.k[*a..][..rec_len].as_ptr();
        }
        for kvh in 0..kvh_n {
            let scales = at.map(|a| c.row_scale(c.k_scales, a + kvh * d, d));
            let mut h0 = kvh * g;
            while h0 < (kvh + 1) * g {
                let hb = ((kvh + 1) * g - h0).min(K_HEADS);
                let step = KStep {
                    recs,
                    scales,
                    kvh,
                    h0,
                    slot: t0 % L::N,
                };
                // SAFETY: forwarded contract; hb ≤ K_HEADS heads from h0 exist.
                unsafe {
                    match hb {
                        1 => key_dots::<L, T, NV, KT, 1>(&step, qp, &mut partial),
                        2 => key_dots::<L, T, NV, KT, 2>(&step, qp, &mut partial),
                        3 => key_dots::<L, T, NV, KT, 3>(&step, qp, &mut partial),
                        _ => key_dots::<L, T, NV, KT, 4>(&step, qp, &mut partial),
                    }
                }
                h0 += hb;
            }
        }
        let i = (t0 + KT).min(n) - 1;
        if i % L::N == L::N - 1 || i + 1 == n {
            // Rows past `done` hold an earlier group's partials; their sums are dropped.
            let done = i % L::N + 1;
            for h in 0..heads {
                let first = h * n + i + 1 - done;
                // SAFETY: partial holds N·N floats per head; a whole group's N sums go
                // straight to scores[first..first + N] (inside head h's n scores).
                unsafe {
                    let t = L::transpose_sums(partial.as_ptr().add(h * tile));
                    if done == L::N {
                        L::store(scores[first..first + L::N].as_mut_ptr(), t);
                    } else {
                        let mut sums = [0f32; 16];
                        L::store(sums.as_mut_ptr(), t);
                        scores[first..first + done].copy_from_slice(&sums[..done]);
                    }
                }
            }
        }
    }
    for (h, slot) in ml.iter_mut().enumerate() {
        let s = &mut scores[h * n..(h + 1) * n];
        let m = crate::simd::max(s);
        // SAFETY: L's features (the entry's) per this function's contract.
        *slot = (m, unsafe { L::exp_shifted_sum(s, m) });
    }
    let mut from = 0;
    while from < n {
        let tokens = from..(from + V_TILE).min(n);
        for kvh in 0..kvh_n {
            let mut h0 = kvh * g;
            while h0 < (kvh + 1) * g {
                let hb = ((kvh + 1) * g - h0).min(V_HEADS);
                let part = VPart {
                    kvh,
                    h0,
                    n,
                    tokens: tokens.clone(),
                };
                // SAFETY: forwarded contract; hb ≤ V_HEADS heads from h0 exist.
                unsafe {
                    match hb {
                        1 => vpass::<L, T, NV, CV, 1>(job, &part, scores, o),
                        2 => vpass::<L, T, NV, CV, 2>(job, &part, scores, o),
                        _ => vpass::<L, T, NV, CV, 3>(job, &part, scores, o),
                    }
                }
                h0 += hb;
            }
        }
        from = tokens.end;
    }
}

/// One step of the K pass: KT tokens' records, a KV head, its first query head, and the
/// transpose row of the first token.
struct KStep<T, const KT: usize> {
    recs: [*const T; KT],
    /// Each token's key scale for the KV head (1 for a float cache).
    scales: [f32; KT],
    kvh: usize,
    h0: usize,
    slot: usize,
}

/// Per token t of the step and head h0 + hh, the N-lane partial dot of the query with
/// the KV head's key row, stored as row `slot + t` of the head's transpose tile. Each
/// key vector is converted once and feeds KT·H independent FMA chains. One token and
/// one head per chain, in program order, left AVX2 waiting on the FMA latency (host B,
/// 1 × 544 f16 tokens, 9/3 heads, d 64, in cache, one thread: the whole kernel's best of
/// 15 rounds, both orders interleaved in one process, 7 runs: 35.0–45.4 µs against
/// 37.4–46.3, lower in 6 of the 7).
///
/// # Safety
/// As for [`kernel`]; every `recs[t]` addresses a whole record; heads h0..h0+H belong to
/// `kvh`; `partial` holds N·N floats for every head.
#[inline(always)]
unsafe fn key_dots<L: Lanes, T: Element, const NV: usize, const KT: usize, const H: usize>(
    step: &KStep<T, KT>,
    qp: *const f32,
    partial: &mut [f32],
) {
    let d = L::N * NV;
    let tile = L::N * L::N;
    debug_assert!(partial.len() >= (step.h0 + H) * tile && step.slot + KT <= L::N);
    // SAFETY: per the contract: records hold kv_heads·d elements (kvh·d + N·v < that),
    // the queries heads·d floats, partial (h0 + H)·N·N.
    unsafe {
        let mut acc = [[L::zero(); H]; KT];
        for v in 0..NV {
            // A loop, not `array::from_fn`: a closure's intrinsics may stay out of line,
            // without the entry's target features.
            let mut k = [L::zero(); KT];
            for (t, kt) in k.iter_mut().enumerate() {
                *kt = load_row::<L, T>(step.recs[t].add(step.kvh * d + L::N * v));
            }
            for hh in 0..H {
                let q = L::load(qp.add((step.h0 + hh) * d + L::N * v));
                for t in 0..KT {
                    acc[t][hh] = if v == 0 {
                        L::mul(q, k[t])
                    } else {
                        L::fmadd(q, k[t], acc[t][hh])
                    };
                }
            }
        }
        for (t, row) in acc.iter().enumerate() {
            for (hh, &a) in row.iter().enumerate() {
                let at = (step.h0 + hh) * tile + (step.slot + t) * L::N;
                // An i8 cache's codes were dotted as they are: one product by the
                // row's scale here instead of one per loaded vector.
                let a = if TypeId::of::<T>() == TypeId::of::<i8>() {
                    L::mul(a, L::splat_f(step.scales[t]))
                } else {
                    a
                };
                L::store(partial.as_mut_ptr().add(at), a);
            }
        }
    }
}

/// What a V pass covers: a KV head, its first query head, the chunk length and the tile
/// of the chunk's tokens.
struct VPart {
    kvh: usize,
    h0: usize,
    n: usize,
    tokens: std::ops::Range<usize>,
}

/// Σ_t p[h, t]·V[t, kvh] over the part's tile for heads h0..h0+H, CV vectors of the head
/// dim at a time, added in registers to what `o` holds from earlier tiles (nothing before
/// the first). Accumulating through `o` on every token put a store→load→FMA chain on
/// each (~80 ns per token measured). Per token the H probabilities are broadcast first
/// and each V vector is converted and used at once, so the pass holds H·CV accumulators,
/// H broadcasts and one V vector: H·CV + H + 1 registers (converting all CV vectors
/// first would need CV − 1 more). AVX2 takes CV = 2 (see `ymm`); 32-register widths 4.
///
/// # Safety
/// As for [`kernel`]; heads h0..h0+H belong to `part.kvh`.
#[inline(always)]
unsafe fn vpass<L: Lanes, T: Element, const NV: usize, const CV: usize, const H: usize>(
    job: &ChunkAll<'_, T>,
    part: &VPart,
    scores: &[f32],
    o: &mut [f32],
) {
    let c = job.cache;
    let d = L::N * NV;
    let (n, h0) = (part.n, part.h0);
    let records = &job.records[part.tokens.clone()];
    debug_assert!(scores.len() >= (h0 + H) * n && part.tokens.end <= n);
    debug_assert!(records.iter().all(|&at| at + c.kv_heads * d <= c.v.len()));
    for cb in (0..NV).step_by(CV) {
        let at = |hh: usize, v: usize| (h0 + hh) * d + L::N * (cb + v);
        // SAFETY: L's features, per the contract.
        let mut acc = [[unsafe { L::zero() }; CV]; H];
        if part.tokens.start > 0 {
            for (hh, row) in acc.iter_mut().enumerate() {
                for (v, a) in row.iter_mut().enumerate() {
                    // SAFETY: o holds heads·d floats.
                    *a = unsafe { L::load(o[at(hh, v)..][..L::N].as_ptr()) };
                }
            }
        }
        for (j, &rec_at) in records.iter().enumerate() {
            let i = part.tokens.start + j;
            if part.kvh == 0 && cb == 0 {
                let (vb, shape) = ((c.v, c.v_scales), (c.kv_heads * d, d));
                prefetch_record::<L, T>(vb, job.records, i + L2_AHEAD, shape, true);
                prefetch_record::<L, T>(vb, job.records, i + PREFETCH_AHEAD, shape, false);
            }
            // SAFETY: every record holds kv_heads·d elements inside the cache buffer
            // (`check` validated the block tables; asserted above in debug builds), and
            // kvh·d + N·(cb + CV) ≤ kv_heads·d; scores holds (h0 + H)·n floats, i < n.
            unsafe {
                let row = rec_at + part.kvh * d;
                let rec = c.v.as_ptr().add(row + L::N * cb);
                // An i8 cache's scale joins the probabilities: one product per head.
                let vs = c.row_scale(c.v_scales, row, d);
                let mut p = [L::zero(); H];
                for (hh, ph) in p.iter_mut().enumerate() {
                    *ph = L::splat_f(*scores.as_ptr().add((h0 + hh) * n + i) * vs);
                }
                for v in 0..CV {
                    let x = load_row::<L, T>(rec.add(L::N * v));
                    for hh in 0..H {
                        acc[hh][v] = L::fmadd(p[hh], x, acc[hh][v]);
                    }
                }
            }
        }
        for (hh, row) in acc.iter().enumerate() {
            for (v, &a) in row.iter().enumerate() {
                // SAFETY: o holds heads·d floats.
                unsafe { L::store(o[at(hh, v)..][..L::N].as_mut_ptr(), a) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ChunkAll, PagedKvCache};
    use super::*;
    use crate::registry::verify::rel_error_finite;
    use crate::simd::lanes::Soft;
    use rand::{Rng, SeedableRng};

    /// AVX-512's instance ([`wide`]) in software lanes, and each ISA this host runs,
    /// against float64: f32, f16, bf16 and scaled i8 caches, d 64 and 128, 3 and 6 query heads per
    /// KV head, chunks of 1 to 100 tokens (ragged against the 16-token transposes and the
    /// 32-token V tiles) whose records are scattered over the pool as a block table
    /// leaves them.
    #[test]
    fn wide_instance_matches_f64_in_software_lanes() {
        fn run<T: Element>(rng: &mut impl Rng, seed: u64, g: usize) {
            let (kv_heads, block_size, num_blocks) = (2, 16, 12);
            let heads = kv_heads * g;
            for d in [64, 128] {
                let rec_len = kv_heads * d;
                let len = num_blocks * block_size * rec_len;
                // i8 codes span ±127 with scales of 0.5/127 to 2/127 per row.
                let scaled = T::DTYPE == tessera_core::DType::I8;
                let amp = if scaled { 127.0 } else { 1.0 };
                let mut rand_t = |n: usize| -> Vec<T> {
                    (0..n)
                        .map(|_| T::from_f32(rng.random_range(-amp..amp)))
                        .collect()
                };
                let (k, v) = (rand_t(len), rand_t(len));
                let rows = if scaled { len / d } else { 0 };
                let mut rand_s = |n: usize| -> Vec<f32> {
                    (0..n).map(|_| rng.random_range(0.5..2.0) / 127.0).collect()
                };
                let (ks, vs) = (rand_s(rows), rand_s(rows));
                let (kf, vf) = (
                    |at: usize| k[at].to_f64() * ks.get(at / d).map_or(1.0, |&s| s as f64),
                    |at: usize| v[at].to_f64() * vs.get(at / d).map_or(1.0, |&s| s as f64),
                );
                let cache = PagedKvCache {
                    k: &k,
                    v: &v,
                    k_scales: &ks,
                    v_scales: &vs,
                    num_blocks,
                    block_size,
                    kv_heads,
                    d,
                };
                for n in [1, 17, 45, 100] {
                    // Token t lives in block (7·(t / 16) + 3) mod 12: scattered, in range.
                    let records: Vec<usize> = (0..n)
                        .map(|t| {
                            ((7 * (t / block_size) + 3) % num_blocks * block_size + t % block_size)
                                * rec_len
                        })
                        .collect();
                    let q: Vec<f32> = (0..heads * d)
                        .map(|_| rng.random_range(-0.5..0.5))
                        .collect();
                    let job = ChunkAll {
                        cache: &cache,
                        records: &records,
                        q: &q,
                    };
                    let want: Vec<f64> = (0..heads)
                        .flat_map(|h| {
                            let at = |r: usize| records[r] + h / g * d;
                            let s: Vec<f64> = (0..n)
                                .map(|r| (0..d).map(|x| q[h * d + x] as f64 * kf(at(r) + x)).sum())
                                .collect();
                            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                            let total: f64 = w.iter().sum();
                            (0..d)
                                .map(|x| (0..n).map(|r| w[r] * vf(at(r) + x)).sum::<f64>() / total)
                                .collect::<Vec<f64>>()
                        })
                        .collect();
                    let check = |what: &str, o: &[f32], ml: &[(f32, f32)]| {
                        let got: Vec<f64> = (0..heads * d)
                            .map(|i| o[i] as f64 / ml[i / d].1 as f64)
                            .collect();
                        let err = rel_error_finite(&got, &want);
                        assert!(
                            err <= super::super::TOL_F32.rel,
                            "{what} {:?}: d {d}, {g} heads per KV head, {n} tokens: error \
                             {err:.2e} (seed {seed})",
                            T::DTYPE
                        );
                    };
                    let bufs = || {
                        (
                            vec![f32::NAN; heads * n],
                            vec![f32::NAN; heads * d],
                            vec![(f32::NAN, f32::NAN); heads],
                        )
                    };
                    let (mut s, mut o, mut ml) = bufs();
                    // SAFETY: Soft needs no CPU feature; d ∈ {64, 128}; T is a cache type.
                    unsafe { wide::<Soft<16>, T>((&job, &mut s, &mut o, &mut ml)) };
                    check("Soft<16>", &o, &ml);
                    for isa in Isa::available() {
                        let (mut s, mut o, mut ml) = bufs();
                        if chunk(isa, &job, &mut s, &mut o, &mut ml) {
                            check(isa.name(), &o, &ml);
                        }
                    }
                }
            }
        }
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // Groups of 3 heads (one K step of 3) and 6 (steps of 4 and 2).
        for g in [3, 6] {
            run::<f32>(&mut rng, seed, g);
            run::<f16>(&mut rng, seed, g);
            run::<bf16>(&mut rng, seed, g);
            run::<i8>(&mut rng, seed, g);
        }
    }
}
