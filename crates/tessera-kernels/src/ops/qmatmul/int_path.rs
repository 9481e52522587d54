//! The integer path's driver: activation rows quantized for the weights in the form
//! the chosen kernel reads, then that kernel over the weight rows.
//!
//! Why quantizing sits here, after the kernel is chosen: the interleaved kernels read
//! activation panels (`act_panel`), every other kernel quantized rows ([`QuantActs`]).
//! The quantizers write either ([`BlockSink`]), so a batching step quantizes straight
//! into its panels, every thread its own rows, in one dispatch. Quantizing rows and then
//! copying them into panels took a second dispatch and a copy, serial on the caller
//! below four panels, while the other thread spun. Host C (Zen 4, 2 threads, Q4_1 in
//! cache, `tessera bench qmatmul --variant avx512-vnni-r8`, 3 alternated rounds): 16
//! rows at 576×576 30.7–31.2 → 23.5–25.6 µs, at 576×1536 68.8–71.8 → 55.2–62.7; a
//! line fitted over N puts the fixed cost of a 16-row call at 11.8 µs before, 4.7 after.

#[cfg(target_arch = "x86_64")]
use super::act_panel;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::act_panel::ActPanels;
#[cfg(target_arch = "x86_64")]
use super::avx2_int8;
use super::packed::{self, PackedWeights};
use super::quant_acts::{BlockSink, QuantActs};
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::row_scaled;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::rows8;
use super::{act_block_rows, each_row_mut, for_weight_rows, ActScales, IntKernel, RowStore, Tiles};
use super::{M_CHUNK, REUSED_ACT_ROWS};
use crate::reuse::with_reused;
use tessera_core::{CacheSizes, Isa, TensorViewMut};

/// How input rows become activation rows for the integer kernels: `N` of them per input
/// row (one for 8-bit activations, two planes for 16-bit), written into any sink.
pub(super) trait ActSource<const N: usize>: Sync {
    /// Writes input row `i`'s `N` activation rows into `rows`, each sized for K.
    fn quantize<S: BlockSink>(&self, i: usize, rows: &mut [S; N]);
}

/// Activation rows as a kernel reads them.
enum IntActs<'a> {
    /// One [`QuantActs`] per row.
    Rows(&'a [QuantActs]),
    /// Interleaved in panels (the kernels for which `IntKernel::reads_panels`).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    Panels(&'a ActPanels),
}

impl IntActs<'_> {
    fn rows(&self) -> usize {
        match self {
            IntActs::Rows(rows) => rows.len(),
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            IntActs::Panels(panels) => panels.len(),
        }
    }
}

/// `y = x·Wᵀ` on the integer kernels: the kernel chosen for `isa`, `w` and the
/// activations' scales, `items` input rows quantized by `src` into `N`·items activation
/// rows in the form that kernel reads, on `threads`; y is [items, n], each input row's
/// N products summed into its row as they are stored (N is 1 or 2). Up to
/// [`REUSED_ACT_ROWS`] input rows reuse this thread's buffers (decode makes hundreds of
/// calls per token; a fresh 512-row set was ~3 500 allocations and their page faults
/// per prefill matmul); only larger calls allocate, rather than keep more than ~4·K
/// bytes × [`REUSED_ACT_ROWS`] per thread.
pub(super) fn quantize_and_run<const N: usize>(
    isa: Isa,
    threads: usize,
    w: &PackedWeights,
    (act, tiles): (ActScales, Tiles),
    (items, src): (usize, &impl ActSource<N>),
    y: &mut TensorViewMut<'_, f32>,
) {
    const { assert!(N == 1 || N == 2, "1 or 2 activation rows per input row") };
    let store = if N == 1 {
        RowStore::Each
    } else {
        RowStore::PairSums
    };
    let (m, k) = (N * items, w.cols());
    let kernel = IntKernel::for_isa(isa)
        .reading(w)
        .for_scales(w, act)
        .with_tiles(tiles, m);
    let reuse = items <= REUSED_ACT_ROWS;
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if kernel.reads_panels() {
        thread_local! {
            static REUSED_PANELS: std::cell::RefCell<ActPanels> =
                std::cell::RefCell::new(ActPanels::default());
        }
        return with_reused(&REUSED_PANELS, reuse, |panels| {
            panels.quantize_rows::<N>((items, k), threads, |i, slots| src.quantize(i, slots));
            run_int8(
                (isa, threads),
                w,
                (kernel, store),
                IntActs::Panels(panels),
                y,
            )
        });
    }
    thread_local! {
        static REUSED_ACTS: std::cell::RefCell<Vec<QuantActs>> = const {
            std::cell::RefCell::new(Vec::new())
        };
    }
    with_reused(&REUSED_ACTS, reuse, |acts| {
        // Rows past m (from an earlier, larger call) are kept for their buffers.
        if acts.len() < m {
            acts.resize_with(m, QuantActs::default);
        }
        let (per_input, _) = acts[..m].as_chunks_mut::<N>();
        each_row_mut(per_input, k, threads, |i, rows| {
            rows.iter_mut().for_each(|a| a.size_for(k));
            src.quantize(i, rows);
            rows.iter_mut().for_each(|a| a.finish_row(act, k));
        });
        run_int8(
            (isa, threads),
            w,
            (kernel, store),
            IntActs::Rows(&acts[..m]),
            y,
        )
    })
}

