//! AVX-512's GEMM geometry on any host: the 6×64 tile of [`micro::lanes_f32`] in
//! software lanes (`Soft<16>`) and a plain-Rust `vdpbf16ps` pair kernel, each through
//! the blocked driver with AVX-512's default blocking (KC = 384, the A-panel-outer loop
//! order, 64-wide packed B panels, bf16 pairs) and with small odd blockings, against
//! float64. A CI host without AVX-512 otherwise never runs these shapes of the driver
//! and packing; the zmm intrinsics themselves are checked by `tessera verify` on an
//! AVX-512 host.

use super::driver::{Blocking, MicroKernel};
use super::micro::{self, TileOut, WIDE_MR, WIDE_NV};
use super::{blocked, c_matrices, check_shapes, default_blocking, GemmParams, TOL_BF16, TOL_F32};
use half::bf16;
use rand::{Rng, SeedableRng};
use tessera_core::{Isa, Layout, TensorView, TensorViewMut};

/// AVX-512's f32 tile ([`micro::lanes_f32`] at 6×64) over `Soft<16>`.
fn soft_f32_kernel() -> MicroKernel<f32> {
    MicroKernel {
        mr: WIDE_MR,
        nr: 16 * WIDE_NV,
        run: micro::soft_6x64,
    }
}

/// `vdpbf16ps` over the 6×64 tile in plain Rust: each packed u32 is a pair of bf16
/// k-values (the lower k in the low half); both products add into the f32 accumulator.
///
/// # Safety
/// `a` holds `k·6` and `b` `k·64` packed pairs; `t.c` is valid for 6 rows of 64 floats
/// `t.rs_c` apart.
unsafe fn soft_bf16_6x64(k: usize, a: *const u32, b: *const u32, t: TileOut) {
    const NR: usize = 16 * WIDE_NV;
    let half = |x: u32, hi: bool| bf16::from_bits((if hi { x >> 16 } else { x }) as u16).to_f32();
    let mut acc = [[0f32; NR]; WIDE_MR];
    for p in 0..k {
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: p < k: step p's 6 A and 64 B pairs exist.
            let x = unsafe { *a.add(p * WIDE_MR + i) };
            for (j, c) in row.iter_mut().enumerate() {
                // SAFETY: as above.
                let y = unsafe { *b.add(p * NR + j) };
                *c += half(x, false) * half(y, false) + half(x, true) * half(y, true);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            // SAFETY: the tile is inside C (the contract).
            unsafe {
                let c = t.c.add(i * t.rs_c + j);
                *c = if t.beta == 0.0 {
                    t.alpha * v
                } else {
                    t.alpha * v + t.beta * *c
                };
            }
        }
    }
}

/// One product: `batch` entries of `m×k · k×n` (A stored transposed when `ta`, B shared
/// when `shared_b`), C stored transposed when `tc` (so tiles take the strided merge),
/// checked against float64 at `tol`.
struct Case {
    batch: usize,
    dims: (usize, usize, usize),
    ta: bool,
    shared_b: bool,
    tc: bool,
    beta: f32,
    blocking: Blocking,
}

impl Case {
    fn run<T: super::GemmInput, P: super::pack::Packed>(
        &self,
        kern: MicroKernel<P>,
        tol: f64,
        rng: &mut impl Rng,
        what: &str,
    ) {
        let (m, n, k) = self.dims;
        let bb = if self.shared_b { 1 } else { self.batch };
        let mut fill = |len: usize| -> Vec<T> {
            (0..len)
                .map(|_| T::from_f32(rng.random_range(-1.0f32..1.0)))
                .collect()
        };
        let (a, b) = (fill(self.batch * m * k), fill(bb * k * n));
        let c0: Vec<f32> = (0..self.batch * m * n)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let view = |d: &[usize], t: bool| {
            let l = Layout::contiguous(&[d[0], d[2], d[1]]).expect("dims");
            if t {
                l.transposed(1, 2).expect("rank 3")
            } else {
                Layout::contiguous(d).expect("dims")
            }
        };
        let (la, lb, lc) = (
            view(&[self.batch, m, k], self.ta),
            view(&[bb, k, n], false),
            view(&[self.batch, m, n], self.tc),
        );
        let (av, bv) = (
            TensorView::new(&a, la).expect("a"),
            TensorView::new(&b, lb).expect("b"),
        );
        let mut c = c0.clone();
        if self.beta == 0.0 {
            c.fill(f32::NAN); // β = 0 never reads C
        }
        let alpha = 0.75;
        let mut cv = TensorViewMut::new(&mut c, lc).expect("c");
        let s = check_shapes(&av, &bv, &cv).expect("valid shapes");
        let c_mat = c_matrices(&mut cv, m, n);
        let p = GemmParams {
            alpha,
            beta: self.beta,
        };
        blocked(kern, self.blocking, (&av, &bv), &s, &c_mat, p);
        let f = |x: T| x.to_f32() as f64;
        let want = super::reference::gemm_f64(
            (self.batch, m, n, k),
            |e, i, q| f(a[la.index_of(&[e, i, q])]),
            |e, q, j| f(b[lb.index_of(&[e.min(bb - 1), q, j])]),
            |e, i, j| c0[lc.index_of(&[e, i, j])] as f64,
            alpha as f64,
            self.beta as f64,
        );
        let got: Vec<f64> = (0..self.batch * m * n)
            .map(|x| c[lc.index_of(&[x / (m * n), x / n % m, x % n])] as f64)
            .collect();
        let err = crate::registry::verify::rel_error_finite(&got, &want);
        assert!(
            err <= tol,
            "{what}: error {err:.2e} (batch {} m{m} n{n} k{k}, ta {} tc {} β {} {:?})",
            self.batch,
            self.ta,
            self.tc,
            self.beta,
            self.blocking
        );
    }
}

