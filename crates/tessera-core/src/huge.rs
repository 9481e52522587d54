//! Long-lived read-mostly buffers (packed model weights) placed together in large chunks
//! that the OS is asked to back with 2 MiB pages.
//!
//! Decode streams every weight once per token: SmolLM2's 106 MB are ~26,000 pages of
//! 4 KiB, each a TLB miss and a page walk (two-dimensional, so up to 24 memory reads,
//! inside a virtual machine). Backed by 2 MiB pages the same bytes are 53 pages. The
//! weights are hundreds of matrices of 60 KB–1 MB, too small for a page of their own, so
//! buffers are bump-allocated one after another from shared 32 MiB chunks, 2 MiB
//! aligned, advised with `MADV_HUGEPAGE` before anything touches them (Linux's default
//! `madvise` mode gives large pages only to memory that asks). On a host measured for
//! this (docs/performance.md) the default model decoded ~10–20% faster.
//!
//! A chunk is freed when its last buffer is dropped; space of a dropped buffer is not
//! reused before that, which suits weights (they live as long as their model). Where the
//! OS gives no large pages, the buffers are ordinary memory.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// The large page size asked for (x86-64 and aarch64 with 4 KiB base pages).
pub const LARGE_PAGE: usize = 2 << 20;

/// Bytes of a shared chunk: one is mapped when the current one cannot hold a buffer
/// (a buffer larger than this gets a chunk of its own size).
pub const CHUNK_BYTES: usize = 32 << 20;

/// Alignment of every buffer (a cache line, an AVX-512 register).
pub const ALIGN: usize = 64;

/// One allocation that buffers are carved from.
struct Chunk {
    base: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the chunk is plain memory; who may touch which bytes is decided by the
// buffers carved from it (each owns its range exclusively).
unsafe impl Send for Chunk {}
// SAFETY: as above; the chunk itself is never read or written through &Chunk.
unsafe impl Sync for Chunk {}

impl Chunk {
    fn new(bytes: usize) -> Self {
        let layout = Layout::from_size_align(bytes, LARGE_PAGE).expect("chunk size fits isize");
        // SAFETY: the layout's size is non-zero (at least one large page).
        let base = NonNull::new(unsafe { alloc::alloc(layout) })
            .unwrap_or_else(|| alloc::handle_alloc_error(layout));
        advise_large_pages(base.as_ptr(), bytes);
        Chunk { base, layout }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: base was allocated in `new` with exactly this layout.
        unsafe { alloc::dealloc(self.base.as_ptr(), self.layout) }
    }
}

/// Asks the kernel for 2 MiB pages under `[at, at + bytes)` (`at` is large-page
/// aligned). Best effort: where THP is off or unsupported the memory stays as it is.
#[cfg(target_os = "linux")]
fn advise_large_pages(at: *mut u8, bytes: usize) {
    // SAFETY: madvise only changes how the kernel backs this range, which this process
    // owns (just allocated, page aligned); an error leaves it unchanged.
    unsafe { libc::madvise(at.cast(), bytes, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_large_pages(_at: *mut u8, _bytes: usize) {}

/// Asks for 2 MiB pages under the whole large pages inside `data` (best effort, as for
/// the chunks): for a large buffer allocated elsewhere whose pages nothing has touched
/// yet (a zeroed KV cache pool), so that they are faulted in as large pages.
pub fn advise<T>(data: &[T]) {
    let start = data.as_ptr() as usize;
    let end = start + std::mem::size_of_val(data);
    let (first, last) = (
        start.next_multiple_of(LARGE_PAGE),
        end / LARGE_PAGE * LARGE_PAGE,
    );
    if first < last {
        advise_large_pages(first as *mut u8, last - first);
    }
}

/// The chunk new buffers are carved from, and how many bytes of it are taken.
static CURRENT: Mutex<Option<(Arc<Chunk>, usize)>> = Mutex::new(None);

/// `bytes` (a multiple of [`ALIGN`], non-zero) from the current chunk, or a new one.
fn carve(bytes: usize) -> (Arc<Chunk>, NonNull<u8>) {
    let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((chunk, used)) = current.as_mut() {
        if chunk.layout.size() - *used >= bytes {
            // SAFETY: used + bytes ≤ the chunk's size, so the offset stays inside it.
            let at = unsafe { chunk.base.add(*used) };
            *used += bytes;
            return (chunk.clone(), at);
        }
    }
    let chunk = Arc::new(Chunk::new(
        bytes.max(CHUNK_BYTES).next_multiple_of(LARGE_PAGE),
    ));
    let at = chunk.base;
    let left = chunk.layout.size() - bytes;
    let current_left = current
        .as_ref()
        .map_or(0, |(c, used)| c.layout.size() - used);
    if left > current_left {
        *current = Some((chunk.clone(), bytes));
    }
    (chunk, at)
}

/// A fixed-length buffer of `T` in a shared large-page chunk (see the module docs):
/// owned and mutable like a boxed slice, 64-byte aligned.
pub struct HugeBuf<T: Copy + Send + Sync + 'static> {
    /// Keeps the memory alive (only ever dropped); `None` for an empty buffer.
    #[allow(dead_code)]
    chunk: Option<Arc<Chunk>>,
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: the buffer owns its range of the chunk exclusively, like Box<[T]>; T: Send.
unsafe impl<T: Copy + Send + Sync + 'static> Send for HugeBuf<T> {}
// SAFETY: shared access only hands out &[T]; T: Sync.
unsafe impl<T: Copy + Send + Sync + 'static> Sync for HugeBuf<T> {}

impl<T: Copy + Send + Sync + 'static> HugeBuf<T> {
    /// `len` copies of `value`.
    pub fn filled(len: usize, value: T) -> Self {
        const { assert!(std::mem::align_of::<T>() <= ALIGN) };
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize / 2)
            .unwrap_or_else(|| panic!("HugeBuf of {len} elements overflows"));
        if bytes == 0 {
            return HugeBuf {
                chunk: None,
                ptr: NonNull::dangling(),
                len,
            };
        }
        let (chunk, at) = carve(bytes.next_multiple_of(ALIGN));
        let ptr = at.cast::<T>();
        for i in 0..len {
            // SAFETY: [ptr, ptr + len) lies in the carved range, which no other buffer
            // holds, and is aligned for T (ALIGN ≥ align_of::<T>()).
            unsafe { ptr.add(i).write(value) };
        }
        HugeBuf {
            chunk: Some(chunk),
            ptr,
            len,
        }
    }

    /// A copy of `data`.
    pub fn from_slice(data: &[T]) -> Self {
        match data.first() {
            None => Self::default(),
            Some(&first) => {
                let mut buf = Self::filled(data.len(), first);
                buf.copy_from_slice(data);
                buf
            }
        }
    }
}

impl<T: Copy + Send + Sync + 'static> Default for HugeBuf<T> {
    fn default() -> Self {
        HugeBuf {
            chunk: None,
            ptr: NonNull::dangling(),
            len: 0,
        }
    }
}

impl<T: Copy + Send + Sync + 'static> From<Vec<T>> for HugeBuf<T> {
    fn from(v: Vec<T>) -> Self {
        Self::from_slice(&v)
    }
}

