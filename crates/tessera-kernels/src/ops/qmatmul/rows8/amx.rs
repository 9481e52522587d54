//! The interleaved integer kernel on AMX tiles (`tdpbsud`), for batches: 16 weight rows
//! (two adjacent 8-row groups, as [`super::x86::dots_vnni16`]'s zmm loop) against 16
//! activation rows (two panels) per call.
//!
//! Why tiles: a batching step's integer matmul is bound by its instructions, not by
//! DRAM (docs/performance.md): `vpdpbusd` does 64 multiply-adds, so a chunk of 32
//! weights × 16 rows × 16 activation rows is 128 of them. One `tdpbsud` does the same
//! 8 192 on the tile unit, beside the vector ports, leaving the vector side the code
//! unpacking and each chunk's finish (a conversion and two FMAs per activation row),
//! which the zmm loop pays too.
//!
//! Shapes, per 32-column chunk c (palette 1, every tile 8 rows):
//!
//! ```text
//! A = tmm4 / tmm5   panel 0 / 1 activation codes: 8 rows × 32 signed bytes, read in
//!                   place from the panel's record (slot s's codes at 32·s, so stride 32)
//! B = tmm6 / tmm7   weight codes of even / odd chunks: 8 steps × (16 rows × 4 codes),
//!                   unsigned, exactly the zmm loop's registers (group r0/8's 8 rows in
//!                   bytes 0–31 of a step, the next group's in 32–63), staged in L1
//! C = tmm0–tmm3     (even, odd chunk) × (panel 0, 1): 8 activation rows × 16 i32
//! ```
//!
//! `tdpbsud` is signed A × unsigned B, as the activation codes and weight codes are.
//! Even and odd chunks use their own B and C tiles, so the tile unit multiplies chunk
//! c + 1 while the vector side finishes chunk c from C stored to L1. Nibble codes need
//! their high or low half masked before B holds them, and two groups' codes lie
//! `group_bytes` apart, so every B is staged (a load, insert, mask and store per step);
//! activation codes need neither.
//!
//! The finish per chunk and activation row is the zmm loop's: `d·(S + init)·d_x +
//! m·(d_x·Σq_x)` with S exact in i32, so the outputs match it up to the same f32
//! roundings.
//!
//! Where its time goes (host H, Intel AVX-512 + AMX, 2026-12-04, `tessera bench qmatmul
//! --dtype q4_1 --shape Mx3072x576 --variant avx512-amx-r16 --in-cache --set
//! threads=1`, 2–3 alternated rounds, fastest samples): a call costs per 8-row panel,
//! whatever its live rows (M = 4: 71 µs, 8: 76, 16: 129–142, every slot finished), and
//! on two threads it runs cold as in cache (73–77 µs against 76–77), so DRAM is not
//! what it waits on. Timing-only builds of M = 16 (wrong outputs): without the finish 95 µs, without
//! restaging B 131; one 16-row A and C tile per chunk instead of two of 8 rows (half the
//! `tdpbsud`, `tilezero`, A loads and C stores), with or without an A tile per parity,
//! 128–132. Finishing each chunk two chunks behind its multiply, from C stored a step
//! earlier, was within noise. So the finish (about a third) and the tile sequence
//! itself, not the count of tile instructions, set its rate. Removing one kind of tile
//! instruction at a time (2026-12-04 evening, the same command, 3 rounds alternated with
//! a base built alike, fastest samples; M = 16 / M = 8): the bases 118–143 / 73–81 µs;
//! no C stores 112–127 / 62–69; no `tdpbsud` 110–121 / 66–69; A loaded once per call
//! instead of per chunk 118–126 / 73–76; no tile instruction at all (staging and finish
//! only, from zeroed C) 80–85 / 46–50. The vector side alone then takes ~81 cycles a
//! chunk at M = 16 (if the core holds the ~3.5 GHz a scalar loop shows) for ~96 512-bit
//! operations (32 staging, 64 finish), about 60% of its two ports; the tile
//! instructions, though the tile unit executes them, add ~50 µs that no one kind of
//! them accounts for.

