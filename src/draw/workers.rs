//! A persistent pool of worker threads for large draw calls.
//!
//! Threads are started once, with the sampler: no thread is created or joined per call (vLLM
//! measured OpenMP's fork/join at about 1 ms per call on s390x, 20x the scan itself). A call
//! publishes one job, a function of a task index, by bumping a generation counter; the workers
//! and the calling thread take task indices from a shared counter until none is left, and the
//! caller returns once every worker has left the job, so the job may borrow the caller's stack.
//!
//! Waking a parked thread costs microseconds, as much as a whole row, so after a job a worker
//! spins for a short while (`SPIN`) watching the generation before it parks on a condition
//! variable: back-to-back calls, the usual pattern of a decoding loop, start at once.

use parking_lot::{Condvar, Mutex};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker watches for the next job before it parks.
const SPIN: Duration = Duration::from_micros(200);

/// A job: `run(task)` for every task in `0..tasks`.
#[derive(Clone, Copy)]
struct Job {
    /// A `&(dyn Fn(usize) + Sync)` whose lifetime the publishing call guarantees.
    run: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

// SAFETY: the closure behind `run` is Sync and outlives the job (see `WorkerPool::run`).
unsafe impl Send for Job {}

// SAFETY: every field is Sync except `job`, whose accesses the generation protocol orders (see
// its comment).
unsafe impl Sync for Shared {}

struct Shared {
    /// Bumped once per job; a worker runs each generation once.
    generation: AtomicU64,
    /// Written only while every worker is outside a job (before the generation is bumped),
    /// read only after a worker saw the new generation: the generation orders the two.
    job: std::cell::UnsafeCell<Option<Job>>,
    /// Parked workers wait here; `sleepers` counts them so a call only notifies when needed.
    wake: Condvar,
    wake_lock: Mutex<()>,
    sleepers: AtomicUsize,
    next_task: AtomicUsize,
    /// Workers still inside the current job.
    active: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
}

pub(crate) struct WorkerPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// One call at a time uses the workers; a concurrent call runs on its own thread.
    busy: Mutex<()>,
}

impl WorkerPool {
    /// Starts `workers` threads (the calling thread of each job is one more).
    pub(crate) fn new(workers: usize) -> std::io::Result<WorkerPool> {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: std::cell::UnsafeCell::new(None),
            wake: Condvar::new(),
            wake_lock: Mutex::new(()),
            sleepers: AtomicUsize::new(0),
            next_task: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let s = Arc::clone(&shared);
            threads.push(std::thread::Builder::new().name(format!("tokenrace-worker-{i}")).spawn(move || worker(&s))?);
        }
        Ok(WorkerPool { shared, threads, busy: Mutex::new(()) })
    }

    /// Threads that can work on a job, the caller included.
    pub(crate) fn width(&self) -> usize {
        self.threads.len() + 1
    }

    /// Runs `f(task)` for every task in `0..tasks` on the workers and the calling thread, and
    /// returns when all have finished. Returns false if a task panicked.
    pub(crate) fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
        let Some(_guard) = self.busy.try_lock() else {
            // Another thread's call holds the workers: do this one here rather than wait.
            return catch_unwind(AssertUnwindSafe(|| (0..tasks).for_each(f))).is_ok();
        };
        let s = &self.shared;
        s.panicked.store(false, Ordering::Relaxed);
        s.next_task.store(0, Ordering::Relaxed);
        s.active.store(self.threads.len(), Ordering::Relaxed);
        // SAFETY: erase the closure's lifetime; this function does not return before every
        // worker has left the job (active == 0), so the closure outlives all its uses.
        let run: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        // SAFETY: no worker reads `job` now: each one left the previous job (active reached 0)
        // and reads again only after it sees the generation bumped below (Release/Acquire).
        unsafe { *s.job.get() = Some(Job { run, tasks }) };
        s.generation.fetch_add(1, Ordering::Release);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.wake_lock.lock();
            s.wake.notify_all();
        }
        take_tasks(s, f, tasks);
        // The workers are running or about to run the last tasks: wait for them to leave.
        let mut spins = 0u32;
        while s.active.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins.is_multiple_of(1024) {
                std::thread::yield_now(); // an oversubscribed host may need this core for them
            } else {
                std::hint::spin_loop();
            }
        }
        !s.panicked.load(Ordering::Relaxed)
    }
}

fn take_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync), tasks: usize) {
    loop {
        let t = s.next_task.fetch_add(1, Ordering::Relaxed);
        if t >= tasks {
            break;
        }
        if catch_unwind(AssertUnwindSafe(|| f(t))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
    }
}

/// Waits for a generation other than `seen`: spins for `SPIN`, then parks. None means stop.
fn next_generation(s: &Shared, seen: u64) -> Option<u64> {
    let start = Instant::now();
    loop {
        if s.stop.load(Ordering::Relaxed) {
            return None;
        }
        let g = s.generation.load(Ordering::Acquire);
        if g != seen {
            return Some(g);
        }
        if start.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        let mut lock = s.wake_lock.lock();
        s.sleepers.fetch_add(1, Ordering::SeqCst);
        // Re-check under the lock: a job published before `sleepers` rose is not missed.
        while s.generation.load(Ordering::Acquire) == seen && !s.stop.load(Ordering::Relaxed) {
            s.wake.wait(&mut lock);
        }
        s.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    while let Some(g) = next_generation(s, seen) {
        seen = g;
        // SAFETY: the generation (Acquire) orders this read after the job was written, and the
        // caller does not write it again before this worker decrements `active`.
        if let Some(job) = unsafe { *s.job.get() } {
            // SAFETY: the publishing call keeps the closure alive until `active` reaches 0.
            let f = unsafe { &*job.run };
            take_tasks(s, f, job.tasks);
        }
        s.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        {
            let _l = self.shared.wake_lock.lock();
            self.shared.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_per_job() {
        let pool = WorkerPool::new(3).unwrap();
        for tasks in [0usize, 1, 2, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            assert!(pool.run(tasks, &|t| {
                hits[t].fetch_add(1, Ordering::Relaxed);
            }));
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn jobs_after_the_workers_parked_still_run() {
        let pool = WorkerPool::new(2).unwrap();
        for _ in 0..3 {
            std::thread::sleep(SPIN * 3);
            let hits = AtomicUsize::new(0);
            assert!(pool.run(50, &|_| {
                hits.fetch_add(1, Ordering::Relaxed);
            }));
            assert_eq!(hits.load(Ordering::Relaxed), 50);
        }
    }

    #[test]
    fn a_panicking_task_is_reported_not_propagated() {
        let pool = WorkerPool::new(2).unwrap();
        assert!(!pool.run(10, &|t| assert!(t != 5, "boom")));
        assert!(pool.run(3, &|_| {}));
    }
}
