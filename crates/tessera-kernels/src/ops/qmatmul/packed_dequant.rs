//! Dequantizing packed rows to f32 ([`PackedWeights::dequantize_row`]): prefill runs every
//! weight through here once per matmul call (`gemm_bt_rows` fills its slabs from it), so
//! codes are taken 4 at a time and the body is compiled per ISA.

use super::{CodeLayout, PackedWeights};
use crate::multiversion;
use crate::quant::QK;
use tessera_core::Isa;

impl PackedWeights {
    /// Row r's 32 codes of chunk b. Places are found once per chunk (prefill over
    /// packed rows dequantizes every weight through here): in every layout, codes
    /// 4t..4t+4 are 4 consecutive bytes, the groups of 4 `stride` bytes apart.
    #[inline(always)]
    pub(super) fn chunk_codes(&self, r: usize, b: usize, out: &mut [u8; QK]) {
        let ((low, shift), top) = self.code_places(r, b, 0);
        if self.layout == CodeLayout::Bytes {
            out.copy_from_slice(&self.quants[low..low + QK]);
            return;
        }
        let stride = if self.layout.interleaved() { QK } else { 4 };
        // One shift and mask per 4 codes: a word holds 4 codes' bytes.
        let mask = u32::from(self.low_mask()) * 0x0101_0101;
        let word = |at: usize| {
            let bytes: [u8; 4] = self.quants[at..at + 4].try_into().expect("4 bytes");
            u32::from_le_bytes(bytes)
        };
        let mut words = [0u32; QK / 4];
        for (t, w) in words.iter_mut().enumerate() {
            *w = (word(low + t * stride) >> shift) & mask;
        }
        if let Some((top, _)) = top {
            // Register t mod 4, crumb 2·(b mod 2) + t/4 (see `code_places`).
            for (t, w) in words.iter_mut().enumerate() {
                let shift = 2 * (2 * (b % 2) + t / 4);
                *w |= ((word(top + (t % 4) * QK) >> shift) & 0x0303_0303) << 4;
            }
        }
        for (four, w) in out.chunks_exact_mut(4).zip(words) {
            four.copy_from_slice(&w.to_le_bytes());
        }
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
        dequantize_row_into(Isa::best(), self, r, out);
    }
}

multiversion! {
    /// [`PackedWeights::dequantize_row`]'s body, compiled per ISA: prefill dequantizes every
    /// weight through here once per call, so the helpers are inlined, the minimum test is
    /// taken once per half-chunk and the 32-value conversions vectorize.
    fn dequantize_row_into(w: &PackedWeights, r: usize, out: &mut [f32]) {
        let halves = w.halves();
        let has_min = w.meta.has_min();
        let offset = w.offset;
        let mut codes = [0u8; QK];
        for (b, chunk) in out.chunks_exact_mut(QK).enumerate() {
            w.chunk_codes(r, b, &mut codes);
            let parts = chunk
                .chunks_exact_mut(QK / halves)
                .zip(codes.chunks_exact(QK / halves));
            for (h, (part, cs)) in parts.enumerate() {
                let (d, m) = w.scale_min(r, b, h);
                if has_min {
                    for (o, &u) in part.iter_mut().zip(cs) {
                        *o = (i32::from(u) - offset) as f32 * d + m;
                    }
                } else {
                    // No `+ 0.0` without a minimum: it would turn the format's −0 into +0.
                    for (o, &u) in part.iter_mut().zip(cs) {
                        *o = (i32::from(u) - offset) as f32 * d;
                    }
                }
            }
        }
    }
}
