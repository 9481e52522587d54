//! Load-time repacking of block weights for the integer (VNNI) path, and the per-call
//! 8-bit quantization of the activations.
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
//! is exactly an f16 (the 32-weight formats store them so) and the CPU has no VNNI, f32
//! otherwise (the K-quants' d·sub-scale products need more bits). At decode the kernel
//! streams these with the codes, so f16 is 20 bytes per 32 Q4_1 weights instead of 24.
//! The VNNI kernel reads f32 only: on a VNNI CPU metadata stays f32, and f16 weights
//! built elsewhere go to the AVX2 kernel.
//!
//! On CPUs without VNNI, 4-bit formats with one scale per chunk are instead interleaved
//! 8 rows at a time ([`PackedWeights::interleaved`]), the layout the AVX2 decode kernel
//! needs to stop being instruction-bound; the bytes are the same, only their order
//! changes, and `dequantize_row` reads either.

use super::ActScales;
use crate::multiversion;
use crate::quant::{BlockFormat, Int8Matrix, QuantMatrix, QK};
use half::f16;
use tessera_core::{CpuFeatures, DType};

/// Per-chunk scales d and minima m (minima empty for formats without one).
#[derive(Clone, Debug)]
pub(super) enum Meta {
    F32 { scales: Vec<f32>, mins: Vec<f32> },
    F16 { scales: Vec<f16>, mins: Vec<f16> },
}

impl Meta {
    /// f16 when every value converts exactly and the VNNI kernel (f32 only) will not run.
    fn compact(scales: Vec<f32>, mins: Vec<f32>) -> Self {
        let exact = |v: &[f32]| v.iter().all(|&x| f16::from_f32(x).to_f32() == x);
        if CpuFeatures::get().avx512_vnni || !exact(&scales) || !exact(&mins) {
            return Meta::F32 { scales, mins };
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
        }
    }

    /// [`Meta::get`], None past the end.
    fn get_checked(&self, at: usize) -> Option<(f32, f32)> {
        let len = match self {
            Meta::F32 { scales, .. } => scales.len(),
            Meta::F16 { scales, .. } => scales.len(),
        };
        (at < len).then(|| self.get(at))
    }

    /// (d, m) at flat index `at` (m = 0 without minima).
    pub(super) fn get(&self, at: usize) -> (f32, f32) {
        match self {
            Meta::F32 { scales, mins } => (scales[at], mins.get(at).copied().unwrap_or(0.0)),
            Meta::F16 { scales, mins } => (
                scales[at].to_f32(),
                mins.get(at).map_or(0.0, |m| m.to_f32()),
            ),
        }
    }
}

/// Weights repacked for the integer path.
#[derive(Clone, Debug)]
pub struct PackedWeights {
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Per row: `cols/2` bytes (4-bit, block pairs) or `cols` bytes (8-bit).
    pub(super) quants: Vec<u8>,
    /// Per row, per chunk (per half-chunk when `split16`): d and m.
    pub(super) meta: Meta,
    pub(super) offset: i32,
    pub(super) four_bit: bool,
    /// Two scales per chunk, one per 16-weight half.
    pub(super) split16: bool,
    /// 4-bit codes and metadata interleaved [`ROWS8`] rows at a time (see
    /// [`PackedWeights::interleaved`]); rows padded to a multiple of 8 with zeros.
    pub(super) interleaved: bool,
    pub(super) dtype: DType,
}

/// Weight rows per interleaved group: one i32 lane each in a ymm register.
pub(super) const ROWS8: usize = 8;
/// Bytes of one interleaved group's chunk pair: 8 rows × 32 bytes.
pub(super) const GROUP_PAIR_BYTES: usize = ROWS8 * QK;

