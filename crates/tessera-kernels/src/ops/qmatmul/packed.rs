//! Load-time repacking of block weights for the integer (VNNI) path. The activations
//! they meet are quantized per call in `quant_acts`; the algebra below covers both.
//!
//! Every format becomes `value = (u − offset)·d + m` with u an unsigned byte and (d, m)
//! per 32-weight chunk, or per 16-weight half for the K-quants with 16-weight
//! sub-blocks ([`BlockFormat::unsigned`], [`BlockFormat::SPLIT16`]): Q4_0 (offset 8),
//! Q4_1 (offset 0, minimum m), Q5_0 (16), Q5_1 (0, minimum), Q8_0 (stored u = q + 128,
//! offset 128), Q2_K (0, minimum), Q3_K (4), Q4_K/Q5_K (0, minimum), Q6_K (32),
//! Q8_K (128). With activations x ≈ d_x·q_x (per 32-block, q_x ∈ −127..=127, s_x = Σq_x):
//!
//!   Σ value·x = d_x·(d·(Σ u·q_x − offset·s_x) + m·s_x),
//!
//! and `vpdpbusd` computes Σ u·q_x four bytes per lane, starting from lanes preloaded with
//! −offset·(the lane's own Σq_x), so the integer correction costs nothing per block. The d and m terms are
//! applied per lane (4 elements), from that lane's own Σq_x, with one FMA: adding m once
//! per block instead would cancel against d·Σu·q_x (m ≈ −range/2) and amplify their
//! separate roundings — seen as 1e-4 relative errors on single outputs. Per-lane scaling
//! is also what lets 16-weight sub-blocks keep their own scales at no extra cost.
//!
//! Layout, chosen so one load feeds two chunks and scales need no f16 conversion:
//! 4-bit rows store chunk pairs as 32 bytes whose low nibbles are chunk 2p's 32 weights
//! and high nibbles chunk 2p+1's, in element order (an odd last chunk has zero high
//! nibbles); wider rows store each chunk's 32 bytes contiguously. Scales and minima are
//! arrays, one per chunk (two, one per half, for SPLIT16 formats): f16 where every value
//! is exactly an f16 (the 32-weight formats store them so), f32 otherwise (the K-quants'
//! d·sub-scale products need more bits). At decode the kernel streams these with the
//! codes, so f16 is 20 bytes per 32 Q4_1 weights instead of 24. (VNNI CPUs kept f32 for
//! a zmm kernel that read nothing else; that kernel is gone, and every integer kernel
//! reads both.)
//!
//! Formats with one scale per chunk, and Q2_K/Q3_K/Q6_K, are instead interleaved 8
//! rows at a time ([`PackedWeights::interleaved`]), the layout the decode kernels need
//! to stop being instruction-bound (`rows8`, with `vpmaddubsw`, `vpdpbusd` or `sdot`;
//! 5-bit codes a byte each, and the 8-bit formats where an integer kernel reads them,
//! [`CodeLayout::Bytes8`]); 4-bit bytes are the
//! same, only their order changes, and Q6_K's codes split into a nibble plane and a
//! 2-bit plane, its file's 6.5625 bits per weight instead of the row layout's 10.
//! `dequantize_row` reads every layout.

use super::quant_acts::QuantActs;
use crate::multiversion;
use crate::quant::{BlockFormat, Int8Matrix, QuantMatrix, QK};
use half::f16;
use tessera_core::{CpuFeatures, DType, HugeBuf, Isa};

/// Per-chunk scales d and minima m (minima empty for formats without one).
#[derive(Clone, Debug)]
pub(super) enum Meta {
    F32 {
        scales: HugeBuf<f32>,
        mins: HugeBuf<f32>,
    },
    F16 {
        scales: HugeBuf<f16>,
        mins: HugeBuf<f16>,
    },
    /// Interleaved Q4_K and Q5_K: the file's own fields, 2.5 bytes per chunk instead of
    /// f32's 8.
    Factored(Factored),
    /// Interleaved Q2_K/Q3_K/Q6_K: the file's own fields, 2.25 bytes per chunk (Q2_K
    /// 4.5, with its minima) instead of 8 (16).
    SplitI8(SplitI8),
}

