//! The integer kernel for weights interleaved eight rows at a time
//! ([`PackedWeights::interleaved`]): one chunk loop ([`chunk`]), written once over
//! [`RowLanes`] and instantiated for AVX2 (`vpmaddubsw` on ymm, one group of 8 rows, or
//! two on a pair of ymm for batches of nibble codes), AVX512_VNNI on ymm (`vpdpbusd`, 8
//! rows), AVX512_VNNI on zmm (16 rows: two adjacent groups, one per 256-bit half)
//! (`x86`), and Arm's DotProd (`sdot` on two q registers, 8 rows) (`neon`);
//! Q2_K/Q3_K/Q6_K's split scales go on to [`planes`].
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
//! (docs/performance.md, "Batching and serving"). `sdot` is the same step on NEON,
//! signed by signed: nibble and 5-bit codes (< 32) go in as they are, full bytes as
//! u − 128.
//!
//! Codes come in three kinds ([`Codes`]): nibbles, 5-bit codes a byte each (Q5_0, Q5_1,
//! Q5_K) and full bytes (Q8_0, Q8_K), the last two in [`CodeLayout::Bytes8`]. On AVX2
//! the partial sums add in i16 (`vpaddw`, which wraps, unlike `vpmaddubsw`), two
//! running sums of 4 steps each: |q_x| ≤ 127 bounds a pair sum by 2·31·127 = 7874 for
//! 5-bit codes, and 4·7874 = 31496 < 2¹⁵, so each running sum widens to i32 on its own;
//! nibbles (2·15·127 = 3810, 8·3810 = 30480) add both in i16 first, or keep one sum of
//! all 8 steps where enough rows hide its latency ([`RowLanes::I16_SUMS`]). A full byte
//! would saturate `vpmaddubsw` (2·255·127 > 2¹⁵), so AVX2 takes it signed, q = u − 128,
//! as llama.cpp's AVX2 dot products do: |q| (unsigned) against the activation bytes
//! given q's signs (`vpsignb`), pair sums within 2·128·127 = 32512 < 2¹⁵, each step's
//! widened to i32 at once (`vpmaddwd` against ones): two multiplies per 4 bytes, twice
//! a nibble's cost per weight, as their bits are ([`RowLanes::Full`]). `vpdpbusd` and
//! `sdot` sum in i32, so they take full bytes whole (up to 255·127·32 per chunk).
//!
//! Per chunk and row the value is `d·(S − offset·Σq_x)·d_x + m·(d_x·Σq_x)`: S and the
//! start value exact in i32, the minimum term from the activation's precomputed
//! d_x·Σq_x. The activation rows come as [`super::act_panel`] records, one per chunk
//! for up to 8 rows, so every activation load is a constant offset from one pointer.
//! Q2_K/Q3_K/Q6_K's split scales have their own loop, [`planes`], over the same widths.

use super::act_panel::{PanelRows, DX_AT, INIT_AT, PANEL_SLOTS, RECORD_BYTES, SUMS_AT};
use super::packed::{CodeLayout, Meta, PackedWeights, GROUP_PAIR_BYTES, ROWS8};
use crate::quant::QK;
use fetch::{prefetch_pair, Fetch};
use meta::{ChunkMeta, Factored8, Plain, Wide8};

#[cfg(target_arch = "x86_64")]
mod amx;
mod fetch;
mod meta;
#[cfg(target_arch = "aarch64")]
mod neon;
mod planes;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "x86_64")]
pub(super) use amx::{begin_matmul, dots_amx16, AMX_M};
#[cfg(target_arch = "aarch64")]
pub(super) use neon::{dots_sdot, planes_sdot};
#[cfg(target_arch = "x86_64")]
pub(super) use x86::{dots16, dots_vnni16, planes_dots, planes_dots_vnni, AVX2_M, ROWS16, VNNI_M};