use super::super::act_panel::{PanelRows, DX_AT, INIT_AT, PANEL_SLOTS, RECORD_BYTES, SUMS_AT};
use super::super::packed::{PackedWeights, GROUP_PAIR_BYTES, ROWS8};
use super::{group_meta, prefetch_pair, ChunkMeta, Codes, Fetch, MetaLoop, BYTES_CHUNK};
use crate::quant::QK;
use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Activation rows per call: two panels, one A tile each.
pub(in super::super) const AMX_M: usize = 2 * PANEL_SLOTS;

/// Weight rows per call: two groups, a B tile's 16 i32 columns.
const ROWS16: usize = 2 * ROWS8;

/// Bytes of a staged B tile: 8 steps of 64.
const B_BYTES: usize = QK / 4 * 64;

/// Bytes of a stored C tile: 8 activation rows of 16 i32.
const C_BYTES: usize = PANEL_SLOTS * 64;

/// The 64-byte tile configuration `ldtilecfg` reads (palette 1): per tile, its bytes per
/// row (u16 at 16 + 2t) and rows (u8 at 48 + t).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn kernel() -> Self {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut tile = |t: usize, rows: u8, colsb: u16| {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
            c[48 + t] = rows;
        };
        let rows = PANEL_SLOTS as u8;
        for t in 0..4 {
            tile(t, rows, 64); // C: 16 i32 per activation row
        }
        tile(4, rows, QK as u16); // A: one chunk's codes per activation row
        tile(5, rows, QK as u16);
        tile(6, (QK / 4) as u8, 64); // B: 8 steps of 16 rows × 4 codes
        tile(7, (QK / 4) as u8, 64);
        TileConfig(c)
    }
}

/// Matmuls begun on tiles ([`begin_matmul`]): a thread reloads the tile configuration
/// when this has moved since it last did.
static MATMULS: AtomicU64 = AtomicU64::new(0);

/// Marks the start of a matmul on tiles, before its tasks run: each thread taking part
/// then loads the configuration once ([`configure`]). Once per matmul rather than per
/// 16-row call: `ldtilecfg` per call cost 8–15% of a 16×3072×576 call (host H, in
/// cache). Not once per thread for good: the calling thread may run other code between
/// matmuls that configures the tiles its own way (a library using AMX), so the tiles
/// are left configured after a matmul (no `tilerelease`, which costs as much) and the
/// next matmul loads ours again.
pub(in super::super) fn begin_matmul() {
    MATMULS.fetch_add(1, Ordering::Relaxed);
}

/// Loads the kernel's tile configuration on this thread, unless it did since the last
/// [`begin_matmul`].
///
/// # Safety
/// AMX granted to the process.
#[inline(always)]
unsafe fn configure() {
    thread_local! {
        static LOADED_AT: Cell<u64> = const { Cell::new(u64::MAX) };
    }
    let now = MATMULS.load(Ordering::Relaxed);
    if LOADED_AT.get() != now {
        let cfg = TileConfig::kernel();
        // SAFETY: AMX granted (contract); the configuration is 64 readable bytes.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
        LOADED_AT.set(now);
    }
}

/// `tilezero tmmT`.
///
/// # Safety
/// Tiles configured ([`TileConfig::kernel`]) on this thread.
#[inline(always)]
unsafe fn zero<const T: u8>() {
    // SAFETY: per the contract; no memory touched. (asm! has no tile operands, so each
    // tile is its own literal instruction; T is a constant and the match folds away.)
    unsafe {
        match T {
            0 => asm!("tilezero tmm0", options(nostack, nomem)),
            1 => asm!("tilezero tmm1", options(nostack, nomem)),
            2 => asm!("tilezero tmm2", options(nostack, nomem)),
            3 => asm!("tilezero tmm3", options(nostack, nomem)),
            _ => unreachable!("tile {T}"),
        }
    }
}

