//! The x86 register types the interleaved loops are written over: [`RowLanes`] on one
//! ymm ([`Ymm`], 8 rows), a pair of ymm ([`YmmPair`], 16 rows) and zmm ([`Zmm`], 16
//! rows), the AVX2 and VNNI dot products they take ([`Dot4`]), [`Wide8`] on ymm, and
//! the split-scale kernel's [`PlaneLanes`]. The entry points that pick among them are
//! in the parent module.

use super::super::super::avx2_int8::MetaElem;
use super::super::super::packed::ROWS8;
use super::super::planes::PlaneLanes;
use super::super::{ChunkMeta, Codes, RowLanes, Wide8};
use super::PAIR_M;
use half::f16;
use std::arch::x86_64::*;

/// The 4-byte dot products of a chunk: per i32 lane (one weight row), Σ u·q_x over 32
/// codes in 8 steps of 4, starting from the activation block's start value.
pub(super) trait Dot4 {
    /// A running chunk sum.
    type Sum: Copy;
    /// As [`RowLanes::SIGNED_BYTES`]: stated by each instance (no default), as its
    /// [`Dot4::full_codes`] and `finish` must agree with it.
    const SIGNED_BYTES: bool;
    /// As [`RowLanes::Full`].
    type Full: Copy;
    /// As [`RowLanes::I16_SUMS`], stated by each instance as its `finish` relies on it.
    const I16_SUMS: bool;
    /// As [`RowLanes::ROLLED_FROM`].
    const ROLLED_FROM: usize;
    /// # Safety
    /// The implementation's CPU features.
    unsafe fn start(init: i32) -> Self::Sum;
    /// Adds the 4-byte dots of codes `u` (< 32 for [`Maddubs`], any byte for [`Vnni`])
    /// and activation bytes `x`.
    ///
    /// # Safety
    /// As [`Dot4::start`].
    unsafe fn add(sum: Self::Sum, u: __m256i, x: __m256i) -> Self::Sum;
    /// As [`RowLanes::full_codes`].
    ///
    /// # Safety
    /// As [`Dot4::start`].
    unsafe fn full_codes(v: __m256i) -> Self::Full;
    /// As [`RowLanes::add_full`].
    ///
    /// # Safety
    /// As [`Dot4::start`].
    unsafe fn add_full(sum: Self::Sum, u: Self::Full, x: __m256i) -> Self::Sum;
    /// The chunk's i32 sums from its two running sums (the first started from `init`),
    /// start value included, for codes of kind `CODES` ([`Codes`]).
    ///
    /// # Safety
    /// As [`Dot4::start`].
    unsafe fn finish<const CODES: u8>(sums: [Self::Sum; 2], init: i32) -> __m256i;
}

/// AVX2: `vpmaddubsw` pairs into i16, added with `vpaddw` (bounded, see `rows8`'s module
/// docs), then `vpmaddwd` against ones into i32. Full bytes go in signed, as |q| against
/// the activation bytes with q's signs, each step widened to i32 (`rows8`'s module docs).
///
/// Full bytes went in as two nibble planes, u = 16·h + l, each with its own i16 sum,
/// until 2026-12-06: as many multiplies, but two sums a row, and 8 rows' 16 sums and 8
/// accumulators spilled in the steps. Signed, one i32 sum a row: Q8_0 16×3072×576 in
/// cache, one thread, 500–504 µs against 564–569; the LM head 16×49152×576 on one copy
/// of its weights, 2 threads, 4100–4112 against 4583–7127 (AMD Zen 3, `tessera bench
/// qmatmul --variant avx2-int8-r8`, 3 alternated rounds, fastest samples).
pub(super) struct Maddubs;