/// The integer kernel `kernel` over activation rows quantized for `w`, stored into y
/// as `store` says.
fn run_int8(
    (isa, threads): (Isa, usize),
    w: &PackedWeights,
    (kernel, store): (IntKernel, RowStore),
    acts: IntActs<'_>,
    y: &mut TensorViewMut<'_, f32>,
) {
    let (m, n, k) = (acts.rows(), w.rows(), w.cols());
    // A quantized activation row takes ~4 bytes per column (codes, then d_x, start values
    // and lane sums at 32 bytes per 32-column block each), all re-read for every weight
    // row: a block stays in L1. Measured at 512×1536×576 Q4_0 on AVX2: 256 KiB (L2)
    // 20.2 ms, 24 KiB 15.5 ms, 12 KiB no different.
    // The interleaved kernels take 8 rows per pass (`rows8::VNNI_M`, `rows8::AVX2_M`)
    // and AMX 16 (`rows8::AMX_M`): their blocks hold at least that many.
    #[cfg(target_arch = "x86_64")]
    let pass = match kernel {
        IntKernel::VnniRows8 => rows8::VNNI_M,
        IntKernel::AmxRows16 => rows8::AMX_M,
        IntKernel::Avx2Rows8 => rows8::AVX2_M,
        _ => M_CHUNK,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let pass = M_CHUNK;
    let act_block = act_block_rows(
        (m, k, pass),
        w.size_bytes() / threads.max(1),
        CacheSizes::get(),
    );
    let acts = match acts {
        IntActs::Rows(rows) => rows,
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        IntActs::Panels(panels) => {
            return run_panels(threads, w, (kernel, store), (m, act_block), panels, y)
        }
    };
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if let IntKernel::RowScaled(instr) = kernel {
        // Row-scaled activations are 8-bit rows (`for_scales` takes it for per-row
        // scales only; 16-bit planes have per-block ones).
        assert_eq!(store, RowStore::Each, "row-scaled kernels store each row");
        // SAFETY: `for_scales` chose it for one scale per weight row and per activation
        // row and K below its overflow bound, with an instruction whose features
        // `for_isa` checked; acts were quantized for these weights; y is [m, n].
        return unsafe { row_scaled::run(threads, instr, w, acts, act_block, y) };
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(kernel, IntKernel::Avx2 | IntKernel::Vnni) && m == 1 {
        // One activation row: `store` is Each.
        const R: usize = avx2_int8::DECODE_ROWS;
        let vnni = kernel == IntKernel::Vnni;
        return for_weight_rows::<1, R>(threads, (n, m, act_block), store, y, |r, _, _, out| {
            // SAFETY: as for the body below; r < rows, and `out` holds R outputs.
            unsafe {
                if vnni {
                    avx2_int8::dots_vnni::<R>(w, r, &[&acts[0]], out)
                } else {
                    avx2_int8::dots::<R>(w, r, &[&acts[0]], out)
                }
            }
        });
    }
    let body = |r: usize, m0: usize, mc: usize, out: &mut [f32]| {
        let a: [&QuantActs; M_CHUNK] = std::array::from_fn(|i| &acts[m0 + i.min(mc - 1)]);
        // The kernels' CPU features were checked by `for_isa`; r < rows; the activations
        // were built for these weights' columns and offset; PackedWeights keeps
        // non-offset-128 codes below 64.
        match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            IntKernel::Vnni => unsafe { avx2_int8::dots_vnni::<1>(w, r, &a[..mc], out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above (the row-scaled weights, run above, are also block-format
            // weights whose chunks repeat the row's scale).
            IntKernel::Avx2 => unsafe { avx2_int8::dots::<1>(w, r, &a[..mc], out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above; `reading` chose it for interleaved weights with split
            // scales, and the driver below hands it whole groups (r a multiple of 8,
            // out 8·mc long).
            IntKernel::Planes8 => unsafe { rows8::planes_dots(w, r, &a[..mc], out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as for Planes8, on a VNNI CPU (`for_isa`).
            IntKernel::VnniPlanes8 => unsafe { rows8::planes_dots_vnni(w, r, &a[..mc], out) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above, with `sdot`: `reading` chose it for interleaved weights
            // with split scales, `for_isa` for a CPU with DotProd.
            IntKernel::NeonPlanes8 => unsafe { rows8::planes_sdot(w, r, &a[..mc], out) },
            #[cfg(target_arch = "x86_64")]
            IntKernel::Avx2Rows8 | IntKernel::VnniRows8 | IntKernel::AmxRows16 => {
                unreachable!("run over activation panels")
            }
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            IntKernel::RowScaled(_) => unreachable!("run above"),
            #[cfg(target_arch = "aarch64")]
            IntKernel::NeonDot => unreachable!("`for_scales` made it row-scaled or portable"),
            #[cfg(target_arch = "aarch64")]
            IntKernel::NeonRows8 => unreachable!("run over activation panels"),
            IntKernel::Portable => packed::int8_dots_portable(isa, w, r, &a[..mc], out),
        }
    };
    match kernel {
        #[cfg(target_arch = "x86_64")]
        IntKernel::Planes8 | IntKernel::VnniPlanes8 => {
            for_weight_rows::<M_CHUNK, { packed::ROWS8 }>(
                threads,
                (n, m, act_block),
                store,
                y,
                body,
            )
        }
        #[cfg(target_arch = "aarch64")]
        IntKernel::NeonPlanes8 => for_weight_rows::<M_CHUNK, { packed::ROWS8 }>(
            threads,
            (n, m, act_block),
            store,
            y,
            body,
        ),
        _ => for_weight_rows::<M_CHUNK, 1>(threads, (n, m, act_block), store, y, body),
    }
}

/// The interleaved kernels over activation panels (`kernel.reads_panels()`), m rows in
/// blocks of `act_block`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn run_panels(
    threads: usize,
    w: &PackedWeights,
    (kernel, store): (IntKernel, RowStore),
    (m, act_block): (usize, usize),
    panels: &ActPanels,
    y: &mut TensorViewMut<'_, f32>,
) {
    let shape = (w.rows(), m, act_block);
    match kernel {
        #[cfg(target_arch = "x86_64")]
        IntKernel::AmxRows16 => {
            rows8::begin_matmul();
            const MC: usize = rows8::AMX_M;
            for_weight_rows::<MC, { rows8::ROWS16 }>(threads, shape, store, y, |r, m0, mc, out| {
                const HALF: usize = act_panel::PANEL_SLOTS;
                let first = panels.rows(m0, mc.min(HALF));
                let second = (mc > HALF).then(|| panels.rows(m0 + HALF, mc - HALF));
                // SAFETY: `with_tiles` chose it for the VNNI interleaved kernel's
                // weights on a CPU with AMX-INT8 granted (`CpuFeatures::amx_int8`,
                // with AVX-512 and VNNI); r is a multiple of 16 below the rows, out
                // 16·mc long; passes start at multiples of 16 (act_block is one), so
                // each half starts a panel.
                unsafe { rows8::dots_amx16(w, r, (first, second), out) }
            })
        }
        #[cfg(target_arch = "x86_64")]
        IntKernel::VnniRows8 => {
            const MC: usize = rows8::VNNI_M;
            for_weight_rows::<MC, { rows8::ROWS16 }>(threads, shape, store, y, |r, m0, mc, out| {
                // SAFETY: `reading` chose it for interleaved weights without split
                // scales, `for_isa` for a VNNI CPU (AVX-512F/BW/DQ/VL with it,
                // `Isa::Avx512`); r is a multiple of 16 below the rows, out 16·mc long;
                // passes start at multiples of MC (act_block is one), so MC slots fit
                // in the panel.
                unsafe { rows8::dots_vnni16(w, r, panels.rows(m0, mc), out) }
            })
        }
        #[cfg(target_arch = "x86_64")]
        IntKernel::Avx2Rows8 => {
            for_weight_rows::<{ rows8::AVX2_M }, { rows8::ROWS16 }>(
                threads,
                shape,
                store,
                y,
                |r, m0, mc, out| {
                    // SAFETY: as for VnniRows8, on an AVX2 CPU (`for_isa`), r a multiple of
                    // 16, out 16·mc long, passes at multiples of AVX2_M (the panel's 8 slots).
                    unsafe { rows8::dots16(w, r, panels.rows(m0, mc), out) }
                },
            )
        }
        #[cfg(target_arch = "aarch64")]
        IntKernel::NeonRows8 => {
            for_weight_rows::<M_CHUNK, { packed::ROWS8 }>(
                threads,
                shape,
                store,
                y,
                |r, m0, mc, out| {
                    // SAFETY: `reading` chose it for interleaved weights without split scales,
                    // `for_isa` for a CPU with DotProd; r is a multiple of 8 below the rows,
                    // out 8·mc long; passes start at multiples of M_CHUNK (a divisor of the
                    // panel's 8 slots).
                    unsafe { rows8::dots_sdot(w, r, panels.rows(m0, mc), out) }
                },
            )
        }
        _ => unreachable!("{kernel:?} reads quantized rows, not panels"),
    }
}
