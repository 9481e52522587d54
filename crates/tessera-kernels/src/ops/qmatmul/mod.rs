//! Quantized matmul `y = x·Wᵀ`: f32 activations `x [M, K]`, weights `W [N, K]` kept in a
//! ggml block format, `y [M, N]` in f32.
//!
//! Two regimes, split at [`F32_BATCH_M`] for f32 activations:
//! - **decode / batching steps** (M ≤ 48): memory-bound at M = 1 on the weights. Each block is read
//!   once from memory, dequantized once into registers, and multiplied into up to
//!   `M_CHUNK` activation rows; threads split N. An explicit AVX-512 kernel expands the
//!   nibbles/bytes with `vpmovzxbd`/`vpmovsxbd` and FMA-accumulates per block.
//! - **prefill** (M > 48): compute-bound. Weight rows are dequantized to f32 as the f32
//!   GEMM packs them ([`gemm_bt_rows`]), so the dequantization cost is amortised over M
//!   rows and the GEMM's register tiling does the work.
//!
//! Dequantization here is exactly the format's definition (the same f32 values
//! [`QuantMatrix::dequantize`] gives), so the only error is f32 accumulation.

mod act16;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod act_panel;
mod byte_rows;
mod fp8;
mod int8;
mod int_kernel;
mod int_path;
mod packed;
mod quant_acts;
mod spec;
mod spec_fp8;
mod spec_int8;
mod stack;

pub use act16::qmatmul_a16;
pub use fp8::qmatmul_fp8;
pub use int8::{qmatmul_i8, qmatmul_w8a8};
use int_kernel::{IntKernel, Tiles};
pub use packed::PackedWeights;
use quant_acts::QuantActs;
pub use spec::{QMatmulOp, QMatmulProblem, TOL, TOL_INT8};
pub use spec_fp8::{Fp8Problem, QMatmulFp8Op};
pub use spec_int8::{I8Problem, QMatmulI8Op};

use super::gemm::{gemm_bt_rows, gemm_bt_weight_rows, WeightRows};
use crate::multiversion;
use crate::pool::{self, SharedMut};
use crate::quant::{BlockFormat, QuantMatrix, QK, QK_K};
use crate::registry::ComputeUnit;
use tessera_core::CacheSizes;
#[cfg(target_arch = "x86_64")]
use tessera_core::CpuFeatures;
use tessera_core::{Error, Isa, Result, TensorView, TensorViewMut};

/// Largest M that takes the per-block (GEMV-like) path.
pub const SMALL_M: usize = 16;
/// Largest M that the per-block path takes with f32 activations: batching steps of up to
/// this many tokens. Its cost grows linearly with M while dequantize + GEMM pays a fixed
/// dequantization of the whole matrix per call; measured on a Zen 4 host (2 threads, Q4_1
/// 3072×576, AVX-512, `tessera bench qmatmul --shape MxNxK --dtype q4_1 --variant
/// avx512`): dequantize + GEMM 2.13 ms at M = 32 and 2.17 ms at M = 64; per-block 0.67 ms
/// at M = 16, 1.37 ms at M = 32, 2.02 ms at M = 48 — they cross near 48.
pub const F32_BATCH_M: usize = 48;
/// Activation rows sharing one dequantized block (2 zmm accumulators each).
const M_CHUNK: usize = 4;
/// Fewest weight rows per task on the small-M path (~5 KiB of Q4_0 blocks at K = 576).
const ROWS_PER_TASK: usize = 16;

/// `y = x·Wᵀ` on a chosen ISA and thread count.
pub fn qmatmul<B: BlockFormat>(
    isa: Isa,
    threads: usize,
    w: &QuantMatrix<B>,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let dequant = |r: usize, out: &mut [f32]| w.dequantize_row(r, out);
    let dots = |r: usize, xr: &[&[f32]], out: &mut [f32]| row_dots(isa, w.row(r), xr, out);
    weight_matmul(isa, threads, (w.rows(), w.cols()), x, y, dequant, dots)
}

