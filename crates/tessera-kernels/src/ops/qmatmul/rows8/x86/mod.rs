//! The x86 entry points of the interleaved kernels ([`super::chunk`]): `vpmaddubsw` on
//! ymm (AVX2), `vpdpbusd` on ymm (AVX512_VNNI + VL, 8 rows) and on zmm (16 rows); and
//! the split-scale kernel ([`super::planes`]) with `vpmaddubsw`. The register types
//! they run on are in [`lanes`], the algorithms in the parent module and `planes`.

use super::super::act_panel::PanelRows;
use super::super::packed::{CodeLayout, Meta, PackedWeights, ROWS8};
use super::super::quant_acts::QuantActs;
use super::super::M_CHUNK;
use super::planes;
use super::{dots_with, nibble_pass_with};
use lanes::{Maddubs, Vnni, Ymm, YmmPair, Zmm};

mod lanes;

/// `out[ld·i + g] = Σ_k W[r0 + g, k]·x̂_i[k]` for the group of 8 rows starting at r0
/// (rows past `w.rows` are zero padding) and up to [`AVX2_M`] activation rows, with
/// `vpmaddubsw`: [`dots16`]'s loop for decode rows, a batch's last 1–3 rows, codes
/// other than nibbles and a last, odd group.
///
/// On Zen 3 (inline-assembly probes, 2026-12-05, not in the repository) `vpmaddubsw`
/// and `vpmaddwd` share two pipes, 2 a cycle together; `vpaddw` runs 4 a cycle, vector
/// loads and broadcasts 2. At 4 rows a pass this loop took 11.5–11.9 cycles per chunk
/// and row (16 rows in cache, one thread) where its 8 `vpmaddubsw` + `vpaddw` steps need
/// ~5.6: each chunk's float finish (a ~14-cycle chain) was exposed. A stand-alone copy
/// (not in the repository) took 12.0 cycles at 4 rows, 6.5 without the finish, and
/// 8.6–9.1 at 8 rows a pass. This loop at 8 rows reaches it only with the chunk's steps
/// kept a loop ([`super::RowLanes::ROLLED_FROM`]): 9.6 cycles (Q4_1 16×3072×576 in cache
/// 331–340 µs against 396–404 at 4 rows, 2026-12-05, host B class); unrolled, LLVM
/// hoisted the chunk's activation words and spilled them (567–569 µs).
/// `scripts/avx2_int8_mix.c` times the loops' instruction mixes alone, with their
/// finishes (host B class, 2026-12-06, clock 3.19–3.20 GHz): 8.0–8.1 cycles per chunk and
/// row for nibbles, 13.1 for full bytes; Q4_1 and Q8_0 16×3072×576 then ran at 86–87% and
/// 90% of those rates (docs/performance.md, host B).
///
/// # Safety
/// AVX2, FMA and F16C; `w.layout.interleaved()`, not `Meta::SplitI8` metadata; r0 a
/// multiple of 8 below `w.rows`; 1 ≤ acts.live() ≤ AVX2_M, the rows quantized for
/// `w.cols` columns and `w`'s offset, starting at a slot that leaves AVX2_M slots in
/// the panel; ld ≥ 8 and out.len() ≥ ld·(live − 1) + 8.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots8(w: &PackedWeights, r0: usize, acts: PanelRows<'_>, out: (&mut [f32], usize)) {
    // SAFETY: forwarded contract.
    unsafe { dots_with::<Ymm<Maddubs>, AVX2_M>(w, r0, acts, out) }
}

/// Activation rows the AVX2 kernel ([`dots8`]) takes per pass over a group's codes: 8
/// rows' one running sum each (nibbles' i16, full bytes' i32) and accumulators
/// fill the 16 ymm registers, and each chunk's float finish then overlaps 8 rows' steps
/// instead of 4 (Q4_1 16×3072×576, 2 threads: 170–172 µs against 201–202 at
/// [`M_CHUNK`]; the Q8_0 LM head 16×49152×576, then as two nibble planes, 4667–4693
/// against 5604–5664; AMD Zen 3,
/// 2026-12-05, `tessera bench qmatmul --variant avx2-int8-r8`, 2 alternated rounds).
/// 5-bit codes, two sums a row, run such a pass as two of 4 (`super::by_rows`).
pub(in super::super) const AVX2_M: usize = 8;

/// Activation rows the VNNI kernel ([`dots_vnni16`]) takes per pass over a group's
/// codes. AVX-512VL's 32 ymm registers hold 8 rows' two running sums and accumulators;
/// each pass expands the codes once and finishes each chunk's 8 rows with one load of
/// their scales, so a 16-row batch expands every code twice instead of four times.
pub(in super::super) const VNNI_M: usize = 8;

