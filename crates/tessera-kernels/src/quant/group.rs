//! 4-bit group quantization as AWQ and GPTQ checkpoints use it: groups of 32, 64 or 128
//! weights along a row, each with an f16 scale and a 4-bit zero point,
//! `value = (q − zero)·scale`, q ∈ 0..16.
//!
//! The numerics are the AWQ/GPTQ ones (asymmetric round-to-nearest; the range always
//! includes 0 so that 0 is exact, an all-zero group gets the range ±1 as GPTQ's quantizer
//! does); the packing is ours, chosen for the kernels: each 32-weight chunk of a group is
//! 16 bytes with weight j in the low nibble of byte j and weight j + 16 in the high (as
//! ggml's Q4_0), so the integer and AVX-512 paths share the 4-bit code. Checkpoint
//! importers repack AWQ's interleaved int32 words into this layout.
//!
//! Rounding is half to even (PyTorch's `round`), and levels are computed against the
//! scale *after* its rounding to f16, so the stored codes are the best for the stored
//! scale. `(q − zero)·scale` is exact in f32 (5-bit × 11-bit significands), so
//! dequantization has no rounding at all. Non-finite input gives a NaN scale.

use super::ggml::{BlockFormat, QK};
use half::f16;
use tessera_core::DType;

/// Quantizes one group: (scale, zero, codes).
fn quantize_group(x: &[f32], q: &mut [u8]) -> (f16, u8) {
    let (mut min, mut max) = (0f32, 0f32);
    for &v in x {
        min = min.min(v);
        max = max.max(v);
    }
    if min == 0.0 && max == 0.0 {
        (min, max) = (-1.0, 1.0);
    }
    let finite = x.iter().all(|v| v.is_finite());
    let scale = f16::from_f32((max - min) / 15.0);
    let s = scale.to_f32();
    // A range beyond f16 makes the scale ∞ (caught as an overflow by QuantMatrix).
    let zero = (-min / s).round_ties_even().clamp(0.0, 15.0);
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v / s).round_ties_even() + zero).clamp(0.0, 15.0) as u8;
    }
    (if finite { scale } else { f16::NAN }, zero as u8)
}

macro_rules! group_format {
    ($name:ident, $g:literal, $dtype:expr, $doc:literal) => {
        #[doc = $doc]
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct $name {
            /// The group's scale.
            pub scale: f16,
            /// The zero point, 0..16.
            pub zero: u8,
            /// Always 0 (keeps the codes 2-byte aligned).
            pub reserved: u8,
            /// Chunk c's weight j at byte 16c + j (low nibble) and j + 16 (high nibble).
            pub qs: [u8; $g / 2],
        }

        const _: () = assert!(std::mem::size_of::<$name>() == $dtype.size_bytes());

        impl BlockFormat for $name {
            const DTYPE: DType = $dtype;
            const BLOCK: usize = $g;
            const OFFSET: i32 = 0;
            const HAS_MIN: bool = true;
            const NIBBLES: bool = true;
            fn quantize(x: &[f32]) -> Self {
                assert_eq!(x.len(), $g, "a {}-weight group", $g);
                let mut q = [0u8; $g];
                let (scale, zero) = quantize_group(x, &mut q);
                let mut qs = [0u8; $g / 2];
                for (dst, src) in qs.chunks_exact_mut(16).zip(q.chunks_exact(QK)) {
                    for j in 0..16 {
                        dst[j] = src[j] | (src[j + 16] << 4);
                    }
                }
                $name {
                    scale,
                    zero,
                    reserved: 0,
                    qs,
                }
            }
            fn dequantize(&self, out: &mut [f32]) {
                assert_eq!(out.len(), $g, "a {}-weight group", $g);
                let (s, z) = (self.scale.to_f32(), self.zero as i32);
                for (o, q) in out.chunks_exact_mut(QK).zip(self.qs.chunks_exact(16)) {
                    for j in 0..16 {
                        o[j] = ((q[j] & 0xF) as i32 - z) as f32 * s;
                        o[j + 16] = ((q[j] >> 4) as i32 - z) as f32 * s;
                    }
                }
            }
            fn scale_is_finite(&self) -> bool {
                self.scale.is_finite()
            }
            fn unsigned(&self, c: usize, u: &mut [u8; QK]) -> [(f32, f32); 2] {
                for (j, &b) in self.qs[16 * c..16 * (c + 1)].iter().enumerate() {
                    u[j] = b & 0xF;
                    u[j + 16] = b >> 4;
                }
                let s = self.scale.to_f32();
                // −zero·scale is exact (4-bit × 11-bit), so u·s + m is (u − zero)·s.
                [(s, -(self.zero as f32) * s); 2]
            }
        }
    };
}

group_format!(
    BlockInt4G32,
    32,
    DType::Int4G32,
    "4-bit weights in groups of 32 (5 bits/weight)."
);
group_format!(
    BlockInt4G64,
    64,
    DType::Int4G64,
    "4-bit weights in groups of 64 (4.5 bits/weight)."
);
group_format!(
    BlockInt4G128,
    128,
    DType::Int4G128,
    "4-bit weights in groups of 128 (4.25 bits/weight)."
);