/// What every f32-activation matmul over compressed weights shares: the checks, then
/// either the prefill path (M > [`SMALL_M`]; `dequant(r, out)` writes weight row r in
/// f32) or, per weight row r, `dots(r, x rows, out)` for up to [`M_CHUNK`] rows at once.
pub(super) fn weight_matmul(
    isa: Isa,
    threads: usize,
    (n, k): (usize, usize),
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
    dequant: impl Fn(usize, &mut [f32]) + Sync,
    dots: impl Fn(usize, &[&[f32]], &mut [f32]) + Sync,
) -> Result<()> {
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    let (m, _) = check_shapes(x, y, n, k)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if m > F32_BATCH_M {
        return gemm_bt_rows(isa, threads, x, (n, &dequant), y);
    }
    let (xs, ld) = contiguous_rows(x);
    for_weight_rows::<M_CHUNK, 1>(threads, (n, m, m), RowStore::Each, y, |r, m0, mc, out| {
        let xr: [&[f32]; M_CHUNK] = std::array::from_fn(|i| &xs[(m0 + i.min(mc - 1)) * ld..][..k]);
        dots(r, &xr[..mc], out);
    });
    Ok(())
}

/// `y = x·Wᵀ` through the integer path: each activation row quantized to 8 bits per
/// 32-block, weights pre-packed ([`PackedWeights`]), integer dot products — `vpdpbusd`
/// when `isa` is AVX-512 and the CPU has AVX512_VNNI, `vpmaddubsw` on AVX2 (and AVX-512
/// without VNNI), the portable integer kernel for the scalar ISA. Error: see [`TOL_INT8`].
pub fn qmatmul_int8(
    isa: Isa,
    threads: usize,
    w: &PackedWeights,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    int8_path(isa, threads, w, x, y, (ActScales::PerBlock, Tiles::Auto))
}

/// [`qmatmul_int8`] with the tile kernel's use pinned (the registry's variants).
fn qmatmul_int8_tiles(
    isa: Isa,
    tiles: Tiles,
    threads: usize,
    w: &PackedWeights,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    int8_path(isa, threads, w, x, y, (ActScales::PerBlock, tiles))
}

/// `y = x·Wᵀ` over weights held only in the packed layout: the integer path
/// ([`qmatmul_int8`], activations quantized per 32-block) for decode and batch sizes
/// M ≤ [`INT8_BATCH_M`], and for prefill where it is the faster one
/// (`int8_prefill_pays`);
/// otherwise f32 activations through dequantize + GEMM. What an engine runs when it
/// keeps one copy of the weights for `--int8-acts`.
///
/// On a VNNI CPU the integer path takes the AVX2 kernels ([`engine_int8_isa`]).
pub fn qmatmul_packed(
    isa: Isa,
    threads: usize,
    w: &PackedWeights,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let (m, _) = check_shapes(x, y, w.rows(), w.cols())?;
    if packed_integer_path(isa, w, m, false) {
        return qmatmul_int8(engine_int8_isa(isa, w), threads, w, x, y);
    }
    packed_f32(isa, threads, w, x, y)
}

/// [`qmatmul_packed`] with 16-bit activations ([`qmatmul_a16`]) up to
/// [`INT8_BATCH_M`] rows, and beyond (prefill) where tiles pay (`a16_prefill_pays`); else f32
/// activations (two 8-bit planes double the integer path's work, and on vector
/// instructions dequantize + GEMM is then the faster).
pub fn qmatmul_packed_a16(
    isa: Isa,
    threads: usize,
    w: &PackedWeights,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let (m, _) = check_shapes(x, y, w.rows(), w.cols())?;
    if packed_integer_path(isa, w, m, true) {
        return qmatmul_a16(engine_int8_isa(isa, w), threads, w, x, y);
    }
    packed_f32(isa, threads, w, x, y)
}

/// Whether [`qmatmul_packed`] (`a16` false) or [`qmatmul_packed_a16`] (true) takes the
/// integer path for `m` activation rows over `w`, rather than dequantize + f32 GEMM.
fn packed_integer_path(isa: Isa, w: &PackedWeights, m: usize, a16: bool) -> bool {
    m <= INT8_BATCH_M
        || if a16 {
            a16_prefill_pays(isa, w)
        } else {
            int8_prefill_pays(isa, w)
        }
}

/// The arithmetic a [`qmatmul_packed`] (`a16` false) or [`qmatmul_packed_a16`] (true)
/// call of `m` activation rows over `w` is bounded by: 8-bit integer dots on the integer
/// path (16-bit activations as two such planes, so twice the dots per FLOP counted), f32
/// FMAs through dequantize + GEMM. What a profile measures the call against.
pub fn packed_compute_unit(isa: Isa, w: &PackedWeights, m: usize, a16: bool) -> ComputeUnit {
    if packed_integer_path(isa, w, m, a16) {
        ComputeUnit::Int8Dot
    } else {
        ComputeUnit::Fma
    }
}