/// The ymm pass of [`dots_vnni16`] for one group, row i's 8 outputs at `out[ld·i..]`.
/// A function of its own: inlined into `dots_vnni16`'s body beside the zmm loop, the
/// same loop ran ~4% slower (one-row 576×576 Q4_1 in cache, one thread, host H).
///
/// # Safety
/// As [`dots_vnni16`] for one group (r0 a multiple of 8), with out.len() ≥ ld·(live −
/// 1) + 8.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn dots_vnni8(w: &PackedWeights, r0: usize, acts: PanelRows<'_>, out: (&mut [f32], usize)) {
    // SAFETY: forwarded contract.
    unsafe { dots_with::<Ymm<Vnni>, VNNI_M>(w, r0, acts, out) }
}

/// Rows [`dots_vnni16`] covers per call: two adjacent groups.
pub(in super::super) const ROWS16: usize = 2 * ROWS8;

/// Activation rows from which [`dots_vnni16`] runs on zmm: only a full pass
/// ([`VNNI_M`]). With 512-bit instructions in flight Intel cores lose port 1's vector
/// ALU, and a few activation rows leave the code loads, inserts and nibble masks as
/// many as the dot products, so until a pass is full the ymm kernel is as fast in cache
/// and faster with the weights cold, as a decode step reads them. Intel Xeon host H
/// (AVX-512 + VNNI + AMX), Q4_1 3072×576 cold, `tessera bench qmatmul --variant
/// avx512-vnni-r8`, 2–3 alternated rounds, ymm against zmm: 2 rows 50–51 µs against
/// 61–62, 4 rows 56–58 against 71, 8 rows 74–75 against 81–84 (in cache 63 against
/// 61–70); 16 rows in cache 123–124 against 98–101. The default 16-bit activations
/// make a decode row two: one stream's decode 234–244 tok/s against 180–198 with zmm
/// from two rows, and 16 streams (32 rows, full passes) 5% faster on zmm than on ymm
/// (docs/performance.md, host H).
const ZMM_MIN_ROWS: usize = VNNI_M;

/// [`dots8`] with `vpdpbusd` (AVX512_VNNI; one instruction per 4 activation bytes
/// instead of `vpmaddubsw` + `vpaddw`, and no `vpmaddwd` per chunk) for the 16 rows of
/// groups r0/8 and r0/8 + 1, on zmm registers with each lane one row: `out[16i + g] =
/// Σ_k W[r0 + g, k]·x̂_i[k]`.
///
/// Why two groups per register rather than two chunk steps of one: the chunk's finish
/// (a conversion, a scale multiply, one or two FMAs per activation row) then serves 16
/// rows instead of 8, where with 8 rows in 16 lanes it would stay as costly as on ymm.
/// The second group's codes come in with one `vinserti64x4` per 32 bytes, shared by
/// the pass's activation rows. A last, odd group runs the same loop on ymm registers
/// (AVX512VL; its rows land in the first 8 of each 16 outputs), and so does each group
/// of a pass of fewer than [`ZMM_MIN_ROWS`] activation rows.
///
/// # Safety
/// As [`dots8`] with [`VNNI_M`] for M_CHUNK, r0 a multiple of 16, out.len() ≥
/// 16·acts.live(), and the CPU has AVX-512F/BW/DQ/VL and AVX512_VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
pub(in super::super) unsafe fn dots_vnni16(
    w: &PackedWeights,
    r0: usize,
    acts: PanelRows<'_>,
    out: &mut [f32],
) {
    debug_assert!(r0.is_multiple_of(ROWS16) && out.len() >= ROWS16 * acts.live());
    if r0 + ROWS8 < w.rows && acts.live() >= ZMM_MIN_ROWS {
        // SAFETY: forwarded contract; group r0/8 + 1 holds row r0 + 8 < rows.
        return unsafe { dots_with::<Zmm, VNNI_M>(w, r0, acts, (out, ROWS16)) };
    }
    for r in (r0..w.rows.min(r0 + ROWS16)).step_by(ROWS8) {
        // Straight into lanes r − r0.. of each row's 16 (a row stride of 16): staging
        // each group's rows and copying them over was ~2% of a one-row 576×576 call.
        // SAFETY: forwarded contract, for one group; out[r − r0..] holds 16·(live − 1)
        // + 8 floats as out holds 16·live.
        unsafe { dots_vnni8(w, r, acts, (&mut out[r - r0..], ROWS16)) };
    }
}

/// Activation rows [`dots16`] takes per pass over two groups' codes: 4 rows' running
/// sums of 2 groups fill 8 ymm registers, as 8 rows of one group in [`dots8`].
const PAIR_M: usize = 4;