impl PackedWeights {
    /// Repacks `w` (dequantization semantics unchanged: the packed values are the
    /// format's own u, d, m) in the layout this CPU's fastest kernel reads: interleaved
    /// where the format allows it and the CPU has no VNNI (whose kernel reads rows).
    pub fn new<B: BlockFormat>(w: &QuantMatrix<B>) -> Self {
        let interleave = Self::can_interleave::<B>() && !CpuFeatures::get().avx512_vnni;
        Self::build(w, interleave)
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
    /// weight (`avx2_rows8`). Scales and minima go per group, per chunk, 8 rows
    /// contiguous, so one load covers a chunk's 8 rows.
    pub fn interleaved<B: BlockFormat>(w: &QuantMatrix<B>) -> Option<Self> {
        Self::can_interleave::<B>().then(|| Self::build(w, true))
    }

    /// Whether [`PackedWeights::interleaved`] takes format B.
    pub(super) fn can_interleave<B: BlockFormat>() -> bool {
        B::NIBBLES && !B::SPLIT16
    }

    fn build<B: BlockFormat>(w: &QuantMatrix<B>, interleaved: bool) -> Self {
        let (rows, cols) = (w.rows(), w.cols());
        let nb = cols / QK;
        let halves = if B::SPLIT16 { 2 } else { 1 };
        let mut p = PackedWeights {
            rows,
            cols,
            quants: Vec::new(),
            meta: Meta::F32 {
                scales: Vec::new(),
                mins: Vec::new(),
            },
            offset: B::OFFSET,
            four_bit: B::NIBBLES,
            split16: B::SPLIT16,
            interleaved,
            dtype: B::DTYPE,
        };
        let stored_rows = p.stored_rows();
        p.quants = vec![0u8; stored_rows * p.row_bytes()];
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
                let (unit, shift) = if p.four_bit {
                    (b / 2, 4 * (b % 2))
                } else {
                    (b, 0)
                };
                for (j, &q) in u.iter().enumerate() {
                    let at = p.code_index(r, unit, j);
                    p.quants[at] |= q << shift;
                }
            }
        }
        p.meta = Meta::compact(scales, mins);
        p
    }

    /// Where row r's byte j (0..32) of chunk pair `unit` (4-bit) or chunk `unit`
    /// (bytes) is stored.
    fn code_index(&self, r: usize, unit: usize, j: usize) -> usize {
        if self.interleaved {
            let pairs = (self.cols / QK).div_ceil(2);
            ((r / ROWS8) * pairs + unit) * GROUP_PAIR_BYTES + (j / 4) * QK + (r % ROWS8) * 4 + j % 4
        } else {
            r * self.row_bytes() + unit * QK + j
        }
    }

    /// Where row r's scale (and minimum) for chunk b, half h, is stored.
    pub(super) fn meta_index(&self, r: usize, b: usize, h: usize) -> usize {
        let nb = self.cols / QK;
        if self.interleaved {
            ((r / ROWS8) * nb + b) * ROWS8 + r % ROWS8
        } else {
            (r * nb + b) * self.halves() + h
        }
    }

    /// Row r's 32 codes of chunk b.
    fn chunk_codes(&self, r: usize, b: usize, out: &mut [u8; QK]) {
        if self.four_bit {
            let shift = 4 * (b % 2);
            for (j, o) in out.iter_mut().enumerate() {
                *o = (self.quants[self.code_index(r, b / 2, j)] >> shift) & 0xF;
            }
        } else {
            let at = self.code_index(r, b, 0);
            out.copy_from_slice(&self.quants[at..at + QK]);
        }
    }

    /// Rows held: `rows`, padded to a multiple of [`ROWS8`] when interleaved.
    fn stored_rows(&self) -> usize {
        if self.interleaved {
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
                mins: Vec::new(),
            },
            offset: 128,
            four_bit: false,
            split16: false,
            interleaved: false,
            dtype: DType::I8,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Bytes held: codes plus scales and minima.
    pub fn size_bytes(&self) -> usize {
        let meta = match &self.meta {
            Meta::F32 { scales, mins } => 4 * (scales.len() + mins.len()),
            Meta::F16 { scales, mins } => 2 * (scales.len() + mins.len()),
        };
        self.quants.len() + meta
    }

    /// Row r's values, (u − offset)·d + m, into `out`: the format's own values, so the
    /// packed copy can stand in for the blocks (prefill, embedding rows). Panics, like
    /// slice indexing, unless r < rows and `out.len() == cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(
            r < self.rows && out.len() == self.cols,
            "row {r} of {} values",
            self.cols
        );
        let halves = self.halves();
        let has_min = self.meta.has_min();
        let mut codes = [0u8; QK];
        for (b, chunk) in out.chunks_exact_mut(QK).enumerate() {
            self.chunk_codes(r, b, &mut codes);
            let parts = chunk
                .chunks_exact_mut(QK / halves)
                .zip(codes.chunks_exact(QK / halves));
            for (h, (part, cs)) in parts.enumerate() {
                let (d, m) = self.meta.get(self.meta_index(r, b, h));
                for (o, &u) in part.iter_mut().zip(cs) {
                    let v = (i32::from(u) - self.offset) as f32 * d;
                    // No `+ 0.0` without a minimum: it would turn the format's −0 into +0.
                    *o = if has_min { v + m } else { v };
                }
            }
        }
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The format's offset o in value = (u − o)·d + m (what [`QuantActs::new`] needs).
    pub fn offset(&self) -> i32 {
        self.offset
    }
    /// Whether every chunk of a row shares one scale (per-channel INT8 from
    /// [`PackedWeights::from_int8`]), so a row's integer dot can be scaled once.
    pub(super) fn one_scale_per_row(&self) -> bool {
        self.dtype == DType::I8
    }
    /// Row `row`'s scale when [`PackedWeights::one_scale_per_row`] (0 for an empty row).
    pub(super) fn row_scale(&self, row: usize) -> f32 {
        let per_row = self.cols / QK * self.halves();
        self.meta.get_checked(row * per_row).map_or(0.0, |(d, _)| d)
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
    pub(super) fn row_bytes(&self) -> usize {
        if self.four_bit {
            (self.cols / QK).div_ceil(2) * QK
        } else {
            self.cols
        }
    }
}