/// Scales and minima as [`crate::quant::FactoredScales`] keeps them: d = d_s·sc and
/// m = (−dmin)_s·mn, exact in f32 (an f16 times a 6-bit integer needs 17 bits).
#[derive(Clone, Debug)]
pub(super) struct Factored {
    /// Per super-block of 8 chunks, at [`PackedWeights::super_index`].
    pub d: HugeBuf<f16>,
    pub neg_dmin: HugeBuf<f16>,
    /// Per chunk, at [`PackedWeights::meta_index`].
    pub sc: HugeBuf<u8>,
    pub mn: HugeBuf<u8>,
}

/// Half scales as [`crate::quant::SplitScales`] keeps them: d = d_s·sc, exact in f32
/// (an f16 times an i8 needs 19 bits), and for Q2_K minima m = (−dmin)_s·mn.
#[derive(Clone, Debug)]
pub(super) struct SplitI8 {
    /// Per super-block of 8 chunks, at [`PackedWeights::super_index`].
    pub d: HugeBuf<f16>,
    /// Per 16-weight half, at [`PackedWeights::meta_index`].
    pub sc: HugeBuf<i8>,
    /// −dmin per super-block as `d`; empty for formats without minima.
    pub neg_dmin: HugeBuf<f16>,
    /// Per half as `sc`; empty for formats without minima.
    pub mn: HugeBuf<i8>,
}

impl Meta {
    /// f16 when every value converts exactly.
    fn compact(scales: Vec<f32>, mins: Vec<f32>) -> Self {
        let exact = |v: &[f32]| v.iter().all(|&x| f16::from_f32(x).to_f32() == x);
        if !exact(&scales) || !exact(&mins) {
            return Meta::F32 {
                scales: scales.into(),
                mins: mins.into(),
            };
        }
        let half = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect();
        Meta::F16 {
            scales: half(scales),
            mins: half(mins),
        }
    }

    pub(super) fn has_min(&self) -> bool {
        match self {
            Meta::F32 { mins, .. } => !mins.is_empty(),
            Meta::F16 { mins, .. } => !mins.is_empty(),
            Meta::Factored(_) => true,
            Meta::SplitI8(f) => !f.mn.is_empty(),
        }
    }
}

/// Weights repacked for the integer path.
#[derive(Clone, Debug)]
pub struct PackedWeights {
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// The codes, laid out as `layout` says.
    pub(super) quants: HugeBuf<u8>,
    /// Per row, per chunk (per half-chunk when `split16`): d and m.
    pub(super) meta: Meta,
    pub(super) offset: i32,
    pub(super) layout: CodeLayout,
    /// Two scales per chunk, one per 16-weight half.
    pub(super) split16: bool,
    pub(super) dtype: DType,
}

/// How the codes are stored: what decides which kernel reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CodeLayout {
    /// Row after row, a byte per code (8-bit formats, INT8, 5- and 6-bit codes).
    Bytes,
    /// Row after row, a byte per 2 codes: chunk 2p in the low nibbles of pair p's 32
    /// bytes, chunk 2p + 1 in the high ones.
    Nibbles,
    /// [`ROWS8`] rows interleaved per chunk pair, nibbles ([`PackedWeights::interleaved`]);
    /// rows padded to a multiple of 8 with zeros.
    Nibbles8,
    /// As `Nibbles8` for the low 4 bits, each chunk pair followed by a plane of the
    /// codes' top 2 bits (Q6_K).
    Planes8,
    /// [`ROWS8`] rows interleaved per chunk, a byte per code: the 5-bit formats (Q5_0,
    /// Q5_1, Q5_K), and full bytes (Q8_0, Q8_K) where an integer kernel reads them
    /// ([`PackedWeights::can_interleave`]): register t of chunk c holds
    /// each row's codes 4t..4t+4.
    Bytes8,
}

impl CodeLayout {
    fn of<B: BlockFormat>(interleaved: bool) -> Self {
        match (interleaved, B::NIBBLES) {
            (false, false) => CodeLayout::Bytes,
            (false, true) => CodeLayout::Nibbles,
            (true, true) => CodeLayout::Nibbles8,
            (true, false) if B::SPLIT_I8_SCALES => CodeLayout::Planes8,
            (true, false) => CodeLayout::Bytes8,
        }
    }

    /// Whether rows are interleaved 8 at a time (`rows8`, and its `planes` loop).
    pub(super) fn interleaved(self) -> bool {
        matches!(
            self,
            CodeLayout::Nibbles8 | CodeLayout::Planes8 | CodeLayout::Bytes8
        )
    }
}

