//! `y = x·Bᵀ` where the rows of Bᵀ (a linear layer's weight rows) are produced on demand
//! by `fill(row, out)`: a quantized matrix dequantized as it is packed (prefill).
//!
//! Why a driver of its own and not [`super::gemm_with`] over a dequantized panel of the
//! weights (what prefill did before): that driver gives each thread one rectangle of C
//! and packs A inside it, so every panel of weight rows repacked all of x once per
//! thread (x is 512×576 at a 512-token prefill), and reading the panel transposed packed
//! B one strided element at a time; the dequantize and the GEMM were two pool jobs per
//! panel. Here x is packed once per call into a buffer every task reads, and each task
//! claims a slab of weight rows, dequantizes it NR rows at a time into a row buffer,
//! transposes that into its own packed B and runs the micro-kernel over every row of x.
//! A source whose layout already interleaves 8 rows (4-bit packed weights) writes the
//! packed B directly instead ([`FillRows8`]: no row buffer, no transpose). Slabs are
//! claimed from the pool's counter, several per thread and the same number for each, so
//! a thread the OS took away delays nobody (issue #24's contention case).
//!
//! Loop nest per task (B slab ≤ [`MAX_PANELS_PER_TASK`] micro-panels, all of K):
//! ```text
//! for pc in K step KC:          packed B slab block (KC×slab), its micro-panels in L1
//!   for ic in rows step MC:     packed x block (MC×KC, shared, read from L2/L3)
//!     for jr in slab step NR:   B micro-panel
//!       for ir in MC step MR:   micro-kernel: MR×NR tile of y in registers
//! ```

use super::driver::{
    grow, pack_shared, run_tile, with_scratch, Blocking, MatMut, MicroKernel, PackJob, Tile,
};
use super::pack::{Block, Mat};
use crate::pool::{self, SharedMut};
use std::cell::RefCell;
use tessera_core::{AlignedVec, CacheSizes, Error, Isa, Result, TensorView, TensorViewMut};

/// Writes row `r` of Bᵀ (its K values) into `out`.
pub type FillRow<'a> = &'a (dyn Fn(usize, &mut [f32]) + Sync);

/// Writes rows `r0..r0 + 8` of Bᵀ (r0 a multiple of 8, r0 + 8 ≤ N), k-values
/// `k0..k0 + kc`, straight into a packed panel: `out[kk·ld + i]` is row r0 + i at k0 + kk.
/// Called as `fill8(r0, (k0, kc), out, ld)`; returns false, writing nothing, where the
/// source cannot (then [`FillRow`] and a transpose fill those rows).
pub type FillRows8<'a> = &'a (dyn Fn(usize, (usize, usize), &mut [f32], usize) -> bool + Sync);

/// Where the rows of Bᵀ come from: N rows, one at a time, and optionally 8 at a time in
/// the packed layout.
#[derive(Clone, Copy)]
pub struct WeightRows<'a> {
    /// Rows of Bᵀ (N).
    pub n: usize,
    /// Any row.
    pub fill: FillRow<'a>,
    /// Eight rows at once into a panel, where the source has that layout.
    pub fill8: Option<FillRows8<'a>>,
}

impl std::fmt::Debug for WeightRows<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightRows")
            .field("n", &self.n)
            .field("fill8", &self.fill8.is_some())
            .finish_non_exhaustive()
    }
}

/// Most micro-panels one task packs: 4·16 = 64 weight rows on AVX2, so a 576-row matrix
/// is ≥ 9 tasks and a slab's packed B (64·K floats, 384 KiB at K = 1,536) stays within
/// Zen 3's 512 KiB L2; AVX-512's 64-wide panels make 256-row slabs, whose KC blocks
/// (384·256 floats) are what must stay there.
const MAX_PANELS_PER_TASK: usize = 4;

/// Most K per block on AVX2: all of K up to 576 (the default model's width) in one
/// block, where the shared default is 256. One block writes each C tile once (no reload
/// of C with β = 1) and runs each micro-kernel call 3× longer. Host B (Zen 3, 512 KiB
/// L2), 2026-11-29, 2 threads: prefill 512 of the default model, two sets of 6
/// alternated runs, medians 574 → 588 and 588 → 631 tok/s (K blocks of 256 → 576);
/// `tessera bench qmatmul --dtype q4_1 --shape 512x3072x576 --variant avx2`, 4
/// alternated runs, median 12.3 → 11.6 ms. K = 1,536 (ffn_down) becomes 3 blocks of 512.
/// Not more: larger blocks were not measured.
const AVX2_KC: usize = 576;

