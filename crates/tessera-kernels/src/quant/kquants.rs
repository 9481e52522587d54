//! ggml's K-quants: 256-weight super-blocks, bit-exact with GGUF files as llama.cpp
//! writes them.
//!
//! | format | sub-blocks | value | bits/weight |
//! |---|---|---|---|
//! | Q2_K | 16 × 16 | `d·sc·q − dmin·mn`, q ∈ 0..4, sc/mn 4-bit | 2.625 |
//! | Q3_K | 16 × 16 | `d·(sc − 32)·(q − 4)`, q ∈ 0..8, sc 6-bit | 3.4375 |
//! | Q4_K | 8 × 32 | `d·sc·q − dmin·mn`, q ∈ 0..16, sc/mn 6-bit | 4.5 |
//! | Q5_K | 8 × 32 | `d·sc·q − dmin·mn`, q ∈ 0..32, sc/mn 6-bit | 5.5 |
//! | Q6_K | 16 × 16 | `d·sc·(q − 32)`, q ∈ 0..64, sc int8 | 6.5625 |
//! | Q8_K | 1 × 256 | `d·q`, d f32, plus 16-value sums | 9.125 |
//!
//! d and dmin are f16; each sub-block's scale (and minimum) is a small integer times them,
//! so `d·sc` and `dmin·mn` are exact in f32 and dequantizing is one rounding per weight,
//! exactly as llama.cpp's `dequantize_row_*`. The bit layouts (which byte and bit holds
//! weight e) are written once, in each format's [`BlockFormat::unsigned`], and
//! everything else (dequantization, the integer kernels' repacking) reads through it.
//! Weight e of a super-block lives in 32-weight chunk `e / 32`; chunks pair up (Q4_K/Q5_K:
//! chunk 2p in the low nibbles of bytes 32p.., chunk 2p+1 in the high) or stack four deep
//! in 2-bit planes (Q2_K/Q3_K: chunk 4h + j in bits 2j of bytes 32h..).
//!
//! Quantizers (`super::kquantize`) follow llama.cpp's reference quantizers step for step.
//! Non-finite input gives a block whose scales are NaN (so it dequantizes to NaN).

use super::ggml::{dequantize_chunk, BlockFormat, FactoredScales, SplitScales, QK};
use super::kquantize as kq;
use half::f16;
use tessera_core::DType;

/// Weights per super-block.
pub const QK_K: usize = 256;

/// Q2_K: 16 sub-blocks of 16, 2-bit weights, 4-bit scales and minima.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ2K {
    /// Sub-block j: scale in the low nibble, minimum in the high.
    pub scales: [u8; QK_K / 16],
    /// 2-bit codes, four per byte.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale.
    pub d: f16,
    /// Super-block minimum scale.
    pub dmin: f16,
}

/// Q3_K: 16 sub-blocks of 16, 3-bit weights (2 low bits in `qs`, the third in `hmask`),
/// 6-bit scales packed in 12 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ3K {
    /// Bit c of byte l: the high bit of weight 32c + l.
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of the 3-bit codes, four per byte.
    pub qs: [u8; QK_K / 4],
    /// 16 packed 6-bit sub-block scales.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}