/// Weight rows per interleaved group: one i32 lane each in a ymm register.
pub(super) const ROWS8: usize = 8;
/// Bytes of one interleaved group's chunk pair: 8 rows × 32 bytes (of nibbles).
pub(super) const GROUP_PAIR_BYTES: usize = ROWS8 * QK;

/// In the 6-bit plane layout ([`CodeLayout::Planes8`]), where chunk b's codes 4t..4t+4
/// keep their top 2 bits: the word, `top0` (code 0's place) plus register t mod 4, and
/// their bit shift in it, crumb 2·(b mod 2) + t/4 ([`PackedWeights::code_places`]). The
/// packer and the unpacker (`chunk_codes`) both go through here.
pub(super) fn top_word(top0: usize, b: usize, t: usize) -> (usize, u32) {
    (top0 + (t % 4) * QK, 2 * (2 * (b % 2) + t / 4) as u32)
}

/// Bytes of a 6-bit group's chunk pair: the nibble plane, then 8 rows × 16 bytes of
/// 2-bit codes.
pub(super) const PLANES_PAIR_BYTES: usize = GROUP_PAIR_BYTES + GROUP_PAIR_BYTES / 2;

impl PackedWeights {
    /// Repacks `w` (dequantization semantics unchanged: the packed values are the
    /// format's own u, d, m) in the layout the fastest kernel reads: interleaved wherever
    /// the format allows it (`PackedWeights::packs_interleaved`). Measured on a Zen 4
    /// host (2 threads; `tessera bench qmatmul --shape MxNxK --dtype D`): Q4_1 3072×576
    /// interleaved 32 µs at M = 1 and 173 µs at M = 16 (avx512-vnni-r8), row-major VNNI
    /// 69 and 648 µs; Q8_0 49152×576 interleaved 3.8–3.9 ms at M = 16 against the
    /// row-major AVX2 kernel's 7.0–9.8, a tie at M = 1 (DRAM-bound).
    pub fn new<B: BlockFormat>(w: &QuantMatrix<B>) -> Self {
        Self::build(w, Self::packs_interleaved::<B>())
    }

    /// Repacks `w` one row after another (what the VNNI kernel reads).
    pub fn row_major<B: BlockFormat>(w: &QuantMatrix<B>) -> Self {
        Self::build(w, false)
    }

    /// Repacks 4-bit formats with one scale per 32 weights (Q4_0, Q4_1, Q4_K, the
    /// group formats) eight rows at a time, None for other formats. For each group of
    /// 8 rows and chunk pair, 8 registers of 32 bytes: register t holds, per row, the 4
    /// bytes of that row's pair bytes 4t..4t+4 (low nibbles: chunk 2p's elements
    /// 4t..4t+4, high: chunk 2p+1's). One `vpmaddubsw` against 4 broadcast activation
    /// bytes then feeds 8 rows' sums, and the i32 lanes are the 8 rows' dots with no
    /// horizontal reduction, so a decode kernel spends ~2.5× fewer instructions per
    /// weight (`rows8`). Scales and minima go per group, per chunk, 8 rows
    /// contiguous, so one load covers a chunk's 8 rows.
    ///
    /// Also Q2_K, Q3_K and Q6_K, whose 16-weight halves have their own i8 scales (times
    /// one f16 per super-block, [`crate::quant::SplitScales`]; Q2_K also its minima's
    /// 4-bit integers times −dmin): their codes' low 4 bits are
    /// laid out as above, and Q6_K's top 2 bits follow each chunk pair's nibbles in 4
    /// registers of 32 bytes, at the same byte as their low bits, register t mod 4, bits
    /// 2·(2h + t/4) for chunk 2p + h (`rows8::planes`). The i8 scales go per chunk as 8
    /// rows' (half 0, half 1) pairs (Q2_K's minima beside them alike), the f16s per
    /// super-block, 8 rows contiguous.
    pub fn interleaved<B: BlockFormat>(w: &QuantMatrix<B>) -> Option<Self> {
        Self::can_interleave::<B>().then(|| Self::build(w, true))
    }