impl Dot4 for Maddubs {
    type Sum = __m256i;
    const SIGNED_BYTES: bool = true;
    /// q = u − 128 and |q| (`vpabsb`; |−128| reads 128 as an unsigned byte).
    type Full = [__m256i; 2];
    const I16_SUMS: bool = true;
    const ROLLED_FROM: usize = 5;
    #[inline(always)]
    unsafe fn start(_: i32) -> __m256i {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn add(sum: __m256i, u: __m256i, x: __m256i) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe { _mm256_add_epi16(sum, _mm256_maddubs_epi16(u, x)) }
    }
    #[inline(always)]
    unsafe fn full_codes(v: __m256i) -> [__m256i; 2] {
        // SAFETY: AVX2 per the contract; u ^ 0x80 is u − 128 as a signed byte.
        unsafe {
            let q = _mm256_xor_si256(v, _mm256_set1_epi8(i8::MIN));
            [q, _mm256_abs_epi8(q)]
        }
    }
    #[inline(always)]
    unsafe fn add_full(sum: __m256i, [q, abs]: [__m256i; 2], x: __m256i) -> __m256i {
        // SAFETY: AVX2 per the contract. |q|·(±x) pairs: |x| ≤ 127 (the activation
        // quantizer's clamp), so a pair is within 2·128·127 < 2¹⁵ and never saturates;
        // where q = 0, `vpsignb` zeroes x as |q| does.
        unsafe {
            let pairs = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(x, q));
            _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
    #[inline(always)]
    unsafe fn finish<const CODES: u8>([a, b]: [__m256i; 2], init: i32) -> __m256i {
        // SAFETY: AVX2 per the contract. Nibbles' two i16 sums together obey the
        // 8-step bound of `rows8`'s module docs; 5-bit codes' only each their own
        // 4 steps, so they widen apart; full bytes' are i32 already.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let s = match CODES {
                Codes::NIBBLES => _mm256_madd_epi16(_mm256_add_epi16(a, b), ones),
                Codes::FULL => _mm256_add_epi32(a, b),
                _ => _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones)),
            };
            _mm256_add_epi32(s, _mm256_set1_epi32(init))
        }
    }
}

/// AVX512_VNNI on ymm: `vpdpbusd` accumulates the 4-byte dots in i32 directly, so it
/// takes full bytes whole, unsigned, with the activation's start value.
pub(super) struct Vnni;

impl Dot4 for Vnni {
    type Sum = __m256i;
    const SIGNED_BYTES: bool = false;
    type Full = __m256i;
    const I16_SUMS: bool = false;
    const ROLLED_FROM: usize = usize::MAX;
    #[inline(always)]
    unsafe fn start(init: i32) -> __m256i {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_set1_epi32(init) }
    }
    #[inline(always)]
    unsafe fn add(sum: __m256i, u: __m256i, x: __m256i) -> __m256i {
        // SAFETY: AVX512_VNNI + AVX512VL per the contract.
        unsafe { _mm256_dpbusd_epi32(sum, u, x) }
    }
    #[inline(always)]
    unsafe fn full_codes(v: __m256i) -> __m256i {
        v
    }
    #[inline(always)]
    unsafe fn add_full(sum: __m256i, u: __m256i, x: __m256i) -> __m256i {
        // SAFETY: forwarded contract.
        unsafe { Self::add(sum, u, x) }
    }
    #[inline(always)]
    unsafe fn finish<const CODES: u8>([a, b]: [__m256i; 2], _: i32) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe { _mm256_add_epi32(a, b) }
    }
}

/// One group's 8 rows on ymm, with dot product `D`.
pub(super) struct Ymm<D>(std::marker::PhantomData<D>);

impl<D: Dot4<Sum = __m256i>> RowLanes for Ymm<D> {
    const GROUPS: usize = 1;
    const SIGNED_BYTES: bool = D::SIGNED_BYTES;
    const I16_SUMS: bool = D::I16_SUMS;
    const ROLLED_FROM: usize = D::ROLLED_FROM;
    type I = __m256i;
    type F = __m256;
    type Full = D::Full;
    #[inline(always)]
    unsafe fn codes(p: *const u8, _: usize) -> __m256i {
        // SAFETY: AVX per the contract; 32 readable bytes.
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }
    #[inline(always)]
    unsafe fn nibbles<const HI: bool>(v: __m256i) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe {
            let v = if HI { _mm256_srli_epi16::<4>(v) } else { v };
            _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
        }
    }
    #[inline(always)]
    unsafe fn start(init: i32) -> __m256i {
        // SAFETY: forwarded contract.
        unsafe { D::start(init) }
    }
    #[inline(always)]
    unsafe fn add(sum: __m256i, u: __m256i, x: i32) -> __m256i {
        // SAFETY: forwarded contract.
        unsafe { D::add(sum, u, _mm256_set1_epi32(x)) }
    }
    #[inline(always)]
    unsafe fn full_codes(v: __m256i) -> D::Full {
        // SAFETY: forwarded contract.
        unsafe { D::full_codes(v) }
    }
    #[inline(always)]
    unsafe fn add_full(sum: __m256i, u: D::Full, x: i32) -> __m256i {
        // SAFETY: forwarded contract.
        unsafe { D::add_full(sum, u, _mm256_set1_epi32(x)) }
    }
    #[inline(always)]
    unsafe fn finish<const CODES: u8>(sums: [__m256i; 2], init: i32) -> __m256i {
        // SAFETY: forwarded contract.
        unsafe { D::finish::<CODES>(sums, init) }
    }
    #[inline(always)]
    unsafe fn meta<C: ChunkMeta, const MINS: bool>(m: &[C; 2], c: usize) -> __m256 {
        // SAFETY: forwarded contract.
        unsafe {
            if MINS {
                m[0].mins::<__m256>(c)
            } else {
                m[0].scales::<__m256>(c)
            }
        }
    }
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn scale_add(s: __m256i, d: __m256, dx: f32, acc: __m256) -> __m256 {
        // SAFETY: AVX and FMA per the contract.
        unsafe {
            _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(s),
                _mm256_mul_ps(d, _mm256_set1_ps(dx)),
                acc,
            )
        }
    }
    #[inline(always)]
    unsafe fn min_add(m: __m256, sums: f32, acc: __m256) -> __m256 {
        // SAFETY: FMA per the contract.
        unsafe { _mm256_fmadd_ps(m, _mm256_set1_ps(sums), acc) }
    }
    #[inline(always)]
    unsafe fn store(acc: __m256, out: &mut [f32]) {
        // SAFETY: per the contract.
        unsafe { store_group(&[acc], out) }
    }
}

