//! A small spinning thread pool for per-op parallelism.
//!
//! Decode runs ~300 small ops per token, so handing work to threads must cost about a
//! microsecond, not the tens of microseconds of a futex wake-up. Workers therefore spin
//! on an epoch counter for a while after each job (about 100 µs) before parking, as
//! ggml's threads do; the calling thread always takes tasks itself. Tasks are claimed
//! from an atomic counter, so uneven tasks balance themselves.
//!
//! One job runs at a time (callers from several threads queue on a mutex); a job started
//! from inside a task runs inline on that thread instead of deadlocking.

use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;

/// Spins before a worker parks: ~100 µs of `spin_loop` hints on a ~4 GHz core.
const SPIN_ROUNDS: u32 = 1 << 15;

thread_local! {
    static IN_POOL_TASK: Cell<bool> = const { Cell::new(false) };
}

type TaskFn<'a> = &'a (dyn Fn(usize) + Sync);

struct Job {
    /// Erased `TaskFn` of the current job; valid until every worker has acknowledged.
    task: *const (dyn Fn(usize) + Sync + 'static),
    n_tasks: usize,
    /// Workers with index below this take tasks; the others only acknowledge.
    participants: usize,
}

struct Shared {
    epoch: AtomicU64,
    job: UnsafeCell<Job>,
    next_task: AtomicUsize,
    acks: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the caller holding `run_lock` while no worker reads it
// (all workers acknowledged the previous epoch); workers read it only after observing the
// new epoch with Acquire ordering, which happens-after the write.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer inside is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// A fixed set of worker threads plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadPool({} threads)", self.threads())
    }
}

impl ThreadPool {
    /// A pool that runs jobs on `threads` threads in all (the caller plus `threads - 1`).
    pub fn new(threads: usize) -> Self {
        let noop: &'static (dyn Fn(usize) + Sync) = &|_: usize| {};
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                task: noop,
                n_tasks: 0,
                participants: 0,
            }),
            next_task: AtomicUsize::new(0),
            acks: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(threads.max(1) - 1);
        for i in 0..threads.max(1) - 1 {
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("tessera-{i}"))
                .spawn(move || worker_loop(&s, i));
            match spawned {
                Ok(w) => workers.push(w),
                // The system refused another thread: run with those it gave, and say so.
                Err(e) => {
                    eprintln!(
                        "tessera: could not start pool thread {} of {threads} ({e}); using {}",
                        i + 2,
                        i + 1
                    );
                    break;
                }
            }
        }
        Self {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    /// Runs `f(first, chunk)` over `items` split into chunks of `chunk` items (the last
    /// may be shorter; `first` is the chunk's index in `items`), on at most
    /// `max_threads` threads: [`ThreadPool::run`] for work that writes a slice in place.
    pub fn for_each_chunk_mut<T: Send>(
        &self,
        items: &mut [T],
        chunk: usize,
        max_threads: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let chunk = chunk.max(1);
        // One uncontended lock per chunk hands each task its own `&mut`.
        let chunks: Vec<std::sync::Mutex<&mut [T]>> =
            items.chunks_mut(chunk).map(std::sync::Mutex::new).collect();
        self.run(chunks.len(), max_threads, |t| {
            let mut c = chunks[t].lock().unwrap_or_else(|e| e.into_inner());
            f(t * chunk, &mut c)
        });
    }

    /// Threads a job can use, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `task(i)` for every `i < n_tasks` on at most `max_threads` threads and returns
    /// when all are done. A panic in a task is re-raised here.
    pub fn run(&self, n_tasks: usize, max_threads: usize, task: impl Fn(usize) + Sync) {
        let helpers = max_threads
            .min(self.threads())
            .min(n_tasks)
            .saturating_sub(1);
        if helpers == 0 || IN_POOL_TASK.with(|f| f.get()) {
            (0..n_tasks).for_each(task);
            return;
        }
        let _guard = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let task_ref: TaskFn<'_> = &task;
        // SAFETY: we erase the lifetime of `task_ref`; it is only dereferenced by workers
        // before they acknowledge this epoch, and we do not return before every worker
        // has acknowledged (the wait loop below), so the borrow outlives every use.
        let erased: *const (dyn Fn(usize) + Sync + 'static) =
            unsafe { std::mem::transmute::<TaskFn<'_>, TaskFn<'static>>(task_ref) };
        // SAFETY: no worker reads `job` now: each acknowledged the previous epoch and waits
        // for the next one; we hold `run_lock`, so no other caller writes it.
        unsafe {
            *s.job.get() = Job {
                task: erased,
                n_tasks,
                participants: helpers,
            };
        }
        s.next_task.store(0, Relaxed);
        s.acks.store(0, Relaxed);
        s.epoch.fetch_add(1, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _l = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        IN_POOL_TASK.with(|f| f.set(true));
        let mine = catch_unwind(AssertUnwindSafe(|| take_tasks(s, task_ref, n_tasks)));
        IN_POOL_TASK.with(|f| f.set(false));
        while s.acks.load(Acquire) < self.workers.len() {
            std::hint::spin_loop();
        }
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Relaxed) {
            panic!("a task panicked on a pool thread");
        }
    }
}

fn take_tasks(s: &Shared, task: TaskFn<'_>, n_tasks: usize) {
    loop {
        let i = s.next_task.fetch_add(1, Relaxed);
        if i >= n_tasks {
            break;
        }
        task(i);
    }
}

fn worker_loop(s: &Shared, index: usize) {
    IN_POOL_TASK.with(|f| f.set(true));
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        while s.epoch.load(Acquire) == seen {
            if s.shutdown.load(Relaxed) {
                return;
            }
            if spins < SPIN_ROUNDS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let guard = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, SeqCst);
            let guard = if s.epoch.load(SeqCst) == seen && !s.shutdown.load(SeqCst) {
                s.wake.wait(guard).unwrap_or_else(|e| e.into_inner())
            } else {
                guard
            };
            s.sleepers.fetch_sub(1, SeqCst);
            drop(guard);
        }
        seen = s.epoch.load(Acquire);
        if s.shutdown.load(Relaxed) {
            return;
        }
        // SAFETY: the caller wrote `job` before bumping the epoch we just observed
        // (Acquire), and will not rewrite it before we acknowledge below.
        let (task, n_tasks, participants) = unsafe {
            let j = &*s.job.get();
            (&*j.task, j.n_tasks, j.participants)
        };
        if index < participants
            && catch_unwind(AssertUnwindSafe(|| take_tasks(s, task, n_tasks))).is_err()
        {
            s.panicked.store(true, Relaxed);
        }
        s.acks.fetch_add(1, Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _l = self
                .shared
                .sleep_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Most threads `TESSERA_THREADS` may ask for (beyond any real machine's cores; a larger
/// value is a typo, and the system would refuse the threads anyway).
pub const MAX_THREADS: usize = 1024;

/// The process-wide pool: `TESSERA_THREADS` threads, or one per available core. A value
/// that is not a count in 1..=[`MAX_THREADS`] is reported on stderr and replaced by one
/// thread per core.
pub fn global() -> &'static ThreadPool {
    static POOL: OnceLock<ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let var = std::env::var("TESSERA_THREADS").ok();
        let (n, warning) = threads_from(var.as_deref(), cores);
        if let Some(w) = warning {
            eprintln!("tessera: {w}");
        }
        ThreadPool::new(n)
    })
}

