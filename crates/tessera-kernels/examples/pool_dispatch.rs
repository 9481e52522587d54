//! What handing a job to the pool costs: `pool::global().run` with 1, 2 and 4 tasks that
//! each bump one counter, 200 000 jobs back to back, three rounds. One task runs inline
//! on the caller; two and more wake the workers, so the difference is the hand-off (the
//! cache lines that travel between cores). `cargo run --release -p tessera-kernels
//! --example pool_dispatch`; `TESSERA_THREADS` sets the pool size.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

fn main() {
    let pool = tessera_kernels::pool::global();
    // One counter per task, 64 bytes apart, so the tasks share no line.
    let counters: Vec<AtomicU64> = (0..32).map(|_| AtomicU64::new(0)).collect();
    const JOBS: u32 = 200_000;
    println!("{} pool threads", pool.threads());
    for round in 0..3 {
        for tasks in [1usize, 2, 4] {
            let start = Instant::now();
            for _ in 0..JOBS {
                pool.run(tasks, pool.threads(), |i| {
                    counters[i * 8].fetch_add(1, Relaxed);
                });
            }
            let ns = start.elapsed().as_secs_f64() / f64::from(JOBS) * 1e9;
            println!("round {round}, {tasks} tasks: {ns:.0} ns a job");
        }
    }
    let total: u64 = counters.iter().map(|c| c.load(Relaxed)).sum();
    assert_eq!(total, 3 * u64::from(JOBS) * 7, "every task ran once");
}