/// Ragged shapes around AVX-512's blocking (KC 384, NC 1024, MC 96, the 6×64 tile) and
/// random small blockings, on 1–3 threads; f32 through `Soft<16>`'s 6×64 tile and bf16
/// through the pair kernel.
#[test]
fn avx512_tile_and_blocking_match_f64_in_software_lanes() {
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let f32_kern = soft_f32_kernel();
    let bf16_kern = MicroKernel::<u32> {
        mr: WIDE_MR,
        nr: 16 * WIDE_NV,
        run: soft_bf16_6x64,
    };
    let wide = default_blocking(Isa::Avx512);
    let shapes = [
        (1, (97, 1090, 401)), // two B blocks (NC 1024), two K blocks (KC 384), ragged
        (1, (13, 70, 385)),   // one row panel past 12, K one past a block
        (3, (50, 129, 97)),   // a batch, one column past two tiles
        (2, (200, 64, 800)),  // A blocks past MC, K in three blocks
    ];
    for (i, &(batch, dims)) in shapes.iter().enumerate() {
        for threads in 1..=3 {
            let small = Blocking {
                mc: rng.random_range(1..40),
                kc: rng.random_range(1..100),
                nc: rng.random_range(1..200),
                threads,
            };
            for blocking in [Blocking { threads, ..wide }, small] {
                let case = Case {
                    batch,
                    dims,
                    ta: i % 2 == 1,
                    shared_b: batch > 1 && threads == 2,
                    tc: threads == 3,
                    beta: if i % 2 == 0 { 0.0 } else { -0.5 },
                    blocking,
                };
                let what = format!("seed {seed}");
                case.run::<f32, f32>(f32_kern, TOL_F32.rel, &mut rng, &what);
                case.run::<bf16, u32>(bf16_kern, TOL_BF16.rel, &mut rng, &what);
            }
        }
    }
}

/// Prefill's driver (`gemm_bt_rows`: x packed once, weight-row slabs claimed per task)
/// with the 6×64 tile in software lanes and AVX-512's blocking: 64-wide panels, slabs of
/// up to 256 weight rows, K blocks evened out from KC = 384; rows filled one at a time
/// and 8 at a time into the packed panel (the interleaved 4-bit weights' path); x a
/// strided view; y poisoned with NaN.
#[test]
fn avx512_tile_in_the_prefill_driver_matches_f64_in_software_lanes() {
    use super::bt_rows::bt_rows_with;
    use super::WeightRows;
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let kern = soft_f32_kernel();
    for (m, n, k) in [(100, 300, 577), (7, 65, 385), (13, 520, 96), (1, 8, 5)] {
        let x: Vec<f32> = (0..2 * m * k)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let wt: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        // x is every other row of a 2m × k matrix: row stride 2k.
        let xl = Layout::strided(&[m, k], &[2 * k, 1], 0).expect("layout");
        let xv = TensorView::new(&x, xl).expect("x");
        let want = super::reference::gemm_f64(
            (1, m, n, k),
            |_, i, q| x[xl.index_of(&[i, q])] as f64,
            |_, q, j| wt[j * k + q] as f64,
            |_, _, _| 0.0,
            1.0,
            0.0,
        );
        let fill = |r: usize, out: &mut [f32]| out.copy_from_slice(&wt[r * k..][..k]);
        let fill8 = |r0: usize, (k0, kc): (usize, usize), out: &mut [f32], ld: usize| {
            for i in 0..8 {
                for q in 0..kc {
                    out[q * ld + i] = wt[(r0 + i) * k + k0 + q];
                }
            }
            true
        };
        for threads in 1..=3 {
            for by8 in [false, true] {
                let rows = WeightRows {
                    n,
                    fill: &fill,
                    fill8: if by8 { Some(&fill8) } else { None },
                };
                let mut y = vec![f32::NAN; m * n];
                let mut yv = TensorViewMut::contiguous(&mut y, &[m, n]).expect("y");
                let blk = Blocking {
                    threads,
                    ..default_blocking(Isa::Avx512)
                }
                .round(&kern);
                bt_rows_with(&kern, blk, threads, &xv, rows, &mut yv).expect("valid shapes");
                let got: Vec<f64> = y.iter().map(|&v| v as f64).collect();
                let err = crate::registry::verify::rel_error_finite(&got, &want);
                assert!(
                    err <= TOL_F32.rel,
                    "m{m} n{n} k{k} threads {threads} by8 {by8}: error {err:.2e} (seed {seed})"
                );
            }
        }
    }
}