/// `tileloadd tmmT, [p + stride·row]`.
///
/// # Safety
/// As [`zero`]; the tile's rows × bytes are readable at `p` with `stride`.
#[inline(always)]
unsafe fn load<const T: u8>(p: *const u8, stride: usize) {
    // SAFETY: per the contract.
    unsafe {
        match T {
            4 => asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) p, s = in(reg) stride,
                options(nostack, readonly)),
            5 => asm!("tileloadd tmm5, [{p} + {s}*1]", p = in(reg) p, s = in(reg) stride,
                options(nostack, readonly)),
            6 => asm!("tileloadd tmm6, [{p} + {s}*1]", p = in(reg) p, s = in(reg) stride,
                options(nostack, readonly)),
            7 => asm!("tileloadd tmm7, [{p} + {s}*1]", p = in(reg) p, s = in(reg) stride,
                options(nostack, readonly)),
            _ => unreachable!("tile {T}"),
        }
    }
}

/// `tilestored [p + 64·row], tmmT`.
///
/// # Safety
/// As [`zero`]; [`C_BYTES`] writable at `p`.
#[inline(always)]
unsafe fn store<const T: u8>(p: *mut u8) {
    // SAFETY: per the contract.
    unsafe {
        match T {
            0 => asm!("tilestored [{p} + {s}*1], tmm0", p = in(reg) p, s = in(reg) 64usize,
                options(nostack)),
            1 => asm!("tilestored [{p} + {s}*1], tmm1", p = in(reg) p, s = in(reg) 64usize,
                options(nostack)),
            2 => asm!("tilestored [{p} + {s}*1], tmm2", p = in(reg) p, s = in(reg) 64usize,
                options(nostack)),
            3 => asm!("tilestored [{p} + {s}*1], tmm3", p = in(reg) p, s = in(reg) 64usize,
                options(nostack)),
            _ => unreachable!("tile {T}"),
        }
    }
}

/// `C += A·B` for C tile `C`, A tile 4 + P and B tile 6 + `ODD` (signed × unsigned
/// bytes, 4-byte dots summed into each i32).
///
/// # Safety
/// As [`zero`]; the three tiles loaded.
#[inline(always)]
unsafe fn dot<const ODD: bool, const P: usize>() {
    // SAFETY: per the contract; registers only.
    unsafe {
        match (ODD, P) {
            (false, 0) => asm!("tdpbsud tmm0, tmm4, tmm6", options(nostack, nomem)),
            (false, 1) => asm!("tdpbsud tmm1, tmm5, tmm6", options(nostack, nomem)),
            (true, 0) => asm!("tdpbsud tmm2, tmm4, tmm7", options(nostack, nomem)),
            (true, 1) => asm!("tdpbsud tmm3, tmm5, tmm7", options(nostack, nomem)),
            _ => unreachable!("panel {P}"),
        }
    }
}

/// `out[16i + g] = Σ_k W[r0 + g, k]·x̂_i[k]` for the 16 rows of groups r0/8 and r0/8 + 1
/// and the activation rows of `acts` (panel 0's, then panel 1's if any), on AMX tiles.
/// A last, odd group goes to the VNNI kernel ([`super::x86::dots_vnni16`]).
///
/// # Safety
/// As [`super::x86::dots_vnni16`] for each panel (r0 a multiple of 16, each panel's
/// rows from slot 0), with out.len() ≥ 16·(rows of both panels), and
/// `CpuFeatures::amx_int8` (tiles granted to the process).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
pub(in super::super) unsafe fn dots_amx16(
    w: &PackedWeights,
    r0: usize,
    acts: (PanelRows<'_>, Option<PanelRows<'_>>),
    out: &mut [f32],
) {
    let live = acts.0.live() + acts.1.map_or(0, |a| a.live());
    debug_assert!(r0.is_multiple_of(ROWS16) && out.len() >= ROWS16 * live);
    if r0 + ROWS8 >= w.rows {
        let (first, rest) = out.split_at_mut(ROWS16 * PANEL_SLOTS.min(out.len() / ROWS16));
        // SAFETY: forwarded contract, one panel at a time.
        unsafe {
            super::x86::dots_vnni16(w, r0, acts.0, first);
            if let Some(second) = acts.1 {
                super::x86::dots_vnni16(w, r0, second, rest);
            }
        }
        return;
    }
    let by_kind = ByKind { w, r0, acts, out };
    // SAFETY: forwarded contract; group r0/8 + 1 holds row r0 + 8 < rows.
    unsafe { group_meta(w, r0, 1, by_kind) }
}

