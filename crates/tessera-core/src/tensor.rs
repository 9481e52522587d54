//! Owned tensors and borrowed views.
//!
//! A view is validated when built: its layout's span fits its slice (and, for mutable
//! views, no two indices alias). Kernels therefore receive views whose every in-range
//! index is a valid buffer index, and may use raw pointers inside without re-checking.

use crate::{AlignedVec, Element, Error, Layout, Result};

/// An owned, contiguous, 64-byte aligned tensor.
#[derive(Clone, Debug)]
pub struct Tensor<T: Element> {
    data: AlignedVec<T>,
    layout: Layout,
}

impl<T: Element> Tensor<T> {
    /// A contiguous tensor of zeros (an error for sizes that overflow).
    pub fn zeros(dims: &[usize]) -> Result<Self> {
        let layout = Layout::contiguous(dims)?;
        Ok(Self {
            data: AlignedVec::zeroed(layout.numel())?,
            layout,
        })
    }

    /// A tensor of `dims` holding `data` in row-major order.
    pub fn from_vec(dims: &[usize], data: &[T]) -> Result<Self> {
        let layout = Layout::contiguous(dims)?;
        if layout.numel() != data.len() {
            return Err(Error::shape(
                "tensor",
                format!(
                    "dims {dims:?} need {} elements, got {}",
                    layout.numel(),
                    data.len()
                ),
            ));
        }
        Ok(Self {
            data: AlignedVec::from_slice(data)?,
            layout,
        })
    }

    /// Extent of each dimension.
    pub fn dims(&self) -> &[usize] {
        self.layout.dims()
    }
    /// The underlying buffer.
    pub fn data(&self) -> &[T] {
        &self.data
    }
    /// The underlying buffer, writable.
    pub fn data_mut(&mut self) -> &mut [T] {
        &mut self.data
    }
    /// A read-only view of the whole tensor.
    pub fn view(&self) -> TensorView<'_, T> {
        TensorView {
            data: &self.data,
            layout: self.layout,
        }
    }
    /// A writable view of the whole tensor.
    pub fn view_mut(&mut self) -> TensorViewMut<'_, T> {
        TensorViewMut {
            data: &mut self.data,
            layout: self.layout,
        }
    }
}

/// A borrowed, possibly strided, read-only view.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a, T> {
    data: &'a [T],
    layout: Layout,
}

impl<'a, T: Element> TensorView<'a, T> {
    /// A view of `data` with `layout`; errors when the layout reaches past the slice.
    pub fn new(data: &'a [T], layout: Layout) -> Result<Self> {
        let needed = layout.span()?;
        if needed > data.len() {
            return Err(Error::OutOfBounds {
                needed,
                len: data.len(),
            });
        }
        Ok(Self { data, layout })
    }

    /// A row-major contiguous view of `data` with `dims` (lengths must match exactly).
    pub fn contiguous(data: &'a [T], dims: &[usize]) -> Result<Self> {
        let layout = Layout::contiguous(dims)?;
        if layout.numel() != data.len() {
            return Err(Error::shape(
                "view",
                format!(
                    "dims {dims:?} need {} elements, got {}",
                    layout.numel(),
                    data.len()
                ),
            ));
        }
        Self::new(data, layout)
    }

    /// Dims, strides and offset.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// Extent of each dimension.
    pub fn dims(&self) -> &[usize] {
        self.layout.dims()
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }
    /// The whole underlying slice (index it with `layout().index_of`).
    pub fn data(&self) -> &'a [T] {
        self.data
    }
    /// The contiguous elements, when the view is contiguous.
    pub fn as_contiguous(&self) -> Option<&'a [T]> {
        self.layout
            .is_contiguous()
            .then(|| &self.data[self.layout.offset()..self.layout.offset() + self.layout.numel()])
    }
    /// Swap two dims (no copy).
    pub fn transposed(&self, a: usize, b: usize) -> Result<Self> {
        Ok(Self {
            data: self.data,
            layout: self.layout.transposed(a, b)?,
        })
    }
    /// The sub-view at index `i` of dim 0.
    pub fn index0(&self, i: usize) -> Result<Self> {
        Ok(Self {
            data: self.data,
            layout: self.layout.index0(i)?,
        })
    }
    /// Element at a full multi-index; `None` when out of range.
    pub fn get(&self, idx: &[usize]) -> Option<T> {
        (idx.len() == self.rank() && idx.iter().zip(self.dims()).all(|(i, d)| i < d))
            .then(|| self.data[self.layout.index_of(idx)])
    }
}

