//! Load-time repacking of 4- and 8-bit block weights for the integer (VNNI) path, and the
//! per-call 8-bit quantization of the activations.
//!
//! Every format becomes `value = (u − offset)·d + m` with u an unsigned byte
//! ([`BlockFormat::unsigned`]): Q4_0 (offset 8), Q4_1 (offset 0, minimum m), Q5_0 (16),
//! Q5_1 (0, minimum), Q8_0 (stored u = q + 128, offset 128).
//! With activations x ≈ d_x·q_x (per 32-block, q_x ∈ −127..=127, s_x = Σq_x):
//!
//!   Σ value·x = d_x·(d·(Σ u·q_x − offset·s_x) + m·s_x),
//!
//! and `vpdpbusd` computes Σ u·q_x four bytes per lane, starting from lanes preloaded with
//! −offset·s_x, so the integer correction costs nothing per block. Q4_1's minimum term is
//! added per lane from that lane's own Σq_x (m·Σq is exact in f32) with one FMA: adding
//! it once per block instead would cancel against d·Σu·q_x (m ≈ −range/2) and amplify
//! their separate roundings — seen as 1e-4 relative errors on single outputs.
//!
//! Layout, chosen so one load feeds two blocks and scales need no f16 conversion:
//! 4-bit rows store block pairs as 32 bytes whose low nibbles are block 2p's 32 weights
//! and high nibbles block 2p+1's, in element order (an odd last block has zero high
//! nibbles); 5- and 8-bit rows store each block's 32 bytes contiguously. Scales and minima are
//! widened to f32 arrays, one per block. The original blocks stay in the `QuantMatrix`.

use crate::multiversion;
use crate::quant::{BlockFormat, QuantMatrix, QK};
use tessera_core::DType;

/// Weights repacked for the integer path.
#[derive(Clone, Debug)]
pub struct PackedWeights {
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Per row: `cols/2` bytes (4-bit, block pairs) or `cols` bytes (8-bit).
    pub(super) quants: Vec<u8>,
    /// Per row, per block: d.
    pub(super) scales: Vec<f32>,
    /// Per row, per block: m (Q4_1 only; empty otherwise).
    pub(super) mins: Vec<f32>,
    pub(super) offset: i32,
    pub(super) four_bit: bool,
    pub(super) dtype: DType,
}

impl PackedWeights {
    /// Repacks `w` (dequantization semantics unchanged: the packed values are the
    /// format's own u, d, m).
    pub fn new<B: BlockFormat>(w: &QuantMatrix<B>) -> Self {
        let (rows, cols) = (w.rows(), w.cols());
        let nb = cols / QK;
        let four_bit = B::NIBBLES;
        let row_bytes = if four_bit { nb.div_ceil(2) * QK } else { cols };
        let mut quants = vec![0u8; rows * row_bytes];
        let mut scales = Vec::with_capacity(rows * nb);
        let mut mins = Vec::new();
        let mut u = [0u8; QK];
        for r in 0..rows {
            let dst = &mut quants[r * row_bytes..(r + 1) * row_bytes];
            for (b, blk) in w.row(r).iter().enumerate() {
                let (d, m) = blk.unsigned(&mut u);
                scales.push(d);
                if B::HAS_MIN {
                    mins.push(m);
                }
                if four_bit {
                    let pair = &mut dst[(b / 2) * QK..][..QK];
                    for (p, &q) in pair.iter_mut().zip(&u) {
                        *p |= q << (4 * (b % 2));
                    }
                } else {
                    dst[b * QK..(b + 1) * QK].copy_from_slice(&u);
                }
            }
        }
        PackedWeights {
            rows,
            cols,
            quants,
            scales,
            mins,
            offset: B::OFFSET,
            four_bit,
            dtype: B::DTYPE,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
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
    /// Lane 0: −offset·s_x; lanes 1..8: 0 (the dpbusd starting values).
    pub(super) init: Vec<[i32; 8]>,
    /// Σq_x over each lane's 4 consecutive elements, as f32 (for Q4_1's minimum term).
    pub(super) lane_sums: Vec<[f32; 8]>,
}

impl QuantActs {
    /// Quantizes `x` (length a multiple of 32) for weights with this `offset`. Non-finite
    /// input makes its block's scale NaN, so the outputs it reaches are NaN.
    pub fn new(x: &[f32], offset: i32) -> Self {
        let nb = x.len() / QK;
        let padded = nb.div_ceil(2) * 2;
        let mut a = QuantActs {
            q: vec![0; padded * QK],
            d8: vec![[0.0; 8]; padded],
            init: vec![[0; 8]; padded],
            lane_sums: vec![[0.0; 8]; padded],
        };
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let finite = xb.iter().all(|v| v.is_finite());
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut s = 0i32;
            for (q, &v) in a.q[b * QK..(b + 1) * QK].iter_mut().zip(xb) {
                *q = (v * id).round() as i8;
                s += *q as i32;
            }
            let d = if finite { d } else { f32::NAN };
            a.d8[b] = [d; 8];
            a.init[b][0] = -offset * s;
            let q = &a.q[b * QK..(b + 1) * QK];
            a.lane_sums[b] =
                std::array::from_fn(|l| q[4 * l..4 * l + 4].iter().map(|&v| v as f32).sum());
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
        let rb = w.row_bytes();
        let quants = &w.quants[row * rb..(row + 1) * rb];
        let mut u = [0u8; QK];
        for (o, a) in out.iter_mut().zip(acts) {
            let mut acc = [0f32; 8];
            for b in 0..nb {
                if w.four_bit {
                    let pair = &quants[(b / 2) * QK..][..QK];
                    for (v, &p) in u.iter_mut().zip(pair) {
                        *v = (p >> (4 * (b % 2))) & 0xF;
                    }
                } else {
                    u.copy_from_slice(&quants[b * QK..(b + 1) * QK]);
                }
                let (d, m) = (w.scales[row * nb + b], w.mins.get(row * nb + b).copied().unwrap_or(0.0));
                let q = &a.q[b * QK..(b + 1) * QK];
                for l in 0..8 {
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