/// [`by_kind`] as a [`MetaLoop`].
struct ByKind<'a, 'o> {
    w: &'a PackedWeights,
    r0: usize,
    acts: (PanelRows<'a>, Option<PanelRows<'a>>),
    out: &'o mut [f32],
}

impl MetaLoop for ByKind<'_, '_> {
    #[inline(always)]
    unsafe fn run<C: ChunkMeta>(self, meta: [C; 2], min: bool) {
        // SAFETY: forwarded contract.
        unsafe { by_kind(self.w, meta, min, self.r0, self.acts, self.out) }
    }
}

/// One loop per code kind, minimum or not, start value or not, and one or two panels.
#[inline(always)]
unsafe fn by_kind<C: ChunkMeta>(
    w: &PackedWeights,
    meta: [C; 2],
    min: bool,
    r0: usize,
    acts: (PanelRows<'_>, Option<PanelRows<'_>>),
    out: &mut [f32],
) {
    let init = w.offset() != 0;
    let nibbles = Codes::of(w) == Codes::NIBBLES;
    let one = [Panel::of(acts.0)];
    macro_rules! arms {
        ($($n:literal, $m:literal, $i:literal;)*) => {
            match (nibbles, min, init, acts.1) {
                $(
                    ($n, $m, $i, None) => tiles::<$n, $m, $i, 1, C>(w, meta, r0, one, out),
                    ($n, $m, $i, Some(second)) => {
                        let two = [one[0], Panel::of(second)];
                        tiles::<$n, $m, $i, 2, C>(w, meta, r0, two, out)
                    }
                )*
            }
        };
    }
    // SAFETY: forwarded contract.
    unsafe {
        arms!(
            true, false, false; true, false, true; true, true, false; true, true, true;
            false, false, false; false, false, true; false, true, false; false, true, true;
        )
    }
}

/// Per-call scratch in L1: staged B tiles (even, odd) and stored C tiles (per chunk
/// parity and panel).
#[repr(C, align(64))]
struct Scratch {
    /// Per chunk pair parity, the pair's (even, odd) B tiles.
    b: [[[u8; B_BYTES]; 2]; 2],
    c: [[[i32; C_BYTES / 4]; 2]; 2],
}

/// A panel's records and its live rows.
#[derive(Clone, Copy)]
struct Panel {
    records: *const u8,
    live: usize,
}

impl Panel {
    fn of(a: PanelRows<'_>) -> Self {
        let (records, slot) = a.first_record();
        debug_assert_eq!(slot, 0);
        Panel {
            records: records.as_ptr(),
            live: a.live(),
        }
    }
}

/// The chunk loop. NIBBLES: two codes a byte, else one (5-bit codes and full bytes
/// both go into `tdpbsud` unsigned, as they are, with the start value); INIT adds each
/// activation block's start value (weights with an offset); MIN the minimum term; P
/// panels of activation rows. Every slot of a panel is finished (empty ones are zero),
/// so the per-row loops have constant bounds and the accumulators stay in registers.
#[inline(always)]
unsafe fn tiles<
    const NIBBLES: bool,
    const MIN: bool,
    const INIT: bool,
    const P: usize,
    C: ChunkMeta,
