//! A small spinning thread pool for per-op parallelism.
//!
//! Decode runs ~300 small ops per token, so handing work to threads must cost about a
//! microsecond, not the tens of microseconds of a futex wake-up. Workers therefore keep
//! watching an epoch counter for about 100 µs after each job before parking, as ggml's
//! threads do; the calling thread always takes tasks itself.
//!
//! Work is claimed, never assigned: one atomic word holds the job's task count and the
//! next task index, and whoever increments it first runs that task. A worker the OS has
//! descheduled (another process took its core) therefore delays nobody: the others,
//! the caller included, take its share, and the caller returns once every task is done
//! without waiting for late workers to show up. A late worker's claim fails (or, if a
//! new job has begun, takes a task of that job, which is just as valid). Waiting, both
//! for work and for the last tasks, spins briefly and then yields the core
//! (`sched_yield`) before parking, so a contended machine gets its cores back.
//!
//! One job runs at a time (callers from several threads queue on a mutex); a job started
//! from inside a task runs inline on that thread instead of deadlocking.

use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Busy-wait hints before a waiting thread starts yielding its core (a few µs).
const SPIN_ROUNDS: u32 = 1 << 10;

/// How long an idle worker keeps watching for the next job (spinning, then yielding)
/// before it parks on the condition variable.
const WATCH: Duration = Duration::from_micros(100);

/// Most tasks in one claim word (its low half counts claims, a few beyond the count).
const MAX_TASKS_PER_JOB: usize = 1 << 30;

thread_local! {
    static IN_POOL_TASK: Cell<bool> = const { Cell::new(false) };
}

type TaskFn<'a> = &'a (dyn Fn(usize) + Sync);

/// `T` alone in its cache lines. Two lines, not one: Intel's adjacent-line prefetcher
/// pulls lines in pairs, so neighbours 64 bytes apart still bounce together.
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The pool's shared state, laid out by who writes what: the caller writes the job
/// (idle workers keep reading its `epoch`); every thread writes `claim` and `done`. All
/// in one cache line, each of the caller's writes invalidated the spinning workers'
/// copy and fetched the line back before the next, and claims and completions bounced
/// it again. Host H (Intel, 2 cores in a VM), `examples/pool_dispatch.rs`, 4 alternated
/// rounds: a two-task job whose tasks each write a line 750–850 ns in one line, 470–510
/// laid out so; four tasks 820–900 against 670–720. (`tessera calibrate`'s no-op job,
/// which the caller mostly finishes alone, reads 0.40–0.45 µs either way.)
struct Shared {
    job: Padded<Job>,
    shutdown: AtomicBool,
    /// `n_tasks << 32 | next_index`: a claim is one `fetch_add(1)`; it succeeded when
    /// the index it returns is below the count it returns.
    claim: Padded<AtomicU64>,
    /// Tasks finished in the current job.
    done: Padded<AtomicUsize>,
    panicked: AtomicBool,
    sleepers: Padded<AtomicUsize>,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

/// A job as the caller publishes it: the fields, then `epoch`, in one line, so a
/// worker that sees the new epoch has the rest in the same transfer.
struct Job {
    /// Bumped once per job, after the fields below and `claim`.
    epoch: AtomicU64,
    /// Erased `TaskFn` of the current job. Written by the caller (holding `run_lock`)
    /// before it publishes `claim`; read only by a thread whose claim succeeded, and the
    /// caller does not return (or rewrite it) before every claimed task is done.
    task: UnsafeCell<*const (dyn Fn(usize) + Sync + 'static)>,
    /// Workers with index below this take tasks (a job's `max_threads`).
    participants: AtomicUsize,
}

// SAFETY: `task` is written only by the caller holding `run_lock` while no claim of the
// current job can succeed (all its tasks are done); it is read only after a successful
// claim (an AcqRel read-modify-write of the `claim` word the caller published with
// Release after writing it), and the caller waits for every claimed task to finish.
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
            shutdown: AtomicBool::new(false),
            job: Padded(Job {
                epoch: AtomicU64::new(0),
                task: UnsafeCell::new(noop),
                participants: AtomicUsize::new(0),
            }),
            claim: Padded(AtomicU64::new(0)),
            done: Padded(AtomicUsize::new(0)),
            panicked: AtomicBool::new(false),
            sleepers: Padded(AtomicUsize::new(0)),
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
        if n_tasks > MAX_TASKS_PER_JOB {
            // More tasks than one claim word counts: consecutive jobs of at most that many.
            for first in (0..n_tasks).step_by(MAX_TASKS_PER_JOB) {
                let n = MAX_TASKS_PER_JOB.min(n_tasks - first);
                self.run_job(n, max_threads, &|i| task(first + i));
            }
            return;
        }
        self.run_job(n_tasks, max_threads, &task)
    }

