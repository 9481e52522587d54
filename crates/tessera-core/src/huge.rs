//! Long-lived read-mostly buffers (packed model weights) placed together in large chunks
//! that the OS is asked to back with 2 MiB pages.
//!
//! Decode streams every weight once per token: SmolLM2's 96.5 MB are ~23,600 pages of
//! 4 KiB, each a TLB miss and a page walk (two-dimensional, so up to 24 memory reads,
//! inside a virtual machine). Backed by 2 MiB pages the same bytes are 47 pages. The
//! weights are hundreds of matrices of 60 KB–1 MB, too small for a page of their own, so
//! buffers are bump-allocated one after another from shared 32 MiB chunks, 2 MiB
//! aligned, advised with `MADV_HUGEPAGE` before anything touches them (Linux's default
//! `madvise` mode gives large pages only to memory that asks). On the host measured for
//! this (docs/performance.md, host H) a single stream decoded 6–14% faster in
//! `tessera bench-model`, 16 streams 1–6% (their step is bound by compute and attention).
//!
//! The chunks are opt-in ([`with_large_pages`]; off, a buffer is a plain `Vec`, allocated
//! and moved exactly as before this module): each large page is zeroed whole on first
//! touch, and in a virtual machine that backs never-touched guest memory lazily (host H)
//! loading the default model into fresh memory took 2.0 s instead of 0.22 (as fast once
//! the memory had been used), so a one-shot `tessera run` could end later. A server
//! pays that once and decodes faster for every request, so `tessera serve` and
//! `bench-serve` turn them on.
//!
//! Not for memory written piecemeal over time, like the KV cache pool: its blocks lie
//! across the pool, and each first write would zero a fresh 2 MiB page (measured: 16-
//! stream decode a third slower).
//!
//! A chunk is freed when its last buffer is dropped; space of a dropped buffer is not
//! reused before that, which suits weights (they live as long as their model). Where the
//! OS gives no large pages, the buffers are ordinary memory.

use std::alloc::{self, Layout};
use std::cell::Cell;
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

thread_local! {
    /// Whether buffers this thread makes go to large-page chunks ([`with_large_pages`]).
    static LARGE_PAGES: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the buffers this thread makes meanwhile in large-page chunks (`on`) or
/// plain heap memory, then restores the thread's previous choice (also when `f`
/// panics). Scoped and per thread, so two models loaded at once, each with its own
/// choice (the engine's `LoadOptions::large_pages`), each get theirs; buffers keep
/// their memory after the call.
pub fn with_large_pages<R>(on: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            LARGE_PAGES.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(LARGE_PAGES.with(|c| c.replace(on)));
    f()
}

/// Whether buffers this thread makes now go to large-page chunks.
pub fn large_pages() -> bool {
    LARGE_PAGES.with(Cell::get)
}

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
        // glibc serves a request this large (past its 32 MiB mmap threshold cap, with
        // the alignment slack) from a fresh mapping: nothing in it is touched yet, so
        // the advice below decides how its pages are faulted in.
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

/// A fixed-length buffer of `T`, owned and mutable like a boxed slice: in a shared
/// large-page chunk (64-byte aligned) while [`large_pages`] is on, else a `Vec`.
pub struct HugeBuf<T: Copy + Send + Sync + 'static> {
    store: Store<T>,
}

enum Store<T> {
    Heap(Vec<T>),
    Chunk {
        /// Keeps the memory alive (only ever dropped).
        #[allow(dead_code)]
        chunk: Arc<Chunk>,
        ptr: NonNull<T>,
        len: usize,
    },
}

// SAFETY: the buffer owns its memory exclusively, like Box<[T]> (a chunk range no other
// buffer holds, or its Vec); T: Send.
unsafe impl<T: Copy + Send + Sync + 'static> Send for HugeBuf<T> {}
// SAFETY: shared access only hands out &[T]; T: Sync.
unsafe impl<T: Copy + Send + Sync + 'static> Sync for HugeBuf<T> {}