>(
    w: &PackedWeights,
    meta: [C; 2],
    r0: usize,
    panels: [Panel; P],
    out: &mut [f32],
) {
    let nb = w.cols / QK;
    let group_bytes = w.group_bytes();
    debug_assert!(w.quants.len() >= (r0 / ROWS8 + 2) * group_bytes);
    // SAFETY: the groups' codes start here (checked above).
    let codes = unsafe { w.quants.as_ptr().add(r0 / ROWS8 * group_bytes) };
    let mut s = std::mem::MaybeUninit::<Scratch>::uninit();
    let s = s.as_mut_ptr();
    // SAFETY: AMX granted (contract).
    unsafe { configure() };
    // SAFETY: AVX-512F per the contract.
    let mut acc = [[unsafe { _mm512_setzero_ps() }; PANEL_SLOTS]; P];
    let pair_bytes = if NIBBLES {
        GROUP_PAIR_BYTES
    } else {
        2 * BYTES_CHUNK
    };
    // SAFETY: chunks c < nb exist in both groups and every panel; the scratch is ours,
    // each buffer written (staged, stored) before it is read.
    unsafe {
        let b = &raw mut (*s).b;
        let cb = &raw mut (*s).c;
        let pairs = nb.div_ceil(2);
        stage::<NIBBLES>(codes, group_bytes, (0, nb), &mut (*b)[0]);
        for pair in 0..pairs {
            let c = 2 * pair;
            for j in 0..2 {
                prefetch_pair(
                    codes.add(j * group_bytes),
                    pair,
                    (pair_bytes, group_bytes),
                    2,
                    // L1: L2 (`Fetch::L2`, as the zmm loop's batch passes) was
                    // no different on host H (Q8_0 16×49152×576 cold min 1.33–1.38
                    // ms against 1.35–1.37, Q4_1 16×3072×576 63–70 µs against 68–72;
                    // 3 alternated rounds, 2026-12-04).
                    Fetch::L1,
                );
            }
            // The next pair's B tiles are staged a pair ahead: a tile load of bytes
            // just stored by vector instructions waited for them (perf: ~35% of the
            // samples on the `tilezero` after it).
            if pair + 1 < pairs {
                stage::<NIBBLES>(
                    codes,
                    group_bytes,
                    (pair + 1, nb),
                    &mut (*b)[(pair + 1) % 2],
                );
            }
            let staged = &(*b)[pair % 2];
            // Each chunk on the tiles of its parity, then the finish of the one before
            // (the other parity) while the tile unit works.
            multiply::<false, P>(&staged[0], panels, c);
            if c > 0 {
                finish::<true, MIN, INIT, P, C>(&mut (*cb)[1], &meta, panels, c - 1, &mut acc);
            }
            if c + 1 < nb {
                multiply::<true, P>(&staged[1], panels, c + 1);
            }
            finish::<false, MIN, INIT, P, C>(&mut (*cb)[0], &meta, panels, c, &mut acc);
        }
        if nb.is_multiple_of(2) {
            finish::<true, MIN, INIT, P, C>(&mut (*cb)[1], &meta, panels, nb - 1, &mut acc);
        }
        // Constant indices only (a slice of `acc` up to `live` kept the whole array in
        // memory, every accumulator stored and reloaded per chunk).
        for j in 0..P {
            for i in 0..PANEL_SLOTS {
                if i < panels[j].live {
                    let o = &mut out[ROWS16 * (PANEL_SLOTS * j + i)..][..ROWS16];
                    _mm512_storeu_ps(o.as_mut_ptr(), acc[j][i]);
                }
            }
        }
    }
}

/// Stages chunk pair `pair`'s B tiles (its even chunk, then its odd one if below `nb`):
/// each step's 32 bytes of the two groups side by side, nibbles masked to the chunk's
/// half.
///
/// # Safety
/// AVX-512F/BW; the pair's chunks exist in both groups at `codes` and `codes +
/// group_bytes`.
#[inline(always)]
unsafe fn stage<const NIBBLES: bool>(
    codes: *const u8,
    group_bytes: usize,
    (pair, nb): (usize, usize),
    b: &mut [[u8; B_BYTES]; 2],
) {
    // SAFETY: per the contract; each step's 64 bytes lie inside its B buffer.
    unsafe {
        let two = |p: *const u8| {
            let lo = _mm256_loadu_si256(p.cast());
            let hi = _mm256_loadu_si256(p.add(group_bytes).cast());
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        };
        if NIBBLES {
            let base = codes.add(pair * GROUP_PAIR_BYTES);
            let mask = _mm512_set1_epi8(0x0F);
            for t in 0..QK / 4 {
                let v = two(base.add(QK * t));
                let lo = _mm512_and_si512(v, mask);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
                _mm512_store_si512(b[0].as_mut_ptr().add(64 * t).cast(), lo);
                _mm512_store_si512(b[1].as_mut_ptr().add(64 * t).cast(), hi);
            }
        } else {
            for h in 0..2.min(nb - 2 * pair) {
                let base = codes.add((2 * pair + h) * BYTES_CHUNK);
                for t in 0..QK / 4 {
                    let v = two(base.add(QK * t));
                    _mm512_store_si512(b[h].as_mut_ptr().add(64 * t).cast(), v);
                }
            }
        }
    }
}