/// The K block on AVX2 for a core with `l2` bytes of L2: [`AVX2_KC`] where a task's
/// slab block (its `slab_rows` weight rows) and x's block (MC rows) fit in ¾ of it
/// together (Zen 3's 512 KiB holds 64 + 96 rows × 576 floats in 368 KiB), less on a
/// smaller L2 (Haswell's or Skylake client's 256 KiB: 307, so K = 576 runs as 2 × 288),
/// never below the shared default; that default where the L2 is unknown.
fn avx2_kc(l2: Option<usize>, slab_rows: usize, mc: usize, default: usize) -> usize {
    let Some(l2) = l2 else { return default };
    let fit = l2 / 4 * 3 / ((slab_rows + mc) * std::mem::size_of::<f32>());
    fit.min(AVX2_KC).max(default)
}

/// Tasks wanted per thread: with several, claiming balances uneven slabs and absorbs a
/// descheduled thread. Below this many slabs the rows of x are split as well (each part
/// then dequantizes its slab again, a few percent of its work).
const TASKS_PER_THREAD: usize = 4;

thread_local! {
    /// The packed x of the calling thread's current call.
    static PACKED_X: RefCell<AlignedVec<f32>> =
        RefCell::new(AlignedVec::zeroed(0).expect("empty"));
    /// A task's packed B slab and its NR-row dequantize buffer.
    static SLAB: RefCell<(AlignedVec<f32>, AlignedVec<f32>)> =
        RefCell::new((AlignedVec::zeroed(0).expect("empty"), AlignedVec::zeroed(0).expect("empty")));
}

/// The shape of one call after validation.
#[derive(Clone, Copy, Debug)]
struct Shape {
    m: usize,
    n: usize,
    k: usize,
    /// Rows of x padded to whole MR panels.
    m_pad: usize,
}

/// One task: weight-row panels `p0..p1` (of NR rows) against x panels `r0..r1` (of MR).
#[derive(Clone, Copy, Debug)]
struct Task {
    p0: usize,
    p1: usize,
    r0: usize,
    r1: usize,
}

/// Slabs of weight rows and parts of x for `threads` threads (see the constants).
fn plan(n_panels: usize, m_panels: usize, threads: usize) -> Vec<Task> {
    let want = threads.max(1) * TASKS_PER_THREAD;
    // A whole number of slabs per thread where there are panels for it: 9 slabs of a
    // 576-row matrix on 2 threads left one thread a fifth slab while the other idled.
    let slabs = n_panels
        .div_ceil(MAX_PANELS_PER_TASK)
        .max(want.min(n_panels))
        .next_multiple_of(threads.max(1))
        .min(n_panels)
        .max(1);
    let parts = if slabs >= want || threads <= 1 {
        1
    } else {
        want.div_ceil(slabs).min(m_panels).max(1)
    };
    let cut = |len: usize, parts: usize, i: usize| (i * len / parts, (i + 1) * len / parts);
    let mut tasks = Vec::with_capacity(slabs * parts);
    for s in 0..slabs {
        let (p0, p1) = cut(n_panels, slabs, s);
        for part in 0..parts {
            let (r0, r1) = cut(m_panels, parts, part);
            if p0 < p1 && r0 < r1 {
                tasks.push(Task { p0, p1, r0, r1 });
            }
        }
    }
    tasks
}

/// `y = x·Bᵀ` with row `r` of Bᵀ from `fill(r, out)` (B is K×N, so `fill` gives N rows
/// of K values), on `isa` with `threads` threads. x is M×K and y M×N, any strides; y is
/// overwritten (NaN in it ignored).
pub fn gemm_bt_rows(
    isa: Isa,
    threads: usize,
    x: &TensorView<'_, f32>,
    (n, fill): (usize, FillRow<'_>),
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let rows = WeightRows {
        n,
        fill,
        fill8: None,
    };
    gemm_bt_weight_rows(isa, threads, x, rows, y)
}

/// [`gemm_bt_rows`] with the rows of Bᵀ from `w`, 8 at a time where `w.fill8` can.
pub fn gemm_bt_weight_rows(
    isa: Isa,
    threads: usize,
    x: &TensorView<'_, f32>,
    w: WeightRows<'_>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    if !isa.is_available() {
        return Err(Error::Unsupported(format!("ISA {isa}")));
    }
    let kern = super::f32_kernel(isa);
    let mut blk = super::default_blocking(isa).round(&kern);
    if isa == Isa::Avx2 {
        let slab_rows = MAX_PANELS_PER_TASK * kern.nr;
        blk.kc = avx2_kc(CacheSizes::get().l2, slab_rows, blk.mc, blk.kc);
    }
    bt_rows_with(&kern, blk, threads, x, w, y)
}

