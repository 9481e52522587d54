//! The blocked, threaded GEMM driver (the Goto/BLIS loop nest).
//!
//! ```text
//! for jc in N step NC:
//!   for pc in K step KC:
//!     pack A[.., pc..], B[pc.., jc..]  A's K slice, the B block (KC×NC): once, shared
//!     tasks (A block × B panels):      claimed from the pool's counter
//!       for jr in NC step NR:          B micro-panel (KC×NR) stays in L1 across ir
//!         for ir in MC step MR:        micro-kernel; the A block (MC×KC) stays in L2
//! ```
//!
//! Work is claimed, not split: each block is cut into several tasks per thread (A
//! blocks, and column ranges of B when M has few A blocks), so a thread the OS takes
//! away delays the call by about one task, not by its whole share, as a static split into
//! one rectangle per thread would (issue #24). Both operands are packed once per block by
//! all threads together and shared; the cost is two pool dispatches per block (~0.2 µs
//! each).
//!
//! The two inner loops run in the order that keeps the smaller operand in L1
//! ([`b_panel_outer`]): a B micro-panel where it fits in half of L1 (AVX2's 16×256 floats,
//! 16 KiB), as BLIS does; otherwise (AVX-512's 64×384, 96 KiB) an A micro-panel, with
//! the B micro-panels streamed past it.

use super::micro::TileOut;
use super::pack::{pack, Block, Mat, PackSource, Packed};
use crate::pool::{self, SharedMut};
use std::cell::RefCell;
use tessera_core::{AlignedVec, CacheSizes};

/// A micro-kernel and its tile shape.
#[derive(Clone, Copy, Debug)]
pub(super) struct MicroKernel<P> {
    pub mr: usize,
    pub nr: usize,
    pub run: unsafe fn(usize, *const P, *const P, TileOut),
}

/// Cache blocking and thread count (the GEMM's tunables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Rows of A per packed panel (L2-resident).
    pub mc: usize,
    /// Depth per packed panel (L1-resident microkernel slices).
    pub kc: usize,
    /// Columns of B per packed panel (L3-resident).
    pub nc: usize,
    /// Threads the call may use.
    pub threads: usize,
}

impl Blocking {
    /// Rounds block sizes to whole tiles (and KC to whole k-pairs for bf16).
    pub(super) fn round<P: Packed>(self, k: &MicroKernel<P>) -> Self {
        let up = |v: usize, q: usize| v.max(1).div_ceil(q) * q;
        Blocking {
            mc: up(self.mc, k.mr),
            kc: up(self.kc, P::KPACK),
            nc: up(self.nc, k.nr),
            threads: self.threads.max(1),
        }
    }
}

