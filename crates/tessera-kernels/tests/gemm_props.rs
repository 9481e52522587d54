//! Property test of f32 GEMM over random shapes, transposes, α/β and (small, odd) block
//! sizes on every ISA this machine has: proptest shrinks any failure to the smallest
//! shape and blocking that shows it, which the fixed ragged-shape list cannot do.

use proptest::prelude::*;
use tessera_core::{Isa, Layout, TensorView, TensorViewMut};
use tessera_kernels::ops::gemm::{gemm_bt_rows, gemm_with, Blocking, GemmParams, TOL_F32};

/// Row-major `rows×cols` data viewed as stored, or stored transposed and viewed back.
fn view<'a>(data: &'a [f32], rows: usize, cols: usize, trans: bool) -> TensorView<'a, f32> {
    if trans {
        TensorView::contiguous(data, &[cols, rows])
            .and_then(|v| v.transposed(0, 1))
            .expect("valid dims")
    } else {
        TensorView::contiguous(data, &[rows, cols]).expect("valid dims")
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn gemm_matches_f64(
        m in 1usize..70, n in 1usize..90, k in 1usize..70,
        ta: bool, tb: bool,
        alpha in -2.0f32..2.0, beta in prop::sample::select(vec![0.0f32, 1.0, -0.5]),
        mc in 1usize..40, kc in 1usize..40, nc in 1usize..100,
        seed: u64,
    ) {
        // Deterministic non-zero inputs from the seed (a tiny LCG is enough here).
        let mut s = seed | 1;
        let mut next = move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0 + 1e-3
        };
        let a: Vec<f32> = (0..m * k).map(|_| next()).collect();
        let b: Vec<f32> = (0..k * n).map(|_| next()).collect();
        let c0: Vec<f32> = (0..m * n).map(|_| next()).collect();
        let av = view(&a, m, k, ta);
        let bv = view(&b, k, n, tb);
        // Reference in f64 from the logical views.
        let at = |i: usize, p: usize| av.get(&[i, p]).expect("in range") as f64;
        let bt = |p: usize, j: usize| bv.get(&[p, j]).expect("in range") as f64;
        let want: Vec<f64> = (0..m * n)
            .map(|ij| {
                let (i, j) = (ij / n, ij % n);
                let dot: f64 = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
                alpha as f64 * dot + beta as f64 * c0[ij] as f64
            })
            .collect();
        for isa in Isa::available() {
            let mut c = c0.clone();
            let mut cv = TensorViewMut::new(&mut c, Layout::contiguous(&[m, n]).expect("dims"))
                .expect("fits");
            let blocking = Blocking { mc, kc, nc, threads: 2 };
            gemm_with(isa, blocking, &av, &bv, &mut cv, GemmParams { alpha, beta })
                .expect("valid problem");
            let err: f64 = c.iter().zip(&want).map(|(&x, &y)| (x as f64 - y).powi(2)).sum();
            let norm: f64 = want.iter().map(|y| y * y).sum();
            let rel = (err / norm.max(f64::MIN_POSITIVE)).sqrt();
            prop_assert!(rel <= TOL_F32.rel, "{isa}: rel {rel:e} (m{m} n{n} k{k} ta{ta} tb{tb})");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Batched GEMM (B per entry or one B for all) with more threads than entries or
    /// fewer, so both ways of sharing out the work run: entries on their own threads,
    /// and each entry's B blocks split into tasks of A blocks × B micro-panels. Shapes
    /// large enough to pass the one-thread cut-off; C poisoned with NaN (β = 0).
    #[test]
    fn batched_gemm_matches_f64(
        batch in 1usize..5, m in 20usize..130, n in 20usize..160, k in 20usize..200,
        shared_b: bool, threads in 1usize..6,
        mc in 1usize..64, kc in 1usize..96, nc in 1usize..128, seed: u64,
    ) {
        let mut s = seed | 1;
        let mut next = move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0 + 1e-3
        };
        let b_entries = if shared_b { 1 } else { batch };
        let a: Vec<f32> = (0..batch * m * k).map(|_| next()).collect();
        let b: Vec<f32> = (0..b_entries * k * n).map(|_| next()).collect();
        let av = TensorView::contiguous(&a, &[batch, m, k]).expect("dims");
        let bv = if shared_b {
            TensorView::contiguous(&b, &[k, n])
        } else {
            TensorView::contiguous(&b, &[batch, k, n])
        }
        .expect("dims");
        let want: Vec<f64> = (0..batch * m * n)
            .map(|bij| {
                let (e, i, j) = (bij / (m * n), bij / n % m, bij % n);
                let be = if shared_b { 0 } else { e };
                (0..k)
                    .map(|p| a[(e * m + i) * k + p] as f64 * b[(be * k + p) * n + j] as f64)
                    .sum()
            })
            .collect();
        for isa in Isa::available() {
            let mut c = vec![f32::NAN; batch * m * n];
            let mut cv =
                TensorViewMut::new(&mut c, Layout::contiguous(&[batch, m, n]).expect("dims"))
                    .expect("fits");
            let blocking = Blocking { mc, kc, nc, threads };
            gemm_with(isa, blocking, &av, &bv, &mut cv, GemmParams::default())
                .expect("valid problem");
            let err: f64 = c.iter().zip(&want).map(|(&x, &y)| (x as f64 - y).powi(2)).sum();
            let norm: f64 = want.iter().map(|y| y * y).sum();
            let rel = (err / norm.max(f64::MIN_POSITIVE)).sqrt();
            prop_assert!(
                rel <= TOL_F32.rel,
                "{isa}: rel {rel:e} (batch{batch} m{m} n{n} k{k} shared_b{shared_b} threads{threads})"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// `gemm_bt_rows` (prefill's GEMM against weight rows produced on demand) against the
    /// f64 triple loop: ragged M, N and K across the MR/NR tiles, the KC blocks and the
    /// task split; x viewed transposed or not, y contiguous or transposed (column stride
    /// ≠ 1, the edge path only); y poisoned with NaN, which must be overwritten.
    #[test]
    fn gemm_bt_rows_matches_f64(
        m in 1usize..140, n in 1usize..150, k in 1usize..600,
        tx: bool, ty: bool, threads in 1usize..3, seed: u64,
    ) {
        let mut s = seed | 1;
        let mut next = move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0 + 1e-3
        };
        let x: Vec<f32> = (0..m * k).map(|_| next()).collect();
        let w: Vec<f32> = (0..n * k).map(|_| next()).collect(); // Bᵀ, row-major n×k
        let xv = view(&x, m, k, tx);
        let fill = |r: usize, out: &mut [f32]| out.copy_from_slice(&w[r * k..][..k]);
        let want: Vec<f64> = (0..m * n)
            .map(|ij| {
                let (i, j) = (ij / n, ij % n);
                (0..k)
                    .map(|p| xv.get(&[i, p]).expect("in range") as f64 * w[j * k + p] as f64)
                    .sum()
            })
            .collect();
        for isa in Isa::available() {
            let mut y = vec![f32::NAN; m * n];
            let layout = if ty {
                Layout::contiguous(&[n, m]).and_then(|l| l.transposed(0, 1))
            } else {
                Layout::contiguous(&[m, n])
            }
            .expect("dims");
            let mut yv = TensorViewMut::new(&mut y, layout).expect("fits");
            gemm_bt_rows(isa, threads, &xv, (n, &fill), &mut yv).expect("valid problem");
            let got = |ij: usize| {
                let (i, j) = (ij / n, ij % n);
                y[if ty { j * m + i } else { ij }] as f64
            };
            let err: f64 = (0..m * n).map(|ij| (got(ij) - want[ij]).powi(2)).sum();
            let norm: f64 = want.iter().map(|y| y * y).sum();
            let rel = (err / norm.max(f64::MIN_POSITIVE)).sqrt();
            prop_assert!(rel <= TOL_F32.rel, "{isa}: rel {rel:e} (m{m} n{n} k{k} tx{tx} ty{ty})");
        }
    }
}

#[test]
fn gemm_bt_rows_rejects_mismatched_shapes() {
    let x = vec![1f32; 6 * 4];
    let xv = TensorView::contiguous(&x, &[6, 4]).expect("dims");
    let fill = |_: usize, out: &mut [f32]| out.fill(1.0);
    for (rows, cols, n) in [(5, 3, 3), (6, 3, 4), (6, 0, 1)] {
        let mut y = vec![0f32; rows * cols];
        let mut yv = TensorViewMut::new(&mut y, Layout::contiguous(&[rows, cols]).expect("dims"))
            .expect("fits");
        let err = gemm_bt_rows(Isa::Scalar, 2, &xv, (n, &fill), &mut yv);
        assert!(err.is_err(), "y {rows}x{cols} with n {n} accepted");
    }
}

#[test]
fn gemm_bt_rows_with_empty_k_writes_zeros() {
    let x: Vec<f32> = Vec::new();
    let xv = TensorView::contiguous(&x, &[3, 0]).expect("dims");
    let fill = |_: usize, out: &mut [f32]| out.fill(1.0);
    for isa in Isa::available() {
        let mut y = vec![f32::NAN; 3 * 5];
        let mut yv =
            TensorViewMut::new(&mut y, Layout::contiguous(&[3, 5]).expect("dims")).expect("fits");
        gemm_bt_rows(isa, 2, &xv, (5, &fill), &mut yv).expect("valid problem");
        assert!(y.iter().all(|&v| v == 0.0), "{isa}: {y:?}");
    }
}