/// The body of every instance (`x86::dots16` on one ymm, or a pair through
/// `nibble_pass_with`; `x86::dots_vnni16` on ymm and zmm; `neon::dots_sdot`), inlined
/// into each so it is compiled with the caller's target features: the chunk loop is
/// written once, its register width and 4-byte dot product (`L`) per instruction set.
///
/// # Safety
/// `w.layout.interleaved()`, not [`Meta::SplitI8`] metadata; r0 a multiple of 8 below `w.rows`; 1 ≤ acts.live()
/// ≤ MC, the rows quantized for `w.cols` columns and `w`'s offset, starting at a slot
/// that leaves MC slots in the panel; `L`'s CPU features; for `L::GROUPS` = 2, r0 a
/// multiple of 16 with row r0 + 8 below the rows. Activation row i's 8·`L::GROUPS`
/// outputs go to `out[ld·i..]`: ld ≥ 8·`L::GROUPS` and out.len() ≥ ld·(live − 1) +
/// 8·`L::GROUPS`.
#[inline(always)]
unsafe fn dots_with<L: RowLanes, const MC: usize>(
    w: &PackedWeights,
    r0: usize,
    acts: PanelRows<'_>,
    out: (&mut [f32], usize),
) {
    // SAFETY: forwarded contract.
    unsafe { pass_with::<L, ByRows<MC>>(w, r0, acts, out) }
}

/// [`dots_with`] for a pass of exactly M activation rows over nibble codes
/// ([`CodeLayout::Nibbles8`]): one loop per metadata kind and minimum, where
/// `dots_with` compiles one per code kind, minimum, metadata kind and row count
/// ([`by_count`]). For an instance only batches of nibbles take (`x86::YmmPair`): the
/// kernels crate's release build took 386 s with it through `dots_with` (~60 loop
/// bodies), 69–71 s through this, 64–65 s without it (AMD Zen 3, 2026-12-06, `cargo
/// build --release -p tessera-kernels`).
///
/// # Safety
/// As [`dots_with`], with nibble codes and exactly M live rows.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn nibble_pass_with<L: RowLanes, const M: usize>(
    w: &PackedWeights,
    r0: usize,
    acts: PanelRows<'_>,
    out: (&mut [f32], usize),
) {
    debug_assert!(w.layout == CodeLayout::Nibbles8 && acts.live() == M);
    // SAFETY: forwarded contract.
    unsafe { pass_with::<L, NibbleRows<M>>(w, r0, acts, out) }
}