/// A writable strided matrix (validated non-overlapping by its view).
#[derive(Clone, Copy, Debug)]
pub(super) struct MatMut {
    pub ptr: SharedMut<f32>,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

/// One batch entry: A (m×k), B (k×n), C (m×n).
#[derive(Clone, Copy, Debug)]
pub(super) struct Operands<T> {
    pub a: Mat<T>,
    pub b: Mat<T>,
    pub c: MatMut,
}

/// Below this many FLOPs a GEMM stays on one thread (dispatch would cost more than it saves).
const MIN_FLOPS_PER_THREAD: f64 = 2e6;

/// Tasks wanted per thread in each B block: with several, claiming balances them and
/// absorbs a descheduled thread.
const TASKS_PER_THREAD: usize = 4;

/// L1 data cache assumed where the OS does not report it.
const DEFAULT_L1D: usize = 32 << 10;

thread_local! {
    /// The packed B block of the calling thread's current call, read by every task (the
    /// packing buffers are reused across calls).
    static PACKED_B: RefCell<AlignedVec<f32>> =
        RefCell::new(AlignedVec::zeroed(0).expect("empty"));
    /// The packed K slice of A (all M rows) of the calling thread's current call.
    static PACKED_A: RefCell<AlignedVec<f32>> =
        RefCell::new(AlignedVec::zeroed(0).expect("empty"));
}

pub(super) fn grow(buf: &mut AlignedVec<f32>, len: usize) {
    if buf.len() < len {
        *buf = AlignedVec::zeroed(len).expect("GEMM packing buffer (sized by validated blocking)");
    }
}

/// Buffers up to this many 4-byte elements (64 MiB) are kept per thread for the next
/// call; a larger one is allocated for its call (A's K slice past M = 65,536 rows at
/// KC = 256; `gemm_bt_rows`' x past 2,048 tokens × K = 8,192).
const REUSED_ELEMS: usize = 16 << 20;

/// Runs `job` on this thread's buffer in `cell` (a fresh one where it is already borrowed
/// or `len` is over [`REUSED_ELEMS`]), grown to `len` 4-byte elements. Errors only where
/// a fresh buffer cannot be allocated.
pub(super) fn with_scratch<R>(
    cell: &'static std::thread::LocalKey<RefCell<AlignedVec<f32>>>,
    len: usize,
    job: impl FnOnce(&mut AlignedVec<f32>) -> R,
) -> tessera_core::Result<R> {
    cell.with(|c| match c.try_borrow_mut() {
        Ok(mut buf) if len <= REUSED_ELEMS => {
            grow(&mut buf, len);
            Ok(job(&mut buf))
        }
        _ => Ok(job(&mut AlignedVec::zeroed(len)?)),
    })
}

/// [`with_scratch`] with the first `len` elements viewed as `P`.
fn with_packed<P: Packed, R>(
    cell: &'static std::thread::LocalKey<RefCell<AlignedVec<f32>>>,
    len: usize,
    job: impl FnOnce(&mut [P]) -> R,
) -> R {
    // Bounded: B's block by the blocking, A's slice by [`A_SLICE_ELEMS`]; only an
    // exhausted machine fails here.
    with_scratch(cell, len, |buf| job(as_packed(buf, len)))
        .expect("GEMM packing buffer (a bounded block)")
}

/// View 4-byte packed scratch as `P`.
fn as_packed<P: Packed>(buf: &mut [f32], len: usize) -> &mut [P] {
    assert!(len <= buf.len());
    // SAFETY: P is 4-byte POD with every bit pattern valid (Packed's contract) and the
    // buffer is 64-byte aligned; len ≤ buf.len() (asserted).
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut P, len) }
}

/// Whether a task loops over B micro-panels outside A micro-panels: where one B
/// micro-panel (`ks` packed steps of `nr`) fits in half of an `l1d`-byte L1 it stays
/// there while the A block streams from L2 (BLIS's order); where it does not, an A
/// micro-panel stays in L1 instead. Host B (Zen 3, 32 KiB L1, AVX2 6×16 at KC = 256:
/// 16 KiB panels), 2026-11-29, one thread, this driver and the one before it (the A
/// order) run at once on the two cores, cores swapped each round (`tessera bench gemm
/// --shape S --variant avx2 --set threads=1`): median ratio 1.045 at 2048³ (10 rounds),
/// 1.04 at 512×3072×576 (8). AVX-512's 6×64 at KC = 384 (96 KiB panels) keeps the
/// A-panel order it had before (not re-measured: no AVX-512 host here).
pub(super) fn b_panel_outer(ks: usize, nr: usize, elem: usize, l1d: Option<usize>) -> bool {
    ks * nr * elem <= l1d.unwrap_or(DEFAULT_L1D) / 2
}

/// Runs the GEMM for every batch entry produced by `operands(b)`: entries on their own
/// threads where there are at least as many as threads, otherwise one after another,
/// each on all of them.
pub(super) fn run<T: PackSource, P: Packed>(
    kern: MicroKernel<P>,
    blocking: Blocking,
    (batches, m, n, k): (usize, usize, usize, usize),
    operands: &(dyn Fn(usize) -> Operands<T> + Sync),
    scalars: (f32, f32),
) {
    let blk = blocking.round(&kern);
    let flops = 2.0 * (batches * m * n * k) as f64;
    let threads = blk
        .threads
        .min((flops / MIN_FLOPS_PER_THREAD) as usize)
        .max(1);
    if batches >= threads {
        pool::global().run(batches, threads, |b| {
            entry(&kern, &blk, &operands(b), (m, n, k), scalars, 1)
        });
    } else {
        for b in 0..batches {
            entry(&kern, &blk, &operands(b), (m, n, k), scalars, threads);
        }
    }
}