/// Two adjacent groups' 16 rows on a pair of ymm registers, with dot product `D`: each
/// activation broadcast serves both groups' `vpmaddubsw`, as do the chunk's d_x and
/// minimum-term broadcasts in the finish ([`super::dots16`]).
pub(super) struct YmmPair<D>(std::marker::PhantomData<D>);

impl<D: Dot4<Sum = __m256i>> RowLanes for YmmPair<D> {
    const GROUPS: usize = 2;
    const SIGNED_BYTES: bool = D::SIGNED_BYTES;
    const I16_SUMS: bool = D::I16_SUMS;
    /// Rolled, as [`super::dots8`]' 8 rows are ([`RowLanes::ROLLED_FROM`]): unrolled,
    /// LLVM spilled the sums (Q4_1 16×3072×576 in cache 431–435 µs against 327–328).
    const ROLLED_FROM: usize = PAIR_M;
    /// Two groups make 4 rows' 8 independent chains, as 8 rows of one group.
    const ONE_CHAIN_FROM: usize = PAIR_M;
    type I = [__m256i; 2];
    type F = [__m256; 2];
    type Full = [D::Full; 2];
    // Each method is `Ymm<D>`'s on each group. Where both take the same activation
    // value (`add`'s bytes, `scale_add`'s d_x, `min_add`'s term), LLVM broadcasts it
    // once: that is the point of the pair.
    #[inline(always)]
    unsafe fn codes(p: *const u8, group_bytes: usize) -> [__m256i; 2] {
        // SAFETY: forwarded contract; 32 readable bytes at each address.
        unsafe {
            [
                Ymm::<D>::codes(p, 0),
                Ymm::<D>::codes(p.add(group_bytes), 0),
            ]
        }
    }
    #[inline(always)]
    unsafe fn nibbles<const HI: bool>(v: [__m256i; 2]) -> [__m256i; 2] {
        // SAFETY: forwarded contract.
        unsafe { [Ymm::<D>::nibbles::<HI>(v[0]), Ymm::<D>::nibbles::<HI>(v[1])] }
    }
    #[inline(always)]
    unsafe fn start(init: i32) -> [__m256i; 2] {
        // SAFETY: forwarded contract.
        unsafe { [Ymm::<D>::start(init); 2] }
    }
    #[inline(always)]
    unsafe fn add(sum: [__m256i; 2], u: [__m256i; 2], x: i32) -> [__m256i; 2] {
        // SAFETY: forwarded contract.
        unsafe {
            [
                Ymm::<D>::add(sum[0], u[0], x),
                Ymm::<D>::add(sum[1], u[1], x),
            ]
        }
    }
    #[inline(always)]
    unsafe fn full_codes(v: [__m256i; 2]) -> [D::Full; 2] {
        // SAFETY: forwarded contract.
        unsafe { v.map(|g| Ymm::<D>::full_codes(g)) }
    }
    #[inline(always)]
    unsafe fn add_full(sum: [__m256i; 2], u: [D::Full; 2], x: i32) -> [__m256i; 2] {
        // SAFETY: forwarded contract.
        unsafe {
            [
                Ymm::<D>::add_full(sum[0], u[0], x),
                Ymm::<D>::add_full(sum[1], u[1], x),
            ]
        }
    }
    #[inline(always)]
    unsafe fn finish<const CODES: u8>(sums: [[__m256i; 2]; 2], init: i32) -> [__m256i; 2] {
        // SAFETY: forwarded contract, per group.
        unsafe {
            [
                Ymm::<D>::finish::<CODES>([sums[0][0], sums[1][0]], init),
                Ymm::<D>::finish::<CODES>([sums[0][1], sums[1][1]], init),
            ]
        }
    }
    #[inline(always)]
    unsafe fn meta<C: ChunkMeta, const MINS: bool>(m: &[C; 2], c: usize) -> [__m256; 2] {
        // SAFETY: forwarded contract, for both groups.
        unsafe {
            if MINS {
                [m[0].mins(c), m[1].mins(c)]
            } else {
                [m[0].scales(c), m[1].scales(c)]
            }
        }
    }
    #[inline(always)]
    unsafe fn zero() -> [__m256; 2] {
        // SAFETY: forwarded contract.
        unsafe { [Ymm::<D>::zero(); 2] }
    }
    #[inline(always)]
    unsafe fn scale_add(s: [__m256i; 2], d: [__m256; 2], dx: f32, acc: [__m256; 2]) -> [__m256; 2] {
        // SAFETY: forwarded contract.
        unsafe {
            [
                Ymm::<D>::scale_add(s[0], d[0], dx, acc[0]),
                Ymm::<D>::scale_add(s[1], d[1], dx, acc[1]),
            ]
        }
    }
    #[inline(always)]
    unsafe fn min_add(m: [__m256; 2], sums: f32, acc: [__m256; 2]) -> [__m256; 2] {
        // SAFETY: forwarded contract.
        unsafe {
            [
                Ymm::<D>::min_add(m[0], sums, acc[0]),
                Ymm::<D>::min_add(m[1], sums, acc[1]),
            ]
        }
    }
    #[inline(always)]
    unsafe fn store(acc: [__m256; 2], out: &mut [f32]) {
        // SAFETY: per the contract (16 floats).
        unsafe { store_group(&acc, out) }
    }
}