/// The pool size for a `TESSERA_THREADS` value on a machine of `cores`, and the warning
/// to print when the value is not a count in 1..=[`MAX_THREADS`] (then one per core).
fn threads_from(var: Option<&str>, cores: usize) -> (usize, Option<String>) {
    let Some(s) = var else {
        return (cores, None);
    };
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => (n, None),
        _ => (
            cores,
            Some(format!(
                "TESSERA_THREADS='{s}' is not a thread count in 1..={MAX_THREADS}; using {cores} (one per core)"
            )),
        ),
    }
}

/// A raw pointer that tasks on several threads may share; each task must write a
/// disjoint part of what it points to (the reason every use carries a SAFETY note).
#[derive(Clone, Copy, Debug)]
pub struct SharedMut<T>(pub *mut T);
// SAFETY: SharedMut is only a carrier; users guarantee disjoint access per task.
unsafe impl<T> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// The pointer (a method, so closures capture the Sync wrapper, not the raw field).
    pub fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn bad_thread_counts_are_reported_not_ignored() {
        assert_eq!(threads_from(None, 4), (4, None));
        assert_eq!(threads_from(Some("3"), 4), (3, None));
        for bad in ["0", "abc", "100000", "-1", ""] {
            let (n, w) = threads_from(Some(bad), 4);
            assert_eq!(n, 4, "{bad}");
            assert!(
                w.is_some_and(|w| w.contains(bad) && w.contains("one per core")),
                "{bad}"
            );
        }
    }

    use super::*;

    #[test]
    fn every_task_runs_once() {
        let pool = ThreadPool::new(3);
        for n in [0usize, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, 8, |i| {
                hits[i].fetch_add(1, Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
        }
    }

    #[test]
    fn chunks_cover_every_item_once_with_their_index() {
        let pool = ThreadPool::new(3);
        for (n, chunk) in [(0usize, 4usize), (1, 4), (7, 3), (100, 7), (5, 0)] {
            let mut items = vec![usize::MAX; n];
            pool.for_each_chunk_mut(&mut items, chunk, 3, |first, c| {
                assert!(c.len() <= chunk.max(1));
                for (j, v) in c.iter_mut().enumerate() {
                    assert_eq!(*v, usize::MAX, "written twice");
                    *v = first + j;
                }
            });
            assert_eq!(items, (0..n).collect::<Vec<_>>());
        }
    }

    #[test]
    fn nested_runs_inline_and_sleepers_wake() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        pool.run(4, 2, |_| {
            pool.run(3, 2, |_| {
                total.fetch_add(1, Relaxed);
            })
        });
        assert_eq!(total.load(Relaxed), 12);
        std::thread::sleep(std::time::Duration::from_millis(20)); // workers park
        pool.run(5, 2, |_| {
            total.fetch_add(1, Relaxed);
        });
        assert_eq!(total.load(Relaxed), 17);
    }

    #[test]
    fn panic_is_reraised_not_hung() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(64, 2, |i| assert!(i != 40))));
        assert!(r.is_err());
        let ok = AtomicUsize::new(0);
        pool.run(4, 2, |_| {
            ok.fetch_add(1, Relaxed);
        });
        assert_eq!(ok.load(Relaxed), 4);
    }
}
