//! Stacking packed matrices that multiply the same input (an attention block's q, k
//! and v; an MLP's gate and up) into one `[Σ rows, K]` matrix at load time, so one
//! matmul serves them: one pool dispatch, one activation quantization, and one long
//! weight stream instead of several short ones, whose fixed costs dominate at decode
//! (a 576→192 projection ran at 51–74 % of DRAM bandwidth, docs/performance.md).
//!
//! Every layout stores rows (or groups of [`ROWS8`] rows) one after another, codes and
//! metadata alike, so stacking is concatenation, provided no part but the last has a
//! padded group.

use super::packed::{Factored, Meta, PackedWeights, SplitI8, ROWS8};
use tessera_core::{Error, HugeBuf, Result};

impl PackedWeights {
    /// The rows of `parts`, in order, as one matrix: row i of part p becomes row
    /// `Σ_{q<p} rows_q + i`, with the same values (so each output is the one the part
    /// gives, bit for bit). Errors unless the parts share format, layout and K, and
    /// every interleaved part but the last has whole groups of 8 rows.
    pub fn stack(parts: &[&PackedWeights]) -> Result<PackedWeights> {
        let fail = |detail: String| Error::Invalid {
            op: "PackedWeights::stack",
            detail,
        };
        let first = *parts.first().ok_or_else(|| fail("no matrices".into()))?;
        for p in parts {
            let same = (p.cols, p.dtype, p.layout, p.offset, p.split16)
                == (
                    first.cols,
                    first.dtype,
                    first.layout,
                    first.offset,
                    first.split16,
                );
            if !same {
                return Err(fail(format!(
                    "{} {}×{} ({:?}) and {} {}×{} ({:?}) differ in format, layout or K",
                    first.dtype,
                    first.rows,
                    first.cols,
                    first.layout,
                    p.dtype,
                    p.rows,
                    p.cols,
                    p.layout
                )));
            }
        }
        let body = &parts[..parts.len() - 1];
        if first.layout.interleaved() && body.iter().any(|p| p.rows % ROWS8 != 0) {
            return Err(fail(format!(
                "interleaved rows stack only in whole groups of {ROWS8}"
            )));
        }
        Ok(PackedWeights {
            rows: parts.iter().map(|p| p.rows).sum(),
            quants: HugeBuf::concat(&parts.iter().map(|p| &p.quants[..]).collect::<Vec<_>>()),
            meta: stack_meta(parts).ok_or_else(|| fail("metadata kinds differ".into()))?,
            ..first.clone_shape()
        })
    }

    /// Everything but the codes and metadata (emptied).
    fn clone_shape(&self) -> PackedWeights {
        PackedWeights {
            quants: HugeBuf::default(),
            meta: Meta::F32 {
                scales: HugeBuf::default(),
                mins: HugeBuf::default(),
            },
            ..*self
        }
    }
}

/// `Meta::$variant` with each field the parts' fields concatenated in order (every
/// field of the wrapped K-quant layouts is stored per row group, in row order). The
/// caller checked that every part has this variant.
macro_rules! concat_fields {
    ($metas:expr, $variant:ident($ty:ident { $($field:ident),+ })) => {{
        let mut parts = Vec::new();
        for m in &$metas {
            let Meta::$variant(part) = m else { return None };
            parts.push(part);
        }
        Some(Meta::$variant($ty {
            $($field: HugeBuf::concat(&parts.iter().map(|p| &p.$field[..]).collect::<Vec<_>>())),+
        }))
    }};
}

/// The parts' metadata concatenated; f16 and f32 parts (each packed its own way, f16
/// where its values allowed) meet in f32, which holds every f16 exactly. None where the
/// kinds cannot meet (a format's parts always share theirs).
fn stack_meta(parts: &[&PackedWeights]) -> Option<Meta> {
    let metas: Vec<&Meta> = parts.iter().map(|p| &p.meta).collect();
    let all = |kind: fn(&Meta) -> bool| metas.iter().all(|m| kind(m));
    if all(|m| matches!(m, Meta::F16 { .. })) {
        let (mut scales, mut mins) = (Vec::new(), Vec::new());
        for m in &metas {
            if let Meta::F16 { scales: s, mins: n } = m {
                scales.extend_from_slice(s);
                mins.extend_from_slice(n);
            }
        }
        return Some(Meta::F16 {
            scales: scales.into(),
            mins: mins.into(),
        });
    }
    if all(|m| matches!(m, Meta::F16 { .. } | Meta::F32 { .. })) {
        let (mut wide, mut mins_wide) = (Vec::new(), Vec::new());
        for m in &metas {
            match m {
                Meta::F32 { scales: s, mins: n } => {
                    wide.extend_from_slice(s);
                    mins_wide.extend_from_slice(n);
                }
                Meta::F16 { scales: s, mins: n } => {
                    wide.extend(s.iter().map(|h| h.to_f32()));
                    mins_wide.extend(n.iter().map(|h| h.to_f32()));
                }
                _ => return None,
            }
        }
        return Some(Meta::F32 {
            scales: wide.into(),
            mins: mins_wide.into(),
        });
    }
    if all(|m| matches!(m, Meta::Factored(_))) {
        return concat_fields!(
            metas,
            Factored(Factored {
                d,
                neg_dmin,
                sc,
                mn
            })
        );
    }
    if all(|m| matches!(m, Meta::SplitI8(_))) {
        return concat_fields!(
            metas,
            SplitI8(SplitI8 {
                d,
                sc,
                neg_dmin,
                mn
            })
        );
    }
    None
}