/// [`gemm_bt_weight_rows`] with micro-kernel `kern` and blocking `blk` (rounded to its
/// tile; KC is evened out over K here).
pub(super) fn bt_rows_with(
    kern: &MicroKernel<f32>,
    mut blk: Blocking,
    threads: usize,
    x: &TensorView<'_, f32>,
    w: WeightRows<'_>,
    y: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let n = w.n;
    let (xd, yd) = (x.dims(), y.dims());
    if xd.len() != 2 || yd.len() != 2 || yd[0] != xd[0] || yd[1] != n {
        return Err(Error::shape(
            "gemm_bt_rows",
            format!("x {xd:?} · Bᵀ [{n}, K] → y {yd:?}"),
        ));
    }
    let (m, k) = (xd[0], xd[1]);
    if m == 0 || n == 0 {
        return Ok(());
    }
    let m_pad = m.div_ceil(kern.mr) * kern.mr;
    let packed_len = m_pad
        .checked_mul(k)
        .ok_or_else(|| Error::Overflow(format!("packed x of {m} x {k}")))?;
    let shape = Shape { m, n, k, m_pad };
    let yl = *y.layout();
    let c = MatMut {
        // SAFETY: the view was validated; its offset is inside its buffer.
        ptr: SharedMut(unsafe { y.data_mut().as_mut_ptr().add(yl.offset()) }),
        rows: m,
        cols: n,
        rs: yl.stride(0),
        cs: yl.stride(1),
    };
    if k == 0 {
        super::scale_c(&|_| c, 1, 0.0); // an empty product: y = 0
        return Ok(());
    }
    // Equal K blocks: 576 as 288 + 288, not 256 + 256 + 64, whose short last block
    // pays a whole tile's C update for a quarter of the work.
    blk.kc = k.div_ceil(k.div_ceil(blk.kc));
    let threads = threads.max(1);
    let xm = Mat::of(x);
    with_scratch(&PACKED_X, packed_len, |xp| {
        pack_x(kern, &blk, &xm, shape, threads, &mut xp[..packed_len]);
        let tasks = plan(n.div_ceil(kern.nr), m_pad / kern.mr, threads);
        let xp: &[f32] = &xp[..packed_len];
        pool::global().run(tasks.len(), threads, |t| {
            let slab_len = (tasks[t].p1 - tasks[t].p0) * kern.nr * k;
            let run = |(slab, rows): &mut (AlignedVec<f32>, AlignedVec<f32>)| {
                grow(slab, slab_len);
                grow(rows, kern.nr * k);
                let bufs = (&mut slab[..slab_len], &mut rows[..kern.nr * k]);
                run_task(kern, &blk, shape, (xp, w), tasks[t], bufs, &c);
            };
            SLAB.with(|s| match s.try_borrow_mut() {
                Ok(mut bufs) => run(&mut bufs),
                Err(_) => run(&mut (
                    AlignedVec::zeroed(0).expect("empty"),
                    AlignedVec::zeroed(0).expect("empty"),
                )),
            });
        });
    })
}

/// Packs all of x: K blocks of KC in order, each `[x panel][k][MR]` (rows past M zero),
/// all blocks in one pool job.
fn pack_x(
    kern: &MicroKernel<f32>,
    blk: &Blocking,
    xm: &Mat<f32>,
    s: Shape,
    threads: usize,
    mut out: &mut [f32],
) {
    let mut jobs: Vec<PackJob<'_, f32, f32>> = Vec::with_capacity(s.k.div_ceil(blk.kc));
    for pc in (0..s.k).step_by(blk.kc) {
        let kc = blk.kc.min(s.k - pc);
        // Block pc occupies [pc·m_pad, (pc + kc)·m_pad) of the packed x.
        let (block, rest) = std::mem::take(&mut out).split_at_mut(kc * s.m_pad);
        out = rest;
        let b = Block {
            r0: 0,
            rows: s.m,
            k0: pc,
            k_len: kc,
            panel: kern.mr,
        };
        jobs.push((xm, b, false, block));
    }
    pack_shared(jobs, threads);
}

