//! One activation row quantized per 32-block for the integer kernels ([`QuantActs`]),
//! and where quantizers put a row ([`BlockSink`]): a `QuantActs`, or a slot of the
//! interleaved kernels' panels (`act_panel`). The portable quantizer lives here; its
//! vector steps per width are in `act_quant` (x86 and Arm only, hence a module of
//! their own), and the weights these rows meet in `packed`.

use super::ActScales;
use crate::multiversion;
use crate::quant::QK;
use tessera_core::Isa;

/// One activation row quantized per 32-block, with what the kernel preloads.
#[derive(Clone, Debug, Default)]
pub(super) struct QuantActs {
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
    /// −offset·Σq_x over the whole row, wrapping (the row-scaled VNNI kernel's start;
    /// with per-row scales only, else 0).
    pub(super) row_init: i32,
    /// Per block: d_x·Σq_x (the interleaved kernel's minimum term; NaN with d_x).
    pub(super) block_sums: Vec<f32>,
    /// Per block: Σq_x over elements 0..16 in the low i16, over 16..32 in the high one
    /// (the 6-bit kernel's offset term, one `vpmaddwd` against two half scales).
    pub(super) half_sums: Vec<i32>,
}

/// Where the quantizers put one activation row, block by block: a [`QuantActs`] (every
/// array any kernel preloads), or a row's slot in the interleaved kernels' panels
/// (`act_panel::PanelSlot`, what those kernels read, written in place so that batching
/// steps skip a copy). The arithmetic is the quantizers'; a sink only stores.
pub(super) trait BlockSink {
    /// Whether the sink holds a row of `k` values (the quantizers' precondition).
    fn holds(&self, k: usize) -> bool;
    /// Block b's 32 codes, to be written before [`BlockSink::finish`].
    fn codes(&mut self, b: usize) -> &mut [i8; QK];
    /// Block b's scale d (NaN for a non-finite block) and the sums of each 4
    /// consecutive codes (lane l: codes 4l..4l+4), once its codes are written.
    fn finish(&mut self, b: usize, d: f32, sums: [i32; 8], offset: i32);
}

impl BlockSink for QuantActs {
    fn holds(&self, k: usize) -> bool {
        let nb = k / QK;
        self.q.len() >= k
            && [self.d8.len(), self.init.len(), self.lane_sums.len()]
                .into_iter()
                .chain([
                    self.block_init.len(),
                    self.block_sums.len(),
                    self.half_sums.len(),
                ])
                .all(|l| l >= nb)
    }

    #[inline(always)]
    fn codes(&mut self, b: usize) -> &mut [i8; QK] {
        (&mut self.q[b * QK..][..QK]).try_into().expect("32 codes")
    }

    #[inline(always)]
    fn finish(&mut self, b: usize, d: f32, sums: [i32; 8], offset: i32) {
        self.finish_sums(b, d, sums, offset)
    }
}

impl QuantActs {
    /// Quantizes `x` (its length a multiple of 32: the weights' K, checked by the
    /// matmul) for weights with this `offset`, one scale per block or one for the row.
    /// Non-finite input makes its block's (or row's) scale NaN, so the outputs it
    /// reaches are NaN.
    pub(super) fn with_scales(x: &[f32], offset: i32, act: ActScales) -> Self {
        let mut a = QuantActs::default();
        a.refill(x, offset, act);
        a
    }

    /// [`QuantActs::with_scales`] into this row's buffers, reusing their allocations
    /// (decode quantizes a row per matmul, several hundred per token).
    pub(super) fn refill(&mut self, x: &[f32], offset: i32, act: ActScales) {
        self.refill_on(Isa::best(), x, offset, act)
    }

    /// [`QuantActs::with_scales`] with the quantizer `isa` runs (for tests).
    #[cfg(test)]
    pub(super) fn with_scales_on(isa: Isa, x: &[f32], offset: i32, act: ActScales) -> Self {
        let mut a = QuantActs::default();
        a.refill_on(isa, x, offset, act);
        a
    }

