//! Per-thread buffers reused across kernel calls.
//!
//! Decode calls each kernel hundreds of times per token, and a buffer allocated per call
//! (or per pool task) costs an allocation, its zeroing and its page faults every time.
//! Kernels therefore keep their scratch in a thread-local `RefCell` and borrow it per
//! call. The borrow can fail where a call re-enters on the same thread (a kernel run
//! from inside another's task), and a caller may not want an oversized request kept
//! for good: both get a fresh value for that call instead.

use std::cell::RefCell;
use std::thread::LocalKey;

/// Runs `f` on this thread's value in `key`, or on a fresh `T::default()` where that
/// value is already borrowed or `keep` is false (then nothing is kept).
pub(crate) fn with_reused<T: Default + 'static, R>(
    key: &'static LocalKey<RefCell<T>>,
    keep: bool,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    if !keep {
        // Not borrowed at all, so a call nested inside this one still finds the value.
        return f(&mut T::default());
    }
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut kept) => f(&mut kept),
        Err(_) => f(&mut T::default()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static KEPT: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    }

    /// A kept value survives between calls; a re-entrant call and a `keep = false`
    /// call each get a fresh one and leave the kept value as it was, and a call inside a
    /// `keep = false` one still finds the kept value.
    #[test]
    fn kept_values_persist_and_reentry_gets_a_fresh_one() {
        with_reused(&KEPT, true, |v| v.push(1));
        with_reused(&KEPT, true, |v| {
            assert_eq!(v, &[1]);
            v.push(2);
            with_reused(&KEPT, true, |inner| {
                assert!(inner.is_empty(), "borrowed: a fresh value");
                inner.push(9);
            });
        });
        with_reused(&KEPT, false, |v| {
            assert!(v.is_empty());
            v.push(7);
            with_reused(&KEPT, true, |inner| {
                assert_eq!(inner, &[1, 2], "not borrowed")
            });
        });
        with_reused(&KEPT, true, |v| assert_eq!(v, &[1, 2]));
    }
}