impl<T: Copy + Send + Sync + 'static> HugeBuf<T> {
    /// `len` copies of `value`.
    pub fn filled(len: usize, value: T) -> Self {
        match Self::carved(len) {
            None => Self::heap(vec![value; len]),
            Some((chunk, ptr)) => {
                for i in 0..len {
                    // SAFETY: [ptr, ptr + len) lies in the carved range, which no other
                    // buffer holds, and is aligned for T (ALIGN ≥ align_of::<T>()).
                    unsafe { ptr.add(i).write(value) };
                }
                HugeBuf {
                    store: Store::Chunk { chunk, ptr, len },
                }
            }
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

    /// Whether the buffer lies in a large-page chunk (made under
    /// [`with_large_pages`]`(true, …)` and not empty) rather than in a `Vec`.
    pub fn in_large_page_chunk(&self) -> bool {
        matches!(self.store, Store::Chunk { .. })
    }

    /// The slices one after another (moved in as one `Vec`, or copied into a chunk).
    pub fn concat(parts: &[&[T]]) -> Self {
        parts.concat().into()
    }

    fn heap(v: Vec<T>) -> Self {
        HugeBuf {
            store: Store::Heap(v),
        }
    }

    /// Room for `len` elements in a chunk, or None for the heap (large pages off, or
    /// nothing to hold).
    fn carved(len: usize) -> Option<(Arc<Chunk>, NonNull<T>)> {
        const { assert!(std::mem::align_of::<T>() <= ALIGN) };
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize / 2)
            .unwrap_or_else(|| panic!("HugeBuf of {len} elements overflows"));
        if bytes == 0 || !large_pages() {
            return None;
        }
        let (chunk, at) = carve(bytes.next_multiple_of(ALIGN));
        Some((chunk, at.cast::<T>()))
    }
}

impl<T: Copy + Send + Sync + 'static> Default for HugeBuf<T> {
    fn default() -> Self {
        Self::heap(Vec::new())
    }
}

impl<T: Copy + Send + Sync + 'static> From<Vec<T>> for HugeBuf<T> {
    /// Moves `v` in (large pages off) or copies it into a chunk. Never inlined, so the
    /// caller's Vec never has its address taken and a loop filling it beforehand keeps
    /// its pointer in a register (measured with the earlier per-code packing loop, host
    /// H: inlined, packing the default model took 0.2 s longer).
    #[inline(never)]
    fn from(v: Vec<T>) -> Self {
        if large_pages() {
            Self::from_slice(&v)
        } else {
            Self::heap(v)
        }
    }
}

impl<T: Copy + Send + Sync + 'static> FromIterator<T> for HugeBuf<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<T>>().into()
    }
}