    fn refill_on(&mut self, isa: Isa, x: &[f32], offset: i32, act: ActScales) {
        self.size_for(x.len());
        // Per ISA: at decode this runs on one thread before the matmul's threads
        // start, and the portable build calls libm's `roundf` per value (~5 µs at
        // K = 1536, a fifth of the matmul).
        quantize_into(isa, x, offset, act, self);
        self.finish_row(act, x.len());
    }

    /// The row's start value once its `k` values' blocks are quantized: only the
    /// row-scaled kernel reads it, and only with one scale per row.
    pub(super) fn finish_row(&mut self, act: ActScales, k: usize) {
        self.row_init = match act {
            ActScales::PerRow => self.block_init[..k / QK]
                .iter()
                .fold(0i32, |a, &b| a.wrapping_add(b)),
            ActScales::PerBlock => 0,
        };
    }

    /// Sizes the arrays for a row of `k` values (a multiple of 32).
    pub(super) fn size_for(&mut self, k: usize) {
        debug_assert!(k.is_multiple_of(QK));
        let nb = k / QK;
        let padded = nb.div_ceil(2) * 2;
        // Sized, and only the padding block zeroed (it must read as zeros, and may hold
        // an earlier, longer row's block): the quantizer writes every other element.
        fn sized<T: Copy + Default>(v: &mut Vec<T>, len: usize, written: usize) {
            v.resize(len, T::default());
            v[written..].fill(T::default());
        }
        sized(&mut self.q, padded * QK, nb * QK);
        sized(&mut self.d8, padded, nb);
        sized(&mut self.init, padded, nb);
        sized(&mut self.lane_sums, padded, nb);
        sized(&mut self.block_init, padded, nb);
        sized(&mut self.block_sums, padded, nb);
        sized(&mut self.half_sums, padded, nb);
    }

    /// Fills block b's preloaded values from its scale d (NaN for a non-finite block)
    /// and the sums of each 4 consecutive codes (lane l: codes 4l..4l+4), as the
    /// quantizers have them.
    #[inline(always)]
    pub(super) fn finish_sums(&mut self, b: usize, d: f32, sums: [i32; 8], offset: i32) {
        let (lo, hi) = (sums[..4].iter().sum::<i32>(), sums[4..].iter().sum::<i32>());
        let total = lo + hi;
        self.d8[b] = [d; 8];
        self.init[b] = sums.map(|s| -offset * s);
        self.lane_sums[b] = sums.map(|s| s as f32);
        self.block_init[b] = -offset * total;
        self.block_sums[b] = d * total as f32;
        // |Σ| ≤ 16·127 fits an i16.
        self.half_sums[b] = i32::from(lo as i16 as u16) | (i32::from(hi as i16 as u16) << 16);
    }

    /// The values the kernel effectively multiplies by, q·d_x, exactly (f64).
    pub(super) fn dequantized(&self, k: usize) -> Vec<f64> {
        (0..k)
            .map(|i| self.q[i] as f64 * self.d8[i / QK][0] as f64)
            .collect()
    }
}

/// max |v| over `x` (NaN ignored: the finiteness check catches it) and whether every
/// value is finite, in 8 lanes the compiler can vectorize.
#[inline(always)]
pub(super) fn amax_finite(x: &[f32]) -> (f32, bool) {
    let (mut m, mut finite) = ([0f32; 8], true);
    for c in x.chunks(8) {
        for (l, &v) in c.iter().enumerate() {
            let a = v.abs();
            m[l] = if a > m[l] { a } else { m[l] };
            finite &= v.is_finite();
        }
    }
    (m.iter().fold(0f32, |a, &b| a.max(b)), finite)
}