/// One activation row quantized per 32-block, with what the kernel preloads.
#[derive(Clone, Debug, Default)]
pub struct QuantActs {
    /// q_x, K bytes (padded by one zero block when K/32 is odd, so pair loads stay inside).
    pub(super) q: Vec<i8>,
    /// d_x replicated over the 8 lanes that hold its block's partial sums.
    pub(super) d8: Vec<[f32; 8]>,
    /// Lane l: −offset·Σq_x over the lane's 4 elements (the dpbusd starting values; per
    /// lane, so each lane's sum is complete before its own scale multiplies it).
    pub(super) init: Vec<[i32; 8]>,
    /// Σq_x over each lane's 4 consecutive elements, as f32 (for the minimum term).
    pub(super) lane_sums: Vec<[f32; 8]>,
    /// Per block: −offset·Σq_x over the whole block (the interleaved kernel's start).
    pub(super) block_init: Vec<i32>,
    /// Per block: d_x·Σq_x (the interleaved kernel's minimum term; NaN with d_x).
    pub(super) block_sums: Vec<f32>,
}

impl QuantActs {
    /// Quantizes `x` (length a multiple of 32) for weights with this `offset`. Non-finite
    /// input makes its block's scale NaN, so the outputs it reaches are NaN.
    pub fn new(x: &[f32], offset: i32) -> Self {
        Self::with_scales(x, offset, ActScales::PerBlock)
    }