/// Two adjacent groups' 16 rows on zmm with `vpdpbusd` (AVX-512F/BW/DQ and
/// AVX512_VNNI): lanes 0–7 the first group's rows, 8–15 the second's.
pub(super) struct Zmm;

impl RowLanes for Zmm {
    const GROUPS: usize = 2;
    type I = __m512i;
    type F = __m512;
    /// Whole and unsigned, as [`Vnni`]'s.
    type Full = __m512i;
    #[inline(always)]
    unsafe fn codes(p: *const u8, group_bytes: usize) -> __m512i {
        // SAFETY: AVX-512F per the contract; 32 readable bytes at each address.
        unsafe {
            let lo = _mm256_loadu_si256(p as *const __m256i);
            let hi = _mm256_loadu_si256(p.add(group_bytes) as *const __m256i);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        }
    }
    #[inline(always)]
    unsafe fn nibbles<const HI: bool>(v: __m512i) -> __m512i {
        // SAFETY: AVX-512F/BW per the contract.
        unsafe {
            let v = if HI { _mm512_srli_epi16::<4>(v) } else { v };
            _mm512_and_si512(v, _mm512_set1_epi8(0x0F))
        }
    }
    #[inline(always)]
    unsafe fn start(init: i32) -> __m512i {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_set1_epi32(init) }
    }
    #[inline(always)]
    unsafe fn add(sum: __m512i, u: __m512i, x: i32) -> __m512i {
        // SAFETY: AVX512_VNNI per the contract.
        unsafe { _mm512_dpbusd_epi32(sum, u, _mm512_set1_epi32(x)) }
    }
    #[inline(always)]
    unsafe fn full_codes(v: __m512i) -> __m512i {
        v
    }
    #[inline(always)]
    unsafe fn add_full(sum: __m512i, u: __m512i, x: i32) -> __m512i {
        // SAFETY: forwarded contract.
        unsafe { Self::add(sum, u, x) }
    }
    #[inline(always)]
    unsafe fn finish<const CODES: u8>([a, b]: [__m512i; 2], _: i32) -> __m512i {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn meta<C: ChunkMeta, const MINS: bool>(m: &[C; 2], c: usize) -> __m512 {
        // SAFETY: forwarded contract; AVX-512DQ for the insert.
        unsafe {
            let [lo, hi]: [__m256; 2] = if MINS {
                [m[0].mins(c), m[1].mins(c)]
            } else {
                [m[0].scales(c), m[1].scales(c)]
            };
            _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi)
        }
    }
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn scale_add(s: __m512i, d: __m512, dx: f32, acc: __m512) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe {
            _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(s),
                _mm512_mul_ps(d, _mm512_set1_ps(dx)),
                acc,
            )
        }
    }
    #[inline(always)]
    unsafe fn min_add(m: __m512, sums: f32, acc: __m512) -> __m512 {
        // SAFETY: AVX-512F per the contract.
        unsafe { _mm512_fmadd_ps(m, _mm512_set1_ps(sums), acc) }
    }
    #[inline(always)]
    unsafe fn store(acc: __m512, out: &mut [f32]) {
        debug_assert!(out.len() >= 16);
        // SAFETY: AVX-512F per the contract; out holds 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) }
    }
}

