//! A persistent pool of worker threads for large draw calls.
//!
//! Threads are started once, with the sampler: no thread is created or joined per call (vLLM
//! measured OpenMP's fork/join at about 1 ms per call on s390x, 20x the scan itself). A call
//! publishes one job, a function of a task index, by bumping a generation counter; the workers
//! and the calling thread take task indices from a shared counter until none is left. Then the
//! caller closes the job and returns once every worker that entered it has left, so the job may
//! borrow the caller's stack, and a worker the scheduler kept away never delays a call.
//!
//! Waking a parked thread costs microseconds, as much as a whole row, so after a job a worker
//! spins for a short while (`SPIN`) watching the generation before it parks on a condition
//! variable: back-to-back calls, the usual pattern of a decoding loop, start at once.
//!
//! In a `fork()` child the workers do not exist and the pool's locks may be held by threads
//! that are gone: there every job runs on the calling thread, and dropping the pool neither
//! locks nor joins (the threads' handles are leaked).

use crate::process::Birthplace;
use parking_lot::{Condvar, Mutex};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The bit of `Shared::inside` that says the current job takes no more workers.
const CLOSED: usize = 1 << (usize::BITS - 1);

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

// SAFETY: every field is Sync except `job`, whose accesses the `inside` protocol orders (see
// `WorkerPool::run` and `worker`).
unsafe impl Sync for Shared {}

struct Shared {
    /// Bumped once per job; a worker runs each generation once.
    generation: AtomicU64,
    /// Written only while no worker is inside a job, read only by a worker that entered it.
    job: std::cell::UnsafeCell<Option<Job>>,
    /// Parked workers wait here; `sleepers` counts them so a call only notifies when needed.
    wake: Condvar,
    wake_lock: Mutex<()>,
    sleepers: AtomicUsize,
    next_task: AtomicUsize,
    /// Workers inside the current job, plus `CLOSED` once the caller closed it: a worker enters
    /// only while the job is open, so the caller waits for the workers that did enter, never for
    /// one that the scheduler kept away until all tasks were taken.
    inside: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
}

pub(crate) struct WorkerPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// One call at a time uses the workers; a concurrent call runs on its own thread.
    busy: Mutex<()>,
    /// The process the workers run in.
    birthplace: Birthplace,
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
            inside: AtomicUsize::new(CLOSED),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let s = Arc::clone(&shared);
            threads.push(std::thread::Builder::new().name(format!("tokenrace-worker-{i}")).spawn(move || worker(&s))?);
        }
        Ok(WorkerPool { shared, threads, busy: Mutex::new(()), birthplace: Birthplace::here() })
    }

    /// Threads that can work on a job, the caller included.
    pub(crate) fn width(&self) -> usize {
        if self.birthplace.elsewhere() {
            return 1;
        }
        self.threads.len() + 1
    }

    /// Runs `f(task)` for every task in `0..tasks` on the workers and the calling thread, and
    /// returns when all have finished. Returns false if a task panicked.
    pub(crate) fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
        let on_this_thread = || catch_unwind(AssertUnwindSafe(|| (0..tasks).for_each(f))).is_ok();
        if self.birthplace.elsewhere() {
            return on_this_thread(); // a fork() child: the workers are not here
        }
        let Some(_guard) = self.busy.try_lock() else {
            // Another thread's call holds the workers: do this one here rather than wait.
            return on_this_thread();
        };
        let s = &self.shared;
        s.panicked.store(false, Ordering::Relaxed);
        s.next_task.store(0, Ordering::Relaxed);
        // SAFETY: erase the closure's lifetime; this function does not return before every
        // worker that entered the job has left it, and no worker enters a closed job, so the
        // closure outlives all its uses.
        let run: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        // SAFETY: no worker is inside a job (the last one closed with nobody inside), and a
        // worker reads `job` only after entering, which the open `inside` below allows only
        // after the write (Release/Acquire).
        unsafe { *s.job.get() = Some(Job { run, tasks }) };
        s.inside.store(0, Ordering::Release);
        s.generation.fetch_add(1, Ordering::Release);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.wake_lock.lock();
            s.wake.notify_all();
        }
        take_tasks(s, f, tasks);
        // Every task is taken: close the job, then wait for the workers inside to finish theirs.
        s.inside.fetch_or(CLOSED, Ordering::AcqRel);
        let mut spins = 0u32;
        while s.inside.load(Ordering::Acquire) != CLOSED {
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

/// Enters the current job unless it is closed.
fn enter(s: &Shared) -> bool {
    let mut v = s.inside.load(Ordering::Acquire);
    loop {
        if v & CLOSED != 0 {
            return false;
        }
        match s.inside.compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(now) => v = now,
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    while let Some(g) = next_generation(s, seen) {
        seen = g;
        if !enter(s) {
            continue; // the caller already took every task
        }
        // SAFETY: entering an open job orders this read after the job was written, and the
        // caller does not write it again before this worker leaves.
        if let Some(job) = unsafe { *s.job.get() } {
            // SAFETY: the publishing call keeps the closure alive until every worker inside left.
            let f = unsafe { &*job.run };
            take_tasks(s, f, job.tasks);
        }
        s.inside.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        if self.birthplace.elsewhere() {
            // A fork() child: joining a thread of the parent would wait for ever, and
            // `wake_lock` may be held by one. The threads' memory stays with the parent.
            std::mem::forget(std::mem::take(&mut self.threads));
            return;
        }
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
    fn many_quick_jobs_each_run_every_task_once() {
        let pool = WorkerPool::new(3).unwrap();
        for job in 0..3000usize {
            let tasks = job % 7;
            let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            assert!(pool.run(tasks, &|t| {
                hits[t].fetch_add(1, Ordering::Relaxed);
            }));
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "job {job}");
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