/// One GEMM on up to `threads` threads: per B block, one pool job packs it and the A
/// rows against it (shared by every task), a second runs tasks of one A block against a
/// range of the block's B micro-panels.
fn entry<T: PackSource, P: Packed>(
    kern: &MicroKernel<P>,
    blk: &Blocking,
    ops: &Operands<T>,
    (m, n, k): (usize, usize, usize),
    (alpha, beta): (f32, f32),
    threads: usize,
) {
    let (mr, nr) = (kern.mr, kern.nr);
    let slice_rows = a_slice_rows(blk);
    let l1d = CacheSizes::get().l1d;
    for jc in (0..n).step_by(blk.nc) {
        let nc = blk.nc.min(n - jc);
        let panels = nc.div_ceil(nr);
        for pc in (0..k).step_by(blk.kc) {
            let k_len = blk.kc.min(k - pc);
            let bblk = Block {
                r0: jc,
                rows: nc,
                k0: pc,
                k_len,
                panel: nr,
            };
            let ks = bblk.k_steps::<P>();
            let b_outer = b_panel_outer(ks, nr, std::mem::size_of::<P>(), l1d);
            let beta = if pc == 0 { beta } else { 1.0 };
            with_packed::<P, _>(&PACKED_B, bblk.packed_len::<P>(), |bp| {
                for i0 in (0..m).step_by(slice_rows) {
                    let ablk = Block {
                        r0: i0,
                        rows: slice_rows.min(m - i0),
                        k0: pc,
                        k_len,
                        panel: mr,
                    };
                    let a_blocks = ablk.rows.div_ceil(blk.mc);
                    // Column ranges per A block: enough tasks for each thread to claim
                    // several.
                    let parts = if threads == 1 {
                        1
                    } else {
                        (TASKS_PER_THREAD * threads).div_ceil(a_blocks).min(panels)
                    };
                    with_packed::<P, _>(&PACKED_A, ablk.packed_len::<P>(), |ap| {
                        // B is packed with the first slice of A, in the same pool job.
                        let mut jobs = vec![(&ops.a, ablk, false, &mut *ap)];
                        if i0 == 0 {
                            jobs.push((&ops.b, bblk, true, &mut *bp));
                        }
                        pack_shared(jobs, threads);
                        let (ap, bp): (&[P], &[P]) = (ap, bp);
                        pool::global().run(a_blocks * parts, threads, |t| {
                            let (ib, part) = (t / parts, t % parts);
                            let at = ib * blk.mc;
                            let rows = blk.mc.min(ablk.rows - at);
                            let block = BlockTiles {
                                // mc is a multiple of MR, so A block ib starts at a panel.
                                a: (&ap[at * ks..][..rows.div_ceil(mr) * mr * ks], i0 + at, rows),
                                b: (bp, jc, nc),
                                ks,
                                b_panels: (part * panels / parts, (part + 1) * panels / parts),
                                b_outer,
                            };
                            block_tiles(kern, block, &ops.c, (alpha, beta));
                        });
                    });
                }
            });
        }
    }
}

/// Packed elements of A per slice: the reused buffer's size. The crate's unit tests
/// take a small one, so their GEMMs of more than MC rows run in several slices; the
/// integration tests and `tessera verify` run the size users get.
const A_SLICE_ELEMS: usize = if cfg!(test) { 1 << 14 } else { REUSED_ELEMS };

/// Rows of A packed at once: all of them up to [`A_SLICE_ELEMS`] packed elements at the
/// block's KC (65,536 rows at KC = 256), a multiple of MC beyond. Packing every row at
/// once let a tall A (a stride-0 view of many rows, say) ask for more memory than the
/// machine has; in slices the buffer stays bounded, and B, packed once per block, serves
/// every slice.
fn a_slice_rows(blk: &Blocking) -> usize {
    (A_SLICE_ELEMS / blk.kc.max(1) / blk.mc.max(1)).max(1) * blk.mc.max(1)
}

/// One block to pack: its matrix, which block, whether its logical rows are the matrix's
/// columns (B), and where it goes.
pub(super) type PackJob<'a, T, P> = (&'a Mat<T>, Block, bool, &'a mut [P]);