/// Whether a prefill over `w` is faster with 16-bit activations on AMX tiles than
/// through dequantize + f32 GEMM: for the formats whose 8-bit prefill pays
/// ([`int8_prefill_pays`]), where the tile kernel serves them. Host H (Intel, AMX, 2
/// threads, 2026-12-02, `tessera bench qmatmul --shape S --variant
/// avx512|avx512-amx-a16`, cold, 2 rounds), tiles ÷ GEMM: Q4_1 512×3072×576 0.82–0.86,
/// 512×576×1536 0.75–0.78, 512×960×576 0.83–0.93, 512×576×576 0.97, 128×3072×576 0.66,
/// 96×576×576 0.76; Q4_0 0.78 / 0.77, Q5_0 0.87 / 0.78, Q4_K and Q5_K 512×576×1536
/// 0.85 / 0.83 (one round).
fn a16_prefill_pays(isa: Isa, w: &PackedWeights) -> bool {
    let isa = engine_int8_isa(isa, w);
    #[cfg(target_arch = "x86_64")]
    if int8_prefill_pays(isa, w) {
        let kernel = IntKernel::for_isa(isa).reading(w);
        return kernel.with_tiles(Tiles::Auto, usize::MAX) == IntKernel::AmxRows16;
    }
    let _ = isa;
    false
}

/// Packed weights against f32 activations: dequantize + GEMM.
fn packed_f32(
    isa: Isa,
    threads: usize,
    w: &PackedWeights,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let (_, n) = check_shapes(x, y, w.rows(), w.cols())?;
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    if n == 0 {
        return Ok(());
    }
    let dequant = |r: usize, out: &mut [f32]| w.dequantize_row(r, out);
    let dequant8 = |r0: usize, ks: (usize, usize), out: &mut [f32], ld: usize| {
        w.dequantize_rows8(r0, ks, out, ld)
    };
    let rows = WeightRows {
        n,
        fill: &dequant,
        fill8: Some(&dequant8),
    };
    gemm_bt_weight_rows(isa, threads, x, rows, y)
}

/// Up to this many rows [`qmatmul_packed`] takes the integer path for every layout: the
/// f32 path dequantizes the whole matrix per call, a fixed cost that small batches do
/// not amortise. Measured on a Zen 4 host (2 threads), Q8_0 49152×576 (the default
/// model's LM head): M = 32 13.9 ms integer against 33.4 ms f32, M = 64 29 against 43,
/// M = 128 a tie (56 against 53); Q8_0 32×960×576 0.27 against 0.49 ms.
pub const INT8_BATCH_M: usize = 64;

/// The ISA whose integer kernel [`qmatmul_packed`] runs for `isa` over `w`. Interleaved
/// weights keep it: on a VNNI CPU their `vpdpbusd` loop beat the `vpmaddubsw` one (Zen 4
/// host, 2 threads, Q4_1 at M = 16: 3072×576 173 against 202–308 µs, 576×1536 93–97
/// against 112–114 µs, a tie at M = 1; `tessera bench qmatmul --shape MxNxK --dtype q4_1`,
/// variants avx512-vnni-r8 and avx2-int8-r8). Row-major weights take AVX2's kernel where
/// the CPU has it: the row-major VNNI kernel lost to it at every shape measured (Q8_0
/// 49152×576 at M = 1 0.74 ms against 1.13, at M = 16 6.8 against 8.5 ms); it stays a
/// registry variant, verified and benchmarked.
pub fn engine_int8_isa(isa: Isa, w: &PackedWeights) -> Isa {
    match isa {
        Isa::Avx512 if !w.layout.interleaved() && Isa::Avx2.is_available() => Isa::Avx2,
        other => other,
    }
}

