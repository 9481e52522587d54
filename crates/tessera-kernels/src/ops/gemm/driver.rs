//! The blocked, threaded GEMM driver (the Goto/BLIS loop nest).
//!
//! ```text
//! for jc in N step NC:            B block (KC×NC) packed once, reused by every A block
//!   for pc in K step KC:
//!     pack B[pc.., jc..]
//!     for ic in M step MC:        A block (MC×KC) packed, stays in L2
//!       pack A[ic.., pc..]
//!       for jr in NC step NR:     B micro-panel (KC×NR) stays in L1 across ir
//!         for ir in MC step MR:   micro-kernel: MR×NR tile of C in registers
//! ```
//! Threads split C into independent rectangles (each packs its own blocks): no barriers,
//! and on 2 cores the duplicated packing of one operand costs ~1% at 2048³.

use super::micro::TileOut;
use super::pack::{pack, Block, Mat, PackSource, Packed};
use crate::pool::{self, SharedMut};
use std::cell::RefCell;
use tessera_core::AlignedVec;

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

/// A rectangle of C one task computes.
#[derive(Clone, Copy, Debug)]
struct Task {
    batch: usize,
    m0: usize,
    m1: usize,
    n0: usize,
    n1: usize,
}

/// Below this many FLOPs a GEMM stays on one thread (dispatch would cost more than it saves).
const MIN_FLOPS_PER_THREAD: f64 = 2e6;

fn plan(
    batches: usize,
    m: usize,
    n: usize,
    k: usize,
    kern_nr: usize,
    kern_mr: usize,
    threads: usize,
) -> Vec<Task> {
    let flops = 2.0 * (batches * m * n * k) as f64;
    let want = threads.min((flops / MIN_FLOPS_PER_THREAD) as usize).max(1);
    let per_batch = want.div_ceil(batches).max(1);
    // Split N first (keeps the micro-kernel's wide dimension whole), then M.
    let n_split = per_batch.min(n.div_ceil(kern_nr)).max(1);
    let m_split = per_batch.div_ceil(n_split).min(m.div_ceil(kern_mr)).max(1);
    let cut = |len: usize, parts: usize, q: usize, i: usize| {
        let step = len.div_ceil(parts).div_ceil(q) * q;
        ((i * step).min(len), ((i + 1) * step).min(len))
    };
    let mut tasks = Vec::new();
    for batch in 0..batches {
        for mi in 0..m_split {
            for ni in 0..n_split {
                let (m0, m1) = cut(m, m_split, kern_mr, mi);
                let (n0, n1) = cut(n, n_split, kern_nr, ni);
                if m0 < m1 && n0 < n1 {
                    tasks.push(Task {
                        batch,
                        m0,
                        m1,
                        n0,
                        n1,
                    });
                }
            }
        }
    }
    tasks
}

thread_local! {
    /// Per-thread packing buffers, reused across calls (decode calls GEMM ~100× per token).
    static SCRATCH: RefCell<(AlignedVec<f32>, AlignedVec<f32>)> =
        RefCell::new((AlignedVec::zeroed(0).expect("empty"), AlignedVec::zeroed(0).expect("empty")));
}

pub(super) fn grow(buf: &mut AlignedVec<f32>, len: usize) {
    if buf.len() < len {
        *buf = AlignedVec::zeroed(len).expect("GEMM packing buffer (sized by validated blocking)");
    }
}

/// View 4-byte packed scratch as `P`.
fn as_packed<P: Packed>(buf: &mut [f32], len: usize) -> &mut [P] {
    // SAFETY: P is 4-byte POD with every bit pattern valid (Packed's contract) and the
    // buffer is 64-byte aligned; len ≤ buf.len() (grown by the caller).
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut P, len) }
}

/// Runs the GEMM for every batch entry produced by `operands(b)`.
pub(super) fn run<T: PackSource, P: Packed>(
    kern: MicroKernel<P>,
    blocking: Blocking,
    (batches, m, n, k): (usize, usize, usize, usize),
    operands: &(dyn Fn(usize) -> Operands<T> + Sync),
    (alpha, beta): (f32, f32),
) {
    let blk = blocking.round(&kern);
    let tasks = plan(batches, m, n, k, kern.nr, kern.mr, blk.threads);
    pool::global().run(tasks.len(), blk.threads, |t| {
        let task = tasks[t];
        let ops = operands(task.batch);
        let job = |scratch: &mut (AlignedVec<f32>, AlignedVec<f32>)| {
            compute_rect(&kern, &blk, &ops, task, k, (alpha, beta), scratch)
        };
        SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut s) => job(&mut s),
            Err(_) => job(&mut (
                AlignedVec::zeroed(0).expect("empty"),
                AlignedVec::zeroed(0).expect("empty"),
            )),
        });
    });
}

fn compute_rect<T: PackSource, P: Packed>(
    kern: &MicroKernel<P>,
    blk: &Blocking,
    ops: &Operands<T>,
    task: Task,
    k: usize,
    (alpha, beta): (f32, f32),
    (abuf, bbuf): &mut (AlignedVec<f32>, AlignedVec<f32>),
) {
    let (mr, nr) = (kern.mr, kern.nr);
    let mut tmp = [0f32; 8 * 64]; // MR·NR ≤ 512 for every kernel (6·64 at most)
    debug_assert!(mr * nr <= tmp.len());
    for jc in (task.n0..task.n1).step_by(blk.nc) {
        let nc = blk.nc.min(task.n1 - jc);
        for pc in (0..k).step_by(blk.kc) {
            let kc = blk.kc.min(k - pc);
            let bblk = Block {
                r0: jc,
                rows: nc,
                k0: pc,
                k_len: kc,
                panel: nr,
            };
            grow(bbuf, bblk.packed_len::<P>());
            let bp = as_packed::<P>(bbuf, bblk.packed_len::<P>());
            pack(&ops.b, bblk, true, bp);
            let ks = bblk.k_steps::<P>();
            let beta_eff = if pc == 0 { beta } else { 1.0 };
            for ic in (task.m0..task.m1).step_by(blk.mc) {
                let mc = blk.mc.min(task.m1 - ic);
                let ablk = Block {
                    r0: ic,
                    rows: mc,
                    k0: pc,
                    k_len: kc,
                    panel: mr,
                };
                grow(abuf, ablk.packed_len::<P>());
                let ap = as_packed::<P>(abuf, ablk.packed_len::<P>());
                pack(&ops.a, ablk, false, ap);
                for ir in 0..mc.div_ceil(mr) {
                    let rows = mr.min(mc - ir * mr);
                    let a_panel = ap[ir * ks * mr..].as_ptr();
                    for jr in 0..nc.div_ceil(nr) {
                        let cols = nr.min(nc - jr * nr);
                        let b_panel = bp[jr * ks * nr..].as_ptr();
                        let (i0, j0) = (ic + ir * mr, jc + jr * nr);
                        let tile = Tile {
                            at: (i0, j0, rows, cols),
                            ks,
                            a_panel,
                            b_panel,
                        };
                        // SAFETY: the panels hold ks·MR / ks·NR packed elements; the tile is
                        // inside C, which this task alone writes (disjoint rectangles).
                        unsafe { run_tile(kern, tile, &ops.c, (alpha, beta_eff), &mut tmp) };
                    }
                }
            }
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
