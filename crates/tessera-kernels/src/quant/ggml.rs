//! ggml block formats Q4_0, Q4_1 and Q8_0, bit-exact with GGUF files as llama.cpp writes
//! them: 32 weights per block, an f16 scale `d` (and for Q4_1 an f16 minimum `m`).
//!
//! Quantization follows llama.cpp's reference quantizer step for step (scale from the
//! block's extreme value in f32, reciprocal from the *unrounded* scale, truncating
//! conversions), so a block quantized here equals the one llama.cpp would write.
//! Dequantization is the format's definition: Q4_0 `(q − 8)·d`, Q4_1 `q·d + m`,
//! Q8_0 `q·d`; 4-bit weight j < 16 is the low nibble of byte j, weight j + 16 the high.
//!
//! Non-finite input (which llama.cpp does not define) gives a block whose scale is NaN,
//! so every weight of it dequantizes to NaN: bad weights are visible, never silent.

use half::f16;
use tessera_core::DType;

/// Weights per block in every format here.
pub const QK: usize = 32;

/// A ggml block format: plain-old-data, every bit pattern valid.
pub trait BlockFormat: Copy + Send + Sync + std::fmt::Debug + 'static {
    const DTYPE: DType;
    /// Quantizes one block as llama.cpp's reference quantizer does.
    fn quantize(x: &[f32; QK]) -> Self;
    /// The 32 values the block defines.
    fn dequantize(&self, out: &mut [f32; QK]);
    /// Whether the f16 scale (and minimum) are finite.
    fn scale_is_finite(&self) -> bool;
    /// The block as unsigned bytes u in element order with (d, m): value = (u − o)·d + m,
    /// o being 8 (Q4_0), 0 (Q4_1) or 128 (Q8_0, u = q + 128). For integer kernels.
    fn unsigned(&self, u: &mut [u8; QK]) -> (f32, f32);
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
    pub d: f16,
    pub qs: [u8; QK / 2],
}

/// `q·d + m`, q ∈ 0..16: 5 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}

/// `q·d`, q ∈ −127..=127: 8.5 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}

// The GGUF byte sizes, which the casts in `super::blocks_from_bytes` rely on.
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == DType::Q4_0.size_bytes());
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == DType::Q4_1.size_bytes());
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == DType::Q8_0.size_bytes());

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
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite()
    }
    fn unsigned(&self, u: &mut [u8; QK]) -> (f32, f32) {
        nibbles(&self.qs, u);
        (self.d.to_f32(), 0.0)
    }
    fn quantize(x: &[f32; QK]) -> Self {
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
    fn dequantize(&self, out: &mut [f32; QK]) {
        let d = self.d.to_f32();
        for (j, &q) in self.qs.iter().enumerate() {
            out[j] = ((q & 0xF) as i32 - 8) as f32 * d;
            out[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

impl BlockFormat for BlockQ4_1 {
    const DTYPE: DType = DType::Q4_1;
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite() && self.m.is_finite()
    }
    fn unsigned(&self, u: &mut [u8; QK]) -> (f32, f32) {
        nibbles(&self.qs, u);
        (self.d.to_f32(), self.m.to_f32())
    }
    fn quantize(x: &[f32; QK]) -> Self {
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
    fn dequantize(&self, out: &mut [f32; QK]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (j, &q) in self.qs.iter().enumerate() {
            out[j] = (q & 0xF) as f32 * d + m;
            out[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }
}

impl BlockFormat for BlockQ8_0 {
    const DTYPE: DType = DType::Q8_0;
    fn scale_is_finite(&self) -> bool {
        self.d.is_finite()
    }
    fn unsigned(&self, u: &mut [u8; QK]) -> (f32, f32) {
        for (o, &q) in u.iter_mut().zip(&self.qs) {
            *o = (q as u8) ^ 0x80; // q + 128
        }
        (self.d.to_f32(), 0.0)
    }
    fn quantize(x: &[f32; QK]) -> Self {
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
    fn dequantize(&self, out: &mut [f32; QK]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}