/// Writes the group's dots, lane g of `acc[i]` (row r0 + g against activation row i),
/// to `out[8i + g]`, the layout the driver reads.
///
/// # Safety
/// AVX.
#[inline(always)]
unsafe fn store_group(acc: &[__m256], out: &mut [f32]) {
    for (a, o) in acc.iter().zip(out.chunks_exact_mut(ROWS8)) {
        // SAFETY: AVX per the contract; `o` holds 8 floats.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *a) };
    }
}

/// A ymm's 8 lanes (AVX2 and F16C, which every caller's features include).
impl Wide8 for __m256 {
    #[inline(always)]
    unsafe fn from_f32(p: *const f32) -> __m256 {
        // SAFETY: forwarded contract.
        unsafe { f32::load8(p) }
    }
    #[inline(always)]
    unsafe fn from_f16(p: *const f16) -> __m256 {
        // SAFETY: forwarded contract.
        unsafe { f16::load8(p) }
    }
    #[inline(always)]
    unsafe fn f16_times_u8(base: *const f16, bytes: *const u8) -> __m256 {
        // SAFETY: forwarded contract.
        unsafe {
            let ints = _mm_loadl_epi64(bytes as *const __m128i);
            let small = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(ints));
            _mm256_mul_ps(f16::load8(base), small)
        }
    }
}

/// `vpshufb` masks repeating each lane's i16 h (0: half 0's scale, 1: half 1's) in
/// both of its i16. Constants: built from a runtime `h` they compiled to a chain of
/// `vpinsrb` per chunk (perf annotate; Q6_K 16×1536×512 took 1.6× as long).
const REPEAT: [[i8; 32]; 2] = [repeat_bytes(0), repeat_bytes(1)];

const fn repeat_bytes(h: i8) -> [i8; 32] {
    let lane = [0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13];
    let mut out = [0i8; 32];
    let mut i = 0;
    while i < 32 {
        out[i] = lane[i % 16] + 2 * h;
        i += 1;
    }
    out
}

/// A 16-weight half's running sum and how its sub-scale applies, per dot product.
pub(super) trait HalfDot: Dot4<Sum = __m256i> {
    /// One activation row's running sum over a half.
    type Half: Copy;
    /// # Safety
    /// The dot product's CPU features (so for every method below).
    unsafe fn half_zero() -> Self::Half;
    /// Adds step `t4` (0..4): codes `u` (< 64) against the 4 activation bytes `x`.
    ///
    /// # Safety
    /// As [`HalfDot::half_zero`].
    unsafe fn half_add(h: Self::Half, u: __m256i, x: i32, t4: usize) -> Self::Half;
    /// `total + sc_half·Σh` per row, `pair` holding each row's (sc₀, sc₁) as i16.
    ///
    /// # Safety
    /// As [`HalfDot::half_zero`].
    unsafe fn half_total(total: __m256i, h: Self::Half, pair: __m256i, half: usize) -> __m256i;
}

