//! The [`BlockFormat`] trait, and ggml's 32-weight formats Q4_0, Q4_1, Q5_0, Q5_1 and
//! Q8_0, bit-exact with GGUF files as llama.cpp writes them: 32 weights per block, an f16
//! scale `d` (and for Q4_1/Q5_1 an f16 minimum `m`). The K-quants are in `super::kquants`.
//!
//! Quantization follows llama.cpp's reference quantizer step for step (scale from the
//! block's extreme value in f32, reciprocal from the *unrounded* scale, truncating
//! conversions), so a block quantized here equals the one llama.cpp would write.
//! Dequantization is the format's definition: Q4_0 `(q − 8)·d`, Q4_1 `q·d + m`,
//! Q5_0 `(q − 16)·d`, Q5_1 `q·d + m`, Q8_0 `q·d`; 4-bit weight j < 16 is the low nibble of
//! byte j, weight j + 16 the high; the 5-bit formats keep the fifth bits of all 32 weights
//! in a little-endian u32 `qh` (bit j for weight j).
//!
//! Non-finite input (which llama.cpp does not define) gives a block whose scale is NaN,
//! so every weight of it dequantizes to NaN: bad weights are visible, never silent.

use half::f16;
use tessera_core::DType;

/// Weights per block of the 32-weight formats, and per chunk of the integer kernels.
pub const QK: usize = 32;

/// A ggml block format: plain-old-data, every bit pattern valid.
///
/// Slices passed to [`BlockFormat::quantize`] and [`BlockFormat::dequantize`] hold exactly
/// [`BlockFormat::BLOCK`] values (they panic otherwise, like slice indexing);
/// [`super::QuantMatrix`] is the checked interface.
pub trait BlockFormat: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The runtime tag of this format.
    const DTYPE: DType;
    /// Weights per block: 32, or 256 for the K-quants' super-blocks.
    const BLOCK: usize;
    /// o in value = (u − o)·d + m for the bytes [`BlockFormat::unsigned`] gives.
    const OFFSET: i32;
    /// Whether the format has a minimum m (else m = 0).
    const HAS_MIN: bool = false;
    /// Whether u fits in 4 bits (packable two weights per byte).
    const NIBBLES: bool = false;
    /// Whether the two 16-weight halves of a 32-weight chunk have their own scales
    /// (Q2_K, Q3_K and Q6_K's 16-weight sub-blocks).
    const SPLIT16: bool = false;
    /// Quantizes one block as llama.cpp's reference quantizer does.
    fn quantize(x: &[f32]) -> Self;
    /// The values the block defines.
    fn dequantize(&self, out: &mut [f32]);
    /// Whether the f16 scale (and minimum) are finite.
    fn scale_is_finite(&self) -> bool;
    /// 32-weight chunk `c` (< BLOCK/32) as unsigned bytes u in element order, with (d, m)
    /// for each 16-weight half: value = (u − OFFSET)·d + m (Q8_0 stores u = q + 128).
    /// For the integer kernels; d and m are exact products of the stored fields.
    fn unsigned(&self, c: usize, u: &mut [u8; QK]) -> [(f32, f32); 2];
    /// For super-blocks whose 8 chunk scales and minima are small integers times one f16
    /// each (Q4_K, Q5_K: d·sc and (−dmin)·mn, sc and mn < 64): (d, −dmin, per chunk (sc, mn)),
    /// whose products are exactly [`BlockFormat::unsigned`]'s (d, m). None otherwise.
    fn factored_scales(&self) -> Option<FactoredScales> {
        None
    }
    /// Whether [`BlockFormat::split_scales`] gives this format's half scales.
    const SPLIT_I8_SCALES: bool = false;
    /// For super-blocks whose 16 half scales are each an i8 times one f16 (Q3_K:
    /// d·(sc − 32), Q6_K: d·sc, Q2_K: d·sc with minima (−dmin)·mn): (d, per half the i8,
    /// and the minima's), whose products are exactly [`BlockFormat::unsigned`]'s (d, m).
    /// None unless [`BlockFormat::SPLIT_I8_SCALES`].
    fn split_scales(&self) -> Option<SplitScales> {
        None
    }
}

/// A super-block's scales as [`BlockFormat::split_scales`] gives them.
#[derive(Clone, Copy, Debug)]
pub struct SplitScales {
    /// The super-block scale the sub-block scales multiply.
    pub d: f16,
    /// Per 16-weight half, in element order.
    pub sc: [i8; 16],
    /// For formats with minima (Q2_K): −dmin and, per half, the integer it multiplies
    /// (m = (−dmin)·mn, exact in f32).
    pub mins: Option<(f16, [i8; 16])>,
}

/// A super-block's scales as [`BlockFormat::factored_scales`] gives them.
#[derive(Clone, Copy, Debug)]
pub struct FactoredScales {
    /// The super-block scale.
    pub d: f16,
    /// Minus the super-block minimum scale.
    pub neg_dmin: f16,
    /// Per 32-weight chunk: (sc, mn).
    pub chunks: [(u8, u8); 8],
}