/// Q4_K: 8 sub-blocks of 32, 4-bit weights, 6-bit scales and minima packed in 12 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    /// Super-block scale.
    pub d: f16,
    /// Super-block minimum scale.
    pub dmin: f16,
    /// 8 packed 6-bit sub-block scales and 8 minimums.
    pub scales: [u8; 12],
    /// 4-bit codes, two per byte.
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: Q4_K plus a fifth bit per weight (bit c of `qh[l]` for weight 32c + l).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5K {
    /// Super-block scale.
    pub d: f16,
    /// Super-block minimum scale.
    pub dmin: f16,
    /// 8 packed 6-bit sub-block scales and 8 minimums.
    pub scales: [u8; 12],
    /// Fifth bits of the codes.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits of the codes, two per byte.
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 16 sub-blocks of 16, 6-bit weights (low nibbles in `ql`, 2-bit planes in
/// `qh`), int8 scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    /// Low 4 bits of the 6-bit codes, two per byte.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the codes, four per byte.
    pub qh: [u8; QK_K / 4],
    /// Signed 8-bit sub-block scales, one per 16 weights.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}

/// Q8_K: 256 int8 values with an f32 scale and the sums of each 16 (llama.cpp quantizes
/// activations to it for its K-quant dot products).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    /// Scale (f32, unlike the weight formats).
    pub d: f32,
    /// Signed 8-bit values.
    pub qs: [i8; QK_K],
    /// Sums of each 16 values (for the minimum terms of the dot products).
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ2K>() == DType::Q2_K.size_bytes());
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == DType::Q3_K.size_bytes());
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == DType::Q4_K.size_bytes());
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == DType::Q5_K.size_bytes());
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == DType::Q6_K.size_bytes());
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == DType::Q8_K.size_bytes());