/// One task: dequantize and pack its slab of weight rows, then every MR×NR tile of its
/// rows of y.
fn run_task(
    kern: &MicroKernel<f32>,
    blk: &Blocking,
    s: Shape,
    (xp, w): (&[f32], WeightRows<'_>),
    task: Task,
    (slab, rows): (&mut [f32], &mut [f32]),
    c: &MatMut,
) {
    let (mr, nr, k) = (kern.mr, kern.nr, s.k);
    let width = (task.p1 - task.p0) * nr;
    let n0 = task.p0 * nr;
    for p in 0..task.p1 - task.p0 {
        let r0 = n0 + p * nr;
        if let Some(fill8) = w.fill8.filter(|_| nr.is_multiple_of(8) && r0 + nr <= s.n) {
            let mut filled = true;
            for pc in (0..k).step_by(blk.kc) {
                let kc = blk.kc.min(k - pc);
                let panel = &mut slab[pc * width + p * nr * kc..][..nr * kc];
                for g in (0..nr).step_by(8) {
                    filled &= fill8(r0 + g, (pc, kc), &mut panel[g..], nr);
                }
            }
            if filled {
                continue;
            }
        }
        for (i, row) in rows.chunks_exact_mut(k).enumerate() {
            let r = r0 + i;
            if r < s.n {
                (w.fill)(r, row);
            } else {
                row.fill(0.0);
            }
        }
        for pc in (0..k).step_by(blk.kc) {
            let kc = blk.kc.min(k - pc);
            let panel = &mut slab[pc * width + p * nr * kc..][..nr * kc];
            transpose_rows(rows, k, pc, nr, panel);
        }
    }
    let mut tmp = [0f32; 8 * 64]; // MR·NR ≤ 512 for every kernel
    debug_assert!(mr * nr <= tmp.len());
    for pc in (0..k).step_by(blk.kc) {
        let kc = blk.kc.min(k - pc);
        let beta = if pc == 0 { 0.0 } else { 1.0 };
        let (xb, bb) = (&xp[pc * s.m_pad..], &slab[pc * width..]);
        for ic in (task.r0..task.r1).step_by(blk.mc / mr) {
            let ic1 = (ic + blk.mc / mr).min(task.r1);
            for jp in 0..task.p1 - task.p0 {
                let j0 = n0 + jp * nr;
                let cols = nr.min(s.n - j0);
                let b_panel = bb[jp * nr * kc..][..nr * kc].as_ptr();
                for ip in ic..ic1 {
                    let i0 = ip * mr;
                    let nrows = mr.min(s.m - i0);
                    let a_panel = xb[ip * mr * kc..][..mr * kc].as_ptr();
                    let tile = Tile {
                        at: (i0, j0, nrows, cols),
                        ks: kc,
                        a_panel,
                        b_panel,
                    };
                    // SAFETY: the panels hold kc·MR and kc·NR packed floats; the tile is
                    // inside y, which only this task writes there (tasks cover disjoint
                    // rows × weight-row slabs).
                    unsafe { run_tile(kern, tile, c, (1.0, beta), &mut tmp) };
                }
            }
        }
    }
}

/// Writes k-values `pc..pc + panel.len()/nr` of the `nr` rows in `rows` (each K long)
/// as `[k][nr]`: one packed B micro-panel. On x86 with AVX, 8×8 tiles go through
/// registers ([`transpose8_avx`]); element by element, the strided stores were ~4% of a
/// prefill's samples (perf, host B). The edges, and other CPUs, copy element by element.
fn transpose_rows(rows: &[f32], k: usize, pc: usize, nr: usize, panel: &mut [f32]) {
    let kc = panel.len() / nr;
    // Rows and k-values already written: whole 8×8 tiles where AVX is available.
    #[cfg(target_arch = "x86_64")]
    let (rows_tiled, done) = if Isa::Avx2.is_available() && kc >= 8 {
        let (rows_tiled, kc_tiled) = (nr - nr % 8, kc - kc % 8);
        assert!(rows.len() >= nr * k && pc + kc <= k && panel.len() >= kc * nr);
        for i0 in (0..rows_tiled).step_by(8) {
            for k0 in (0..kc_tiled).step_by(8) {
                // SAFETY: AVX is available (AVX2 implies it); rows i0..i0+8 hold k-values
                // pc+k0..pc+k0+8 (pc + kc ≤ k, asserted), and panel rows k0..k0+8 hold
                // columns i0..i0+8 (i0 + 8 ≤ nr, kc·nr ≤ panel.len(), asserted).
                unsafe {
                    transpose8_avx(
                        rows.as_ptr().add(i0 * k + pc + k0),
                        k,
                        panel.as_mut_ptr().add(k0 * nr + i0),
                        nr,
                    )
                };
            }
        }
        (rows_tiled, kc_tiled)
    } else {
        (0, 0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (rows_tiled, done) = (0, 0);
    for i in 0..nr {
        let from = if i < rows_tiled { done } else { 0 };
        for kk in from..kc {
            panel[kk * nr + i] = rows[i * k + pc + kk];
        }
    }
}

/// `dst[b·ld_dst + a] = src[a·ld_src + b]` for a, b < 8: 8 row loads, 24 shuffles, 8
/// stores.
///
/// # Safety
/// AVX is available; 8 rows of 8 floats readable at `src` (`ld_src` apart) and writable
/// at `dst` (`ld_dst` apart).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose8_avx(src: *const f32, ld_src: usize, dst: *mut f32, ld_dst: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the contract's rows are readable and writable; AVX per the contract.
    unsafe {
        let r: [__m256; 8] = std::array::from_fn(|a| _mm256_loadu_ps(src.add(a * ld_src)));
        let lo = |a: usize| _mm256_unpacklo_ps(r[a], r[a + 1]);
        let hi = |a: usize| _mm256_unpackhi_ps(r[a], r[a + 1]);
        let t = [lo(0), hi(0), lo(2), hi(2), lo(4), hi(4), lo(6), hi(6)];
        let u = [
            _mm256_shuffle_ps::<0x44>(t[0], t[2]),
            _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
            _mm256_shuffle_ps::<0x44>(t[1], t[3]),
            _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
            _mm256_shuffle_ps::<0x44>(t[4], t[6]),
            _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
            _mm256_shuffle_ps::<0x44>(t[5], t[7]),
            _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
        ];
        for b in 0..4 {
            _mm256_storeu_ps(
                dst.add(b * ld_dst),
                _mm256_permute2f128_ps::<0x20>(u[b], u[b + 4]),
            );
            _mm256_storeu_ps(
                dst.add((b + 4) * ld_dst),
                _mm256_permute2f128_ps::<0x31>(u[b], u[b + 4]),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_covers_every_tile_once() {
        for (n_panels, m_panels, threads) in [(36, 86, 2), (1, 1, 2), (12, 86, 2), (192, 3, 1)] {
            let tasks = plan(n_panels, m_panels, threads);
            let mut seen = vec![0u8; n_panels * m_panels];
            for t in &tasks {
                for p in t.p0..t.p1 {
                    for r in t.r0..t.r1 {
                        seen[p * m_panels + r] += 1;
                    }
                }
                assert!(t.p1 - t.p0 <= MAX_PANELS_PER_TASK);
            }
            assert!(seen.iter().all(|&s| s == 1), "{n_panels} x {m_panels}");
        }
    }

    /// The default model's prefill shapes (576, 960 and 3,072 weight rows: 36, 60 and
    /// 192 panels of 16) and a few ragged ones give every thread the same number of
    /// slabs, so the last claimed slab does not leave a thread idle for a whole task
    /// (where there are panels enough for [`TASKS_PER_THREAD`] each; fewer also split x).
    #[test]
    fn slabs_split_evenly_between_threads() {
        for threads in [2, 3, 4] {
            for n_panels in [36, 60, 192, 13, 37, 100] {
                if n_panels < threads * TASKS_PER_THREAD {
                    continue;
                }
                let tasks = plan(n_panels, 86, threads);
                assert_eq!(
                    tasks.len() % threads,
                    0,
                    "{n_panels} panels on {threads} threads: {} tasks",
                    tasks.len()
                );
                assert!(tasks.iter().all(|t| t.r0 == 0 && t.r1 == 86));
            }
        }
    }

    /// The AVX2 K block from the L2 size: the measured 576 on Zen 3's 512 KiB and on
    /// larger L2s, what fits ¾ of a 256 KiB L2, the shared default where the L2 is small
    /// or unknown.
    #[test]
    fn avx2_k_block_follows_the_l2() {
        let (slab, mc, default) = (64, 96, 256);
        assert_eq!(avx2_kc(Some(512 << 10), slab, mc, default), 576);
        assert_eq!(avx2_kc(Some(2 << 20), slab, mc, default), 576);
        // 196,608 bytes / (160 rows × 4 bytes) = 307 floats per row.
        assert_eq!(avx2_kc(Some(256 << 10), slab, mc, default), 307);
        assert_eq!(avx2_kc(Some(64 << 10), slab, mc, default), default);
        assert_eq!(avx2_kc(None, slab, mc, default), default);
    }
}
