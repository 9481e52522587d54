//! Rotary position embedding, both conventions: interleaved pairs `(x₂ᵢ, x₂ᵢ₊₁)` as GGUF
//! Llama models store Q/K, and half-split pairs `(xᵢ, xᵢ₊d/2)` as HF/NeoX checkpoints do.
//!
//! The cos/sin table is built once per call in f64 (angle = pos·θ^(−2i/d)) and rounded to
//! f32, so positions in the tens of thousands keep full f32 accuracy, which computing the
//! angle in f32 would not.

use super::rowwise::{run_rows, RowKernel, RowOpDesc};
use crate::multiversion;
use crate::registry::{Rng, Tolerance};
use rand::Rng as _;
use tessera_core::device::RowOp;
use tessera_core::{DType, Element, Error, Isa, Result, TensorView, TensorViewMut};

/// One rotation per pair: two products and a sum, from an f32 table.
pub const TOL: Tolerance = Tolerance {
    rel: 1e-6,
    reason: "f32-rounded cos/sin table, one rotation",
};

/// Which elements form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// `(x₂ᵢ, x₂ᵢ₊₁)` (GGUF Llama).
    Interleaved,
    /// `(xᵢ, xᵢ₊d/2)` (HF, NeoX).
    HalfSplit,
}

/// A RoPE table for a batch of tokens.
#[derive(Clone, Debug)]
pub struct Rope {
    /// Which elements form a rotated pair.
    pub style: RopeStyle,
    /// Heads per row.
    pub heads: usize,
    /// Head width (even).
    pub d: usize,
    /// Angular frequency of pair i (`θ^(−2i/d)` unscaled), `d/2` of them.
    pub freqs: Vec<f64>,
    /// Position of each row's token.
    pub positions: Vec<usize>,
    /// Every token's `d/2` cosines, then every token's `d/2` sines (one buffer, so a
    /// device takes the whole table as its parameter row).
    table: Vec<f32>,
}

/// The standard frequencies `θ^(−2i/d)`, i < d/2 (models with RoPE scaling adjust them
/// before building a table with [`Rope::with_frequencies`]).
pub fn base_frequencies(d: usize, theta: f64) -> Vec<f64> {
    (0..d / 2)
        .map(|i| theta.powf(-2.0 * i as f64 / d as f64))
        .collect()
}

impl Rope {
    /// Every token's `d/2` cosines, then every token's `d/2` sines: the parameter row
    /// of a device's [`RowOp::Rope`].
    pub fn table(&self) -> &[f32] {
        &self.table
    }

    /// The table for `positions` (one per token), `heads` heads of dim `d` (even).
    pub fn new(
        style: RopeStyle,
        positions: &[usize],
        heads: usize,
        d: usize,
        theta: f64,
    ) -> Result<Self> {
        if theta.partial_cmp(&1.0) != Some(std::cmp::Ordering::Greater) {
            return Err(Error::invalid("rope", format!("θ {theta} must be > 1")));
        }
        Self::with_frequencies(style, positions, heads, d, &base_frequencies(d, theta))
    }

    /// The table for given per-pair frequencies (angle = pos·`freqs[i]`).
    pub fn with_frequencies(
        style: RopeStyle,
        positions: &[usize],
        heads: usize,
        d: usize,
        freqs: &[f64],
    ) -> Result<Self> {
        if d == 0 || !d.is_multiple_of(2) || heads == 0 {
            return Err(Error::invalid(
                "rope",
                format!("head dim {d} must be even and > 0, heads {heads} > 0"),
            ));
        }
        if freqs.len() != d / 2 || !freqs.iter().all(|f| f.is_finite() && *f > 0.0) {
            return Err(Error::invalid(
                "rope",
                format!(
                    "{} frequencies for head dim {d}, each finite and > 0",
                    freqs.len()
                ),
            ));
        }
        let angles = || {
            positions
                .iter()
                .flat_map(|&p| freqs.iter().map(move |f| p as f64 * f))
        };
        let table = angles()
            .map(|a| a.cos() as f32)
            .chain(angles().map(|a| a.sin() as f32))
            .collect();
        Ok(Rope {
            style,
            heads,
            d,
            freqs: freqs.to_vec(),
            positions: positions.to_vec(),
            table,
        })
    }

    /// The cosines and the sines, `tokens·d/2` each.
    fn cos_sin(&self) -> (&[f32], &[f32]) {
        self.table.split_at(self.table.len() / 2)
    }

    fn pair(&self, i: usize) -> (usize, usize) {
        match self.style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::HalfSplit => (i, i + self.d / 2),
        }
    }
}

multiversion! {
    fn rope_interleaved(x: &[f32], c: &[f32], s: &[f32], out: &mut [f32]) {
        for (((o, xv), &c), &s) in out.chunks_exact_mut(2).zip(x.chunks_exact(2)).zip(c).zip(s) {
            o[0] = xv[0] * c - xv[1] * s;
            o[1] = xv[0] * s + xv[1] * c;
        }
    }
}