/// Whether a prefill (M > [`SMALL_M`]) over `w` on `isa` is faster on the integer path
/// than through dequantize + f32 GEMM. Measured on AVX2 at 512×N×K for the model's
/// shapes (`tessera bench qmatmul --variant avx2|avx2-int8[-r8] --shape 512xNxK`, the
/// two alternated, docs/performance.md): the interleaved 4-bit kernel wins for Q4_0,
/// Q4_1 and the group formats (int8 ÷ f32 0.69–0.79) and for Q4_K (0.73–0.77, a tie on
/// 192-row k/v), and so do the interleaved 5-bit formats (host B, Zen 3, 2026-11-27, 3 rounds:
/// Q5_0 512×1536×576 0.62–0.82, Q5_1 0.48–1.04 (median 0.64), Q5_K 512×576×1536
/// 0.51–0.86); Q3_K/Q6_K's split scales lose (1.06–1.2), and so keep the GEMM, as
/// does Q2_K (a tie: 512×1536×512 0.73–1.33, 512×576×1536 0.76–0.96, host B, 3
/// rounds); so do full bytes, whose `vpmaddubsw` reads two nibble planes (Q8_0
/// 512×1536×576 interleaved 1.02–1.27, host B, 2026-11-27; the row kernel lost by
/// 1.4–1.8×). The `vpdpbusd` instance of the same loop takes the same formats.
fn int8_prefill_pays(isa: Isa, w: &PackedWeights) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa.is_available()
        && matches!(
            IntKernel::for_isa(isa).reading(w),
            IntKernel::Avx2Rows8 | IntKernel::VnniRows8
        )
    {
        let five_bit = w.layout == packed::CodeLayout::Bytes8 && !w.signed_bytes();
        return (w.layout == packed::CodeLayout::Nibbles8 || five_bit)
            && !matches!(w.meta, packed::Meta::SplitI8(_));
    }
    let _ = (isa, w);
    false
}

/// How activations are quantized to 8 bits for the integer path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActScales {
    /// One scale per 32-value block (as ggml's Q8_0): the more accurate choice.
    PerBlock,
    /// One scale per row (W8A8 as SmoothQuant and TensorRT-LLM define it).
    PerRow,
}

/// What an integer path quantizes: M, N and x's rows (contiguous, `ld` apart), after
/// the ISA and the shapes are checked; None when there is nothing to compute.
type IntOperands<'a> = Option<(usize, usize, std::borrow::Cow<'a, [f32]>, usize)>;

fn int_operands<'a>(
    isa: Isa,
    w: &PackedWeights,
    x: &TensorView<'a, f32>,
    y: &TensorViewMut<'_, f32>,
) -> Result<IntOperands<'a>> {
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    let (m, n) = check_shapes(x, y, w.rows(), w.cols())?;
    if m == 0 || n == 0 {
        return Ok(None);
    }
    let (xs, ld) = contiguous_rows(x);
    Ok(Some((m, n, xs, ld)))
}

fn int8_path(
    isa: Isa,
    threads: usize,
    w: &PackedWeights,
    x: &TensorView<'_, f32>,
    y: &mut TensorViewMut<'_, f32>,
    (act, tiles): (ActScales, Tiles),
) -> Result<()> {
    let Some((m, _, xs, ld)) = int_operands(isa, w, x, y)? else {
        return Ok(());
    };
    let rows = Int8Rows {
        xs: &xs,
        ld,
        k: w.cols(),
        offset: w.offset(),
        act,
    };
    int_path::quantize_and_run::<1>(isa, threads, w, (act, tiles), (m, &rows), y);
    Ok(())
}

/// Activation rows quantized to 8 bits, one per row of x (`xs`, rows `ld` apart).
struct Int8Rows<'a> {
    xs: &'a [f32],
    ld: usize,
    k: usize,
    offset: i32,
    act: ActScales,
}

impl int_path::ActSource<1> for Int8Rows<'_> {
    fn quantize<S: quant_acts::BlockSink>(&self, i: usize, [a]: &mut [S; 1]) {
        let x = &self.xs[i * self.ld..][..self.k];
        quant_acts::quantize_into(Isa::best(), x, self.offset, self.act, a)
    }
}

