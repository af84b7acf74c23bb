//! A persistent pool of worker threads for large draw calls.
//!
//! Threads are started once, with the sampler, and sleep on a condition variable between calls:
//! no thread is created or joined per call (vLLM measured OpenMP's fork/join at about 1 ms per
//! call on s390x, 20x the scan itself). A call publishes one job, a function of a task index;
//! the workers and the calling thread take task indices from a shared counter until none is
//! left, and the caller returns once every task has finished, so the job may borrow the caller's
//! stack.

use parking_lot::{Condvar, Mutex};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A job: `run(task)` for every task in `0..tasks`.
#[derive(Clone, Copy)]
struct Job {
    /// A `&(dyn Fn(usize) + Sync)` whose lifetime the publishing call guarantees.
    run: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

// SAFETY: the closure behind `run` is Sync and outlives the job (see `WorkerPool::run`).
unsafe impl Send for Job {}

struct Shared {
    /// The current job and its generation (a new generation wakes the workers).
    slot: Mutex<(u64, Option<Job>)>,
    wake: Condvar,
    next_task: AtomicUsize,
    /// Workers still inside the current job.
    active: AtomicUsize,
    done: Condvar,
    done_lock: Mutex<()>,
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
            slot: Mutex::new((0, None)),
            wake: Condvar::new(),
            next_task: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            done: Condvar::new(),
            done_lock: Mutex::new(()),
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
        s.active.store(self.threads.len(), Ordering::Release);
        // SAFETY: erase the closure's lifetime; this function does not return before every
        // worker has left the job (active == 0), so the closure outlives all its uses.
        let run: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        {
            let mut slot = s.slot.lock();
            slot.0 += 1;
            slot.1 = Some(Job { run, tasks });
        }
        s.wake.notify_all();
        take_tasks(s, f, tasks);
        let mut lock = s.done_lock.lock();
        while s.active.load(Ordering::Acquire) != 0 {
            s.done.wait(&mut lock);
        }
        s.slot.lock().1 = None;
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

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let job = {
            let mut slot = s.slot.lock();
            while slot.0 == seen && !s.stop.load(Ordering::Relaxed) {
                s.wake.wait(&mut slot);
            }
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            seen = slot.0;
            slot.1
        };
        if let Some(job) = job {
            // SAFETY: the publishing call keeps the closure alive until `active` reaches 0.
            let f = unsafe { &*job.run };
            take_tasks(s, f, job.tasks);
        }
        if s.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _lock = s.done_lock.lock();
            s.done.notify_all();
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        {
            let _slot = self.shared.slot.lock();
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
    fn a_panicking_task_is_reported_not_propagated() {
        let pool = WorkerPool::new(2).unwrap();
        assert!(!pool.run(10, &|t| assert!(t != 5, "boom")));
        assert!(pool.run(3, &|_| {}));
    }
}