/// The 6-bit (scale, minimum) of Q4_K/Q5_K sub-block j from the 12 packed bytes: the
/// first four pairs whole in bytes 0..8, the last four split into a nibble in bytes
/// 8..12 and two high bits on top of bytes 0..8.
#[inline(always)]
pub(super) fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The 6-bit scale of Q3_K sub-block j (0..64; the value is it − 32): low nibble from
/// bytes 0..8, two high bits from bytes 8..12.
#[inline(always)]
pub(super) fn scale_q3k(j: usize, q: &[u8; 12]) -> i32 {
    let low = if j < 8 { q[j] & 0xF } else { q[j - 8] >> 4 };
    (low | (((q[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i32
}

/// The 2-bit plane of chunk c: bits 2·(c mod 4) of bytes 32·(c / 4)...
fn plane2(qs: &[u8; QK_K / 4], c: usize, u: &mut [u8; QK]) {
    let (bytes, shift) = (&qs[QK * (c / 4)..][..QK], 2 * (c % 4));
    for (u, &b) in u.iter_mut().zip(bytes) {
        *u = (b >> shift) & 3;
    }
}

/// The nibble plane of chunk c: low (even c) or high (odd c) nibbles of bytes 32·(c / 2)...
fn plane4(qs: &[u8; QK_K / 2], c: usize, u: &mut [u8; QK]) {
    let (bytes, shift) = (&qs[QK * (c / 2)..][..QK], 4 * (c % 2));
    for (u, &b) in u.iter_mut().zip(bytes) {
        *u = (b >> shift) & 0xF;
    }
}

/// Bit c of each of the 32 `bits` bytes, shifted to `at`, OR'd into u.
fn or_bit(bits: &[u8; QK_K / 8], c: usize, at: u32, u: &mut [u8; QK]) {
    for (u, &b) in u.iter_mut().zip(bits) {
        *u |= ((b >> c) & 1) << at;
    }
}

/// What the K-quants share: codes per 32-weight chunk and (d, m) per 16-weight half,
/// from which [`BlockFormat::dequantize`] and [`BlockFormat::unsigned`] are built (and
/// the SIMD kernels decode the scales once per super-block).
pub trait KQuant: BlockFormat {
    /// Chunk c's unsigned codes u (value = (u − OFFSET)·d + m), in element order.
    fn codes(&self, c: usize, u: &mut [u8; QK]);
    /// (d, m) of each 16-weight half; halves 2j and 2j+1 are equal in the formats with
    /// 32-weight sub-blocks.
    fn half_scales(&self) -> [(f32, f32); 16];
}

/// `(u − o)·d (+ m)`, one rounding, as llama.cpp's `dequantize_row_*`; the scales are
/// decoded once per super-block.
fn dequantize_k<B: KQuant>(b: &B, out: &mut [f32]) {
    assert_eq!(out.len(), B::BLOCK, "{} block", B::DTYPE);
    let halves = b.half_scales();
    let mut u = [0u8; QK];
    for (c, o) in out.chunks_exact_mut(QK).enumerate() {
        b.codes(c, &mut u);
        dequantize_chunk::<B>(&u, [halves[2 * c], halves[2 * c + 1]], o);
    }
}

fn check_len(x: &[f32]) -> &[f32; QK_K] {
    x.try_into().expect("a 256-weight super-block")
}

/// The `BlockFormat` items every K-quant derives from its [`KQuant`] impl.
macro_rules! kquant_block_format {
    ($quantize:path) => {
        const BLOCK: usize = QK_K;
        fn quantize(x: &[f32]) -> Self {
            $quantize(check_len(x))
        }
        fn dequantize(&self, out: &mut [f32]) {
            dequantize_k(self, out)
        }
        fn unsigned(&self, c: usize, u: &mut [u8; QK]) -> [(f32, f32); 2] {
            self.codes(c, u);
            let h = self.half_scales();
            [h[2 * c], h[2 * c + 1]]
        }
    };
}

impl BlockFormat for BlockQ2K {
    const DTYPE: DType = DType::Q2_K;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    const NIBBLES: bool = true;
    const SPLIT16: bool = true;
    const SPLIT_I8_SCALES: bool = true;
    kquant_block_format!(kq::q2_k);
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite() && self.dmin.is_finite()
    }
    fn split_scales(&self) -> Option<SplitScales> {
        // 4-bit sc and mn: a byte's low and high nibble.
        Some(SplitScales {
            d: self.d,
            sc: self.scales.map(|s| (s & 0xF) as i8),
            mins: Some((-self.dmin, self.scales.map(|s| (s >> 4) as i8))),
        })
    }
}

impl KQuant for BlockQ2K {
    #[inline]
    fn codes(&self, c: usize, u: &mut [u8; QK]) {
        plane2(&self.qs, c, u);
    }
    #[inline(always)]
    fn half_scales(&self) -> [(f32, f32); 16] {
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        self.scales
            .map(|s| (d * (s & 0xF) as f32, -(dmin * (s >> 4) as f32)))
    }
}

impl BlockFormat for BlockQ3K {
    const DTYPE: DType = DType::Q3_K;
    const OFFSET: i32 = 4;
    const NIBBLES: bool = true;
    const SPLIT16: bool = true;
    const SPLIT_I8_SCALES: bool = true;
    kquant_block_format!(kq::q3_k);
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite()
    }
    fn split_scales(&self) -> Option<SplitScales> {
        Some(SplitScales {
            d: self.d,
            // 6-bit sc − 32 ∈ −32..32.
            sc: std::array::from_fn(|j| (scale_q3k(j, &self.scales) - 32) as i8),
            mins: None,
        })
    }
}

impl KQuant for BlockQ3K {
    #[inline]
    fn codes(&self, c: usize, u: &mut [u8; QK]) {
        plane2(&self.qs, c, u);
        or_bit(&self.hmask, c, 2, u);
    }
    #[inline(always)]
    fn half_scales(&self) -> [(f32, f32); 16] {
        let d = self.d.to_f32();
        std::array::from_fn(|j| (d * (scale_q3k(j, &self.scales) - 32) as f32, 0.0))
    }
}

/// Q4_K/Q5_K's (d·sc, −dmin·mn) per half (each 32-weight sub-block's twice).
#[inline(always)]
fn k4_scales(d: f16, dmin: f16, scales: &[u8; 12]) -> [(f32, f32); 16] {
    let (d, dmin) = (d.to_f32(), dmin.to_f32());
    std::array::from_fn(|h| {
        let (sc, mn) = scale_min_k4(h / 2, scales);
        (d * sc as f32, -(dmin * mn as f32))
    })
}

/// Q4_K and Q5_K's scales as [`FactoredScales`]: d·sc and (−dmin)·mn per chunk.
fn k4_factored(d: f16, dmin: f16, scales: &[u8; 12]) -> FactoredScales {
    FactoredScales {
        d,
        neg_dmin: -dmin,
        chunks: std::array::from_fn(|c| scale_min_k4(c, scales)),
    }
}

impl BlockFormat for BlockQ4K {
    const DTYPE: DType = DType::Q4_K;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    const NIBBLES: bool = true;
    kquant_block_format!(kq::q4_k);
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite() && self.dmin.is_finite()
    }
    fn factored_scales(&self) -> Option<FactoredScales> {
        Some(k4_factored(self.d, self.dmin, &self.scales))
    }
}

impl KQuant for BlockQ4K {
    #[inline]
    fn codes(&self, c: usize, u: &mut [u8; QK]) {
        plane4(&self.qs, c, u);
    }
    #[inline(always)]
    fn half_scales(&self) -> [(f32, f32); 16] {
        k4_scales(self.d, self.dmin, &self.scales)
    }
}

impl BlockFormat for BlockQ5K {
    const DTYPE: DType = DType::Q5_K;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    kquant_block_format!(kq::q5_k);
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite() && self.dmin.is_finite()
    }
    fn factored_scales(&self) -> Option<FactoredScales> {
        // Q4_K's scale fields exactly; only the codes gain a fifth bit.
        Some(k4_factored(self.d, self.dmin, &self.scales))
    }
}

impl KQuant for BlockQ5K {
    #[inline]
    fn codes(&self, c: usize, u: &mut [u8; QK]) {
        plane4(&self.qs, c, u);
        or_bit(&self.qh, c, 4, u);
    }
    #[inline(always)]
    fn half_scales(&self) -> [(f32, f32); 16] {
        k4_scales(self.d, self.dmin, &self.scales)
    }
}

impl BlockFormat for BlockQ6K {
    const DTYPE: DType = DType::Q6_K;
    const OFFSET: i32 = 32;
    const SPLIT16: bool = true;
    const SPLIT_I8_SCALES: bool = true;
    kquant_block_format!(kq::q6_k);
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite()
    }
    fn split_scales(&self) -> Option<SplitScales> {
        Some(SplitScales {
            d: self.d,
            sc: self.scales,
            mins: None,
        })
    }
}