    /// Whether [`PackedWeights::interleaved`] takes format B: nibbles and 5-bit codes
    /// with one scale per chunk, the split-scale 6-bit formats, and the 8-bit formats
    /// (offset 128, one scale per chunk) where an integer kernel reads them interleaved:
    /// `vpdpbusd` takes full unsigned bytes, `sdot` signed ones (u − 128), and
    /// `vpmaddubsw` their magnitudes against sign-flipped activations (`rows8`);
    /// elsewhere (an Arm CPU without DotProd) they keep the row layout.
    pub(super) fn can_interleave<B: BlockFormat>() -> bool {
        // (AVX512_VNNI comes with AVX2 on every x86 CPU.)
        let full_bytes = Isa::Avx2.is_available() || CpuFeatures::get().neon_dotprod;
        (B::NIBBLES && !B::SPLIT16)
            || B::SPLIT_I8_SCALES
            || Self::five_bit::<B>()
            || (B::OFFSET == 128 && !B::SPLIT16 && full_bytes)
    }

    /// Whether B's codes are 5-bit bytes with one scale per chunk (Q5_0, Q5_1, Q5_K):
    /// the byte formats below offset 128, every code under 32 (tested over every
    /// format), which keeps `vpmaddubsw`'s i16 sums in range (`rows8`'s module docs).
    pub(super) fn five_bit<B: BlockFormat>() -> bool {
        !B::NIBBLES && !B::SPLIT16 && B::OFFSET < 128
    }

    /// Whether [`PackedWeights::new`] interleaves format B: as
    /// [`PackedWeights::can_interleave`], but full bytes only where the default ISA
    /// reaches an interleaved integer kernel (AVX2, AVX-512 or `sdot`): under
    /// `TESSERA_ISA=scalar` they stay row-major.
    pub(super) fn packs_interleaved<B: BlockFormat>() -> bool {
        Self::can_interleave::<B>()
            && (B::NIBBLES
                || B::SPLIT_I8_SCALES
                || Self::five_bit::<B>()
                || matches!(Isa::best(), Isa::Avx512 | Isa::Avx2 | Isa::Neon))
    }

    fn build<B: BlockFormat>(w: &QuantMatrix<B>, interleaved: bool) -> Self {
        let (rows, cols) = (w.rows(), w.cols());
        let nb = cols / QK;
        let halves = if B::SPLIT16 { 2 } else { 1 };
        let mut p = PackedWeights {
            rows,
            cols,
            quants: HugeBuf::default(),
            meta: Meta::F32 {
                scales: HugeBuf::default(),
                mins: HugeBuf::default(),
            },
            offset: B::OFFSET,
            layout: CodeLayout::of::<B>(interleaved),
            split16: B::SPLIT16,
            dtype: B::DTYPE,
        };
        let stored_rows = p.stored_rows();
        // The codes gather in a local Vec and move into place once (see `HugeBuf::from`).
        let mut quants = vec![0u8; stored_rows * p.row_bytes()];
        let mut scales = vec![0f32; stored_rows * nb * halves];
        let mut mins = vec![0f32; if B::HAS_MIN { scales.len() } else { 0 }];
        let mut u = [0u8; QK];
        for r in 0..rows {
            let chunks = w
                .row(r)
                .iter()
                .flat_map(|blk| (0..B::BLOCK / QK).map(move |c| (blk, c)));
            for (b, (blk, c)) in chunks.enumerate() {
                for (h, (d, m)) in blk.unsigned(c, &mut u)[..halves].iter().enumerate() {
                    let at = p.meta_index(r, b, h);
                    scales[at] = *d;
                    if B::HAS_MIN {
                        mins[at] = *m;
                    }
                }
                p.scatter_codes(&mut quants, (r, b), &u);
            }
        }
        p.quants = quants.into();
        let factored = interleaved && w.blocks().first().and_then(B::factored_scales).is_some();
        p.meta = if factored {
            Meta::Factored(p.factored(w))
        } else if interleaved && B::SPLIT_I8_SCALES {
            Meta::SplitI8(p.split_i8(w))
        } else {
            Meta::compact(scales, mins)
        };
        p
    }