impl<T: Copy + Send + Sync + 'static> FromIterator<T> for HugeBuf<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Self::from_slice(&iter.into_iter().collect::<Vec<T>>())
    }
}

impl<T: Copy + Send + Sync + 'static> Deref for HugeBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: ptr is valid for len initialised elements while self (and so its
        // chunk) lives, or dangling with len 0.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy + Send + Sync + 'static> DerefMut for HugeBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in Deref; &mut self is exclusive, and no other buffer overlaps.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy + Send + Sync + 'static> Clone for HugeBuf<T> {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl<T: Copy + Send + Sync + 'static> std::fmt::Debug for HugeBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HugeBuf[{}]", self.len)
    }
}

impl<T: Copy + Send + Sync + 'static + PartialEq> PartialEq for HugeBuf<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_hold_their_values_aligned_and_apart() {
        // Enough small and odd-sized buffers to spill over at least one chunk.
        let mut bufs: Vec<HugeBuf<u32>> = Vec::new();
        let mut total = 0;
        let mut i = 0u32;
        while total <= CHUNK_BYTES + LARGE_PAGE {
            let len = 1 + (i as usize * 7919) % 300_000;
            bufs.push((0..len as u32).map(|x| x ^ i).collect());
            total += 4 * len;
            i += 1;
        }
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for (i, b) in bufs.iter().enumerate() {
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            assert!(b.iter().enumerate().all(|(x, &v)| v == x as u32 ^ i as u32));
            ranges.push((b.as_ptr() as usize, b.as_ptr() as usize + 4 * b.len()));
        }
        ranges.sort();
        assert!(
            ranges.windows(2).all(|w| w[0].1 <= w[1].0),
            "buffers overlap"
        );
    }

    #[test]
    fn a_buffer_larger_than_a_chunk_gets_its_own() {
        let len = CHUNK_BYTES + 12_345;
        let mut big = HugeBuf::filled(len, 7u8);
        big[len - 1] = 9;
        assert_eq!(big.len(), len);
        assert!(big[..len - 1].iter().all(|&x| x == 7) && big[len - 1] == 9);
        let chunk = big.chunk.as_ref().unwrap();
        assert!(chunk.layout.size() >= len && chunk.layout.size().is_multiple_of(LARGE_PAGE));
        assert_eq!(chunk.base.as_ptr() as usize % LARGE_PAGE, 0);
    }

    #[test]
    fn clones_are_independent_and_chunks_are_shared_until_dropped() {
        let a = HugeBuf::from_slice(&[1.5f32, -2.0, 3.25]);
        let mut b = a.clone();
        b[0] = 0.0;
        assert_eq!(&a[..], &[1.5, -2.0, 3.25]);
        assert_eq!(&b[..], &[0.0, -2.0, 3.25]);
        let chunk = Arc::clone(a.chunk.as_ref().unwrap());
        let held = Arc::strong_count(&chunk);
        drop(a);
        assert_eq!(Arc::strong_count(&chunk), held - 1);
    }

    #[test]
    fn empty_buffers_need_no_chunk() {
        let e = HugeBuf::<u16>::from_slice(&[]);
        assert!(e.is_empty() && e.chunk.is_none());
        assert!(HugeBuf::<i8>::default().is_empty());
        assert_eq!(HugeBuf::from(vec![3u8; 5]), HugeBuf::filled(5, 3u8));
    }
}