/// Runs `f(i, &mut items[i])` for every row, split into contiguous runs of rows when
/// they hold at least [`pool::PARALLEL_ROW_VALUES`] values (`k` each): one per thread
/// for a batch, runs of ~16 Ki values for a prefill ([`pool::row_runs`]). Batched steps
/// quantize 16 rows before each matmul; on the caller alone the other threads wait.
/// Host H, 16 streams (`bench-serve`, 2026-12-02): quantizing took 11.3 µs a matmul on
/// one thread (the mean K of 816; a timer around it, ~10% of the int8 step), 8.7 on two.
fn each_row_mut<T: Send>(
    items: &mut [T],
    k: usize,
    threads: usize,
    f: impl Fn(usize, &mut T) + Sync,
) {
    let (tasks, per) = pool::row_runs(items.len(), k, threads);
    if tasks <= 1 {
        items.iter_mut().enumerate().for_each(|(i, t)| f(i, t));
        return;
    }
    pool::global().for_each_chunk_mut(items, per, threads, |first, run| {
        run.iter_mut()
            .enumerate()
            .for_each(|(i, x)| f(first + i, x))
    });
}

/// Most activation rows whose quantized buffers a thread keeps between integer matmuls:
/// a 512-token prefill (~3 MiB at K = 1536).
const REUSED_ACT_ROWS: usize = 512;

/// L1 bytes a prefill matmul's activation block takes (8 rows at K = 576): measured at
/// 512×1536×576 Q4_0 on AVX2 with a 32 KiB L1D, and kept on 48 KiB ones.
const PREFILL_ACT_BUDGET: usize = 24 << 10;

/// L1 bytes a batching step's (M ≤ [`INT8_BATCH_M`]) activation block takes: all of the
/// L1D but 8 KiB for the weight codes streaming past, between the prefill budget and
/// 40 KiB. A batching step streams its weights from L3 or DRAM once per block, so it
/// takes the most of L1 its blocks can. On a 48 KiB L1D (host E) that is 40 KiB, 16 rows
/// at K = 576, where 8-row blocks read the weights twice (3 alternated rounds, the
/// 16-stream step: LM head 3.95–4.57 -> 2.91–3.20 ms, gate/up 186–221 -> 155–197 µs);
/// all M rows in one block (up to 147 KiB) measured slower at M = 32 and 64. A 32 KiB
/// L1D (Zen 3/4) keeps the prefill budget, which was measured there; unknown, too.
fn batch_act_budget(l1d: Option<usize>) -> usize {
    l1d.map_or(PREFILL_ACT_BUDGET, |l1| {
        l1.saturating_sub(8 << 10)
            .clamp(PREFILL_ACT_BUDGET, 40 << 10)
    })
}

/// Activation rows per block of an integer matmul (a multiple of `pass`, the kernel's
/// rows per pass): each block streams the call's weight rows past once.
///
/// - Prefill, and batching steps whose weights a thread's L2 holds: as many rows as the
///   L1 budget takes ([`batch_act_budget`], [`PREFILL_ACT_BUDGET`]); a block after the
///   first re-reads the weights from L2.
/// - Batching steps (M ≤ [`INT8_BATCH_M`]) whose weight share per thread is larger than
///   its L2 (in the default model only the LM head, 28.7 MB of Q8_0): all M rows in one
///   block. Each further block would stream the weights from L3 or DRAM again, where
///   the activation rows, ≤ 64 of them, stay in L2 (≤ 147 KiB at K = 576). On a Zen 4
///   host with a 32 KiB L1D (host C: 8-row blocks before), Q8_0 16×49152×576 cold took
///   2.2–2.5 ms against 8-row blocks' 3.4–3.8, 32 rows 3.9–4.2 against 5.1–6.3
///   (`tessera bench qmatmul --variant avx512-vnni-r8`, 3 alternated rounds); the
///   engine's 16 streams are in docs/performance.md. Not measured on a 48 KiB L1D:
///   there [`batch_act_budget`] gives 16-row blocks, and every matmul of a step in one
///   block of 32 or 64 rows measured slower (its doc); whether the LM head alone
///   gains there is open.
fn act_block_rows(
    (m, k, pass): (usize, usize, usize),
    weight_share: usize,
    caches: CacheSizes,
) -> usize {
    let batch = m <= INT8_BATCH_M;
    if batch && caches.l2.is_some_and(|l2| weight_share > l2) {
        return m.next_multiple_of(pass);
    }
    let l1_budget = if batch {
        batch_act_budget(caches.l1d)
    } else {
        PREFILL_ACT_BUDGET
    };
    (l1_budget / (4 * k)).clamp(pass, 256) / pass * pass
}