    /// `w`'s [`SplitI8`] metadata at this layout's indices.
    fn split_i8<B: BlockFormat>(&self, w: &QuantMatrix<B>) -> SplitI8 {
        let chunks = self.stored_rows() * (self.cols / QK);
        let mins = B::HAS_MIN;
        let mut f = SplitI8 {
            d: HugeBuf::filled(chunks / 8, f16::ZERO),
            sc: HugeBuf::filled(2 * chunks, 0),
            neg_dmin: HugeBuf::filled(if mins { chunks / 8 } else { 0 }, f16::ZERO),
            mn: HugeBuf::filled(if mins { 2 * chunks } else { 0 }, 0),
        };
        for r in 0..self.rows {
            for (s, blk) in w.row(r).iter().enumerate() {
                let Some(ss) = blk.split_scales() else {
                    continue;
                };
                let at = self.super_index(r, 8 * s);
                f.d[at] = ss.d;
                for (half, &sc) in ss.sc.iter().enumerate() {
                    f.sc[self.meta_index(r, 8 * s + half / 2, half % 2)] = sc;
                }
                if let (true, Some((neg_dmin, mn))) = (mins, ss.mins) {
                    f.neg_dmin[at] = neg_dmin;
                    for (half, &m) in mn.iter().enumerate() {
                        f.mn[self.meta_index(r, 8 * s + half / 2, half % 2)] = m;
                    }
                }
            }
        }
        f
    }

    /// `w`'s [`Factored`] metadata at this layout's indices.
    fn factored<B: BlockFormat>(&self, w: &QuantMatrix<B>) -> Factored {
        let nb = self.cols / QK;
        let chunks = self.stored_rows() * nb;
        let mut f = Factored {
            d: HugeBuf::filled(chunks / 8, f16::ZERO),
            neg_dmin: HugeBuf::filled(chunks / 8, f16::ZERO),
            sc: HugeBuf::filled(chunks, 0),
            mn: HugeBuf::filled(chunks, 0),
        };
        for r in 0..self.rows {
            for (s, blk) in w.row(r).iter().enumerate() {
                let Some(fs) = blk.factored_scales() else {
                    continue;
                };
                let at = self.super_index(r, 8 * s);
                (f.d[at], f.neg_dmin[at]) = (fs.d, fs.neg_dmin);
                for (c, &(sc, mn)) in fs.chunks.iter().enumerate() {
                    let at = self.meta_index(r, 8 * s + c, 0);
                    (f.sc[at], f.mn[at]) = (sc, mn);
                }
            }
        }
        f
    }

    /// Stores row r's 32 codes `u` of chunk b at their places, the inverse of
    /// [`PackedWeights::chunk_codes`]: in every layout codes 4t..4t+4 are 4 consecutive
    /// bytes, so the places are found once per chunk and each group of 4 is one word.
    /// Its own function so that `self` and `quants` arrive as non-aliasing references
    /// (inlined into `build`, LLVM reloaded the buffer pointer after every byte store).
    #[inline(never)]
    fn scatter_codes(&self, quants: &mut [u8], (r, b): (usize, usize), u: &[u8; QK]) {
        let ((low, shift), top) = self.code_places(r, b, 0);
        let stride = if self.layout.interleaved() { QK } else { 4 };
        let mask = u32::from(self.low_mask()) * 0x0101_0101;
        let mut or_word = |at: usize, bits: u32| {
            let word: &mut [u8; 4] = (&mut quants[at..at + 4]).try_into().expect("4 bytes");
            *word = (u32::from_le_bytes(*word) | bits).to_le_bytes();
        };
        for (t, four) in u.chunks_exact(4).enumerate() {
            let codes = u32::from_le_bytes(four.try_into().expect("4 codes"));
            or_word(low + t * stride, (codes & mask) << shift);
            if let Some((top, _)) = top {
                let (at, shift) = top_word(top, b, t);
                or_word(at, ((codes >> 4) & 0x0303_0303) << shift);
            }
        }
    }

    /// Where row r's code j (0..32) of chunk b is stored: the byte and bit shift of
    /// its low bits ([`PackedWeights::low_mask`]), and in 6-bit planes of its top 2.
    #[inline(always)]
    fn code_places(&self, r: usize, b: usize, j: usize) -> ((usize, u32), Option<(usize, u32)>) {
        let nibble = 4 * (b % 2) as u32;
        let lane = (r % ROWS8) * 4 + j % 4;
        match self.layout {
            CodeLayout::Bytes => return ((r * self.row_bytes() + b * QK + j, 0), None),
            CodeLayout::Nibbles => {
                return ((r * self.row_bytes() + (b / 2) * QK + j, nibble), None)
            }
            CodeLayout::Bytes8 => {
                let unit = (r / ROWS8) * self.group_bytes() + b * ROWS8 * QK;
                return ((unit + (j / 4) * QK + lane, 0), None);
            }
            CodeLayout::Nibbles8 | CodeLayout::Planes8 => {}
        }
        let pairs = (self.cols / QK).div_ceil(2);
        let unit = ((r / ROWS8) * pairs + b / 2) * self.group_pair_bytes();
        let low = (unit + (j / 4) * QK + lane, nibble);
        let top = (self.layout == CodeLayout::Planes8).then(|| {
            let (word, shift) = top_word(unit + GROUP_PAIR_BYTES + lane - j % 4, b, j / 4);
            (word + j % 4, shift)
        });
        (low, top)
    }

