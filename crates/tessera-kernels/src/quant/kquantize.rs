//! The K-quant quantizers, following llama.cpp's reference quantizers
//! (`quantize_row_q*_K_ref`, what `llama-quantize` writes without an importance matrix)
//! operation for operation in f32, so the bytes match the blocks llama.cpp writes.
//! Rust never fuses `a·b + c`, and ggml's base library is built without FMA contraction,
//! so keeping each expression's order keeps every rounding.
//!
//! The shape of each: fit every sub-block with a small least-squares search
//! ([`fit_min_scale`] for the formats with a minimum, [`fit_symmetric`] and
//! [`fit_q3`] for the others), quantize the sub-block scales themselves against one f16
//! super-scale, then re-quantize each weight against its now-rounded scale.

use super::kquants::{scale_min_k4, scale_q3k, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K};
use super::kquants::{BlockQ8K, QK_K};
use half::f16;

/// Below this a sub-block counts as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: adding 1.5·2²³ rounds to an integer (ties to even) in the low
/// mantissa bits. Reproduced bit for bit, including what it gives out of its ±2²² range.
fn nearest_int(v: f32) -> i32 {
    let t = v + 12_582_912.0;
    (t.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// NaN when any input is not finite (llama.cpp leaves such blocks undefined).
fn poison(x: &[f32; QK_K], d: f16) -> f16 {
    if x.iter().all(|v| v.is_finite()) {
        d
    } else {
        f16::NAN
    }
}

/// Search parameters of [`fit_min_scale`]: candidate inverse scales
/// `(nmax + rmin + rdelta·i) / (max − min)` for i in 0..=steps, errors summed as absolute
/// values (`mad`) or squares.
struct MinScaleSearch {
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    steps: i32,
    mad: bool,
}

/// Fits x ≈ scale·L − min with L in 0..=nmax, weights w; returns (scale, min ≥ 0) and
/// leaves the levels in `l` (llama.cpp's `make_qkx2_quants`).
fn fit_min_scale(p: &MinScaleSearch, x: &[f32], w: &[f32], l: &mut [u8]) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = if x[i] < min { x[i] } else { min };
        max = if x[i] > max { x[i] } else { max };
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if p.mad { d.abs() } else { d * d };
    let nmax = p.nmax as f32;
    let iscale = nmax / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0f32;
    for i in 0..n {
        l[i] = nearest_int(iscale * (x[i] - min)).clamp(0, p.nmax) as u8;
        best += w[i] * err(scale * l[i] as f32 + min - x[i]);
    }
    let mut aux = [0u8; 32];
    for step in 0..=p.steps {
        let iscale = (p.rmin + p.rdelta * step as f32 + nmax) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, p.nmax);
            aux[i] = q as u8;
            let q = q as f32;
            sum_l += w[i] * q;
            sum_l2 += w[i] * q * q;
            sum_xl += w[i] * q * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur = 0f32;
            for i in 0..n {
                cur += w[i] * err(this_scale * aux[i] as f32 + this_min - x[i]);
            }
            if cur < best {
                l.copy_from_slice(&aux[..n]);
                best = cur;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The first value of largest magnitude (0 when all are 0).
fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// Fits x ≈ scale·(L − nmax) with L in 0..2·nmax, weighting by x², trying 19 inverse
/// scales around −nmax/max (llama.cpp's `make_qx_quants`, rmse type 1).
fn fit_symmetric(nmax: i32, x: &[f32], l: &mut [u8]) -> f32 {
    let (amax, max) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let (w, q) = (v * v, level(iscale, v) as f32);
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let set = |iscale: f32, l: &mut [u8]| {
        for (l, &v) in l.iter_mut().zip(x) {
            *l = (level(iscale, v) + nmax) as u8;
        }
    };
    let iscale = -(nmax as f32) / max;
    set(iscale, l);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&i| i != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            set(iscale, l);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q3_K's sub-block fit: x ≈ scale·L, L in −nmax..nmax, then up to 5 passes moving single
/// levels while the x²-weighted fit improves (llama.cpp's `make_q3_quants` with rmse).
/// Leaves L + nmax in `l`.
fn fit_q3(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (amax, max) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (l, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *l = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (l, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let old = *l as f32;
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new != *l as i32 {
                    slx += w * v * new as f32;
                    sl2 += w * new as f32 * new as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *l = new as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for l in l.iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Packs 2-bit levels: level e goes to bits 2·((e mod 128) / 32) of byte 32·(e / 128) + e mod 32.
fn pack2(l: &[u8; QK_K]) -> [u8; QK_K / 4] {
    let mut qs = [0u8; QK_K / 4];
    for (e, &v) in l.iter().enumerate() {
        qs[32 * (e / 128) + e % 32] |= v << (2 * ((e % 128) / 32));
    }
    qs
}

/// Packs 4-bit levels: chunk 2p in the low nibbles of bytes 32p.., chunk 2p+1 in the high.
fn pack4(l: &[u8; QK_K]) -> [u8; QK_K / 2] {
    let mut qs = [0u8; QK_K / 2];
    for (e, &v) in l.iter().enumerate() {
        qs[32 * (e / 64) + e % 32] |= (v & 0xF) << (4 * ((e / 32) % 2));
    }
    qs
}

/// Q4_K/Q5_K: 8 sub-blocks fitted with a minimum, scales/minima to 6 bits against
/// max/63, levels re-fitted to the rounded scales. Returns (d, dmin, scales, levels).
fn kx_32(x: &[f32; QK_K], search: &MinScaleSearch) -> (f16, f16, [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * (j + 1)];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let w: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        (scales[j], mins[j]) = fit_min_scale(search, xs, &w, &mut l[32 * j..32 * (j + 1)]);
        max_scale = if scales[j] > max_scale {
            scales[j]
        } else {
            max_scale
        };
        max_min = if mins[j] > max_min { mins[j] } else { max_min };
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        // C stores the int in a uint8_t (wrapping) before clamping.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d.to_f32() * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for i in 32 * j..32 * (j + 1) {
            l[i] = nearest_int((x[i] + dm) / dj).clamp(0, search.nmax) as u8;
        }
    }
    (poison(x, d), poison(x, dmin), packed, l)
}

pub(super) fn q4_k(x: &[f32; QK_K]) -> BlockQ4K {
    let search = MinScaleSearch {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        steps: 20,
        mad: false,
    };
    let (d, dmin, scales, l) = kx_32(x, &search);
    BlockQ4K {
        d,
        dmin,
        scales,
        qs: pack4(&l),
    }
}

pub(super) fn q5_k(x: &[f32; QK_K]) -> BlockQ5K {
    let search = MinScaleSearch {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        steps: 15,
        mad: false,
    };
    let (d, dmin, scales, l) = kx_32(x, &search);
    let mut qh = [0u8; QK_K / 8];
    for (e, &v) in l.iter().enumerate() {
        qh[e % 32] |= (v >> 4) << (e / 32);
    }
    BlockQ5K {
        d,
        dmin,
        scales,
        qh,
        qs: pack4(&l),
    }
}

pub(super) fn q2_k(x: &[f32; QK_K]) -> BlockQ2K {
    let search = MinScaleSearch {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        steps: 15,
        mad: true,
    };
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * (j + 1)];
        let w: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
        (scales[j], mins[j]) = fit_min_scale(&search, xs, &w, &mut l[16 * j..16 * (j + 1)]);
        max_scale = if scales[j] > max_scale {
            scales[j]
        } else {
            max_scale
        };
        max_min = if mins[j] > max_min { mins[j] } else { max_min };
    }
    let mut packed = [0u8; 16];
    let mut d = f16::ZERO;
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for j in 0..16 {
            packed[j] = nearest_int(iscale * scales[j]) as u8;
        }
        d = f16::from_f32(max_scale / 15.0);
    }
    let mut dmin = f16::ZERO;
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for j in 0..16 {
            packed[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        dmin = f16::from_f32(max_min / 15.0);
    }
    for j in 0..16 {
        let dj = d.to_f32() * (packed[j] & 0xF) as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * (packed[j] >> 4) as f32;
        for i in 16 * j..16 * (j + 1) {
            l[i] = nearest_int((x[i] + dm) / dj).clamp(0, 3) as u8;
        }
    }
    BlockQ2K {
        scales: packed,
        qs: pack2(&l),
        d: poison(x, d),
        dmin: poison(x, dmin),
    }
}

pub(super) fn q3_k(x: &[f32; QK_K]) -> BlockQ3K {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut amax, mut max_scale) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = fit_q3(4, &x[16 * j..16 * (j + 1)], &mut l[16 * j..16 * (j + 1)]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    let mut packed = [0u8; 12];
    let mut d = f16::ZERO;
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            // C: an int narrowed to int8_t (wrapping), clamped, offset to 0..64.
            let v = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) as i32 + 32;
            if j < 8 {
                packed[j] = (v & 0xF) as u8;
            } else {
                packed[j - 8] |= ((v & 0xF) << 4) as u8;
            }
            packed[j % 4 + 8] |= ((v >> 4) << (2 * (j / 4))) as u8;
        }
        d = f16::from_f32(1.0 / iscale);
    }
    for j in 0..16 {
        let dj = d.to_f32() * (scale_q3k(j, &packed) - 32) as f32;
        if dj == 0.0 {
            continue;
        }
        for i in 16 * j..16 * (j + 1) {
            l[i] = (nearest_int(x[i] / dj).clamp(-4, 3) + 4) as i8;
        }
    }
    let mut hmask = [0u8; QK_K / 8];
    let mut low = [0u8; QK_K];
    for (e, &v) in l.iter().enumerate() {
        if v > 3 {
            hmask[e % 32] |= 1 << (e / 32);
        }
        low[e] = (v & 3) as u8;
    }
    BlockQ3K {
        hmask,
        qs: pack2(&low),
        scales: packed,
        d: poison(x, d),
    }
}

pub(super) fn q6_k(x: &[f32; QK_K]) -> BlockQ6K {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_abs, mut max_scale) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = fit_symmetric(32, &x[16 * j..16 * (j + 1)], &mut l[16 * j..16 * (j + 1)]);
        if scales[j].abs() > max_abs {
            max_abs = scales[j].abs();
            max_scale = scales[j];
        }
    }
    if max_abs < GROUP_MAX_EPS {
        return BlockQ6K {
            ql: [0; QK_K / 2],
            qh: [0; QK_K / 4],
            scales: [0; 16],
            d: poison(x, f16::ZERO),
        };
    }
    let iscale = -128.0 / max_scale;
    let d = f16::from_f32(1.0 / iscale);
    let sc: [i8; 16] = std::array::from_fn(|j| nearest_int(iscale * scales[j]).min(127) as i8);
    for j in 0..16 {
        let dj = d.to_f32() * sc[j] as f32;
        if dj == 0.0 {
            continue;
        }
        for i in 16 * j..16 * (j + 1) {
            l[i] = (nearest_int(x[i] / dj).clamp(-32, 31) + 32) as u8;
        }
    }
    // Chunk c = 4h + k: low nibbles into ql[64h + 32·(k mod 2)..] (high nibble when
    // k ≥ 2), top two bits into bits 2k of qh[32h..].
    let (mut ql, mut qh) = ([0u8; QK_K / 2], [0u8; QK_K / 4]);
    for (e, &v) in l.iter().enumerate() {
        let (h, k, i) = (e / 128, (e % 128) / 32, e % 32);
        ql[64 * h + 32 * (k % 2) + i] |= (v & 0xF) << (4 * (k / 2));
        qh[32 * h + i] |= (v >> 4) << (2 * k);
    }
    BlockQ6K {
        ql,
        qh,
        scales: sc,
        d: poison(x, d),
    }
}

pub(super) fn q8_k(x: &[f32; QK_K]) -> BlockQ8K {
    let (amax, max) = signed_max(x);
    let mut b = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };
    if amax == 0.0 {
        return b;
    }
    let iscale = -127.0 / max;
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i16).sum();
    }
    b.d = if x.iter().all(|v| v.is_finite()) {
        1.0 / iscale
    } else {
        f32::NAN
    };
    b
}