multiversion! {
    fn rope_half_split(x: &[f32], c: &[f32], s: &[f32], out: &mut [f32]) {
        let h = x.len() / 2;
        let (lo, hi) = out.split_at_mut(h);
        for i in 0..h {
            lo[i] = x[i] * c[i] - x[i + h] * s[i];
            hi[i] = x[i] * s[i] + x[i + h] * c[i];
        }
    }
}

impl RowKernel for Rope {
    fn row(&self, isa: Isa, row: usize, x: &[&[f32]], out: &mut [f32]) {
        let half = self.d / 2;
        let t = row / self.heads;
        let (cos, sin) = self.cos_sin();
        let (c, s) = (
            &cos[t * half..(t + 1) * half],
            &sin[t * half..(t + 1) * half],
        );
        match self.style {
            RopeStyle::Interleaved => rope_interleaved(isa, x[0], c, s, out),
            RopeStyle::HalfSplit => rope_half_split(isa, x[0], c, s, out),
        }
    }
}

/// Rotates `x` `[tokens, heads, d]` into `out` (same dims) with the table's positions.
pub fn rope<T: Element>(
    isa: Isa,
    x: &TensorView<'_, T>,
    table: &Rope,
    out: &mut TensorViewMut<'_, f32>,
) -> Result<()> {
    let expect = [table.positions.len(), table.heads, table.d];
    if x.dims() != expect {
        return Err(Error::shape(
            "rope",
            format!("x {:?}, table built for {expect:?}", x.dims()),
        ));
    }
    run_rows(
        "rope",
        isa,
        crate::pool::global().threads(),
        table,
        &[*x],
        out,
        table.d,
    )
}

/// Registry descriptor; `NEOX` picks the half-split convention.
#[derive(Debug)]
pub struct RopeDesc<const NEOX: bool>;

impl<const NEOX: bool> RowOpDesc for RopeDesc<NEOX> {
    type Kernel = Rope;
    const NAME: &'static str = if NEOX { "rope_neox" } else { "rope" };
    const SUMMARY: &'static str = if NEOX {
        "RoPE, half-split pairs (HF/NeoX)"
    } else {
        "RoPE, interleaved pairs (GGUF Llama)"
    };
    const FLOPS_PER_ELEM: f64 = 3.0;
    fn tolerance(_: DType) -> Tolerance {
        TOL
    }
    fn valid_n(n: usize) -> bool {
        n > 0 && n.is_multiple_of(2)
    }
    fn kernel(rows: usize, n: usize, rng: &mut Rng) -> Rope {
        let heads = [3, 2, 1]
            .into_iter()
            .find(|h| rows.is_multiple_of(*h))
            .unwrap_or(1);
        let offset = rng.random_range(0..30_000);
        let positions: Vec<usize> = (0..rows / heads).map(|t| offset + t).collect();
        let style = if NEOX {
            RopeStyle::HalfSplit
        } else {
            RopeStyle::Interleaved
        };
        Rope::new(style, &positions, heads, n, 10_000.0).expect("valid test parameters")
    }
    fn reference(k: &Rope, row: usize, x: &[Vec<f64>]) -> Vec<f64> {
        let pos = k.positions[row / k.heads] as f64;
        let mut out = x[0].clone();
        for i in 0..k.d / 2 {
            let angle = pos * k.freqs[i];
            let (a, b) = k.pair(i);
            out[a] = x[0][a] * angle.cos() - x[0][b] * angle.sin();
            out[b] = x[0][a] * angle.sin() + x[0][b] * angle.cos();
        }
        out
    }
    fn nan_reach(n: usize, col: usize) -> Option<Vec<usize>> {
        let (i, h) = if NEOX {
            (col % (n / 2), n / 2)
        } else {
            (col / 2 * 2, 1)
        };
        Some(vec![i, i + h])
    }
    fn device_op(k: &Rope) -> Option<(RowOp, Option<&[f32]>)> {
        let op = RowOp::Rope {
            heads: k.heads,
            half_split: k.style == RopeStyle::HalfSplit,
        };
        Some((op, Some(&k.table)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequencies_and_scaled_tables() {
        let f = base_frequencies(8, 10_000.0);
        assert_eq!(f.len(), 4);
        assert_eq!(f[0], 1.0);
        assert!((f[2] - 10_000f64.powf(-0.5)).abs() < 1e-15);
        // Halving every frequency is the same table as halving every position.
        let half: Vec<f64> = f.iter().map(|x| x / 2.0).collect();
        let a = Rope::with_frequencies(RopeStyle::HalfSplit, &[6, 40], 2, 8, &half).unwrap();
        let b = Rope::new(RopeStyle::HalfSplit, &[3, 20], 2, 8, 10_000.0).unwrap();
        assert_eq!(a.table, b.table);
        // Wrong count, non-finite or non-positive frequencies, bad θ: errors.
        let ok =
            |fr: &[f64]| Rope::with_frequencies(RopeStyle::Interleaved, &[0], 1, 8, fr).is_ok();
        assert!(!ok(&f[..3]));
        assert!(!ok(&[1.0, f64::NAN, 0.1, 0.01]));
        assert!(!ok(&[1.0, 0.0, 0.1, 0.01]));
        assert!(Rope::new(RopeStyle::Interleaved, &[0], 1, 8, 1.0).is_err());
    }
}