    /// The bits of a code stored at its low place: 4 in nibble layouts (the 6-bit
    /// planes' low plane included), all 8 in byte rows.
    fn low_mask(&self) -> u8 {
        if matches!(self.layout, CodeLayout::Bytes | CodeLayout::Bytes8) {
            0xFF
        } else {
            0xF
        }
    }

    /// Where row r's scale (and minimum) for chunk b, half h, is stored.
    #[inline(always)]
    pub(super) fn meta_index(&self, r: usize, b: usize, h: usize) -> usize {
        let nb = self.cols / QK;
        if self.layout.interleaved() {
            (((r / ROWS8) * nb + b) * ROWS8 + r % ROWS8) * self.halves() + h
        } else {
            (r * nb + b) * self.halves() + h
        }
    }

    /// Where row r's super-block scales for chunk b (of 8 per super-block) are stored
    /// ([`Meta::Factored`]).
    #[inline(always)]
    pub(super) fn super_index(&self, r: usize, b: usize) -> usize {
        let ns = self.cols / QK / 8;
        if self.layout.interleaved() {
            ((r / ROWS8) * ns + b / 8) * ROWS8 + r % ROWS8
        } else {
            r * ns + b / 8
        }
    }

    /// Row r's (d, m) for chunk b, half h (m = 0 without minima).
    #[inline(always)]
    pub(super) fn scale_min(&self, r: usize, b: usize, h: usize) -> (f32, f32) {
        let at = self.meta_index(r, b, h);
        match &self.meta {
            Meta::F32 { scales, mins } => (scales[at], mins.get(at).copied().unwrap_or(0.0)),
            Meta::F16 { scales, mins } => (
                scales[at].to_f32(),
                mins.get(at).map_or(0.0, |m| m.to_f32()),
            ),
            Meta::Factored(f) => {
                let s = self.super_index(r, b);
                (
                    f.d[s].to_f32() * f32::from(f.sc[at]),
                    f.neg_dmin[s].to_f32() * f32::from(f.mn[at]),
                )
            }
            Meta::SplitI8(f) => {
                let s = self.super_index(r, b);
                let m = match (f.neg_dmin.get(s), f.mn.get(at)) {
                    (Some(n), Some(&mn)) => n.to_f32() * f32::from(mn),
                    _ => 0.0,
                };
                (f.d[s].to_f32() * f32::from(f.sc[at]), m)
            }
        }
    }

    /// Rows held: `rows`, padded to a multiple of [`ROWS8`] when interleaved.
    pub(super) fn stored_rows(&self) -> usize {
        if self.layout.interleaved() {
            self.rows.next_multiple_of(ROWS8)
        } else {
            self.rows
        }
    }

    /// Packs per-channel INT8 weights: u = q + 128 (offset 128), each row's scale
    /// repeated per 32-weight chunk, so the same kernels run W8A8.
    pub fn from_int8(w: &Int8Matrix) -> Self {
        let (rows, cols) = (w.rows(), w.cols());
        let quants = (0..rows)
            .flat_map(|r| w.row(r).iter().map(|&q| (q as u8) ^ 0x80))
            .collect();
        let scales = w
            .scales()
            .iter()
            .flat_map(|&s| std::iter::repeat_n(s, cols / QK))
            .collect();
        PackedWeights {
            rows,
            cols,
            quants,
            meta: Meta::F32 {
                scales,
                mins: HugeBuf::default(),
            },
            offset: 128,
            layout: CodeLayout::Bytes,
            split16: false,
            dtype: DType::I8,
        }
    }

    /// Output features (rows of W).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Bytes held: codes plus scales and minima.
    pub fn size_bytes(&self) -> usize {
        let meta = match &self.meta {
            Meta::F32 { scales, mins } => 4 * (scales.len() + mins.len()),
            Meta::F16 { scales, mins } => 2 * (scales.len() + mins.len()),
            Meta::Factored(f) => 2 * (f.d.len() + f.neg_dmin.len()) + f.sc.len() + f.mn.len(),
            Meta::SplitI8(f) => 2 * (f.d.len() + f.neg_dmin.len()) + f.sc.len() + f.mn.len(),
        };
        self.quants.len() + meta
    }