    /// As [`QuantActs::new`], with one scale per block or one for the whole row.
    pub fn with_scales(x: &[f32], offset: i32, act: ActScales) -> Self {
        let nb = x.len() / QK;
        let row_amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let row_finite = x.iter().all(|v| v.is_finite());
        let padded = nb.div_ceil(2) * 2;
        let mut a = QuantActs {
            q: vec![0; padded * QK],
            d8: vec![[0.0; 8]; padded],
            init: vec![[0; 8]; padded],
            lane_sums: vec![[0.0; 8]; padded],
            block_init: vec![0; padded],
            block_sums: vec![0.0; padded],
        };
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let (amax, finite) = match act {
                ActScales::PerBlock => (
                    xb.iter().fold(0f32, |m, v| m.max(v.abs())),
                    xb.iter().all(|v| v.is_finite()),
                ),
                ActScales::PerRow => (row_amax, row_finite),
            };
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            for (q, &v) in a.q[b * QK..(b + 1) * QK].iter_mut().zip(xb) {
                *q = (v * id).round() as i8;
            }
            let d = if finite { d } else { f32::NAN };
            a.d8[b] = [d; 8];
            let q = &a.q[b * QK..(b + 1) * QK];
            let sums: [i32; 8] =
                std::array::from_fn(|l| q[4 * l..4 * l + 4].iter().map(|&v| v as i32).sum());
            a.init[b] = sums.map(|s| -offset * s);
            a.lane_sums[b] = sums.map(|s| s as f32);
            let total: i32 = sums.iter().sum();
            a.block_init[b] = -offset * total;
            a.block_sums[b] = d * total as f32;
        }
        a
    }

    /// The values the kernel effectively multiplies by, q·d_x, exactly (f64).
    pub fn dequantized(&self, k: usize) -> Vec<f64> {
        (0..k)
            .map(|i| self.q[i] as f64 * self.d8[i / QK][0] as f64)
            .collect()
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
                    let (d, m) = w.meta.get(w.meta_index(row, b, (l / 4) * (w.halves() - 1)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::qmatmul::qmatmul_int8;
    use crate::quant::{BlockQ8K, BlockQ8_0, BLOCK_DTYPES};
    use rand::{Rng, SeedableRng};
    use tessera_core::{Isa, Result, TensorView, TensorViewMut};

    /// `y [m, n]` (NaN-poisoned first) from `matmul(x [m, k], y)`.
    fn apply(
        x: &[f32],
        (m, k, n): (usize, usize, usize),
        matmul: impl FnOnce(&TensorView<'_, f32>, &mut TensorViewMut<'_, f32>) -> Result<()>,
    ) -> Vec<f32> {
        let xv = TensorView::contiguous(x, &[m, k]).unwrap();
        let mut y = vec![f32::NAN; m * n];
        let mut yv = TensorViewMut::contiguous(&mut y, &[m, n]).unwrap();
        matmul(&xv, &mut yv).unwrap();
        y
    }

    /// The AVX2 kernel multiplies codes unsigned with saturating i16 pair sums: every
    /// format but the offset-128 ones must keep its codes below 64 (2·63·127 < 2¹⁵), on
    /// data with outliers too.
    #[test]
    fn only_offset_128_formats_have_wide_codes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (rows, cols) = (4, 512);
        let data: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let v: f32 = rng.random_range(-1.0..1.0);
                if i % 97 == 0 {
                    v * 50.0
                } else {
                    v
                }
            })
            .collect();
        for dtype in BLOCK_DTYPES {
            let p = crate::with_block_format!(dtype,
                B => PackedWeights::new(&QuantMatrix::<B>::quantize(rows, cols, &data).unwrap()),
                _ => unreachable!("{dtype} is a block format")
            );
            let widest = p.quants.iter().map(|&q| q as u32).max().unwrap();
            if p.signed_bytes() {
                assert!(!p.four_bit, "{dtype}");
            } else if !p.four_bit {
                assert!(widest < 64, "{dtype}: code {widest}");
            }
        }
    }

    /// Both layouts of `dtype`'s weights: row-major, then interleaved where it applies.
    fn layouts(dtype: DType, (rows, cols): (usize, usize), data: &[f32]) -> Vec<PackedWeights> {
        crate::with_block_format!(dtype, B => {
            let q = QuantMatrix::<B>::quantize(rows, cols, data).unwrap();
            std::iter::once(PackedWeights::row_major(&q))
                .chain(PackedWeights::interleaved(&q))
                .collect()
        }, _ => unreachable!("{dtype} is a block format"))
    }

    /// `p` with its metadata in the other width: f16 → f32 always, f32 → f16 where
    /// every value is exact (None otherwise).
    fn other_width(p: &PackedWeights) -> Option<PackedWeights> {
        let meta = match &p.meta {
            Meta::F16 { scales, mins } => {
                let wide = |v: &[f16]| v.iter().map(|h| h.to_f32()).collect();
                Meta::F32 {
                    scales: wide(scales),
                    mins: wide(mins),
                }
            }
            Meta::F32 { scales, mins } => {
                let exact = |v: &[f32]| v.iter().all(|&x| f16::from_f32(x).to_f32() == x);
                if !exact(scales) || !exact(mins) {
                    return None;
                }
                let half = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect();
                Meta::F16 {
                    scales: half(scales),
                    mins: half(mins),
                }
            }
        };
        Some(PackedWeights { meta, ..p.clone() })
    }

    /// f16 metadata holds the same values as f32 (it is chosen only where exact), so every
    /// kernel, in either layout, must give bit-identical outputs from either width; and
    /// the 32-weight formats do get f16 here unless the CPU has VNNI.
    #[test]
    fn f16_metadata_matches_f32_metadata_exactly() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (rows, cols, m) = (7, 256, 3);
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-2.0..2.0))
            .collect();
        let x: Vec<f32> = (0..m * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
        for dtype in BLOCK_DTYPES {
            let thirty_two = matches!(
                dtype,
                DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0
            );
            let auto = crate::with_block_format!(dtype,
                B => PackedWeights::new(&QuantMatrix::<B>::quantize(rows, cols, &data).unwrap()),
                _ => unreachable!("{dtype} is a block format")
            );
            let is_f16 = matches!(auto.meta, Meta::F16 { .. });
            let want_f16 = thirty_two && !CpuFeatures::get().avx512_vnni;
            assert_eq!(is_f16, want_f16, "{dtype}");
            for p in layouts(dtype, (rows, cols), &data) {
                let Some(q) = other_width(&p) else {
                    assert!(!thirty_two, "{dtype}: its scales are f16 values");
                    continue;
                };
                for isa in Isa::available() {
                    let run = |w: &PackedWeights| {
                        apply(&x, (m, cols, rows), |x, y| qmatmul_int8(isa, 1, w, x, y))
                    };
                    let (a, b) = (run(&p), run(&q));
                    let at = format!("{dtype} {isa} interleaved {}", p.interleaved);
                    assert!(a.iter().all(|v| v.is_finite()), "{at}");
                    assert_eq!(a, b, "{at}");
                }
            }
        }
    }

    /// The packed copy stands in for the blocks (`qmatmul_packed`, an engine's embedding
    /// rows), so its rows must be the format's values bit for bit, and its prefill the
    /// block path's, in either layout; with outliers, so K-quant sub-scales span their
    /// range.
    #[test]
    fn packed_rows_are_the_formats_values() {
        use crate::ops::qmatmul::{qmatmul, qmatmul_packed};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let (rows, cols, m) = (9, 512, 20);
        let data: Vec<f32> = (0..rows * cols)
            .map(|i| rng.random_range(-1.0f32..1.0) * if i % 61 == 0 { 30.0 } else { 1.0 })
            .collect();
        let x: Vec<f32> = (0..m * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
        let isa = Isa::best();
        for dtype in BLOCK_DTYPES {
            let (want, y_blocks) = crate::with_block_format!(dtype, B => {
                let q = QuantMatrix::<B>::quantize(rows, cols, &data).unwrap();
                let y = apply(&x, (m, cols, rows), |x, y| qmatmul(isa, 2, &q, x, y));
                (q.dequantize(), y)
            }, _ => unreachable!("{dtype} is a block format"));
            for p in layouts(dtype, (rows, cols), &data) {
                let at = format!("{dtype} interleaved {}", p.interleaved);
                let mut row = vec![f32::NAN; cols];
                for r in 0..rows {
                    p.dequantize_row(r, &mut row);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&row),
                        bits(&want[r * cols..(r + 1) * cols]),
                        "{at} row {r}"
                    );
                }
                let y = apply(&x, (m, cols, rows), |x, y| qmatmul_packed(isa, 2, &p, x, y));
                assert_eq!(y, y_blocks, "{at}: prefill over packed rows");
                let short = TensorView::contiguous(&x[..m * (cols - QK)], &[m, cols - QK]).unwrap();
                let mut y = vec![0f32; m * rows];
                let mut yv = TensorViewMut::contiguous(&mut y, &[m, rows]).unwrap();
                assert!(
                    qmatmul_packed(isa, 2, &p, &short, &mut yv).is_err(),
                    "{at}: K"
                );
                assert!(
                    p.size_bytes() > 0 && p.size_bytes() < rows * cols * 2,
                    "{at}"
                );
            }
        }
    }

    /// The interleaved kernel against the portable integer kernel on the row-major
    /// layout, over ragged groups (1, 7, 9, 17 rows: padding in the last group), odd
    /// chunk counts (K = 96), every activation-row count of a call (1–4, and 6 = 4 + 2),
    /// and 1 or 3 threads (groups split across tasks); NaN-poisoned outputs, and a NaN
    /// activation reaching exactly its row.
    #[test]
    fn interleaved_kernel_matches_portable() {
        if !Isa::Avx2.is_available() {
            eprintln!("skipped: no AVX2");
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        let mut formats = 0;
        for dtype in BLOCK_DTYPES {
            let ks: &[usize] = if dtype.block_size() == QK {
                &[96, 320]
            } else {
                &[256, 512]
            };
            for (&rows, &k) in [1, 7, 9, 17].iter().zip(ks.iter().cycle()) {
                let data: Vec<f32> = (0..rows * k).map(|_| rng.random_range(-1.0..1.0)).collect();
                let [row_major, interleaved] = &layouts(dtype, (rows, k), &data)[..] else {
                    continue;
                };
                formats += usize::from(rows == 1);
                for m in [1, 2, 3, 4, 6] {
                    let mut x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
                    let want = apply(&x, (m, k, rows), |x, y| {
                        qmatmul_int8(Isa::Scalar, 1, row_major, x, y)
                    });
                    let scale: f32 = x.iter().map(|v| v.abs()).sum::<f32>() / m as f32;
                    for threads in [1, 3] {
                        let got = apply(&x, (m, k, rows), |x, y| {
                            qmatmul_int8(Isa::Avx2, threads, interleaved, x, y)
                        });
                        for (g, w) in got.iter().zip(&want) {
                            assert!(
                                (g - w).abs() <= 1e-5 * scale,
                                "{dtype} {rows}x{k} m {m}: {g} vs {w}"
                            );
                        }
                    }
                    x[(m - 1) * k + k / 2] = f32::NAN;
                    let got = apply(&x, (m, k, rows), |x, y| {
                        qmatmul_int8(Isa::Avx2, 2, interleaved, x, y)
                    });
                    let (before, last) = got.split_at((m - 1) * rows);
                    assert!(before.iter().all(|v| v.is_finite()), "{dtype} m {m}");
                    assert!(last.iter().all(|v| v.is_nan()), "{dtype} m {m}");
                }
            }
        }
        // Q4_0, Q4_1, Q4_K and the three group formats.
        assert_eq!(formats, 6);
    }

    /// Full-range 8-bit codes against full-range activations: rows and activation rows
    /// of ±max in several sign patterns, where a plain unsigned×signed multiply would
    /// saturate (2·255·127 > 2¹⁵), must match the portable integer kernel.
    #[test]
    fn full_byte_codes_do_not_saturate() {
        if !Isa::Avx2.is_available() {
            eprintln!("skipped: no AVX2");
            return;
        }
        let k = 256;
        // Pattern p's sign at j: all +, all −, pairs alternating, singles alternating.
        let sign = |p: usize, j: usize| match p {
            0 => 1.0f32,
            1 => -1.0,
            2 => [1.0, -1.0][(j / 2) % 2],
            _ => [1.0, -1.0][j % 2],
        };
        let pattern =
            |n: usize| -> Vec<f32> { (0..n * k).map(|i| sign(i / k % 4, i % k)).collect() };
        let (w, x) = (pattern(4), pattern(4));
        let q8_0 = PackedWeights::new(&QuantMatrix::<BlockQ8_0>::quantize(4, k, &w).unwrap());
        let q8_k = PackedWeights::new(&QuantMatrix::<BlockQ8K>::quantize(4, k, &w).unwrap());
        for w in [&q8_0, &q8_k] {
            let run = |isa| apply(&x, (4, k, 4), |x, y| qmatmul_int8(isa, 1, w, x, y));
            let (fast, portable) = (run(Isa::Avx2), run(Isa::Scalar));
            for (f, p) in fast.iter().zip(&portable) {
                assert!(
                    (f - p).abs() <= 1e-5 * p.abs().max(1.0),
                    "{fast:?} vs {portable:?}"
                );
            }
            // Equal patterns dot to ±k: the saturating cases are really there.
            assert!(
                (portable[0] - k as f32).abs() < 1e-2 * k as f32,
                "{portable:?}"
            );
        }
    }
}