/// Validates `x [M, K] · W[N, K]ᵀ → y [M, N]`; returns (M, N).
fn check_shapes(
    x: &TensorView<'_, f32>,
    y: &TensorViewMut<'_, f32>,
    n: usize,
    k: usize,
) -> Result<(usize, usize)> {
    const OP: &str = "qmatmul";
    if x.rank() != 2 || y.rank() != 2 {
        return Err(Error::Rank {
            op: OP,
            expected: "2 ([M, K] activations and [M, N] output)".into(),
            got: if x.rank() != 2 { x.rank() } else { y.rank() },
        });
    }
    let m = x.dims()[0];
    if x.dims()[1] != k || y.dims() != [m, n] {
        return Err(Error::shape(
            OP,
            format!(
                "x {:?} · W[{n}, {k}]ᵀ → y {:?} (want [{m}, {n}])",
                x.dims(),
                y.dims()
            ),
        ));
    }
    Ok((m, n))
}

/// x's rows as one slice and a row stride (copied when its columns are strided).
fn contiguous_rows<'a>(x: &TensorView<'a, f32>) -> (std::borrow::Cow<'a, [f32]>, usize) {
    let (l, k) = (*x.layout(), x.dims()[1]);
    if l.stride(1) == 1 {
        (
            std::borrow::Cow::Borrowed(&x.data()[l.offset()..]),
            l.stride(0),
        )
    } else {
        let rows = x.dims()[0];
        let v = (0..rows * k)
            .map(|i| x.get(&[i / k, i % k]).unwrap_or(f32::NAN))
            .collect();
        (std::borrow::Cow::Owned(v), k)
    }
}

/// Whether a matmul's tasks ask for their output lines one weight-row group ahead of
/// their stores (`prefetchw`): batching steps (M ≤ [`INT8_BATCH_M`]) whose outputs per
/// task, `task_bytes`, outgrow the L2 — the LM head, 16 rows × 24 576 columns × 4 bytes
/// a thread — where each group's stores otherwise wait for their lines (perf of the
/// 16-stream step: the output copy's stores hot, ~4% of its samples). Host C (Zen 4),
/// `tessera bench qmatmul --dtype q8_0 --shape 16x49152x576 --variant avx512-vnni-r8`
/// cold, 3 alternated rounds: 2.55–2.64 ms with plain stores, 1.88–2.15 with this,
/// 2.21–2.41 with a read prefetch (T0) instead. The layer matmuls (≤ 196 KiB of
/// outputs) measured no different in the engine (3 profiled runs each way), and prefill
/// is unmeasured: both keep plain stores.
#[cfg(any(target_arch = "x86_64", test))]
fn prefetch_outputs(m: usize, task_bytes: usize, caches: CacheSizes) -> bool {
    m <= INT8_BATCH_M && caches.l2.is_some_and(|l2| task_bytes > l2)
}

/// How [`for_weight_rows`] stores a pass's activation rows into y.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowStore {
    /// Activation row i is y's row i.
    Each,
    /// Activation rows 2i and 2i + 1 (a 16-bit row's two planes, `act16`) sum into
    /// y's row i, as each tile is stored: a separate pass over a 2M-row product read
    /// the other thread's half across cores and cost ~0.45 µs of a 576×576 decode
    /// call's 6.1 (host H, `tessera bench qmatmul --dtype q4_1 --shape 1x576x576
    /// --variant avx512-vnni-a16 --in-cache`, two threads, 3 alternated rounds).
    PairSums,
}

impl RowStore {
    /// Activation rows per row of y.
    fn rows_per_output(self) -> usize {
        match self {
            RowStore::Each => 1,
            RowStore::PairSums => 2,
        }
    }
}

