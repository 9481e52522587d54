//! Shared proptest strategies for the quantized-format property tests.

use proptest::prelude::*;

/// `rows × cols` values (rows in `1..max_rows`, cols one or two `col_unit`s) in runs of
/// 16, each run uniform at its own scale (up to 2⁸ below a matrix-wide 2^e0, e0 in
/// −8..8), with one outlier (40× its scale), constant, or zero: what stresses quantized
/// sub-block scales, FP8 ranges and zero points.
pub fn runs_matrix(
    max_rows: usize,
    col_unit: usize,
) -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
    const RUN: usize = 16;
    (1usize..max_rows, 1usize..3, -8i32..8).prop_flat_map(move |(rows, nb, e0)| {
        let cols = nb * col_unit;
        let run = (0u8..5, 0i32..9, prop::collection::vec(-1.0f32..1.0, RUN)).prop_map(
            move |(kind, e, v)| {
                let s = 2f32.powi(e0 - e);
                match kind {
                    0 | 1 => v.iter().map(|x| x * s).collect::<Vec<f32>>(),
                    2 => v
                        .iter()
                        .enumerate()
                        .map(|(i, x)| if i == 3 { x.signum() * 40.0 * s } else { x * s })
                        .collect(),
                    3 => vec![v[0] * s; RUN],
                    _ => vec![0.0; RUN],
                }
            },
        );
        prop::collection::vec(run, rows * cols / RUN).prop_map(move |rs| (rows, cols, rs.concat()))
    })
}