/// Fills `a` (sized for `x`) with `x` quantized per 32-block, and what the kernels
/// preload. Non-finite input makes its block's (or row's) scale NaN. The vector
/// quantizer of `act_quant` on AVX2, AVX-512 and NEON (bit-exact with the portable
/// loop, which stays mostly scalar when compiled).
pub(super) fn quantize_into<S: BlockSink>(
    isa: Isa,
    x: &[f32],
    offset: i32,
    act: ActScales,
    a: &mut S,
) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && Isa::Avx2.is_available() {
        // SAFETY: AVX2 and FMA checked; x is whole blocks (the matmul checked K); every
        // store goes through the sink's bounds-checked `codes` and `finish`.
        return unsafe { super::act_quant::quantize_ymm(x, offset, act, a) };
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // SAFETY: NEON is baseline on aarch64; as above for x and a.
        return unsafe { super::act_quant::quantize_neon(x, offset, act, a) };
    }
    quantize_portable(isa, x, offset, act, a)
}

/// The sums of each 4 consecutive codes of a block (lane l: codes 4l..4l+4), as the
/// vector quantizers return them.
#[inline(always)]
pub(super) fn four_sums(q: &[i8; QK]) -> [i32; 8] {
    std::array::from_fn(|l| q[4 * l..4 * l + 4].iter().map(|&v| v as i32).sum())
}