    /// Whether the codes lie in 2 MiB-page chunks (packed under
    /// [`tessera_core::huge::with_large_pages`]`(true, …)`) rather than heap memory.
    pub fn in_large_pages(&self) -> bool {
        self.quants.in_large_page_chunk()
    }

    /// Input features (columns of W).
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The format the weights were packed from.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The format's offset o in value = (u − o)·d + m (what `QuantActs::with_scales` needs).
    pub fn offset(&self) -> i32 {
        self.offset
    }
    /// Whether every chunk of a row shares one scale (per-channel INT8 from
    /// [`PackedWeights::from_int8`]), so a row's integer dot can be scaled once.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )] // the row-scaled kernel's
    pub(super) fn one_scale_per_row(&self) -> bool {
        self.dtype == DType::I8
    }
    /// Row `row`'s scale when [`PackedWeights::one_scale_per_row`] (0 for an empty row).
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )] // the row-scaled kernel's
    pub(super) fn row_scale(&self, row: usize) -> f32 {
        if self.cols < QK {
            return 0.0;
        }
        self.scale_min(row, 0, 0).0
    }
    /// Whether the codes are full bytes (Q8_0, Q8_K, INT8: exactly the offset-128
    /// formats). Every other format's codes are below 64, which the AVX2 kernel's
    /// saturating `vpmaddubsw` relies on (tested over every format).
    pub(super) fn signed_bytes(&self) -> bool {
        self.offset == 128
    }
    /// Scale entries per chunk (1, or 2 for split formats).
    pub(super) fn halves(&self) -> usize {
        1 + self.split16 as usize
    }
    /// Bytes of an interleaved group's chunk pair.
    pub(super) fn group_pair_bytes(&self) -> usize {
        if self.layout == CodeLayout::Planes8 {
            PLANES_PAIR_BYTES
        } else {
            GROUP_PAIR_BYTES
        }
    }
    /// Code bytes of an interleaved group of [`ROWS8`] rows.
    pub(super) fn group_bytes(&self) -> usize {
        ROWS8 * self.row_bytes()
    }
    /// Code bytes per row: 16 per 32 weights for nibbles (an odd last chunk padded),
    /// 24 for 6-bit planes, 32 for bytes.
    pub(super) fn row_bytes(&self) -> usize {
        let pairs = (self.cols / QK).div_ceil(2);
        match self.layout {
            CodeLayout::Bytes | CodeLayout::Bytes8 => self.cols,
            CodeLayout::Nibbles | CodeLayout::Nibbles8 => pairs * QK,
            CodeLayout::Planes8 => pairs * PLANES_PAIR_BYTES / ROWS8,
        }
    }
}

multiversion! {
    /// The integer path without VNNI, same arithmetic as the VNNI kernel: exact integer
    /// sums per 4-element lane (from the lane's −offset·Σq start), then per lane
    /// `d·S (+ m·Σq)` and `× d_x` in f32. The portable baseline the SIMD kernel is checked
    /// against, and the int8 path on CPUs without AVX512_VNNI.
    pub(super) fn int8_dots_portable(w: &PackedWeights, row: usize, acts: &[&QuantActs], out: &mut [f32]) {
        let nb = w.cols / QK;
        let mut u = [0u8; QK];
        for (o, a) in out.iter_mut().zip(acts) {
            let mut acc = [0f32; 8];
            for b in 0..nb {
                w.chunk_codes(row, b, &mut u);
                let q = &a.q[b * QK..(b + 1) * QK];
                for l in 0..8 {
                    // Lane l covers elements 4l..4l+4: half l / 4.
                    let (d, m) = w.scale_min(row, b, (l / 4) * (w.halves() - 1));
                    let mut s = a.init[b][l];
                    for j in 4 * l..4 * l + 4 {
                        s += u[j] as i32 * q[j] as i32;
                    }
                    acc[l] += (s as f32 * d + m * a.lane_sums[b][l]) * a.d8[b][l];
                }
            }
            *o = acc.iter().sum();
        }
    }
}

#[path = "packed_dequant.rs"]
mod dequant;

#[cfg(test)]
#[path = "packed_tests.rs"]
pub(super) mod tests;