/// Chunk values `(u − B::OFFSET)·d (+ m)`, (d, m) per 16-weight half, one rounding per
/// weight (formats without a minimum skip the add: adding 0 would turn −0 into +0).
pub(super) fn dequantize_chunk<B: BlockFormat>(
    u: &[u8; QK],
    halves: [(f32, f32); 2],
    out: &mut [f32],
) {
    for (j, (o, &u)) in out.iter_mut().zip(u).enumerate() {
        let (d, m) = halves[j / 16];
        let v = (u as i32 - B::OFFSET) as f32 * d;
        *o = if B::HAS_MIN { v + m } else { v };
    }
}

/// `x` as one 32-weight block (the legacy formats' whole block).
fn block32(x: &[f32]) -> &[f32; QK] {
    x.try_into().expect("a 32-weight block")
}
fn block32_mut(x: &mut [f32]) -> &mut [f32; QK] {
    x.try_into().expect("a 32-weight block")
}

/// The 32 nibbles of a 4-bit block in element order.
fn nibbles(qs: &[u8; QK / 2], u: &mut [u8; QK]) {
    for (j, &q) in qs.iter().enumerate() {
        u[j] = q & 0xF;
        u[j + QK / 2] = q >> 4;
    }
}

/// `(q − 8)·d`, q ∈ 0..16: 4.5 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// 4-bit codes, two per byte (low nibbles: weights 0..16, high: 16..32).
    pub qs: [u8; QK / 2],
}

/// `q·d + m`, q ∈ 0..16: 5 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum.
    pub m: f16,
    /// 4-bit codes, two per byte (low nibbles: weights 0..16, high: 16..32).
    pub qs: [u8; QK / 2],
}

/// `q·d`, q ∈ −127..=127: 8.5 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Signed 8-bit codes.
    pub qs: [i8; QK],
}

/// `(q − 16)·d`, q ∈ 0..32: 5.5 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bits of the 32 codes.
    pub qh: [u8; 4],
    /// Low 4 bits of the codes, two per byte.
    pub qs: [u8; QK / 2],
}

/// `q·d + m`, q ∈ 0..32: 6 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum.
    pub m: f16,
    /// Fifth bits of the 32 codes.
    pub qh: [u8; 4],
    /// Low 4 bits of the codes, two per byte.
    pub qs: [u8; QK / 2],
}

// The GGUF byte sizes, which the casts in `super::blocks_from_bytes` rely on.
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == DType::Q4_0.size_bytes());
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == DType::Q4_1.size_bytes());
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == DType::Q8_0.size_bytes());
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == DType::Q5_0.size_bytes());
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == DType::Q5_1.size_bytes());

/// NaN when any input is NaN or ±∞, else `d`.
fn poisoned(x: &[f32; QK], d: f32) -> f32 {
    if x.iter().all(|v| v.is_finite()) {
        d
    } else {
        f32::NAN
    }
}

/// C's `(int8_t)v` for the in-range values the quantizers produce (truncation).
fn trunc_i8(v: f32) -> i32 {
    v as i8 as i32
}

