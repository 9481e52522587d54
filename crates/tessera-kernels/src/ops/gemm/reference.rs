//! The float64 GEMM reference: the textbook triple loop, nothing else.

/// `c[b][i][j] = alpha·Σₚ a(b,i,p)·b(b,p,j) + beta·c0[b][i][j]` with closures supplying the
/// operands in f64 (so any layout or dtype is read the same way the test built it).
pub fn gemm_f64(
    (batch, m, n, k): (usize, usize, usize, usize),
    a: impl Fn(usize, usize, usize) -> f64,
    b: impl Fn(usize, usize, usize) -> f64,
    c0: impl Fn(usize, usize, usize) -> f64,
    alpha: f64,
    beta: f64,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(batch * m * n);
    for bt in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let dot: f64 = (0..k).map(|p| a(bt, i, p) * b(bt, p, j)).sum();
                let prior = if beta == 0.0 {
                    0.0
                } else {
                    beta * c0(bt, i, j)
                };
                out.push(alpha * dot + prior);
            }
        }
    }
    out
}