/// A borrowed, possibly strided, writable view whose indices never alias.
#[derive(Debug)]
pub struct TensorViewMut<'a, T> {
    data: &'a mut [T],
    layout: Layout,
}

impl<'a, T: Element> TensorViewMut<'a, T> {
    /// A writable view; errors when out of bounds or self-overlapping.
    pub fn new(data: &'a mut [T], layout: Layout) -> Result<Self> {
        TensorView::new(data, layout)?;
        if !layout.is_non_overlapping() {
            return Err(Error::Overlapping {
                dims: layout.dims().to_vec(),
                strides: layout.strides().to_vec(),
            });
        }
        Ok(Self { data, layout })
    }

    /// A row-major contiguous writable view of `data` with `dims`.
    pub fn contiguous(data: &'a mut [T], dims: &[usize]) -> Result<Self> {
        TensorView::contiguous(data, dims)?;
        let layout = Layout::contiguous(dims)?;
        Ok(Self { data, layout })
    }

    /// Dims, strides and offset.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// Extent of each dimension.
    pub fn dims(&self) -> &[usize] {
        self.layout.dims()
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }
    /// A read-only view of the same elements.
    pub fn as_view(&self) -> TensorView<'_, T> {
        TensorView {
            data: self.data,
            layout: self.layout,
        }
    }
    /// The underlying slice (index with `layout().index_of`).
    pub fn data_mut(&mut self) -> &mut [T] {
        self.data
    }
    /// The contiguous elements, when the view is contiguous.
    pub fn as_contiguous_mut(&mut self) -> Option<&mut [T]> {
        if self.layout.is_contiguous() {
            let o = self.layout.offset();
            let n = self.layout.numel();
            Some(&mut self.data[o..o + n])
        } else {
            None
        }
    }
    /// Re-borrow with a shorter lifetime.
    pub fn reborrow(&mut self) -> TensorViewMut<'_, T> {
        TensorViewMut {
            data: self.data,
            layout: self.layout,
        }
    }
    /// Swap two dims (no copy).
    pub fn transposed(self, a: usize, b: usize) -> Result<Self> {
        let layout = self.layout.transposed(a, b)?;
        Ok(Self {
            data: self.data,
            layout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_bounds_checked() {
        let buf = vec![1.0f32; 10];
        assert!(TensorView::contiguous(&buf, &[2, 5]).is_ok());
        assert!(TensorView::contiguous(&buf, &[3, 5]).is_err());
        let l = Layout::strided(&[3, 3], &[4, 1], 0).unwrap(); // span 11
        assert!(TensorView::new(&buf, l).is_err());
        let l = Layout::strided(&[3, 3], &[4, 1], 0).unwrap();
        assert!(TensorView::new(&buf[..], Layout::strided(&[2, 3], &[4, 1], 1).unwrap()).is_ok());
        assert!(matches!(
            TensorView::new(&buf, l),
            Err(Error::OutOfBounds { .. })
        ));
    }

    #[test]
    fn mutable_views_reject_aliasing() {
        let mut buf = vec![0.0f32; 16];
        let l = Layout::strided(&[4, 4], &[0, 1], 0).unwrap();
        assert!(matches!(
            TensorViewMut::new(&mut buf, l),
            Err(Error::Overlapping { .. })
        ));
    }

    #[test]
    fn transposed_get() {
        let t = Tensor::from_vec(&[2, 3], &[0.0f32, 1., 2., 3., 4., 5.]).unwrap();
        let v = t.view().transposed(0, 1).unwrap();
        assert_eq!(v.dims(), &[3, 2]);
        assert_eq!(v.get(&[2, 1]), Some(5.0));
        assert_eq!(v.get(&[3, 0]), None);
    }
}