/// A pass's arguments, and (`K`) the loop it runs once its groups' metadata is known:
/// [`ByRows`] or [`NibbleRows`].
struct Pass<'a, 'o, L, K> {
    w: &'a PackedWeights,
    r0: usize,
    acts: PanelRows<'a>,
    out: (&'o mut [f32], usize),
    loop_kind: std::marker::PhantomData<(L, K)>,
}

/// [`dots_with`]' and [`nibble_pass_with`]'s shared start: the groups' metadata, then
/// `K`'s loop.
///
/// # Safety
/// As [`dots_with`], and `K`'s contract.
#[inline(always)]
unsafe fn pass_with<'a, 'o, L: RowLanes, K>(
    w: &'a PackedWeights,
    r0: usize,
    acts: PanelRows<'a>,
    out: (&'o mut [f32], usize),
) where
    Pass<'a, 'o, L, K>: MetaLoop,
{
    let last = r0 + ROWS8 * (L::GROUPS - 1);
    debug_assert!(w.layout.interleaved() && r0.is_multiple_of(ROWS8) && last < w.rows);
    debug_assert_eq!(acts.chunks(), w.cols / QK);
    let pass = Pass::<L, K> {
        w,
        r0,
        acts,
        out,
        loop_kind: std::marker::PhantomData,
    };
    // SAFETY: forwarded contract; the second group exists where L covers two.
    unsafe { group_meta(w, r0, L::GROUPS - 1, pass) }
}

/// A chunk loop over a call's groups, once their metadata is known ([`group_meta`]).
trait MetaLoop {
    /// # Safety
    /// The loop's own contract, `meta` the groups' metadata.
    unsafe fn run<C: ChunkMeta>(self, meta: [C; 2], min: bool);
}

/// Runs `f` with the metadata of groups r0/8 and r0/8 + `second` (0: the first again,
/// for a call covering one group), and whether the format has minima: one place for
/// every interleaved loop (`dots_with`'s instances and `amx`).
///
/// # Safety
/// `w.layout.interleaved()`, not [`Meta::SplitI8`] metadata; r0 a multiple of 8 with
/// group r0/8 + `second` inside the packed groups; `f`'s contract.
#[inline(always)]
unsafe fn group_meta(w: &PackedWeights, r0: usize, second: usize, f: impl MetaLoop) {
    let nb = w.cols / QK;
    let group = r0 / ROWS8;
    let at = |j: usize| (group + j * second) * nb * ROWS8;
    // SAFETY: in each arm each group's metadata starts at these offsets (the packer sized
    // the arrays for every padded group); the rest is forwarded.
    unsafe {
        match &w.meta {
            Meta::F32 { scales, mins } => {
                debug_assert!(scales.len() >= at(1) + nb * ROWS8);
                f.run(
                    [0, 1].map(|j| Plain::of(scales, mins, at(j))),
                    !mins.is_empty(),
                )
            }
            Meta::F16 { scales, mins } => {
                debug_assert!(scales.len() >= at(1) + nb * ROWS8);
                f.run(
                    [0, 1].map(|j| Plain::of(scales, mins, at(j))),
                    !mins.is_empty(),
                )
            }
            Meta::Factored(fm) => {
                debug_assert!(fm.sc.len() >= at(1) + nb * ROWS8);
                let m = [0, 1].map(|j| {
                    let s = w.super_index(r0 + j * second * ROWS8, 0);
                    Factored8 {
                        d: fm.d.as_ptr().add(s),
                        neg_dmin: fm.neg_dmin.as_ptr().add(s),
                        sc: fm.sc.as_ptr().add(at(j)),
                        mn: fm.mn.as_ptr().add(at(j)),
                    }
                });
                f.run(m, true)
            }
            Meta::SplitI8(_) => unreachable!("split scales run `planes` (IntKernel::reading)"),
        }
    }
}

/// [`by_rows`]' loop, for up to MC rows of any codes.
struct ByRows<const MC: usize>;

impl<L: RowLanes, const MC: usize> MetaLoop for Pass<'_, '_, L, ByRows<MC>> {
    #[inline(always)]
    unsafe fn run<C: ChunkMeta>(self, meta: [C; 2], min: bool) {
        let Self {
            w, r0, acts, out, ..
        } = self;
        let pass = GroupPass { w, meta, min, r0 };
        // SAFETY: forwarded contract.
        unsafe { by_rows::<L, C, MC>(pass, acts, out) }
    }
}

/// [`nibble_pass_with`]'s loop: exactly M rows of nibble codes.
#[cfg(target_arch = "x86_64")]
struct NibbleRows<const M: usize>;

#[cfg(target_arch = "x86_64")]
impl<L: RowLanes, const M: usize> MetaLoop for Pass<'_, '_, L, NibbleRows<M>> {
    #[inline(always)]
    unsafe fn run<C: ChunkMeta>(self, meta: [C; 2], min: bool) {
        let Self {
            w, r0, acts, out, ..
        } = self;
        // SAFETY: forwarded contract: nibble codes, M live rows.
        unsafe {
            if min {
                dots_m::<L, { Codes::NIBBLES }, true, C, M>(w, meta, r0, acts, out)
            } else {
                dots_m::<L, { Codes::NIBBLES }, false, C, M>(w, meta, r0, acts, out)
            }
        }
    }
}

/// One register of row lanes (or a pair, on NEON) and the chunk arithmetic on it: the 8
/// rows of one group on ymm (`x86::Ymm`, with either dot product) or two q registers
/// (`neon::Sdot8`), or the 16 rows of two adjacent groups on zmm (`x86::Zmm`).
/// [`chunk`] is written once over it.
trait RowLanes {
    /// 8-row groups one register covers (1 or 2).
    const GROUPS: usize;
    /// Whether full-byte codes go into the dot product as signed u − 128
    /// ([`RowLanes::full_codes`]), whose sums then include −128·Σq_x: the activation's
    /// start value is not added.
    const SIGNED_BYTES: bool = false;
    /// Activation rows from which each keeps one running sum per chunk instead of two
    /// (enough independent dot products to hide the instruction's latency).
    const ONE_CHAIN_FROM: usize = 8;
    /// Whether the running sums are i16 (`vpmaddubsw` + `vpaddw`): then 5-bit codes
    /// keep two sums of 4 steps each at any row count, as only those fit i16 (the module
    /// docs), and nibbles' one sum of 8 steps fits.
    const I16_SUMS: bool = false;
    /// Activation rows from which a chunk's 8 steps run as a loop instead of unrolled.
    /// Unrolled at 8 rows on AVX2, LLVM hoisted a chunk's 64 activation words ahead of
    /// its steps and spilled them and the codes (`perf annotate`): Q4_1 16×3072×576 in
    /// cache took 567–569 µs at 8 rows a pass against 396–403 at 4; kept a loop, 331–340
    /// (AMD Zen 3, 2026-12-05, one thread).
    const ROLLED_FROM: usize = usize::MAX;
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
    /// A step's full-byte codes as every activation row's [`RowLanes::add_full`] takes
    /// them, prepared once: unsigned as they are, u − 128 where
    /// [`RowLanes::SIGNED_BYTES`], or (`vpmaddubsw`, which would saturate on whole
    /// bytes) u − 128 with its magnitudes.
    type Full: Copy;
    /// A step's full-byte codes `v` as [`RowLanes::Full`].
    ///
    /// # Safety
    /// As [`RowLanes::nibbles`].
    unsafe fn full_codes(v: Self::I) -> Self::Full;
    /// [`RowLanes::add`] for full-byte codes.
    ///
    /// # Safety
    /// As [`RowLanes::nibbles`].
    unsafe fn add_full(sum: Self::I, u: Self::Full, x: i32) -> Self::I;
    /// A running sum started at `init` (or at zero, where `finish` adds it).
    ///
    /// # Safety
    /// As [`RowLanes::nibbles`].
    unsafe fn start(init: i32) -> Self::I;
    /// Adds the 4-byte dots of codes `u` (< 32 on `vpmaddubsw`, any byte with
    /// `vpdpbusd`, a signed byte with `sdot`) and the activation bytes `x` (the same 4
    /// in every lane).
    ///
    /// # Safety
    /// As [`RowLanes::nibbles`].
    unsafe fn add(sum: Self::I, u: Self::I, x: i32) -> Self::I;
    /// The chunk's i32 sums from its two running sums (the first started from `init`),
    /// start value included, for codes of kind `CODES` ([`Codes`]).
    ///
    /// # Safety
    /// As [`RowLanes::nibbles`].
    unsafe fn finish<const CODES: u8>(sums: [Self::I; 2], init: i32) -> Self::I;
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

/// The kinds of codes [`chunk`] reads (a const parameter, so each kind's loop is
/// compiled apart): how they are stored, and how they go into the dot product.
struct Codes;

impl Codes {
    /// Two per byte, a chunk pair's 32 bytes per row ([`CodeLayout::Nibbles8`]).
    const NIBBLES: u8 = 0;
    /// 5-bit codes, a byte each ([`CodeLayout::Bytes8`] of Q5_0, Q5_1, Q5_K): as they
    /// are into every dot product, with the activation's start value.
    const FIVE_BIT: u8 = 1;
    /// Full bytes, offset 128 ([`CodeLayout::Bytes8`] of Q8_0, Q8_K): through
    /// [`RowLanes::full_codes`] and [`RowLanes::add_full`].
    const FULL: u8 = 2;

    /// The kind of `w`'s codes.
    fn of(w: &PackedWeights) -> u8 {
        match (w.layout == CodeLayout::Bytes8, w.signed_bytes()) {
            (false, _) => Codes::NIBBLES,
            (true, false) => Codes::FIVE_BIT,
            (true, true) => Codes::FULL,
        }
    }
}

/// One monomorphized loop per code kind ([`Codes`]), minimum / no minimum and
/// activation-row count: 1 to 4 exactly, more (up to MC) as MC with the last row
/// repeated and its extra outputs dropped.
///
/// On i16 sums ([`RowLanes::I16_SUMS`], AVX2) a pass of more than 4 rows runs as two,
/// of 4 rows and the rest, for 5-bit codes and for 5 rows. 5-bit codes keep two running
/// sums a row, and 8 rows' would not fit the 16 ymm registers: at 8 rows a pass Q5_0
/// 16×3072×576 took 229 µs against 194–202 at 4, where nibbles (one sum a row) were
/// faster (Q4_1 −15%). 5 rows in a pass of 8 waste 3: Q4_1 5×3072×576 85–87 µs against
/// 73 as 4 + 1; 6 rows broke even. AMD Zen 3, 2026-12-05, `tessera bench qmatmul
/// --variant avx2-int8-r8`, 2 threads (16 rows on one copy of the weights, 5 on rotated
/// copies, as the bench's cost model chose), 2 alternated rounds. Full bytes, one i32
/// sum a row, too: Q8_0 16×3072×576 in cache, one thread, 501–504 µs at 8 rows a pass
/// against 658–666 at 4 (2026-12-06, 3 alternated rounds, fastest samples).
#[inline(always)]
unsafe fn by_rows<L: RowLanes, C: ChunkMeta, const MC: usize>(
    pass: GroupPass<'_, C>,
    acts: PanelRows<'_>,
    (out, ld): (&mut [f32], usize),
) {
    const HALF: usize = 4;
    let live = acts.live();
    if L::I16_SUMS && live > HALF && (Codes::of(pass.w) == Codes::FIVE_BIT || live == HALF + 1) {
        let (first, rest) = acts.split(HALF);
        let (out_first, out_rest) = out.split_at_mut(HALF * ld);
        // SAFETY: forwarded contract; the rest start HALF slots on, in the same pass.
        unsafe {
            by_count::<L, C, MC>(pass, first, (out_first, ld));
            by_count::<L, C, MC>(pass, rest, (out_rest, ld));
        }
    } else {
        // SAFETY: forwarded contract.
        unsafe { by_count::<L, C, MC>(pass, acts, (out, ld)) }
    }
}

/// What every pass over a call's groups shares: the weights, the groups' metadata,
/// whether the format has minima, and the first group's first row.
#[derive(Clone, Copy)]
struct GroupPass<'a, C> {
    w: &'a PackedWeights,
    meta: [C; 2],
    min: bool,
    r0: usize,
}

/// [`by_rows`]' loop for one pass's row count.
#[inline(always)]
unsafe fn by_count<L: RowLanes, C: ChunkMeta, const MC: usize>(
    GroupPass { w, meta, min, r0 }: GroupPass<'_, C>,
    acts: PanelRows<'_>,
    out: (&mut [f32], usize),
) {
    macro_rules! arms {
        ($($codes:path, $min:literal;)*) => {
            match (Codes::of(w), min, acts.live()) {
                (_, _, 0) => {}
                $(
                    ($codes, $min, 1) => dots_m::<L, { $codes }, $min, C, 1>(w, meta, r0, acts, out),
                    ($codes, $min, 2) => dots_m::<L, { $codes }, $min, C, 2>(w, meta, r0, acts, out),
                    ($codes, $min, 3) => dots_m::<L, { $codes }, $min, C, 3>(w, meta, r0, acts, out),
                    ($codes, $min, 4) => dots_m::<L, { $codes }, $min, C, 4>(w, meta, r0, acts, out),
                    ($codes, $min, _) => dots_m::<L, { $codes }, $min, C, MC>(w, meta, r0, acts, out),
                )*
                (_, true, _) => unreachable!("full-byte formats have no minimum"),
                _ => unreachable!("three kinds of codes"),
            }
        };
    }
    // SAFETY: forwarded contract; each arm gets at most its count of rows.
    unsafe {
        arms!(
            Codes::NIBBLES, false; Codes::NIBBLES, true;
            Codes::FIVE_BIT, false; Codes::FIVE_BIT, true;
            Codes::FULL, false;
        )
    }
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
/// dropped); row i's lanes go to `out[ld·i..]`.
#[inline(always)]
unsafe fn dots_m<L: RowLanes, const CODES: u8, const MIN: bool, C: ChunkMeta, const M: usize>(
    w: &PackedWeights,
    meta: [C; 2],
    r0: usize,
    acts: PanelRows<'_>,
    (out, ld): (&mut [f32], usize),
) {
    let nb = w.cols / QK;
    let group = r0 / ROWS8;
    let live = acts.live();
    // `chunk` starts a format with minima from zero instead of its start value.
    debug_assert!(
        !MIN || w.offset() == 0,
        "a format with minima and an offset"
    );
    let (records, slot) = acts.first_record();
    let lanes = ROWS8 * L::GROUPS;
    debug_assert!((1..=M).contains(&live) && slot + M <= PANEL_SLOTS);
    debug_assert!(ld >= lanes && out.len() >= ld * (live - 1) + lanes);
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
    let fetch = Fetch::for_rows(M);
    let mut c = 0;
    // SAFETY: chunks c (and c + 1) < nb exist in the groups and in every activation row.
    unsafe {
        while c + 1 < nb {
            let pair_bytes = if CODES != Codes::NIBBLES {
                2 * BYTES_CHUNK
            } else {
                GROUP_PAIR_BYTES
            };
            for j in 0..L::GROUPS {
                let at = g.codes.add(j * g.group_bytes);
                prefetch_pair(at, c / 2, (pair_bytes, g.group_bytes), L::GROUPS, fetch);
            }
            chunk::<L, CODES, false, MIN, C, M>(&g, rows, c, &mut acc);
            chunk::<L, CODES, true, MIN, C, M>(&g, rows, c + 1, &mut acc);
            c += 2;
        }
        if c < nb {
            chunk::<L, CODES, false, MIN, C, M>(&g, rows, c, &mut acc);
        }
        for (i, a) in acc[..live].iter().enumerate() {
            L::store(*a, &mut out[ld * i..]);
        }
    }
}

/// Bytes of a [`CodeLayout::Bytes8`] group's chunk: 8 rows × 32 codes.
const BYTES_CHUNK: usize = ROWS8 * QK;

/// Adds chunk c (the high nibbles of its pair when HI; its own 256 bytes for byte
/// [`Codes`]) of the covered groups' rows, against every activation row, to `acc`.
///
/// # Safety
/// `L`'s CPU features; chunk c exists in the groups and in every row of `rows`.
#[inline(always)]
unsafe fn chunk<
    L: RowLanes,
    const CODES: u8,
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
        let bytes = CODES != Codes::NIBBLES;
        let base = if bytes {
            g.codes.add(c * BYTES_CHUNK)
        } else {
            g.codes.add((c / 2) * GROUP_PAIR_BYTES)
        };
        // Two running sums per activation row, even and odd steps: `vpdpbusd`
        // accumulates in place, and one chain of 8 would wait on its latency.
        // Signed full bytes carry −128·Σq_x in their sums, and formats with minima have
        // no offset (a wrong start would fail every format's float64 verification): no
        // start value to broadcast, the sums start from a zeroed register.
        let init = |i: usize| {
            if (CODES == Codes::FULL && L::SIGNED_BYTES) || MIN {
                0
            } else {
                rows.meta::<i32>(c, INIT_AT, i)
            }
        };
        let mut sums = [[L::start(0); 2]; M];
        for i in 0..M {
            sums[i][0] = L::start(init(i));
        }
        let steps = Steps {
            base,
            group_bytes: g.group_bytes,
            rows,
            c,
        };
        if M >= L::ROLLED_FROM {
            // An opaque trip count keeps LLVM from unrolling the 8 steps (see
            // `RowLanes::ROLLED_FROM`); two steps an iteration keep the parity constant.
            for t2 in 0..std::hint::black_box(QK / 8) {
                steps.add::<L, CODES, HI, M>(2 * t2, 0, &mut sums);
                steps.add::<L, CODES, HI, M>(2 * t2 + 1, 1, &mut sums);
            }
        } else {
            for t in 0..QK / 4 {
                steps.add::<L, CODES, HI, M>(t, t % 2, &mut sums);
            }
        }
        let d = L::meta::<C, false>(&g.meta, c);
        let m = if MIN {
            L::meta::<C, true>(&g.meta, c)
        } else {
            d
        };
        for i in 0..M {
            let s = L::finish::<CODES>(sums[i], init(i));
            acc[i] = L::scale_add(s, d, rows.meta::<f32>(c, DX_AT, i), acc[i]);
            if MIN {
                acc[i] = L::min_add(m, rows.meta::<f32>(c, SUMS_AT, i), acc[i]);
            }
        }
    }
}

/// Where a chunk's steps read: its codes at `base` (the next group's `group_bytes` on)
/// and activation records `rows` at chunk `c`.
#[derive(Clone, Copy)]
struct Steps {
    base: *const u8,
    group_bytes: usize,
    rows: ActRecords,
    c: usize,
}

impl Steps {
    /// Adds step t (of QK/4) to each row's running sum `k` (the step's parity; 0 where
    /// one sum a row suffices).
    ///
    /// # Safety
    /// As [`chunk`], t < QK/4.
    #[inline(always)]
    unsafe fn add<L: RowLanes, const CODES: u8, const HI: bool, const M: usize>(
        self,
        t: usize,
        k: usize,
        sums: &mut [[L::I; 2]; M],
    ) {
        // SAFETY: per the contract.
        unsafe {
            let (c, rows) = (self.c, self.rows);
            let v = L::codes(self.base.add(QK * t), self.group_bytes);
            // One running sum a row where M rows hide the latency, but 5-bit codes in i16.
            let one_chain = M >= L::ONE_CHAIN_FROM && !(L::I16_SUMS && CODES == Codes::FIVE_BIT);
            let k = if one_chain { 0 } else { k };
            if CODES == Codes::FULL {
                let u = L::full_codes(v);
                for i in 0..M {
                    sums[i][k] = L::add_full(sums[i][k], u, rows.four(c, i, t));
                }
                return;
            }
            let u = if CODES == Codes::FIVE_BIT {
                v
            } else {
                L::nibbles::<HI>(v)
            };
            for i in 0..M {
                sums[i][k] = L::add(sums[i][k], u, rows.four(c, i, t));
            }
        }
    }
}