    /// [`ThreadPool::run`] for at most [`MAX_TASKS_PER_JOB`] tasks.
    fn run_job(&self, n_tasks: usize, max_threads: usize, task: TaskFn<'_>) {
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
        let task_ref: TaskFn<'_> = task;
        // SAFETY: we erase the lifetime of `task_ref`; it is dereferenced only by threads
        // whose claim on this job succeeded, and we do not return before every claimed
        // task is done (the wait on `done` below), so the borrow outlives every use.
        let erased: *const (dyn Fn(usize) + Sync + 'static) =
            unsafe { std::mem::transmute::<TaskFn<'_>, TaskFn<'static>>(task_ref) };
        // SAFETY: every task of the previous job is done, so no claim can succeed until
        // the Release store of `claim` below, and no thread reads `task` without one; we
        // hold `run_lock`, so no other caller writes it.
        unsafe { *s.job.task.get() = erased };
        s.job.participants.store(helpers, Relaxed);
        s.done.store(0, Relaxed);
        s.claim.store((n_tasks as u64) << 32, Release);
        s.job.epoch.fetch_add(1, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _l = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        IN_POOL_TASK.with(|f| f.set(true));
        let mine = take_tasks(s);
        IN_POOL_TASK.with(|f| f.set(false));
        // The last tasks may still run on workers; a descheduled one gets our core.
        let mut waited = 0u32;
        while s.done.load(Acquire) < n_tasks {
            pause(&mut waited);
        }
        if let Err(p) = mine {
            s.panicked.store(false, Relaxed);
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Relaxed) {
            panic!("a task panicked on a pool thread");
        }
    }
}

/// One step of waiting: a spin hint for the first [`SPIN_ROUNDS`], then a yield of the
/// core to whatever else is runnable (returns at once on an idle machine).
fn pause(waited: &mut u32) {
    if *waited < SPIN_ROUNDS {
        *waited += 1;
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Claims and runs tasks of the current job until none is left. Each finished task
/// counts in `done`, panicked or not (a panic is recorded, and the first one caught on
/// this thread is returned).
fn take_tasks(s: &Shared) -> std::thread::Result<()> {
    let mut result = Ok(());
    loop {
        let word = s.claim.fetch_add(1, AcqRel);
        let (n_tasks, i) = ((word >> 32) as usize, (word & 0xFFFF_FFFF) as usize);
        if i >= n_tasks {
            return result;
        }
        // SAFETY: the claim succeeded, so the caller wrote `task` before publishing this
        // job's claim word (Release, observed by our AcqRel) and waits for this task.
        let task = unsafe { &**s.job.task.get() };
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| task(i))) {
            s.panicked.store(true, Relaxed);
            if result.is_ok() {
                result = Err(p);
            }
        }
        s.done.fetch_add(1, Release);
    }
}

fn worker_loop(s: &Shared, index: usize) {
    IN_POOL_TASK.with(|f| f.set(true));
    let mut seen = 0u64;
    loop {
        let started = Instant::now();
        let mut waited = 0u32;
        while s.job.epoch.load(Acquire) == seen {
            if s.shutdown.load(Relaxed) {
                return;
            }
            if waited < SPIN_ROUNDS || started.elapsed() < WATCH {
                pause(&mut waited);
                continue;
            }
            let guard = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, SeqCst);
            let guard = if s.job.epoch.load(SeqCst) == seen && !s.shutdown.load(SeqCst) {
                s.wake.wait(guard).unwrap_or_else(|e| e.into_inner())
            } else {
                guard
            };
            s.sleepers.fetch_sub(1, SeqCst);
            drop(guard);
        }
        seen = s.job.epoch.load(Acquire);
        if s.shutdown.load(Relaxed) {
            return;
        }
        if index < s.job.participants.load(Relaxed) {
            // A panic was recorded in `panicked`; the caller re-raises it.
            let _ = take_tasks(s);
        }
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

/// Values (rows × row length) from which row-by-row work is spread over the pool:
/// below, one thread's pass costs less than waking the others. Host H (Intel, 2
/// threads, 2026-12-02): activation quantization ~0.5 ns a value (16 × 576 in 4.9 µs);
/// the fused residual norm at 576 values a row (`bench-serve --profile`, 2 runs each)
/// 2 and 4 rows faster on one thread (0.7–0.8 against 1.5 µs, 1.2 against 1.8), 8 rows
/// a tie (2.4–2.5 against 2.2–2.3), 16 rows faster on two (3.3–3.4 against 4.3–4.5).
pub(crate) const PARALLEL_ROW_VALUES: usize = 4096;

/// Values a task takes at least once work is split (~64 KiB of f32): large inputs go
/// in tasks of this size, claimed as threads free up, so a thread slowed by another
/// process takes fewer; the dispatch (~0.5 µs) stays small beside each.
pub(crate) const MIN_TASK_VALUES: usize = 16 * 1024;

/// How `rows` rows of `row_len` values split over at most `threads` threads: (tasks,
/// rows per task), in equal contiguous runs. Below [`PARALLEL_ROW_VALUES`] values one
/// task (run inline by [`ThreadPool::run`]); above, one run per thread, or runs of
/// about [`MIN_TASK_VALUES`] where there are more. Not a task per row: each task is a
/// claim on the job's shared counter, whose cache line then bounces between the cores
/// once per row (the residual norm at 16 rows took 8.3 µs so, 3.3 in two runs; a
/// 512-row prefill 116–122 µs against 39–41).
pub(crate) fn row_runs(rows: usize, row_len: usize, threads: usize) -> (usize, usize) {
    let values = rows * row_len;
    let tasks = if values < PARALLEL_ROW_VALUES {
        1
    } else {
        threads.max(values / MIN_TASK_VALUES).clamp(1, rows.max(1))
    };
    let per = rows.div_ceil(tasks).max(1);
    (rows.div_ceil(per).max(1), per)
}

/// A raw pointer that tasks on several threads may share; each task must write a
/// disjoint part of what it points to (the reason every use carries a SAFETY note).
#[derive(Debug)]
pub struct SharedMut<T>(pub *mut T);

// Copy for every T (a derive would ask T: Copy): it copies the pointer, not the pointee.
impl<T> Clone for SharedMut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedMut<T> {}
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

    /// Runs partition the rows in order, none empty, equal but the last; one task below
    /// the threshold, one per thread just above it, ~MIN_TASK_VALUES each far above.
    #[test]
    fn row_runs_partition_the_rows() {
        for (rows, len, threads) in [
            (0, 576, 2),
            (1, 576, 2),
            (7, 576, 2),
            (8, 576, 2),
            (16, 1536, 2),
            (17, 576, 3),
            (512, 576, 2),
            (100_000, 1, 4),
        ] {
            let (tasks, per) = row_runs(rows, len, threads);
            assert!(tasks >= 1 && per >= 1, "{rows}x{len}");
            assert!(
                (tasks - 1) * per < rows.max(1) && tasks * per >= rows,
                "{rows}x{len}"
            );
            if rows * len < PARALLEL_ROW_VALUES {
                assert_eq!(tasks, 1, "{rows}x{len}");
            } else {
                assert!(tasks >= threads.min(rows), "{rows}x{len}: {tasks} tasks");
                assert!(per * len <= MIN_TASK_VALUES.max(rows * len / threads) + len);
            }
        }
    }

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

    /// Many short jobs back to back, with thread limits that change between them, so
    /// late workers meet the next job's claims: every task still runs exactly once, and
    /// only in its own job.
    #[test]
    fn back_to_back_jobs_never_mix() {
        let pool = ThreadPool::new(4);
        for job in 0..20_000usize {
            let n = job % 13;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, 1 + job % 5, |i| {
                hits[i].fetch_add(1, Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "job {job}");
        }
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