/// `out[16i + g] = Σ_k W[r0 + g, k]·x̂_i[k]` for the 16 rows of groups r0/8 and r0/8 + 1
/// and up to [`AVX2_M`] activation rows, with `vpmaddubsw`. Nibble codes run passes of
/// exactly [`PAIR_M`] rows over both groups on a pair of ymm registers ([`YmmPair`]):
/// per 8 `vpmaddubsw`, 4 activation broadcasts and 2 code vectors instead of
/// [`dots8`]'s 8 and 1. The rest (the last 1–3 rows, other codes, a last, odd group)
/// runs [`dots8`] per group.
///
/// Why: broadcasts cost this loop more than the probes in [`dots8`]'s doc suggest. A
/// timing build (wrong outputs) sharing each broadcast between two activation rows took
/// Q4_1 16×3072×576 in cache on one thread from 345–348 µs to 269–270; the pair, which
/// pays for its halved broadcasts with a second code vector and its nibble masks each
/// step, takes 327–328 (−5%); on 2 threads (one copy of the weights) 165–166 against
/// 175, 16×960×576 54 against 57 (AMD Zen 3, 2026-12-06, `tessera bench qmatmul
/// --variant avx2-int8-r8`, 3 alternated rounds, fastest samples). One and two rows
/// (decode) took 10–15% longer as pairs (1×3072×576 29–36 µs against 26–30), so they
/// stay per group. 5-bit codes
/// keep two sums a row, which 4 rows of two groups would not fit in 16 registers. Full
/// bytes (one i32 sum a row) have not been tried as pairs: each step would hold q and
/// |q| of both groups.
///
/// # Safety
/// As [`dots8`], with r0 a multiple of 16 and out.len() ≥ 16·acts.live().
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn dots16(
    w: &PackedWeights,
    r0: usize,
    acts: PanelRows<'_>,
    out: &mut [f32],
) {
    debug_assert!(r0.is_multiple_of(ROWS16) && out.len() >= ROWS16 * acts.live());
    let pairs = r0 + ROWS8 < w.rows && w.layout == CodeLayout::Nibbles8;
    let (mut rest, mut at) = (Some(acts), 0);
    while let Some(rows) = rest.filter(|rows| pairs && rows.live() >= PAIR_M) {
        let (pass, next) = if rows.live() > PAIR_M {
            let (pass, next) = rows.split(PAIR_M);
            (pass, Some(next))
        } else {
            (rows, None)
        };
        // SAFETY: forwarded contract, nibble codes and PAIR_M live rows; each pass
        // starts PAIR_M slots further on in the panel, and group r0/8 + 1 holds row
        // r0 + 8 < rows.
        unsafe {
            let out = (&mut out[ROWS16 * at..], ROWS16);
            nibble_pass_with::<YmmPair<Maddubs>, PAIR_M>(w, r0, pass, out)
        };
        (rest, at) = (next, at + PAIR_M);
    }
    let Some(rows) = rest else { return };
    for r in (r0..w.rows.min(r0 + ROWS16)).step_by(ROWS8) {
        // SAFETY: forwarded contract, for one group, at a row stride of 16; after pair
        // passes the rest are fewer than PAIR_M rows, which `dots8` reads exactly (no
        // slots past them), so starting PAIR_M slots on is in the panel.
        unsafe { dots8(w, r, rows, (&mut out[ROWS16 * at + r - r0..], ROWS16)) };
    }
}

/// `out[8i + g] = Σ_k W[r0 + g, k]·x̂_i[k]` over Q2_K/Q3_K/Q6_K's split scales (`planes`)
/// for the group of 8 rows at r0 and up to M_CHUNK activation rows, with `vpmaddubsw`.
///
/// # Safety
/// AVX2, FMA and F16C; `w.layout.interleaved()` with `Meta::SplitI8` metadata; r0 a
/// multiple of 8 below `w.rows`; 1 ≤ acts.len() ≤ M_CHUNK, each built for `w.cols`
/// columns and `w`'s offset; out.len() ≥ 8·acts.len().
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn planes_dots(
    w: &PackedWeights,
    r0: usize,
    acts: &[&QuantActs],
    out: &mut [f32],
) {
    match &w.meta {
        // SAFETY: forwarded contract.
        Meta::SplitI8(s) => unsafe { planes::dots::<Ymm<Maddubs>, M_CHUNK>(w, s, r0, acts, out) },
        _ => unreachable!("the split-scale kernel reads split scales only"),
    }
}

/// [`planes_dots`] with `vpdpbusd` on ymm registers.
///
/// # Safety
/// As [`planes_dots`], and the CPU has AVX-512F/VL and AVX512_VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(in super::super) unsafe fn planes_dots_vnni(
    w: &PackedWeights,
    r0: usize,
    acts: &[&QuantActs],
    out: &mut [f32],
) {
    match &w.meta {
        // SAFETY: forwarded contract.
        Meta::SplitI8(s) => unsafe { planes::dots::<Ymm<Vnni>, M_CHUNK>(w, s, r0, acts, out) },
        _ => unreachable!("the split-scale kernel reads split scales only"),
    }
}