/// Loads chunk c's activation tiles and B, and multiplies into the C tiles of its
/// parity (zeroed first).
///
/// # Safety
/// Tiles configured; `b` staged for chunk c; chunk c inside every panel.
#[inline(always)]
unsafe fn multiply<const ODD: bool, const P: usize>(
    b: &[u8; B_BYTES],
    panels: [Panel; P],
    c: usize,
) {
    // SAFETY: per the contract: A reads 8 slots × 32 codes at the record's start.
    unsafe {
        if ODD {
            load::<7>(b.as_ptr(), 64);
            zero::<2>();
        } else {
            load::<6>(b.as_ptr(), 64);
            zero::<0>();
        }
        load::<4>(panels[0].records.add(c * RECORD_BYTES), QK);
        dot::<ODD, 0>();
        if P == 2 {
            if ODD {
                zero::<3>();
            } else {
                zero::<1>();
            }
            load::<5>(panels[P - 1].records.add(c * RECORD_BYTES), QK);
            dot::<ODD, 1>();
        }
    }
}

/// Stores chunk c's C tiles (parity ODD) and adds them, scaled, to the accumulators:
/// `acc += (S + init)·d·d_x + m·(d_x·Σq_x)` per live activation row.
///
/// # Safety
/// Tiles configured, chunk c multiplied on the ODD tiles; chunk c inside both panels
/// and both groups' metadata.
#[inline(always)]
unsafe fn finish<
    const ODD: bool,
    const MIN: bool,
    const INIT: bool,
    const P: usize,
    C: ChunkMeta,
