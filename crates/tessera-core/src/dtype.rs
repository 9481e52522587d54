//! Element types.
//!
//! [`DType`] is the runtime tag the registry, the CLI and file loaders speak; [`Element`]
//! is the compile-time side kernels are generic over. Integer, FP8 and block-quantized
//! formats have tags here already so descriptors can name them; their element types and
//! codecs arrive with the quantization layer.

use half::{bf16, f16};
use std::fmt;

/// A runtime element type tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types)] // ggml's names (Q4_K), which users search for
pub enum DType {
    /// IEEE binary64 (references).
    F64,
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (f32's exponent, 8-bit mantissa).
    BF16,
    /// Signed bytes (INT8 weights and activations).
    I8,
    /// Unsigned bytes.
    U8,
    /// FP8 with 4 exponent bits and 3 mantissa bits (OCP, no infinities).
    F8E4M3,
    /// FP8 with 5 exponent bits and 2 mantissa bits (OCP).
    F8E5M2,
    /// ggml block formats: 32 weights per block with an f16 scale (and minimum).
    /// Q4_0: 4-bit codes, scale only.
    Q4_0,
    /// 4-bit codes, scale and minimum.
    Q4_1,
    /// 5-bit codes, scale only.
    Q5_0,
    /// 5-bit codes, scale and minimum.
    Q5_1,
    /// 8-bit codes, scale only.
    Q8_0,
    /// ggml K-quants: 256-weight super-blocks of 16- or 32-weight sub-blocks whose
    /// scales are themselves quantized against f16 super-scales. Q2_K: 2-bit codes
    /// with 4-bit sub-block scales and minimums.
    Q2_K,
    /// 3-bit codes, 6-bit sub-block scales.
    Q3_K,
    /// 4-bit codes, 6-bit sub-block scales and minimums.
    Q4_K,
    /// 5-bit codes, 6-bit sub-block scales and minimums.
    Q5_K,
    /// 6-bit codes, 8-bit sub-block scales.
    Q6_K,
    /// 256 8-bit values with an f32 scale and 16-value sums (llama.cpp's activations).
    Q8_K,
    /// AWQ/GPTQ-style 4-bit groups of 32, 64 or 128 weights, each with an f16 scale and
    /// a 4-bit zero point. Groups of 32.
    Int4G32,
    /// Groups of 64.
    Int4G64,
    /// Groups of 128.
    Int4G128,
}

impl DType {
    /// Bytes per element; for a block-quantized tag, bytes per block of
    /// [`DType::block_size`] elements.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F64 => 8,
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 | DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::Q8_K => 292,
            DType::Int4G32 => 20,
            DType::Int4G64 => 36,
            DType::Int4G128 => 68,
        }
    }

    /// Elements per storage unit: 1 for scalar types, the block length for block formats.
    pub const fn block_size(self) -> usize {
        match self {
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => 32,
            DType::Int4G32 => 32,
            DType::Int4G64 => 64,
            DType::Int4G128 => 128,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::Q8_K => {
                256
            }
            _ => 1,
        }
    }

    /// Bytes holding `n` elements, or None when `n` is not a whole number of blocks (or
    /// the size overflows).
    pub const fn storage_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.size_bytes())
    }

    /// Lower-case name as used on the command line (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q2_K => "q2_k",
            DType::Q3_K => "q3_k",
            DType::Q4_K => "q4_k",
            DType::Q5_K => "q5_k",
            DType::Q6_K => "q6_k",
            DType::Q8_K => "q8_k",
            DType::Int4G32 => "int4_g32",
            DType::Int4G64 => "int4_g64",
            DType::Int4G128 => "int4_g128",
        }
    }

    /// All tags, for parsing and listing.
    pub const ALL: [DType; 22] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::Int4G32,
        DType::Int4G64,
        DType::Int4G128,
    ];
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        DType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| crate::Error::invalid("dtype", format!("unknown dtype '{s}'")))
    }
}

/// A plain-old-data floating element that kernels can load, convert and store.
///
/// Every bit pattern is a valid value (so zero-filled or arbitrary memory is a valid
/// buffer), which is what lets [`crate::AlignedVec`] hand out zeroed storage safely.
pub trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + Default + 'static {
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// Widens (exact for every element type).
    fn to_f32(self) -> f32;
    /// Rounds to nearest even.
    fn from_f32(v: f32) -> Self;
    /// Widens to f64 (exact).
    fn to_f64(self) -> f64;
    /// Round from f64 (through f32 for the 16-bit types: a double rounding that is
    /// at most half an ulp of the narrow type off, irrelevant for test data).
    fn from_f64(v: f64) -> Self;
    /// The slice itself when `Self` is f32 (lets kernels skip a widening copy).
    fn as_f32_slice(s: &[Self]) -> Option<&[f32]> {
        let _ = s;
        None
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn as_f32_slice(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
}

impl Element for f64 {
    const DTYPE: DType = DType::F64;
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}

// f16 → f32 in plain integer and float ops, so it vectorizes inside kernels (`half`'s
// conversion detects F16C at run time and is a call per element there: paged decode
// attention over an f16 KV cache ran at 2 % of DRAM on AVX2 that way). The exponent and
// mantissa bits shifted into an f32 read as the value × 2^-112, subnormals included;
// one exact multiply restores it, and exponent 31 (∞/NaN) is forced to 255 afterwards.
impl Element for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        let h = self.to_bits() as u32;
        let scaled = f32::from_bits(((h & 0x8000) << 16) | ((h & 0x7FFF) << 13));
        let v = scaled * f32::from_bits((127 + 112) << 23);
        let special = if h & 0x7C00 == 0x7C00 { 0x7F80_0000 } else { 0 };
        f32::from_bits(v.to_bits() | special)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f32(v as f32)
    }
}

// bf16 → f32 is exact as a 16-bit shift (NaNs stay NaN); written out because it then
// vectorizes inside kernels, where `half`'s NaN-quieting branch does not.
impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    fn from_f64(v: f64) -> Self {
        bf16::from_f32(v as f32)
    }
}

// Signed bytes as plain integers: the codes of a scaled int8 store (an int8 KV cache
// keeps one f32 scale per row beside them), so widening is the integer's value and
// rounding saturates to ±127 (−128 is left out so a code's negation is a code).
impl Element for i8 {
    const DTYPE: DType = DType::I8;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn from_f32(v: f32) -> Self {
        v.round_ties_even().clamp(-127.0, 127.0) as i8
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v.round_ties_even().clamp(-127.0, 127.0) as i8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i8_codes_round_to_nearest_even_and_saturate_at_127() {
        let cases = [
            (0.49, 0),
            (0.5, 0),
            (1.5, 2),
            (-2.5, -2),
            (126.6, 127),
            (300.0, 127),
            (-127.4, -127),
            (-1e9, -127),
        ];
        for (v, want) in cases {
            assert_eq!(<i8 as Element>::from_f32(v), want, "{v}");
            assert_eq!(<i8 as Element>::from_f64(v as f64), want, "{v}");
        }
        for c in -127i8..=127 {
            assert_eq!(<i8 as Element>::from_f32(c.to_f32()), c);
            assert_eq!(c.to_f64(), c as f64);
        }
    }

    #[test]
    fn f16_widening_is_exact_for_every_code() {
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            let (ours, theirs) = (Element::to_f32(h), f16::to_f32(h));
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{bits:#06x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{bits:#06x}");
            }
        }
    }
}