/// B micro-panels (or A panels) one packing task writes (48 rows of A on AVX2).
const PACK_PANELS_PER_TASK: usize = 8;

/// Packs every job's block on up to `threads` threads in one pool job, a few panels per
/// task.
pub(super) fn pack_shared<T: PackSource, P: Packed>(jobs: Vec<PackJob<'_, T, P>>, threads: usize) {
    // Per job: its first task, its matrix and block, its panels, one panel's length,
    // where its buffer starts.
    let mut tasks = 0;
    let plan: Vec<_> = jobs
        .into_iter()
        .map(|(m, blk, transposed, dst)| {
            let panels = blk.rows.div_ceil(blk.panel);
            let panel_len = blk.panel * blk.k_steps::<P>();
            assert!(dst.len() >= panels * panel_len);
            let first = tasks;
            tasks += panels.div_ceil(PACK_PANELS_PER_TASK);
            let out = SharedMut(dst.as_mut_ptr());
            (first, (m, blk, transposed), panels, panel_len, out)
        })
        .collect();
    pool::global().run(tasks, threads, |t| {
        let job = plan
            .iter()
            .rposition(|j| j.0 <= t)
            .expect("task 0 is job 0's");
        let (first, (m, blk, transposed), panels, panel_len, out) = plan[job];
        let p0 = (t - first) * PACK_PANELS_PER_TASK;
        let p1 = (p0 + PACK_PANELS_PER_TASK).min(panels);
        let part = Block {
            r0: blk.r0 + p0 * blk.panel,
            rows: (p1 * blk.panel).min(blk.rows) - p0 * blk.panel,
            ..blk
        };
        // SAFETY: panels p0..p1 of this job occupy [p0·panel_len, p1·panel_len) of its
        // buffer (asserted to hold every panel), written by this task alone.
        let o = unsafe {
            std::slice::from_raw_parts_mut(out.get().add(p0 * panel_len), (p1 - p0) * panel_len)
        };
        pack(m, part, transposed, o);
    });
}

/// One task's tiles: a packed A block against B micro-panels `b_panels` of a packed B
/// block.
struct BlockTiles<'a, P> {
    /// The packed A block, its first row of C and its rows.
    a: (&'a [P], usize, usize),
    /// The packed B block, its first column of C and its columns.
    b: (&'a [P], usize, usize),
    /// Packed k-steps per micro-panel.
    ks: usize,
    /// Which of the block's B micro-panels.
    b_panels: (usize, usize),
    /// Loop order ([`b_panel_outer`]).
    b_outer: bool,
}

fn block_tiles<P>(kern: &MicroKernel<P>, blk: BlockTiles<'_, P>, c: &MatMut, scalars: (f32, f32)) {
    let (mr, nr, ks) = (kern.mr, kern.nr, blk.ks);
    let ((ap, ic, mc), (bp, jc, nc)) = (blk.a, blk.b);
    let mut tmp = [0f32; 8 * 64]; // MR·NR ≤ 512 for every kernel (6·64 at most)
    debug_assert!(mr * nr <= tmp.len());
    let mut tile = |ir: usize, jr: usize| {
        let tile = Tile {
            at: (
                ic + ir * mr,
                jc + jr * nr,
                mr.min(mc - ir * mr),
                nr.min(nc - jr * nr),
            ),
            ks,
            a_panel: ap[ir * ks * mr..][..ks * mr].as_ptr(),
            b_panel: bp[jr * ks * nr..][..ks * nr].as_ptr(),
        };
        // SAFETY: the panels hold ks·MR / ks·NR packed elements (sliced above); the tile
        // is inside C, which this task alone writes (tasks cover disjoint A blocks ×
        // column ranges).
        unsafe { run_tile(kern, tile, c, scalars, &mut tmp) };
    };
    let (a_panels, (j0, j1)) = (mc.div_ceil(mr), blk.b_panels);
    if blk.b_outer {
        for jr in j0..j1 {
            (0..a_panels).for_each(|ir| tile(ir, jr));
        }
    } else {
        for ir in 0..a_panels {
            (j0..j1).for_each(|jr| tile(ir, jr));
        }
    }
}

/// One micro-kernel call: C rows `i0..i0+rows`, columns `j0..j0+cols` from `ks` packed
/// steps of an A and a B micro-panel.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tile<P> {
    pub at: (usize, usize, usize, usize),
    pub ks: usize,
    pub a_panel: *const P,
    pub b_panel: *const P,
}

