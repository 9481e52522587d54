//! 64-byte aligned owned storage.
//!
//! 64 bytes is one cache line and one AVX-512 register: aligned buffers never split a
//! vector load across lines and never share a line between two threads' outputs.

use crate::{Element, Error, Result};
use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every owned buffer, in bytes.
pub const ALIGN: usize = 64;

/// A fixed-length, zero-initialised, 64-byte aligned buffer of `T`.
pub struct AlignedVec<T: Element> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: AlignedVec owns its allocation exclusively, like Vec<T>; T: Send + Sync.
unsafe impl<T: Element> Send for AlignedVec<T> {}
// SAFETY: shared access only hands out &[T]; T: Sync.
unsafe impl<T: Element> Sync for AlignedVec<T> {}

impl<T: Element> AlignedVec<T> {
    fn layout(len: usize) -> Result<Layout> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize - ALIGN)
            .ok_or_else(|| Error::Overflow(format!("{len} elements of {}", T::DTYPE)))?;
        Layout::from_size_align(bytes.max(ALIGN), ALIGN).map_err(|e| Error::Overflow(e.to_string()))
    }

    /// A zeroed buffer of `len` elements (every `Element` is valid as all-zero bits).
    pub fn zeroed(len: usize) -> Result<Self> {
        let layout = Self::layout(len)?;
        // SAFETY: layout has non-zero size (at least ALIGN bytes).
        let raw = unsafe { alloc::alloc_zeroed(layout) } as *mut T;
        let ptr = NonNull::new(raw).ok_or_else(|| {
            Error::Overflow(format!("allocation of {} bytes failed", layout.size()))
        })?;
        Ok(Self { ptr, len })
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[T]) -> Result<Self> {
        let mut v = Self::zeroed(data.len())?;
        v.copy_from_slice(data);
        Ok(v)
    }

    /// A buffer of `len` elements all equal to `value`.
    pub fn filled(len: usize, value: T) -> Result<Self> {
        let mut v = Self::zeroed(len)?;
        v.fill(value);
        Ok(v)
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Element> Drop for AlignedVec<T> {
    fn drop(&mut self) {
        let layout = Self::layout(self.len).expect("layout was valid at allocation");
        // SAFETY: ptr was allocated with exactly this layout in `zeroed`.
        unsafe { alloc::dealloc(self.ptr.as_ptr() as *mut u8, layout) };
    }
}

impl<T: Element> Deref for AlignedVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: ptr is valid for len initialised elements for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Element> DerefMut for AlignedVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in Deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Element> Clone for AlignedVec<T> {
    fn clone(&self) -> Self {
        Self::from_slice(self).expect("same size allocated before")
    }
}

impl<T: Element> std::fmt::Debug for AlignedVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedVec<{}>[{}]", T::DTYPE, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0usize, 1, 7, 33, 1000] {
            let v = AlignedVec::<f32>::zeroed(len).unwrap();
            assert_eq!(v.as_ptr() as usize % ALIGN, 0);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&x| x == 0.0));
        }
    }

    #[test]
    fn absurd_size_is_an_error() {
        assert!(matches!(
            AlignedVec::<f32>::zeroed(usize::MAX / 2),
            Err(Error::Overflow(_))
        ));
    }
}