impl BlockFormat for BlockQ4_0 {
    const DTYPE: DType = DType::Q4_0;
    const BLOCK: usize = QK;
    const OFFSET: i32 = 8;
    const NIBBLES: bool = true;
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite()
    }
    fn unsigned(&self, _: usize, u: &mut [u8; QK]) -> [(f32, f32); 2] {
        nibbles(&self.qs, u);
        [(self.d.to_f32(), 0.0); 2]
    }
    fn quantize(x: &[f32]) -> Self {
        let x = block32(x);
        // The signed value of largest magnitude maps to −8 (the first one on ties).
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for (j, q) in qs.iter_mut().enumerate() {
            let lo = trunc_i8(x[j] * id + 8.5).min(15);
            let hi = trunc_i8(x[j + QK / 2] * id + 8.5).min(15);
            *q = (lo | (hi << 4)) as u8;
        }
        BlockQ4_0 {
            d: f16::from_f32(poisoned(x, d)),
            qs,
        }
    }
    fn dequantize(&self, out: &mut [f32]) {
        let out = block32_mut(out);
        let d = self.d.to_f32();
        for (j, &q) in self.qs.iter().enumerate() {
            out[j] = ((q & 0xF) as i32 - 8) as f32 * d;
            out[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

impl BlockFormat for BlockQ4_1 {
    const DTYPE: DType = DType::Q4_1;
    const BLOCK: usize = QK;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    const NIBBLES: bool = true;
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite() && self.m.is_finite()
    }
    fn unsigned(&self, _: usize, u: &mut [u8; QK]) -> [(f32, f32); 2] {
        nibbles(&self.qs, u);
        [(self.d.to_f32(), self.m.to_f32()); 2]
    }
    fn quantize(x: &[f32]) -> Self {
        let x = block32(x);
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for (j, q) in qs.iter_mut().enumerate() {
            let lo = trunc_i8((x[j] - min) * id + 0.5).min(15);
            let hi = trunc_i8((x[j + QK / 2] - min) * id + 0.5).min(15);
            *q = (lo | (hi << 4)) as u8;
        }
        BlockQ4_1 {
            d: f16::from_f32(poisoned(x, d)),
            m: f16::from_f32(min),
            qs,
        }
    }
    fn dequantize(&self, out: &mut [f32]) {
        let out = block32_mut(out);
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (j, &q) in self.qs.iter().enumerate() {
            out[j] = (q & 0xF) as f32 * d + m;
            out[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }
}

impl BlockFormat for BlockQ8_0 {
    const DTYPE: DType = DType::Q8_0;
    const BLOCK: usize = QK;
    const OFFSET: i32 = 128;
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite()
    }
    fn unsigned(&self, _: usize, u: &mut [u8; QK]) -> [(f32, f32); 2] {
        for (o, &q) in u.iter_mut().zip(&self.qs) {
            *o = (q as u8) ^ 0x80; // q + 128
        }
        [(self.d.to_f32(), 0.0); 2]
    }
    fn quantize(x: &[f32]) -> Self {
        let x = block32(x);
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // roundf: half away from zero, as Rust's `round`; |x·id| ≤ 127 by construction.
        let qs = std::array::from_fn(|j| (x[j] * id).round() as i8);
        BlockQ8_0 {
            d: f16::from_f32(poisoned(x, d)),
            qs,
        }
    }
    fn dequantize(&self, out: &mut [f32]) {
        let out = block32_mut(out);
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Packs 32 five-bit values: low nibbles as in the 4-bit formats, fifth bits in `qh`.
fn pack5(q: &[i32; QK]) -> ([u8; 4], [u8; QK / 2]) {
    let mut qh = 0u32;
    let mut qs = [0u8; QK / 2];
    for j in 0..QK / 2 {
        qs[j] = ((q[j] & 0xF) | ((q[j + QK / 2] & 0xF) << 4)) as u8;
        qh |= (((q[j] >> 4) & 1) as u32) << j;
        qh |= (((q[j + QK / 2] >> 4) & 1) as u32) << (j + QK / 2);
    }
    (qh.to_le_bytes(), qs)
}

/// The 32 five-bit values of a block, in element order.
fn unpack5(qh: &[u8; 4], qs: &[u8; QK / 2], u: &mut [u8; QK]) {
    let qh = u32::from_le_bytes(*qh);
    nibbles(qs, u);
    for (j, v) in u.iter_mut().enumerate() {
        *v |= (((qh >> j) & 1) as u8) << 4;
    }
}

impl BlockFormat for BlockQ5_0 {
    const DTYPE: DType = DType::Q5_0;
    const BLOCK: usize = QK;
    const OFFSET: i32 = 16;
    fn quantize(x: &[f32]) -> Self {
        let x = block32(x);
        // As Q4_0 with 32 levels: the extreme value maps to −16.
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = std::array::from_fn(|j| trunc_i8(x[j] * id + 16.5).min(31));
        let (qh, qs) = pack5(&q);
        BlockQ5_0 {
            d: f16::from_f32(poisoned(x, d)),
            qh,
            qs,
        }
    }
    fn dequantize(&self, out: &mut [f32]) {
        let mut u = [0u8; QK];
        let halves = self.unsigned(0, &mut u);
        dequantize_chunk::<Self>(&u, halves, block32_mut(out));
    }
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite()
    }
    fn unsigned(&self, _: usize, u: &mut [u8; QK]) -> [(f32, f32); 2] {
        unpack5(&self.qh, &self.qs, u);
        [(self.d.to_f32(), 0.0); 2]
    }
}

impl BlockFormat for BlockQ5_1 {
    const DTYPE: DType = DType::Q5_1;
    const BLOCK: usize = QK;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    fn quantize(x: &[f32]) -> Self {
        let x = block32(x);
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // llama.cpp does not clamp here ((x − min)·id + 0.5 < 32 by construction); the
        // clamp only keeps non-finite input in range.
        let q = std::array::from_fn(|j| trunc_i8((x[j] - min) * id + 0.5).min(31));
        let (qh, qs) = pack5(&q);
        BlockQ5_1 {
            d: f16::from_f32(poisoned(x, d)),
            m: f16::from_f32(min),
            qh,
            qs,
        }
    }
    fn dequantize(&self, out: &mut [f32]) {
        let mut u = [0u8; QK];
        let halves = self.unsigned(0, &mut u);
        dequantize_chunk::<Self>(&u, halves, block32_mut(out));
    }
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite() && self.m.is_finite()
    }
    fn unsigned(&self, _: usize, u: &mut [u8; QK]) -> [(f32, f32); 2] {
        unpack5(&self.qh, &self.qs, u);
        [(self.d.to_f32(), self.m.to_f32()); 2]
    }
}
