//! Property tests of `Layout`: the safety of every strided kernel rests on `span` and
//! `is_non_overlapping` being right, so they are checked against brute-force enumeration
//! of every element's buffer index over random dims, strides and offsets.

use proptest::prelude::*;
use std::collections::HashSet;
use tessera_core::{Layout, TensorView, MAX_RANK};

/// Every multi-index of `dims`, row-major.
fn all_indices(dims: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &d in dims {
        out = out
            .into_iter()
            .flat_map(|p| {
                (0..d).map(move |i| {
                    let mut q = p.clone();
                    q.push(i);
                    q
                })
            })
            .collect();
    }
    out
}

fn small_layout() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, usize)> {
    (1..=MAX_RANK).prop_flat_map(|rank| {
        (
            prop::collection::vec(0usize..5, rank),
            prop::collection::vec(0usize..12, rank),
            0usize..7,
        )
    })
}

proptest! {
    #[test]
    fn span_and_overlap_match_enumeration((dims, strides, offset) in small_layout()) {
        let l = Layout::strided(&dims, &strides, offset).expect("small values never overflow");
        let idx: Vec<usize> = all_indices(&dims).iter().map(|i| l.index_of(i)).collect();
        let span = l.span().expect("small span");
        // Every element lies inside the span, and the span is tight (offset + max + 1).
        prop_assert_eq!(span, idx.iter().max().map_or(0, |m| m + 1));
        prop_assert_eq!(l.numel(), idx.len());
        // "Non-overlapping" is a promise kernels rely on when writing in parallel: it must
        // never be claimed for a layout where two elements share an index.
        if l.is_non_overlapping() {
            let distinct: HashSet<usize> = idx.iter().copied().collect();
            prop_assert_eq!(distinct.len(), idx.len());
        }
    }

    #[test]
    fn contiguous_and_transposes((dims, _s, _o) in small_layout(), a in 0usize..MAX_RANK, b in 0usize..MAX_RANK) {
        let c = Layout::contiguous(&dims).expect("small dims");
        prop_assert!(c.is_contiguous());
        prop_assert!(c.is_non_overlapping());
        prop_assert_eq!(c.span().expect("small"), c.numel());
        match c.transposed(a, b) {
            Ok(t) => {
                prop_assert!(a < dims.len() && b < dims.len());
                prop_assert!(t.is_non_overlapping());
                prop_assert_eq!(t.transposed(a, b).expect("valid dims"), c);
                for i in all_indices(&dims) {
                    let mut j = i.clone();
                    j.swap(a, b);
                    prop_assert_eq!(t.index_of(&j), c.index_of(&i));
                }
            }
            Err(_) => prop_assert!(a >= dims.len() || b >= dims.len()),
        }
    }

    /// Views over too-short buffers and absurd sizes are errors, never panics.
    #[test]
    fn views_validate_lengths(dims in prop::collection::vec(0usize..6, 1..=MAX_RANK), extra in 0usize..3, short in 0usize..2) {
        let c = Layout::contiguous(&dims).expect("small dims");
        let need = c.numel();
        let data = vec![1.0f32; (need + extra).saturating_sub(if need > 0 { short } else { 0 })];
        // `contiguous` wants the exact length; `new` any buffer the layout fits in.
        prop_assert_eq!(TensorView::contiguous(&data, &dims).is_ok(), data.len() == need);
        prop_assert_eq!(TensorView::new(&data, c).is_ok(), data.len() >= need);
        prop_assert!(Layout::strided(&dims, &vec![usize::MAX / 2 + 1; dims.len()], usize::MAX / 2 + 1)
            .and_then(|l| l.span()).is_err() || dims.iter().any(|&d| d <= 1));
    }
}