impl KQuant for BlockQ6K {
    #[inline]
    fn codes(&self, c: usize, u: &mut [u8; QK]) {
        // Chunk c = 4h + k: low nibbles from ql[64h + 32·(k mod 2)..] (high nibbles for
        // k ≥ 2), top two bits from bits 2k of qh[32h..].
        let (h, k) = (c / 4, c % 4);
        let ql = &self.ql[64 * h + QK * (k % 2)..][..QK];
        let qh = &self.qh[QK * h..][..QK];
        for ((u, &l), &hb) in u.iter_mut().zip(ql).zip(qh) {
            *u = ((l >> (4 * (k / 2))) & 0xF) | (((hb >> (2 * k)) & 3) << 4);
        }
    }
    #[inline(always)]
    fn half_scales(&self) -> [(f32, f32); 16] {
        let d = self.d.to_f32();
        self.scales.map(|s| (d * s as f32, 0.0))
    }
}

impl BlockFormat for BlockQ8K {
    const DTYPE: DType = DType::Q8_K;
    const OFFSET: i32 = 128;
    kquant_block_format!(kq::q8_k);
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite()
    }
}

impl KQuant for BlockQ8K {
    #[inline]
    fn codes(&self, c: usize, u: &mut [u8; QK]) {
        for (o, &q) in u.iter_mut().zip(&self.qs[QK * c..][..QK]) {
            *o = (q as u8) ^ 0x80; // q + 128
        }
    }
    #[inline(always)]
    fn half_scales(&self) -> [(f32, f32); 16] {
        [(self.d, 0.0); 16]
    }
}