/// Runs `dots(r, m0, mc, out)` for every group of G weight rows starting at r and chunk
/// of ≤ ROWS activation rows starting at m0, storing `out[i·G + g]` (i < mc; `out` is
/// mc·G long) into y[m0 + i, r + g], or with [`RowStore::PairSums`] the sum of rows
/// 2i and 2i + 1 into y[m0/2 + i, r + g] (rows past N are dropped: a last group may be
/// padding). Activation-row-major, so each activation row's G outputs go to y as one
/// contiguous run: the earlier weight-row-major tile was transposed here one float at a
/// time, 15% of a 16×3072×576 Q4_1 VNNI call (perf). Each thread takes one
/// contiguous run of weight rows: long sequential streams keep the hardware prefetchers
/// ahead (interleaved 16-row tasks left them restarting). Activation rows go in blocks
/// of `act_block`, each block swept over all of the thread's weight rows: sized to stay
/// in cache, so many rows (int8 prefill) are not re-streamed for every weight row.
fn for_weight_rows<const ROWS: usize, const G: usize>(
    threads: usize,
    (n, m, act_block): (usize, usize, usize),
    store: RowStore,
    y: &mut TensorViewMut<'_, f32>,
    dots: impl Fn(usize, usize, usize, &mut [f32]) + Sync,
) {
    // Pairs never straddle a pass or a block: both start at even rows.
    assert!(
        store == RowStore::Each
            || (m.is_multiple_of(2) && act_block.is_multiple_of(2) && ROWS.is_multiple_of(2)),
        "pair sums need whole pairs per pass ({m} rows, blocks of {act_block}, passes of {ROWS})"
    );
    let per_y = store.rows_per_output();
    // y's strides read once: `Layout::index_of` per output (a call and a loop over
    // the rank) was a quarter of int8 prefill's time (perf, 512×1536×576 Q4_0).
    let yl = *y.layout();
    let (ld, step, origin) = (yl.stride(0), yl.stride(1), yl.offset());
    let yptr = SharedMut(y.data_mut().as_mut_ptr());
    let per_task = n
        .div_ceil(threads.max(1))
        .max(ROWS_PER_TASK)
        .next_multiple_of(G);
    let act_block = act_block.max(1);
    #[cfg(target_arch = "x86_64")]
    let ahead = step == 1
        && CpuFeatures::get().prefetchw
        && prefetch_outputs(m, m / per_y * per_task * 4, CacheSizes::get());
    pool::global().run(n.div_ceil(per_task), threads.max(1), |t| {
        // One tile per task, not zeroed per group: `dots` writes out[..mc·G] before
        // anything is read from it (lanes of a last, partial group are never copied).
        let mut out = [[0f32; G]; ROWS];
        let end = ((t + 1) * per_task).min(n);
        for a0 in (0..m).step_by(act_block) {
            let a1 = (a0 + act_block).min(m);
            for r in (t * per_task..end).step_by(G) {
                let live = G.min(n - r);
                #[cfg(target_arch = "x86_64")]
                if ahead && r + G < end {
                    for i in a0 / per_y..a1 / per_y {
                        let next = yptr.get().wrapping_add(origin + i * ld + r + G);
                        // `ahead` holds only where the CPU reported PRFCHW.
                        crate::simd::prefetch_line_for_write(next.cast(), true);
                    }
                }
                let mut m0 = a0;
                while m0 < a1 {
                    let mc = ROWS.min(a1 - m0);
                    dots(r, m0, mc, &mut out.as_flattened_mut()[..mc * G]);
                    if store == RowStore::PairSums {
                        // Row i of the pass: the pair's sum (a 16-bit row's planes).
                        for i in 0..mc / 2 {
                            let (h, l) = (out[2 * i], out[2 * i + 1]);
                            out[i] = std::array::from_fn(|g| h[g] + l[g]);
                        }
                    }
                    for (i, outs) in out[..mc / per_y].iter().enumerate() {
                        let at = origin + (m0 / per_y + i) * ld + r * step;
                        if step == 1 && live == G {
                            // SAFETY: y[m0 + i, r..r + G] is inside the validated,
                            // non-overlapping y view (r + G ≤ n) and contiguous (step
                            // 1); each weight row belongs to exactly one task. (A
                            // constant-length copy: a `live`-long one called memmove.)
                            unsafe { yptr.get().add(at).cast::<[f32; G]>().write_unaligned(*outs) };
                        } else {
                            for (g, v) in outs[..live].iter().enumerate() {
                                // SAFETY: as above, element by element at y's stride.
                                unsafe { *yptr.get().add(at + g * step) = *v };
                            }
                        }
                    }
                    m0 += mc;
                }
            }
        }
    });
}

/// `out[i] = Σ_b block_b · x_i[b·32..]` for one weight row and up to M_CHUNK rows of x.
fn row_dots<B: BlockFormat>(isa: Isa, w: &[B], x: &[&[f32]], out: &mut [f32]) {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if matches!(isa, Isa::Avx512 | Isa::Avx2 | Isa::Neon) && isa.is_available() {
        // SAFETY: the ISA was detected (Isa::Avx2 implies FMA and F16C, Isa::Avx512
        // AVX-512F/BW/VL/DQ with them); slices as documented on the kernel.
        if unsafe { simd_rows::row_dots(isa, w, x, out) } {
            return;
        }
    }
    row_dots_portable(isa, w, x, out)
}