>(
    cbuf: &mut [[i32; C_BYTES / 4]; 2],
    meta: &[C; 2],
    panels: [Panel; P],
    c: usize,
    acc: &mut [[__m512; PANEL_SLOTS]; P],
) {
    // SAFETY: per the contract.
    unsafe {
        let wide = |lo: __m256, hi: __m256| _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi);
        let d = wide(meta[0].scales(c), meta[1].scales(c));
        let m = if MIN {
            wide(meta[0].mins(c), meta[1].mins(c))
        } else {
            d
        };
        // Both panels' tiles stored first: the second's store completes while the
        // first's rows are finished.
        for j in 0..P {
            match (ODD, j) {
                (false, 0) => store::<0>(cbuf[0].as_mut_ptr().cast()),
                (false, _) => store::<1>(cbuf[1].as_mut_ptr().cast()),
                (true, 0) => store::<2>(cbuf[0].as_mut_ptr().cast()),
                (true, _) => store::<3>(cbuf[1].as_mut_ptr().cast()),
            }
        }
        for (j, p) in panels.iter().enumerate() {
            let rec = p.records.add(c * RECORD_BYTES);
            let field = |at: usize, i: usize| rec.add(at + 4 * i);
            for i in 0..PANEL_SLOTS {
                let mut sum = _mm512_load_si512(cbuf[j].as_ptr().add(16 * i).cast());
                if INIT {
                    sum = _mm512_add_epi32(
                        sum,
                        _mm512_set1_epi32(field(INIT_AT, i).cast::<i32>().read()),
                    );
                }
                let dx = _mm512_set1_ps(field(DX_AT, i).cast::<f32>().read());
                let a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, dx), acc[j][i]);
                acc[j][i] = if MIN {
                    _mm512_fmadd_ps(m, _mm512_set1_ps(field(SUMS_AT, i).cast::<f32>().read()), a)
                } else {
                    a
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::packed::tests::REORDER_TOL;
    use super::super::super::{qmatmul_int8, qmatmul_int8_tiles, PackedWeights, Tiles};
    use crate::quant::{QuantMatrix, BLOCK_DTYPES};
    use rand::{Rng, SeedableRng};
    use tessera_core::{CpuFeatures, Isa, TensorView, TensorViewMut};

    fn apply(
        x: &[f32],
        (m, k, n): (usize, usize, usize),
        w: &PackedWeights,
        run: impl Fn(&PackedWeights, &TensorView<'_, f32>, &mut TensorViewMut<'_, f32>),
    ) -> Vec<f32> {
        let xv = TensorView::contiguous(x, &[m, k]).unwrap();
        let mut y = vec![f32::NAN; m * n];
        run(
            w,
            &xv,
            &mut TensorViewMut::contiguous(&mut y, &[m, n]).unwrap(),
        );
        y
    }

    /// The tile kernel against the portable integer kernel on the row-major layout (no
    /// code in common): every interleaved format (nibbles, 5-bit and full bytes; f16,
    /// f32 and factored metadata; offsets and minima), one or two panels (M = 1, 8, 9,
    /// 16, 17, 40: partial panels, several passes), ragged weight groups (13 rows: one
    /// odd group, which falls back to VNNI; 40: five groups), odd chunk counts (K = 96),
    /// 1 and 3 threads; NaN-poisoned outputs, and a NaN activation reaching exactly its
    /// row. Skipped, saying so, where the CPU has no AMX-INT8 granted.
    #[test]
    fn tiles_match_the_portable_integer_kernel() {
        if !CpuFeatures::get().amx_int8 {
            eprintln!("the AMX tile kernel skipped: this CPU has no AMX-INT8 granted");
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(23);
        let mut formats = 0;
        for dtype in BLOCK_DTYPES {
            let k = if dtype.block_size() == 32 { 96 } else { 512 };
            for n in [13, 40] {
                let data: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0)).collect();
                let (row_major, interleaved) = crate::with_block_format!(dtype, B => {
                    let q = QuantMatrix::<B>::quantize(n, k, &data).unwrap();
                    (PackedWeights::row_major(&q), PackedWeights::interleaved(&q))
                }, _ => unreachable!("{dtype} is a block format"));
                let Some(interleaved) = interleaved else {
                    continue;
                };
                if matches!(
                    interleaved.meta,
                    super::super::super::packed::Meta::SplitI8(_)
                ) {
                    continue; // the split-scale kernel (`planes`) reads these
                }
                formats += usize::from(n == 13);
                for m in [1, 8, 9, 16, 17, 40] {
                    let mut x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
                    let want = apply(&x, (m, k, n), &row_major, |w, x, y| {
                        qmatmul_int8(Isa::Scalar, 1, w, x, y).unwrap()
                    });
                    let scale: f32 = x.iter().map(|v| v.abs()).sum::<f32>() / m as f32;
                    for threads in [1, 3] {
                        let got = apply(&x, (m, k, n), &interleaved, |w, x, y| {
                            qmatmul_int8_tiles(Isa::Avx512, Tiles::Always, threads, w, x, y)
                                .unwrap()
                        });
                        for (g, w) in got.iter().zip(&want) {
                            assert!(
                                (g - w).abs() <= REORDER_TOL as f32 * scale,
                                "{dtype} {n}x{k} m {m} threads {threads}: {g} vs {w}"
                            );
                        }
                    }
                    x[(m - 1) * k + k / 2] = f32::NAN;
                    let got = apply(&x, (m, k, n), &interleaved, |w, x, y| {
                        qmatmul_int8_tiles(Isa::Avx512, Tiles::Always, 2, w, x, y).unwrap()
                    });
                    let (before, last) = got.split_at((m - 1) * n);
                    assert!(before.iter().all(|v| v.is_finite()), "{dtype} m {m}");
                    assert!(last.iter().all(|v| v.is_nan()), "{dtype} m {m}");
                }
            }
        }
        // Q4_0, Q4_1, Q4_K, the three group formats, Q5_0, Q5_1, Q5_K, Q8_0 and Q8_K.
        assert_eq!(formats, 11);
    }
}