multiversion! {
    /// [`quantize_into`] in portable Rust, compiled per ISA (the scalar baseline the
    /// vector quantizer is checked against).
    fn quantize_portable<S: BlockSink>(x: &[f32], offset: i32, act: ActScales, a: &mut S) {
        let row = match act {
            ActScales::PerBlock => None,
            ActScales::PerRow => Some(amax_finite(x)),
        };
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let (amax, finite) = row.unwrap_or_else(|| amax_finite(xb));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let q = a.codes(b);
            for (q, &v) in q.iter_mut().zip(xb) {
                // Clamped for a subnormal d, whose 1/d overflows: ±∞ would saturate
                // to −128 on one side, and every kernel bounds |q_x| by 127.
                *q = (v * id).round().clamp(-127.0, 127.0) as i8;
            }
            let sums = four_sums(q);
            a.finish(b, if finite { d } else { f32::NAN }, sums, offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use tessera_core::DType;

    /// Activation quantization is compiled per ISA (it runs on one thread before every
    /// integer matmul): each build must give the portable one's codes and metadata bit
    /// for bit, ties (±0.5 steps) rounded away from zero, with a non-finite value making
    /// its block's (or, per row, the row's) scale NaN.
    #[test]
    fn activation_quantization_is_the_same_on_every_isa() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(23);
        let k = 10 * QK;
        let mut x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0..3.0)).collect();
        // Block 8 all zeros (d = 0); block 9 so small that 1/d overflows to ∞.
        x[8 * QK..9 * QK].fill(0.0);
        for v in &mut x[9 * QK..] {
            *v = rng.random_range(-1e-38..1e-38);
        }
        // Block 1 holds exact ties: amax 127 makes d = 1, so v = n + 0.5 sits on one.
        for (j, v) in x[QK..2 * QK].iter_mut().enumerate() {
            *v = j as f32 - 15.5;
        }
        x[QK] = 127.0;
        x[3 * QK + 5] = f32::NAN;
        x[5 * QK + 9] = f32::INFINITY;
        let bits = |a: &QuantActs| {
            let f = |v: &[[f32; 8]]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
            let s = a.block_sums.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            (
                a.q.clone(),
                f(&a.d8),
                a.init.clone(),
                f(&a.lane_sums),
                a.block_init.clone(),
                s,
                a.half_sums.clone(),
            )
        };
        for act in [ActScales::PerBlock, ActScales::PerRow] {
            let padded = k / QK;
            let run = |isa| {
                let mut a = QuantActs {
                    q: vec![0; k],
                    d8: vec![[0.0; 8]; padded],
                    init: vec![[0; 8]; padded],
                    lane_sums: vec![[0.0; 8]; padded],
                    block_init: vec![0; padded],
                    block_sums: vec![0.0; padded],
                    half_sums: vec![0; padded],
                    row_init: 0,
                };
                quantize_into(isa, &x, 8, act, &mut a);
                a
            };
            let portable = run(Isa::Scalar);
            if act == ActScales::PerBlock {
                // (Per row, the infinity leaves every scale NaN and every code 0.)
                let ties = (&portable.q[QK + 1..QK + 4], &portable.q[QK + 16..QK + 19]);
                assert_eq!(ties, (&[-15, -14, -13][..], &[1, 2, 3][..]), "away from 0");
            }
            let nan_blocks: Vec<bool> = portable.d8.iter().map(|d| d[0].is_nan()).collect();
            let want: Vec<bool> = (0..padded)
                .map(|b| act == ActScales::PerRow || b == 3 || b == 5)
                .collect();
            assert_eq!(nan_blocks, want, "{act:?}");
            for (b, &h) in portable.half_sums.iter().enumerate() {
                let sum =
                    |r: std::ops::Range<usize>| portable.q[r].iter().map(|&v| i32::from(v)).sum();
                let want: (i32, i32) = (sum(b * QK..b * QK + 16), sum(b * QK + 16..(b + 1) * QK));
                assert_eq!((h as i16 as i32, h >> 16), want, "{act:?} block {b}");
            }
            for isa in Isa::available() {
                assert!(bits(&run(isa)) == bits(&portable), "{isa} {act:?}");
            }
        }
        // Random rows of every magnitude, through `refill` as the matmuls call it.
        for _ in 0..200 {
            let k = QK * rng.random_range(1..40);
            let scale = 10f32.powi(rng.random_range(-6..6));
            let x: Vec<f32> = (0..k).map(|_| rng.random_range(-scale..scale)).collect();
            for act in [ActScales::PerBlock, ActScales::PerRow] {
                let want = bits(&QuantActs::with_scales_on(Isa::Scalar, &x, 128, act));
                for isa in Isa::available() {
                    let got = bits(&QuantActs::with_scales_on(isa, &x, 128, act));
                    assert!(got == want, "{isa} {act:?} K = {k}, scale {scale}");
                }
            }
        }
    }

    /// The activation quantizer against ggml's `quantize_row_q8_0_ref` (data from
    /// scripts/ggml_blocks_reference.c, no Tessera code involved): the same codes, and the
    /// same scale once rounded to the f16 ggml stores (Tessera keeps d_x in f32, which only
    /// makes the product more exact), on every ISA's quantizer this host runs.
    #[test]
    fn activation_codes_match_ggml_q8_0() {
        let data: serde_json::Value = serde_json::from_str(include_str!(
            "../../../tests/data/ggml_blocks_reference.json"
        ))
        .unwrap();
        let hex = |s: &str| -> Vec<u8> {
            (0..s.len() / 2)
                .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
                .collect()
        };
        let mut checked = 0;
        for case in data["cases"].as_array().unwrap() {
            if case["format"] != "q8_0" || case["input"].is_null() {
                continue;
            }
            let x: Vec<f32> = case["input"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| f32::from_bits(u32::from_str_radix(h.as_str().unwrap(), 16).unwrap()))
                .collect();
            let blocks = hex(case["blocks"].as_str().unwrap());
            let block_bytes = DType::Q8_0.size_bytes();
            for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                let a = QuantActs::with_scales_on(isa, &x, 0, ActScales::PerBlock);
                for (b, ggml) in blocks.chunks_exact(block_bytes).enumerate() {
                    let at = format!("{} block {b} on {isa}", case["kind"]);
                    let d = half::f16::from_f32(a.d8[b][0]).to_bits();
                    assert_eq!(d, u16::from_le_bytes([ggml[0], ggml[1]]), "{at}: scale");
                    let codes: Vec<i8> = ggml[2..].iter().map(|&c| c as i8).collect();
                    assert_eq!(a.q[b * QK..(b + 1) * QK], codes[..], "{at}: codes");
                }
                checked += 1;
            }
        }
        assert!(
            checked >= 5,
            "every input kind on at least one ISA ({checked})"
        );
    }
}
