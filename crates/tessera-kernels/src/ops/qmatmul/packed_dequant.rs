//! Dequantizing packed rows to f32 ([`PackedWeights::dequantize_row`]): prefill runs every
//! weight through here once per matmul call (`gemm_bt_rows` fills its slabs from it), so
//! codes are taken 4 at a time and the body is compiled per ISA. Interleaved 4-bit rows
//! go 8 at a time straight into the GEMM's packed panel
//! ([`PackedWeights::dequantize_rows8`]).

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
            for (t, w) in words.iter_mut().enumerate() {
                let (at, shift) = super::top_word(top, b, t);
                *w |= ((word(at) >> shift) & 0x0303_0303) << 4;
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

impl PackedWeights {
    /// Rows r0..r0+8 (one interleaved group), k-values k0..k0+kc, dequantized straight
    /// into a packed GEMM panel: `out[kk·ld + i]` is row r0+i at k0+kk. Returns false,
    /// writing nothing, unless the rows are one whole group of 4-bit interleaved codes
    /// with one plain scale (and minimum) per chunk (Q4_0, Q4_1, 4-bit groups of 32),
    /// and k0 + kc ≤ cols.
    ///
    /// Why: a group's chunk pair is 8 rows × 32 bytes with word t of row i at byte
    /// 32·t + 4·i, so one 32-byte load gives code j of all 8 rows, one lane each — the
    /// panel's layout. Row by row ([`Self::dequantize_row`]) took each word apart with
    /// scalar shifts and the GEMM then transposed the rows (~5% of a prefill on host
    /// B). The arithmetic is the row path's, (u − offset)·d + m in the same order, so
    /// the values are the same bits.
    pub fn dequantize_rows8(
        &self,
        r0: usize,
        (k0, kc): (usize, usize),
        out: &mut [f32],
        ld: usize,
    ) -> bool {
        let plain_meta = matches!(self.meta, super::Meta::F32 { .. } | super::Meta::F16 { .. });
        let fits = r0.is_multiple_of(super::ROWS8)
            && r0 + super::ROWS8 <= self.rows
            && k0 + kc <= self.cols
            && ld >= super::ROWS8
            && (kc == 0 || out.len() >= (kc - 1) * ld + super::ROWS8);
        if self.layout != CodeLayout::Nibbles8 || self.halves() != 1 || !plain_meta || !fits {
            return false;
        }
        dequantize_rows8_into(Isa::best(), self, r0, (k0, kc), out, ld);
        true
    }
}

multiversion! {
    /// [`PackedWeights::dequantize_rows8`]'s body, compiled per ISA so the 8-lane loop
    /// is one vector of each operation.
    fn dequantize_rows8_into(
        w: &PackedWeights,
        r0: usize,
        ks: (usize, usize),
        out: &mut [f32],
        ld: usize,
    ) {
        let (k0, kc) = ks;
        const G: usize = super::ROWS8;
        let has_min = w.meta.has_min();
        let offset = w.offset;
        let (pairs, pair_bytes) = ((w.cols / QK).div_ceil(2), w.group_pair_bytes());
        let mut k = k0;
        while k < k0 + kc {
            let (b, j0) = (k / QK, k % QK);
            let j1 = QK.min(j0 + (k0 + kc - k));
            let unit = ((r0 / G) * pairs + b / 2) * pair_bytes;
            let nibble = 4 * (b % 2) as u32;
            let (mut d, mut m) = ([0f32; G], [0f32; G]);
            for i in 0..G {
                (d[i], m[i]) = w.scale_min(r0 + i, b, 0);
            }
            for j in j0..j1 {
                let words: &[u8; 4 * G] = w.quants[unit + (j / 4) * QK..][..4 * G]
                    .try_into()
                    .expect("a group's 8 words");
                let shift = nibble + 8 * (j % 4) as u32;
                let dst: &mut [f32; G] = (&mut out[(k + j - j0 - k0) * ld..][..G])
                    .try_into()
                    .expect("8 lanes");
                if has_min {
                    lanes8::<true>(words, (shift, offset), (&d, &m), dst);
                } else {
                    lanes8::<false>(words, (shift, offset), (&d, &m), dst);
                }
            }
            k += j1 - j0;
        }
    }
}

/// One k-value of a group's 8 rows: lane i = (code of word i − offset)·`d[i]` (+ `m[i]` with
/// `MIN`; without, no `+ 0.0`, which would turn the format's −0 into +0).
#[inline(always)]
fn lanes8<const MIN: bool>(
    words: &[u8; 32],
    (shift, offset): (u32, i32),
    (d, m): (&[f32; 8], &[f32; 8]),
    dst: &mut [f32; 8],
) {
    let mut u = [0i32; 8];
    for (i, u) in u.iter_mut().enumerate() {
        let word = u32::from_le_bytes([
            words[4 * i],
            words[4 * i + 1],
            words[4 * i + 2],
            words[4 * i + 3],
        ]);
        *u = ((word >> shift) & 0xF) as i32 - offset;
    }
    for i in 0..8 {
        dst[i] = if MIN {
            u[i] as f32 * d[i] + m[i]
        } else {
            u[i] as f32 * d[i]
        };
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::packed_f32;
    use super::super::Meta;
    use super::*;
    use crate::ops::gemm::gemm_bt_rows;
    use crate::quant::{QuantMatrix, BLOCK_DTYPES};
    use rand::{Rng, SeedableRng};
    use tessera_core::{TensorView, TensorViewMut};

    /// Every block format, both layouts, 17 rows (a partial last group) and K = 768
    /// (three K-quant super-blocks): `dequantize_rows8` over whole, partial, unaligned and
    /// empty k ranges writes exactly the format's own values (`QuantMatrix::dequantize`,
    /// bit for bit: the same arithmetic) into lanes 0..8 of a 16-wide panel and leaves
    /// lanes 8..16 alone; where it declines (other layouts, scales per half, K-quant
    /// metadata, a partial group, a range past K) it writes nothing. Q4_0 and Q4_1 must
    /// take it.
    #[test]
    fn grouped_dequant_writes_the_formats_values_into_a_panel() {
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (rows, cols, ld) = (17, 768, 16);
        let data: Vec<f32> = (0..rows * cols)
            .map(|i| rng.random_range(-1.0f32..1.0) * if i % 61 == 0 { 30.0 } else { 1.0 })
            .collect();
        let mut taken = Vec::new();
        for dtype in BLOCK_DTYPES {
            let (want, packs) = crate::with_block_format!(dtype, B => {
                let q = QuantMatrix::<B>::quantize(rows, cols, &data).unwrap();
                let packs: Vec<PackedWeights> = std::iter::once(PackedWeights::row_major(&q))
                    .chain(PackedWeights::interleaved(&q))
                    .collect();
                (q.dequantize(), packs)
            }, _ => unreachable!("{dtype} is a block format"));
            for p in packs {
                let plain = matches!(p.meta, Meta::F32 { .. } | Meta::F16 { .. });
                let able = p.layout == CodeLayout::Nibbles8 && p.halves() == 1 && plain;
                for r0 in [0, 8, 16] {
                    for (k0, kc) in [
                        (0, cols),
                        (0, 32),
                        (40, 50),
                        (cols - 7, 7),
                        (5, 0),
                        (760, 9),
                    ] {
                        let at = format!(
                            "{dtype} {:?} rows {r0}.. k {k0}+{kc} (seed {seed})",
                            p.layout
                        );
                        let mut out = vec![f32::NAN; kc.max(1) * ld];
                        let took = p.dequantize_rows8(r0, (k0, kc), &mut out, ld);
                        let expect = able && r0 + 8 <= rows && k0 + kc <= cols;
                        assert_eq!(took, expect, "{at}");
                        for kk in 0..kc {
                            for i in 0..ld {
                                let got = out[kk * ld + i];
                                if took && i < 8 {
                                    let w = want[(r0 + i) * cols + k0 + kk];
                                    assert_eq!(got.to_bits(), w.to_bits(), "{at}: {i}, {kk}");
                                } else {
                                    assert!(got.is_nan(), "{at}: wrote lane {i} at {kk}");
                                }
                            }
                        }
                        if took && kc > 0 {
                            taken.push(dtype);
                        }
                    }
                }
            }
        }
        for dtype in [tessera_core::DType::Q4_0, tessera_core::DType::Q4_1] {
            assert!(
                taken.contains(&dtype),
                "{dtype} never took the grouped path"
            );
        }
    }

    /// A prefill over interleaved Q4_0/Q4_1 (the grouped fill for whole 16-row panels,
    /// rows one at a time for the partial last one; K = 608, 19 chunks, an odd pair
    /// count and K blocks that split chunks) gives the same outputs as the GEMM
    /// over rows filled one at a time: the panels hold the same values, so the products
    /// are summed in the same order.
    #[test]
    fn prefill_with_grouped_panels_matches_row_fill() {
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (rows, cols, m) = (41, 608, 70);
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let x: Vec<f32> = (0..m * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
        let xv = TensorView::contiguous(&x, &[m, cols]).unwrap();
        for isa in Isa::available() {
            for p in [
                PackedWeights::interleaved(
                    &QuantMatrix::<crate::quant::BlockQ4_0>::quantize(rows, cols, &data).unwrap(),
                ),
                PackedWeights::interleaved(
                    &QuantMatrix::<crate::quant::BlockQ4_1>::quantize(rows, cols, &data).unwrap(),
                ),
            ] {
                let p = p.expect("4-bit formats interleave");
                let mut y = vec![f32::NAN; m * rows];
                let mut yv = TensorViewMut::contiguous(&mut y, &[m, rows]).unwrap();
                packed_f32(isa, 2, &p, &xv, &mut yv).unwrap();
                let mut want = vec![f32::NAN; m * rows];
                let mut wv = TensorViewMut::contiguous(&mut want, &[m, rows]).unwrap();
                let fill = |r: usize, out: &mut [f32]| p.dequantize_row(r, out);
                gemm_bt_rows(isa, 2, &xv, (rows, &fill), &mut wv).unwrap();
                assert!(y.iter().all(|v| v.is_finite()), "{isa} (seed {seed})");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y), bits(&want), "{isa} {:?} (seed {seed})", p.dtype);
            }
        }
    }
}
