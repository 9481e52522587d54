//! The AVX512_VNNI kernel: two weight blocks per `vpdpbusd` (64 byte products), see
//! [`super::packed`] for the algebra and layout.

use super::packed::{CodeLayout, Meta, PackedWeights, QuantActs};
use super::M_CHUNK;
use crate::quant::QK;
use std::arch::x86_64::*;

/// `out[i] = Σ_k W[row, k]·x̂_i[k]` for up to M_CHUNK quantized activation rows.
///
/// # Safety
/// The CPU must support AVX-512F/BW/DQ/VL and AVX512_VNNI; `row < w.rows`; every `acts[i]` was
/// built for `w.cols` columns and `w`'s offset; `w` is row-major with f32 metadata
/// (`IntKernel::reading` sends f16, factored or interleaved weights to the AVX2 kernels).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
pub(super) unsafe fn dots(w: &PackedWeights, row: usize, acts: &[&QuantActs], out: &mut [f32]) {
    let nb = w.cols / QK;
    let pairs = nb.div_ceil(2);
    let rb = w.row_bytes();
    let quants = &w.quants[row * rb..(row + 1) * rb];
    let per_row = nb * w.halves();
    let Meta::F32 { scales, mins } = &w.meta else {
        unreachable!("f16 or factored metadata goes to the AVX2 kernels")
    };
    let scales = &scales[row * per_row..(row + 1) * per_row];
    let mins = if mins.is_empty() {
        &[][..]
    } else {
        &mins[row * per_row..(row + 1) * per_row]
    };
    // Lane i of a chunk pair belongs to half i / 4 of the pair's four halves.
    let quarter = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    let nib = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); M_CHUNK];
    for p in 0..pairs {
        let two = 2 * p + 1 < nb;
        // SAFETY: pair p's bytes lie inside the row: 32 bytes at 32p (4-bit), or 64 (32
        // masked to the one existing block) at 64p (8-bit).
        let wz = unsafe {
            if w.layout == CodeLayout::Nibbles {
                let v = _mm256_loadu_si256(quants.as_ptr().add(QK * p) as *const __m256i);
                let lo = _mm256_and_si256(v, nib);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
            } else {
                let src = quants.as_ptr().add(2 * QK * p);
                if two {
                    _mm512_loadu_si512(src as *const __m512i)
                } else {
                    _mm512_maskz_loadu_epi8((1u64 << QK) - 1, src as *const i8)
                }
            }
        };
        // The pair's scales spread over its 16 lanes: 8 lanes per chunk, or 4 per half.
        let pair = |v: &[f32]| {
            if w.split16 {
                let n = if two { 4 } else { 2 };
                // SAFETY: halves 4p..4p+n exist (n = 2 for an odd last chunk).
                let q = unsafe { _mm_maskz_loadu_ps((1 << n) - 1, v.as_ptr().add(4 * p)) };
                _mm512_permutexvar_ps(quarter, _mm512_castps128_ps512(q))
            } else {
                let hi = if two { v[2 * p + 1] } else { 0.0 };
                _mm512_insertf32x8::<1>(_mm512_set1_ps(v[2 * p]), _mm256_set1_ps(hi))
            }
        };
        let dw = pair(scales);
        let mw = (!mins.is_empty()).then(|| pair(mins));
        for (i, a) in acts.iter().enumerate() {
            // SAFETY: activations are padded to an even block count, so the 64 bytes of
            // q and 16 lanes of d8, init and lane_sums at pair p exist.
            unsafe {
                let xq = _mm512_loadu_si512(a.q.as_ptr().add(2 * QK * p) as *const __m512i);
                let init = _mm512_loadu_si512(a.init.as_ptr().add(2 * p) as *const __m512i);
                let isum = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init, wz, xq));
                // Per lane: d·Σu·q (+ m·Σq for Q4_1, exact), then × d_x.
                let lane = match mw {
                    Some(m) => {
                        let sl = _mm512_loadu_ps(a.lane_sums.as_ptr().add(2 * p) as *const f32);
                        _mm512_fmadd_ps(isum, dw, _mm512_mul_ps(m, sl))
                    }
                    None => _mm512_mul_ps(isum, dw),
                };
                let dx = _mm512_loadu_ps(a.d8.as_ptr().add(2 * p) as *const f32);
                acc[i] = _mm512_fmadd_ps(lane, dx, acc[i]);
            }
        }
    }
    for (i, o) in out.iter_mut().enumerate().take(acts.len()) {
        *o = _mm512_reduce_add_ps(acc[i]);
    }
}