/// Runs `t` into C: straight into C when the tile is whole and C's rows are contiguous,
/// otherwise into `tmp` and then merged (ragged edges, strided C).
///
/// # Safety
/// The panels hold `ks·MR` and `ks·NR` packed elements; rows `i0..i0+rows` and columns
/// `j0..j0+cols` lie inside C, and no other thread writes them during the call.
pub(super) unsafe fn run_tile<P>(
    kern: &MicroKernel<P>,
    t: Tile<P>,
    c: &MatMut,
    (alpha, beta): (f32, f32),
    tmp: &mut [f32; 8 * 64],
) {
    let (mr, nr) = (kern.mr, kern.nr);
    let (i0, j0, rows, cols) = t.at;
    debug_assert!(mr * nr <= tmp.len());
    if rows == mr && cols == nr && c.cs == 1 {
        let out = TileOut {
            // SAFETY: the whole tile is inside C (the caller's contract).
            c: unsafe { c.ptr.get().add(i0 * c.rs + j0) },
            rs_c: c.rs,
            alpha,
            beta,
        };
        // SAFETY: the caller's contract: panels of ks steps, the tile inside C.
        unsafe { (kern.run)(t.ks, t.a_panel, t.b_panel, out) };
    } else {
        let out = TileOut {
            c: tmp.as_mut_ptr(),
            rs_c: nr,
            alpha: 1.0,
            beta: 0.0,
        };
        // SAFETY: panels as above; tmp holds MR·NR ≤ 512 floats.
        unsafe { (kern.run)(t.ks, t.a_panel, t.b_panel, out) };
        merge_edge(c, tmp, (i0, j0, rows, cols, nr), alpha, beta);
    }
}

/// Adds a partial tile (kept in `tmp`, row stride `nr`) into a strided C.
fn merge_edge(
    c: &MatMut,
    tmp: &[f32],
    (i0, j0, rows, cols, nr): (usize, usize, usize, usize, usize),
    alpha: f32,
    beta: f32,
) {
    for i in 0..rows {
        for j in 0..cols {
            // SAFETY: i0+i < C.rows and j0+j < C.cols (edge tile clipped to the matrix);
            // this task alone writes this rectangle.
            unsafe {
                let p = c.ptr.get().add((i0 + i) * c.rs + (j0 + j) * c.cs);
                let v = alpha * tmp[i * nr + j];
                *p = if beta == 0.0 { v } else { v + beta * *p };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_micro_panel_that_fits_half_of_l1_stays_there() {
        // AVX2 6×16 at KC = 256: a 16 KiB B panel, half of a 32 KiB L1.
        assert!(b_panel_outer(256, 16, 4, Some(32 << 10)));
        assert!(
            b_panel_outer(256, 16, 4, None),
            "32 KiB assumed where unknown"
        );
        // AVX-512 6×64 at KC = 384 (96 KiB), bf16 pairs at 192 steps (48 KiB): A stays.
        assert!(!b_panel_outer(384, 64, 4, Some(48 << 10)));
        assert!(!b_panel_outer(192, 64, 4, Some(48 << 10)));
        // A larger KC on AVX2 overflows half of L1 as well.
        assert!(!b_panel_outer(512, 16, 4, Some(32 << 10)));
    }

    /// A slice of A is whole MC blocks, at least one, and within the slice budget
    /// whenever one MC block is.
    #[test]
    fn a_slices_are_whole_mc_blocks_within_the_budget() {
        for (mc, kc) in [(96, 256), (144, 384), (1, 1), (7, 5), (96, 1 << 20)] {
            let blk = Blocking {
                mc,
                kc,
                nc: 64,
                threads: 1,
            };
            let rows = a_slice_rows(&blk);
            assert!(rows >= mc && rows.is_multiple_of(mc), "{mc} {kc}: {rows}");
            assert!(
                rows * kc <= A_SLICE_ELEMS.max(mc * kc),
                "{mc} {kc}: {rows} rows"
            );
        }
    }
}
