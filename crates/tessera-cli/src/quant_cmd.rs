//! `tessera quant-error`: which weight format loses how much, for a matrix you choose.

use anyhow::{bail, Context, Result};
use clap::Args;
use tessera_kernels::quant::error::{report, sample, Dist};
use tessera_kernels::registry;

#[derive(Args, Debug)]
pub struct QuantErrorArgs {
    /// Weight matrix ROWSxCOLS (formats whose block does not divide COLS are skipped:
    /// K-quants need a multiple of 256).
    #[arg(long, default_value = "1536x576")]
    shape: String,
    /// Random weights: uniform, normal or outliers (ignored with --file).
    #[arg(long, default_value = "normal")]
    dist: String,
    /// Raw little-endian f32 weights (ROWS·COLS values) instead of random ones.
    #[arg(long)]
    file: Option<std::path::PathBuf>,
    /// Activation rows for the matmul error.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Most values the weight matrix or the activations may hold: 2²⁷ f32 (512 MiB), since
/// the report keeps several quantized and dequantized copies of each.
const MAX_VALUES: usize = 1 << 27;

pub fn run(a: QuantErrorArgs) -> Result<()> {
    let dims = registry::parse_dims("quant-error", &a.shape, 2, "ROWSxCOLS")?;
    let (rows, cols) = (dims[0], dims[1]);
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    for (what, n) in [
        ("the weight matrix", rows.checked_mul(cols)),
        (
            "the activations (--batch × COLS)",
            a.batch.checked_mul(cols),
        ),
    ] {
        if n.is_none_or(|n| n > MAX_VALUES) {
            bail!(
                "{what} would hold {} values; the limit is {MAX_VALUES} (--shape {}, --batch {})",
                n.map_or("more than usize".into(), |n| n.to_string()),
                a.shape,
                a.batch
            );
        }
    }
    let mut rng = registry::rng(a.seed);
    let (w, source) = match &a.file {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let want = rows.checked_mul(cols).and_then(|n| n.checked_mul(4));
            if want != Some(bytes.len()) {
                bail!(
                    "{}: {} bytes, but {rows}×{cols} f32 weights need {}",
                    path.display(),
                    bytes.len(),
                    want.map_or("more than usize".into(), |b| b.to_string())
                );
            }
            let w = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (w, path.display().to_string())
        }
        None => {
            let dist: Dist = a.dist.parse()?;
            (
                sample(dist, rows * cols, &mut rng),
                format!("random {dist:?}"),
            )
        }
    };
    let x = sample(Dist::Uniform, a.batch * cols, &mut rng);
    let lines = report(rows, cols, &w, &x)?;
    println!(
        "{rows}×{cols} weights ({source}), matmul error over {} random activation rows",
        a.batch
    );
    println!(
        "{:<18} {:>9} {:>12} {:>12} {:>12}",
        "format", "bits/w", "weight rel", "weight max", "matmul rel"
    );
    for l in lines {
        println!(
            "{:<18} {:>9.3} {:>12.3e} {:>12.3e} {:>12.3e}",
            l.format, l.bits_per_weight, l.weight_rel, l.weight_max_abs, l.matmul_rel
        );
    }
    Ok(())
}
