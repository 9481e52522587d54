//! Shapes and strides.
//!
//! A [`Layout`] is dims + strides (in elements) + an offset, up to [`MAX_RANK`] dims, held
//! inline so building and passing views never allocates. Strides are unsigned: transposes
//! and sub-views are expressible, reversed views are not (no kernel needs them).

use crate::{Error, Result};

/// The highest rank a view can have (batch × heads × rows × cols).
pub const MAX_RANK: usize = 4;

/// Dims, strides and offset of a view into a flat buffer.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    rank: usize,
    dims: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
    offset: usize,
}

impl std::fmt::Debug for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?}/strides{:?}+{}",
            self.dims(),
            self.strides(),
            self.offset
        )
    }
}

impl Layout {
    /// Row-major contiguous layout of `dims`.
    pub fn contiguous(dims: &[usize]) -> Result<Self> {
        let mut strides = [0usize; MAX_RANK];
        let mut acc = 1usize;
        for (i, &d) in dims.iter().enumerate().rev().take(MAX_RANK) {
            strides[i] = acc;
            acc = acc
                .checked_mul(d)
                .ok_or_else(|| Error::Overflow(format!("dims {dims:?}")))?;
        }
        Self::strided(dims, &strides[..dims.len().min(MAX_RANK)], 0)
    }

    /// An arbitrary strided layout; `strides.len()` must equal `dims.len()`.
    pub fn strided(dims: &[usize], strides: &[usize], offset: usize) -> Result<Self> {
        if dims.len() > MAX_RANK || dims.len() != strides.len() {
            return Err(Error::Rank {
                op: "layout",
                expected: format!("≤ {MAX_RANK} with one stride per dim"),
                got: dims.len(),
            });
        }
        let mut l = Layout {
            rank: dims.len(),
            dims: [1; MAX_RANK],
            strides: [0; MAX_RANK],
            offset,
        };
        l.dims[..dims.len()].copy_from_slice(dims);
        l.strides[..dims.len()].copy_from_slice(strides);
        l.numel_checked()?;
        l.span()?;
        Ok(l)
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Extent of each dimension, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank]
    }
    /// Elements between neighbours along each dimension.
    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.rank]
    }
    /// Buffer index of the first element.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Extent of dimension `i`.
    pub fn dim(&self, i: usize) -> usize {
        self.dims[i]
    }
    /// Stride of dimension `i`, in elements.
    pub fn stride(&self, i: usize) -> usize {
        self.strides[i]
    }

    fn numel_checked(&self) -> Result<usize> {
        self.dims()
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::Overflow(format!("dims {:?}", self.dims())))
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims().iter().product()
    }

    /// One past the largest buffer index the layout touches (0 when empty).
    pub fn span(&self) -> Result<usize> {
        if self.numel() == 0 {
            return Ok(0);
        }
        let mut last = self.offset;
        for i in 0..self.rank {
            let reach = (self.dims[i] - 1)
                .checked_mul(self.strides[i])
                .ok_or_else(|| Error::Overflow(format!("layout {self:?}")))?;
            last = last
                .checked_add(reach)
                .ok_or_else(|| Error::Overflow(format!("layout {self:?}")))?;
        }
        last.checked_add(1)
            .ok_or_else(|| Error::Overflow(format!("layout {self:?}")))
    }

    /// True for row-major contiguous layouts (offset may be non-zero).
    pub fn is_contiguous(&self) -> bool {
        let mut expect = 1;
        for i in (0..self.rank).rev() {
            if self.dims[i] != 1 && self.strides[i] != expect {
                return false;
            }
            expect *= self.dims[i];
        }
        true
    }

    /// True when no two distinct indices map to the same element: sorting dims by
    /// stride, each stride must clear the whole extent of the smaller ones.
    pub fn is_non_overlapping(&self) -> bool {
        if self.numel() == 0 {
            return true; // no elements (a zero dim can leave the other strides at 0)
        }
        let mut idx: Vec<usize> = (0..self.rank).filter(|&i| self.dims[i] > 1).collect();
        idx.sort_by_key(|&i| self.strides[i]);
        let mut extent = 1usize;
        for i in idx {
            if self.strides[i] < extent {
                return false;
            }
            extent += self.strides[i] * (self.dims[i] - 1);
        }
        true
    }

    /// The layout with dims `a` and `b` swapped (a transpose, no data moved).
    pub fn transposed(&self, a: usize, b: usize) -> Result<Self> {
        if a >= self.rank || b >= self.rank {
            return Err(Error::invalid(
                "transpose",
                format!("dims {a},{b} of rank {}", self.rank),
            ));
        }
        let mut l = *self;
        l.dims.swap(a, b);
        l.strides.swap(a, b);
        Ok(l)
    }

    /// The sub-layout at index `i` of dim 0 (rank drops by one).
    pub fn index0(&self, i: usize) -> Result<Self> {
        if self.rank == 0 || i >= self.dims[0] {
            return Err(Error::invalid(
                "index",
                format!("index {i} into {:?}", self.dims()),
            ));
        }
        let mut l = Layout {
            rank: self.rank - 1,
            dims: [1; MAX_RANK],
            strides: [0; MAX_RANK],
            offset: self.offset + i * self.strides[0],
        };
        l.dims[..l.rank].copy_from_slice(&self.dims[1..self.rank]);
        l.strides[..l.rank].copy_from_slice(&self.strides[1..self.rank]);
        Ok(l)
    }

    /// Buffer index of a full multi-index (debug-checked only; callers index validated views).
    #[inline]
    pub fn index_of(&self, idx: &[usize]) -> usize {
        debug_assert_eq!(idx.len(), self.rank);
        self.offset
            + idx
                .iter()
                .zip(self.strides())
                .map(|(i, s)| i * s)
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_and_transpose() {
        let l = Layout::contiguous(&[3, 5]).unwrap();
        assert_eq!(l.strides(), &[5, 1]);
        assert!(l.is_contiguous());
        let t = l.transposed(0, 1).unwrap();
        assert_eq!(t.dims(), &[5, 3]);
        assert!(!t.is_contiguous());
        assert!(t.is_non_overlapping());
        assert_eq!(t.span().unwrap(), 15);
    }

    #[test]
    fn overlap_detected() {
        let l = Layout::strided(&[4, 4], &[2, 1], 0).unwrap();
        assert!(!l.is_non_overlapping());
        let bcast = Layout::strided(&[4, 3], &[0, 1], 0).unwrap();
        assert!(!bcast.is_non_overlapping());
        let padded = Layout::strided(&[4, 3], &[7, 1], 2).unwrap();
        assert!(padded.is_non_overlapping());
    }

    #[test]
    fn overflow_is_error() {
        assert!(Layout::contiguous(&[usize::MAX, 3]).is_err());
        assert!(Layout::strided(&[3, 3], &[usize::MAX / 2, 1], 0).is_err());
        assert!(Layout::strided(&[3], &[1, 1], 0).is_err());
    }
}