/// AVX2: a half's sum in two i16 accumulators (steps 0–1 and 2–3, each within i16, see
/// `planes`), finished and scaled by one `vpmaddwd` each against the repeated scale.
impl HalfDot for Maddubs {
    type Half = [__m256i; 2];
    #[inline(always)]
    unsafe fn half_zero() -> [__m256i; 2] {
        // SAFETY: AVX per the contract.
        unsafe { [_mm256_setzero_si256(); 2] }
    }
    #[inline(always)]
    unsafe fn half_add(mut h: [__m256i; 2], u: __m256i, x: i32, t4: usize) -> [__m256i; 2] {
        // SAFETY: AVX2 per the contract; codes < 64 keep pairs and the i16 sums in range.
        unsafe {
            let p = _mm256_maddubs_epi16(u, _mm256_set1_epi32(x));
            h[t4 / 2] = _mm256_add_epi16(h[t4 / 2], p);
        }
        h
    }
    #[inline(always)]
    unsafe fn half_total(total: __m256i, h: [__m256i; 2], pair: __m256i, half: usize) -> __m256i {
        // SAFETY: AVX2 per the contract; the mask is 32 bytes.
        unsafe {
            let sc = _mm256_shuffle_epi8(pair, _mm256_loadu_si256(REPEAT[half].as_ptr().cast()));
            let s = _mm256_add_epi32(_mm256_madd_epi16(h[0], sc), _mm256_madd_epi16(h[1], sc));
            _mm256_add_epi32(total, s)
        }
    }
}

/// AVX512_VNNI: `vpdpbusd` sums a half in i32 (no i16 steps), and the half's scale,
/// sign-extended from its i16 in the row's lane, multiplies it in (`vpmulld`).
impl HalfDot for Vnni {
    type Half = __m256i;
    #[inline(always)]
    unsafe fn half_zero() -> __m256i {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn half_add(h: __m256i, u: __m256i, x: i32, _: usize) -> __m256i {
        // SAFETY: AVX512_VNNI + VL per the contract.
        unsafe { _mm256_dpbusd_epi32(h, u, _mm256_set1_epi32(x)) }
    }
    #[inline(always)]
    unsafe fn half_total(total: __m256i, h: __m256i, pair: __m256i, half: usize) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe {
            let sc = if half == 0 {
                _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(pair))
            } else {
                _mm256_srai_epi32::<16>(pair)
            };
            _mm256_add_epi32(total, _mm256_mullo_epi32(h, sc))
        }
    }
}

/// The split-scale primitives on ymm, the half sums per dot product ([`HalfDot`]).
impl<D: HalfDot> PlaneLanes for Ymm<D> {
    type Half = D::Half;
    /// Lane r: row r's (sc₀, sc₁) as i16.
    type Scales = __m256i;
    #[inline(always)]
    unsafe fn crumb<const K: u32>(v: __m256i) -> __m256i {
        // SAFETY: AVX2 per the contract. Bits shifted across a byte land outside 4–5.
        unsafe {
            let at4 = match K {
                0 => _mm256_slli_epi16::<4>(v),
                1 => _mm256_slli_epi16::<2>(v),
                2 => v,
                _ => _mm256_srli_epi16::<2>(v),
            };
            _mm256_and_si256(at4, _mm256_set1_epi8(0x30))
        }
    }
    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe { _mm256_or_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn zero_i() -> __m256i {
        // SAFETY: AVX per the contract.
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn half_zero() -> D::Half {
        // SAFETY: forwarded contract.
        unsafe { D::half_zero() }
    }
    #[inline(always)]
    unsafe fn half_add(h: D::Half, u: __m256i, x: i32, t4: usize) -> D::Half {
        // SAFETY: forwarded contract.
        unsafe { D::half_add(h, u, x, t4) }
    }
    #[inline(always)]
    unsafe fn scales(p: *const i8) -> __m256i {
        // SAFETY: AVX2 per the contract; 16 bytes at p.
        unsafe { _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn half_total(total: __m256i, h: D::Half, pair: __m256i, half: usize) -> __m256i {
        // SAFETY: forwarded contract.
        unsafe { D::half_total(total, h, pair, half) }
    }
    #[inline(always)]
    unsafe fn minus_offset(total: __m256i, pair: __m256i, half_sums: i32, offset: i32) -> __m256i {
        // SAFETY: AVX2 per the contract.
        unsafe {
            let term = _mm256_madd_epi16(pair, _mm256_set1_epi32(half_sums));
            _mm256_sub_epi32(total, _mm256_mullo_epi32(term, _mm256_set1_epi32(offset)))
        }
    }
    #[inline(always)]
    unsafe fn d8(p: *const f16) -> __m256 {
        // SAFETY: forwarded contract (F16C).
        unsafe { f16::load8(p) }
    }
}