multiversion! {
    fn row_dots_portable<B: BlockFormat>(w: &[B], x: &[&[f32]], out: &mut [f32]) {
        let mut acc = [[0f32; QK]; M_CHUNK];
        let mut buf = [0f32; QK_K];
        let dq = &mut buf[..B::BLOCK];
        for (b, blk) in w.iter().enumerate() {
            blk.dequantize(dq);
            for (a, xr) in acc.iter_mut().zip(x) {
                let xb = &xr[b * B::BLOCK..][..B::BLOCK];
                for (wc, xc) in dq.chunks_exact(QK).zip(xb.chunks_exact(QK)) {
                    for j in 0..QK {
                        a[j] += wc[j] * xc[j];
                    }
                }
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            let mut l16 = [0f32; 16];
            for j in 0..16 {
                l16[j] = a[j] + a[j + 16];
            }
            *o = crate::simd::hsum(l16);
        }
    }
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod act_quant;
#[cfg(target_arch = "x86_64")]
mod avx2_int8;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod expand;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod row_scaled;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod rows8;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod simd_rows;

#[cfg(test)]
mod tests {
    use super::*;

    /// Host C's caches (AMD Zen 4): the rules below were measured there.
    const ZEN4: CacheSizes = CacheSizes {
        l1d: Some(32 << 10),
        l2: Some(1 << 20),
        largest: Some(32 << 20),
    };

    /// A batching step's activation block: L1D less 8 KiB, never below the prefill
    /// budget (a 32 KiB L1D, or none reported) nor above the 40 KiB measured on 48 KiB.
    #[test]
    fn batch_blocks_follow_the_l1d() {
        for (l1d, want) in [
            (Some(48 << 10), 40 << 10),
            (Some(32 << 10), PREFILL_ACT_BUDGET),
            (Some(16 << 10), PREFILL_ACT_BUDGET),
            (Some(64 << 10), 40 << 10),
            (None, PREFILL_ACT_BUDGET),
        ] {
            assert_eq!(batch_act_budget(l1d), want, "{l1d:?}");
        }
    }

    /// Output lines are asked for ahead only for batching steps whose outputs per task
    /// outgrow the L2 (the LM head), never for prefill or where the L2 is unknown.
    #[test]
    fn only_outputs_past_the_l2_are_prefetched() {
        for (m, task_bytes, caches, want) in [
            (16, 16 * 24_576 * 4, ZEN4, true),
            (64, 64 * 24_576 * 4, ZEN4, true),
            (16, 16 * 1536 * 4, ZEN4, false),
            (512, 512 * 1536 * 4, ZEN4, false),
            (16, 16 * 24_576 * 4, CacheSizes::default(), false),
        ] {
            assert_eq!(
                prefetch_outputs(m, task_bytes, caches),
                want,
                "M {m}, {task_bytes} bytes, {caches:?}"
            );
        }
    }

    /// Blocks of activation rows: one block for a batching step whose weight share
    /// outgrows the L2 (rounded up to whole passes), the L1 rule otherwise, and for
    /// prefill whatever the weights' size.
    #[test]
    fn weights_past_the_l2_stream_once_per_batch() {
        let lm_head = 28_700_000 / 2;
        // (M, K, pass, share, caches) → rows per block.
        for ((m, k, pass), share, caches, want) in [
            ((16, 576, 8), lm_head, ZEN4, 16),
            ((13, 576, 8), lm_head, ZEN4, 16),
            ((64, 576, 8), lm_head, ZEN4, 64),
            ((30, 576, 4), lm_head, ZEN4, 32),
            // The L1 rule: 24 KiB over 4 bytes a column, in whole passes.
            ((16, 576, 8), 600_000, ZEN4, 8),
            ((16, 576, 4), 600_000, ZEN4, 8),
            ((16, 1536, 4), 600_000, ZEN4, 4),
            ((65, 576, 8), lm_head, ZEN4, 8),
            ((16, 576, 8), lm_head, CacheSizes::default(), 8),
        ] {
            assert_eq!(
                act_block_rows((m, k, pass), share, caches),
                want,
                "M {m} K {k} pass {pass} share {share} {caches:?}"
            );
        }
    }
}