impl<T: Copy + Send + Sync + 'static> Deref for HugeBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.store {
            Store::Heap(v) => v,
            // SAFETY: ptr is valid for len initialised elements while the chunk lives.
            Store::Chunk { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: Copy + Send + Sync + 'static> DerefMut for HugeBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.store {
            Store::Heap(v) => v,
            // SAFETY: as in Deref; &mut self is exclusive, and no other buffer overlaps.
            Store::Chunk { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: Copy + Send + Sync + 'static> Clone for HugeBuf<T> {
    fn clone(&self) -> Self {
        match &self.store {
            Store::Heap(v) => Self::heap(v.clone()),
            Store::Chunk { .. } => Self::from_slice(self),
        }
    }
}

impl<T: Copy + Send + Sync + 'static> std::fmt::Debug for HugeBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HugeBuf[{}]", self.len())
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

    fn chunk_of<T: Copy + Send + Sync + 'static>(b: &HugeBuf<T>) -> Option<&Arc<Chunk>> {
        match &b.store {
            Store::Chunk { chunk, .. } => Some(chunk),
            Store::Heap(_) => None,
        }
    }

    #[test]
    fn the_choice_is_per_thread_scoped_and_restored_after_a_panic() {
        let placed = || HugeBuf::filled(3, 1u8).in_large_page_chunk();
        assert!(!large_pages() && !placed(), "off unless asked for");
        with_large_pages(true, || {
            assert!(placed());
            // Another thread (another model's load) keeps its own choice meanwhile.
            let other = std::thread::spawn(move || (large_pages(), placed()));
            assert_eq!(other.join().unwrap(), (false, false));
            with_large_pages(false, || assert!(!placed()));
            assert!(placed(), "the inner scope restored the outer choice");
        });
        assert!(!placed());
        let panicked = std::panic::catch_unwind(|| with_large_pages(true, || panic!("mid-load")));
        assert!(panicked.is_err());
        assert!(
            !large_pages() && !placed(),
            "restored when the scope panicked"
        );
    }

    #[test]
    fn buffers_hold_their_values_aligned_and_apart() {
        with_large_pages(true, || {
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
                assert!(chunk_of(b).is_some());
                assert_eq!(b.as_ptr() as usize % ALIGN, 0);
                assert!(b.iter().enumerate().all(|(x, &v)| v == x as u32 ^ i as u32));
                ranges.push((b.as_ptr() as usize, b.as_ptr() as usize + 4 * b.len()));
            }
            ranges.sort();
            assert!(
                ranges.windows(2).all(|w| w[0].1 <= w[1].0),
                "buffers overlap"
            );
        });
    }

    #[test]
    fn a_buffer_larger_than_a_chunk_gets_its_own() {
        with_large_pages(true, || {
            let len = CHUNK_BYTES + 12_345;
            let mut big = HugeBuf::filled(len, 7u8);
            big[len - 1] = 9;
            assert_eq!(big.len(), len);
            assert!(big[..len - 1].iter().all(|&x| x == 7) && big[len - 1] == 9);
            let chunk = chunk_of(&big).unwrap();
            assert!(chunk.layout.size() >= len && chunk.layout.size().is_multiple_of(LARGE_PAGE));
            assert_eq!(chunk.base.as_ptr() as usize % LARGE_PAGE, 0);
        });
    }

    #[test]
    fn clones_are_independent_and_chunks_are_shared_until_dropped() {
        with_large_pages(true, || {
            let a = HugeBuf::from_slice(&[1.5f32, -2.0, 3.25]);
            let mut b = a.clone();
            b[0] = 0.0;
            assert_eq!(&a[..], &[1.5, -2.0, 3.25]);
            assert_eq!(&b[..], &[0.0, -2.0, 3.25]);
            let chunk = Arc::clone(chunk_of(&a).unwrap());
            let held = Arc::strong_count(&chunk);
            drop(a);
            assert_eq!(Arc::strong_count(&chunk), held - 1);
        });
    }

    #[test]
    fn without_large_pages_a_buffer_is_the_vec_it_was_made_from() {
        with_large_pages(false, || {
            let v = vec![1u16, 2, 3];
            let at = v.as_ptr();
            let a = HugeBuf::from(v);
            assert_eq!(a.as_ptr(), at, "moved, not copied");
            let mut b = a.clone();
            b[0] = 9;
            assert_eq!((&a[..], &b[..]), (&[1u16, 2, 3][..], &[9u16, 2, 3][..]));
            let c = HugeBuf::filled(1000, 5i8);
            assert!(chunk_of(&a).is_none() && chunk_of(&c).is_none());
            assert!(c.iter().all(|&x| x == 5));
        });
    }

    #[test]
    fn concat_joins_the_parts_in_order_in_both_modes() {
        for on in [true, false] {
            with_large_pages(on, || {
                let (a, b, c) = (vec![1i8, -2, 3], Vec::<i8>::new(), vec![4i8; 70]);
                let joined = HugeBuf::concat(&[&a, &b, &c]);
                assert_eq!(chunk_of(&joined).is_some(), on);
                assert_eq!(&joined[..], &[a.clone(), c.clone()].concat()[..]);
                assert!(HugeBuf::<u8>::concat(&[]).is_empty());
            });
        }
    }

    #[test]
    fn empty_buffers_need_no_chunk() {
        with_large_pages(true, || {
            let e = HugeBuf::<u16>::from_slice(&[]);
            assert!(e.is_empty() && chunk_of(&e).is_none());
            assert!(HugeBuf::<i8>::default().is_empty());
            assert_eq!(HugeBuf::from(vec![3u8; 5]), HugeBuf::filled(5, 3u8));
        });
    }
}
