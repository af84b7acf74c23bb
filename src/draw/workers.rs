//! A persistent pool of worker threads for large draw calls.
//!
//! Threads are started once, with the sampler: no thread is created or joined per call (vLLM
//! measured OpenMP's fork/join at about 1 ms per call on s390x, 20x the scan itself). A call
//! publishes one job, a function of a task index, and invites as many workers as it wants
//! participants (the caller is one): each invited worker gets the job's generation in its own
//! slot, and only a parked one is unparked, so a 2-task job on a wide pool neither wakes nor
//! involves the other workers. The caller and the invited workers take task indices from a
//! shared counter until none is left. Then the caller closes the job and returns once every
//! worker that entered it has left, so the job may borrow the caller's stack, and a worker the
//! scheduler kept away never delays a call.
//!
//! Waking a parked thread costs microseconds, as much as a whole row, so after a job a worker
//! spins for a short while (`SPIN`) watching its slot before it parks: back-to-back calls, the
//! usual pattern of a decoding loop, start at once. The pool measures what an invited worker
//! costs on every job (the time a job took beyond its work shared evenly, spinning or parked:
//! [`WakeCost`]), for the caller to decide how many participants a call is worth.
//!
//! In a `fork()` child the workers do not exist: there every job runs on the calling thread,
//! and dropping the pool neither wakes nor joins (the threads' handles are leaked).

use super::cost::{Estimate, WakeCost};
use crate::process::Birthplace;
use parking_lot::Mutex;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `Shared::state` holds the job's generation above this shift, then `CLOSED`, then the count
/// of workers inside the job.
const GENERATION_SHIFT: u32 = 32;
/// The bit of `Shared::state` that says the current job takes no more workers.
const CLOSED: u64 = 1 << 31;
const INSIDE: u64 = CLOSED - 1;

/// How long an idle worker watches for the next job before it parks.
const SPIN: Duration = Duration::from_micros(200);

/// Before the first measurement: what an invited worker adds to a job when it was spinning, and
/// when it was parked (a futex wake and a trip through the scheduler).
const INITIAL_SPINNING_NS: f64 = 1_000.0;
const INITIAL_PARKED_NS: f64 = 20_000.0;

/// A job: `run(task)` for every task in `0..tasks`.
#[derive(Clone, Copy)]
struct Job {
    /// A `&(dyn Fn(usize) + Sync)` whose lifetime the publishing call guarantees.
    run: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

// SAFETY: the closure behind `run` is Sync and outlives the job (see `WorkerPool::run`).
unsafe impl Send for Job {}

/// One worker's mailbox, on its own cache line so that inviting one worker does not disturb
/// the others.
#[repr(align(128))]
struct Slot {
    /// The generation of the last job this worker was invited to.
    invited: AtomicU32,
    /// Raised by the worker before it parks: the caller unparks only a parked worker.
    parked: AtomicBool,
}

// SAFETY: every field is Sync except `job`, whose accesses the `state` protocol orders (see
// `WorkerPool::run` and `worker`).
unsafe impl Sync for Shared {}

struct Shared {
    slots: Box<[Slot]>,
    /// Written only while no worker is inside a job, read only by a worker that entered it.
    job: std::cell::UnsafeCell<Option<Job>>,
    /// The current job's generation, `CLOSED`, and the workers inside it. A worker enters only
    /// the open job of the generation it was invited to, so a job never has more participants
    /// than it invited, and the caller waits for the workers that did enter, never for one the
    /// scheduler kept away until all tasks were taken.
    state: AtomicU64,
    next_task: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
    /// The time the workers spent on the current job's tasks (the work estimate when the caller
    /// took none).
    busy_ns: AtomicU64,
}

/// What a job did.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Finished {
    /// False if a task panicked.
    pub ok: bool,
    /// What the job's tasks would take on one thread, estimated from the caller's time per task
    /// (a worker's own clock also counts the time the scheduler kept it off its core).
    pub work_ns: u64,
}

/// The tasks one thread took, and the time it spent on them.
struct Taken {
    ns: u64,
    count: usize,
}

pub(crate) struct WorkerPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// One call at a time uses the workers; a concurrent call runs on its own thread.
    busy: Mutex<()>,
    /// The process the workers run in.
    birthplace: Birthplace,
    /// The cores this process may run on, when the pool was made.
    cores: usize,
    /// What an invited worker adds to a job, spinning or parked.
    spinning_ns: Estimate,
    parked_ns: Estimate,
    /// When the last job ended (ns since `epoch`) and how many workers it invited: those spin
    /// for `SPIN` after it.
    epoch: Instant,
    last_end_ns: AtomicU64,
    last_invited: AtomicUsize,
    /// When the caller's last call ended, whether it used the workers or not.
    last_call_ns: AtomicU64,
}

impl WorkerPool {
    /// Starts `workers` threads (the calling thread of each job is one more).
    pub(crate) fn new(workers: usize) -> std::io::Result<WorkerPool> {
        let slots = (0..workers).map(|_| Slot { invited: AtomicU32::new(0), parked: AtomicBool::new(false) }).collect();
        let shared = Arc::new(Shared {
            slots,
            job: std::cell::UnsafeCell::new(None),
            state: AtomicU64::new(CLOSED),
            next_task: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            busy_ns: AtomicU64::new(0),
        });
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let s = Arc::clone(&shared);
            threads
                .push(std::thread::Builder::new().name(format!("tokenrace-worker-{i}")).spawn(move || worker(&s, i))?);
        }
        Ok(WorkerPool {
            shared,
            threads,
            busy: Mutex::new(()),
            birthplace: Birthplace::here(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            spinning_ns: Estimate::new(INITIAL_SPINNING_NS),
            parked_ns: Estimate::new(INITIAL_PARKED_NS),
            epoch: Instant::now(),
            last_end_ns: AtomicU64::new(0),
            last_invited: AtomicUsize::new(0),
            last_call_ns: AtomicU64::new(0),
        })
    }

    /// Threads that can work on a job, the caller included.
    pub(crate) fn width(&self) -> usize {
        if self.birthplace.elsewhere() {
            return 1;
        }
        self.threads.len() + 1
    }

    /// The most participants worth having: more threads than cores only take turns.
    pub(crate) fn useful_width(&self) -> usize {
        self.width().min(self.cores)
    }

    /// What inviting workers would cost a call now, in the steady state: when calls come back to
    /// back (within `SPIN` of each other), the workers a call uses still spin at the next, so
    /// only the first call pays for waking them; after a longer pause, every call does.
    pub(crate) fn wake_cost(&self) -> WakeCost {
        let spinning = if self.within_spin(&self.last_call_ns) { self.width() - 1 } else { 0 };
        WakeCost { spinning, spinning_ns: self.spinning_ns.get(), parked_ns: self.parked_ns.get() }
    }

    /// Notes the end of a draw call, whether or not it used the workers.
    pub(crate) fn call_ended(&self) {
        self.last_call_ns.store(self.now_ns(), Ordering::Relaxed);
    }

    /// The workers spinning now: those of the last job, for `SPIN` after it.
    fn spinning_workers(&self) -> usize {
        if self.within_spin(&self.last_end_ns) {
            self.last_invited.load(Ordering::Relaxed)
        } else {
            0
        }
    }

    fn within_spin(&self, since: &AtomicU64) -> bool {
        self.now_ns().saturating_sub(since.load(Ordering::Relaxed)) < SPIN.as_nanos() as u64
    }

    /// Runs `f(task)` for every task in `0..tasks` on at most `participants` threads (the
    /// calling thread and `participants - 1` workers), and returns when all have finished.
    pub(crate) fn run(&self, tasks: usize, participants: usize, f: &(dyn Fn(usize) + Sync)) -> Finished {
        let on_this_thread = || {
            let start = Instant::now();
            let ok = catch_unwind(AssertUnwindSafe(|| (0..tasks).for_each(f))).is_ok();
            Finished { ok, work_ns: start.elapsed().as_nanos() as u64 }
        };
        let invited = participants.min(self.width()).min(tasks).saturating_sub(1);
        if invited == 0 || self.birthplace.elsewhere() {
            return on_this_thread(); // nobody to invite, or a fork() child: the workers are not here
        }
        let Some(_guard) = self.busy.try_lock() else {
            // Another thread's call holds the workers: do this one here rather than wait.
            return on_this_thread();
        };
        let warm = self.spinning_workers();
        let s = &self.shared;
        let start = Instant::now();
        let generation = self.publish(tasks, invited, f);
        let mine = take_tasks(s, f, tasks);
        // Every task is taken: close the job, then wait for the workers inside to finish theirs.
        s.state.fetch_or(CLOSED, Ordering::AcqRel);
        wait_until_empty(s);
        debug_assert_eq!(s.state.load(Ordering::Relaxed) >> GENERATION_SHIFT, u64::from(generation));
        let work_ns = match mine.count {
            0 => mine.ns + s.busy_ns.load(Ordering::Relaxed), // the workers took every task
            n => mine.ns * tasks as u64 / n as u64,
        };
        self.learn_wake_cost(invited, warm, start.elapsed().as_nanos() as u64, work_ns);
        Finished { ok: !s.panicked.load(Ordering::Relaxed), work_ns }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Publishes the job (no worker is inside one) and invites workers `0..invited`. Returns
    /// its generation.
    fn publish(&self, tasks: usize, invited: usize, f: &(dyn Fn(usize) + Sync)) -> u32 {
        let s = &self.shared;
        s.panicked.store(false, Ordering::Relaxed);
        s.next_task.store(0, Ordering::Relaxed);
        s.busy_ns.store(0, Ordering::Relaxed);
        // SAFETY: erase the closure's lifetime; `run` does not return before every worker that
        // entered the job has left it, and no worker enters a closed job, so the closure
        // outlives all its uses.
        let run: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        // SAFETY: no worker is inside a job (the last one closed with nobody inside), and a
        // worker reads `job` only after entering, which the open `state` below allows only
        // after the write (Release/Acquire).
        unsafe { *s.job.get() = Some(Job { run, tasks }) };
        // Generations wrap at 2^32: a worker would have to sleep through 2^32 jobs to mistake one.
        let generation = ((s.state.load(Ordering::Relaxed) >> GENERATION_SHIFT) as u32).wrapping_add(1);
        s.state.store(u64::from(generation) << GENERATION_SHIFT, Ordering::Release);
        for (slot, thread) in s.slots.iter().zip(&self.threads).take(invited) {
            // SeqCst pairs with the worker's: either it sees this invitation before it parks, or
            // this sees `parked` and unparks it.
            slot.invited.store(generation, Ordering::SeqCst);
            if slot.parked.load(Ordering::SeqCst) {
                thread.thread().unpark();
            }
        }
        generation
    }

    /// Folds this job into the estimates: what it took beyond its work shared evenly by all its
    /// participants, per invited worker. That is what the cost model adds to the work: waking
    /// the workers, their late start, waiting for the last one, and a worker the scheduler
    /// preempted (or that never came, leaving its share to the others).
    fn learn_wake_cost(&self, invited: usize, warm: usize, elapsed_ns: u64, work_ns: u64) {
        let lost_ns = elapsed_ns as f64 - work_ns as f64 / (invited + 1) as f64;
        let per_worker = lost_ns.max(0.0) / invited as f64;
        if invited <= warm {
            self.spinning_ns.update(per_worker);
        } else {
            self.parked_ns.update(per_worker);
        }
        self.last_end_ns.store(self.now_ns(), Ordering::Relaxed);
        self.last_invited.store(invited, Ordering::Relaxed);
    }
}

/// Takes and runs tasks until none is left.
fn take_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync), tasks: usize) -> Taken {
    let start = Instant::now();
    let mut count = 0;
    loop {
        let t = s.next_task.fetch_add(1, Ordering::Relaxed);
        if t >= tasks {
            break;
        }
        count += 1;
        if catch_unwind(AssertUnwindSafe(|| f(t))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
    }
    Taken { ns: start.elapsed().as_nanos() as u64, count }
}

fn wait_until_empty(s: &Shared) {
    let mut spins = 0u32;
    while s.state.load(Ordering::Acquire) & INSIDE != 0 {
        spins += 1;
        if spins.is_multiple_of(1024) {
            std::thread::yield_now(); // an oversubscribed host may need this core for them
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Waits for an invitation other than `seen`: spins for `SPIN`, then parks. None means stop.
fn next_invitation(s: &Shared, slot: &Slot, seen: u32) -> Option<u32> {
    let start = Instant::now();
    loop {
        if s.stop.load(Ordering::Relaxed) {
            return None;
        }
        let g = slot.invited.load(Ordering::Acquire);
        if g != seen {
            return Some(g);
        }
        if start.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        slot.parked.store(true, Ordering::SeqCst);
        // Checked after raising `parked`: an invitation stored before it is seen here, one
        // stored after it finds `parked` and unparks this thread (park keeps that token).
        while slot.invited.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
            std::thread::park();
        }
        slot.parked.store(false, Ordering::Relaxed);
    }
}

/// Enters the job of `generation` unless it is closed or already another one.
fn enter(s: &Shared, generation: u32) -> bool {
    let mut v = s.state.load(Ordering::Acquire);
    loop {
        if v & CLOSED != 0 || (v >> GENERATION_SHIFT) as u32 != generation {
            return false;
        }
        match s.state.compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(now) => v = now,
        }
    }
}

fn worker(s: &Shared, index: usize) {
    let slot = &s.slots[index];
    let mut seen = 0u32;
    while let Some(g) = next_invitation(s, slot, seen) {
        seen = g;
        if !enter(s, g) {
            continue; // the caller already took every task
        }
        // SAFETY: entering an open job orders this read after the job was written, and the
        // caller does not write it again before this worker leaves.
        if let Some(job) = unsafe { *s.job.get() } {
            // SAFETY: the publishing call keeps the closure alive until every worker inside left.
            let f = unsafe { &*job.run };
            let taken = take_tasks(s, f, job.tasks);
            s.busy_ns.fetch_add(taken.ns, Ordering::Relaxed);
            // Before leaving, so that when the call returns no thread of it keeps more than
            // the cap (a check of a few thread-locals when it keeps less).
            super::trim_kept();
        }
        s.state.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        if self.birthplace.elsewhere() {
            // A fork() child: joining a thread of the parent would wait for ever. The threads'
            // memory stays with the parent.
            std::mem::forget(std::mem::take(&mut self.threads));
            return;
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in &self.threads {
            t.thread().unpark();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::thread::ThreadId;

    fn run_counting(pool: &WorkerPool, tasks: usize, participants: usize) -> bool {
        let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
        let ok = pool
            .run(tasks, participants, &|t| {
                hits[t].fetch_add(1, Ordering::Relaxed);
            })
            .ok;
        ok && hits.iter().all(|h| h.load(Ordering::Relaxed) == 1)
    }

    #[test]
    fn every_task_runs_once_per_job() {
        let pool = WorkerPool::new(3).unwrap();
        for tasks in [0usize, 1, 2, 7, 100] {
            for participants in [0usize, 1, 2, 4, 9] {
                assert!(run_counting(&pool, tasks, participants), "{tasks} tasks on {participants}");
            }
        }
    }

    #[test]
    fn many_quick_jobs_each_run_every_task_once() {
        let pool = WorkerPool::new(3).unwrap();
        for job in 0..3000usize {
            assert!(run_counting(&pool, job % 7, 1 + job % 5), "job {job}");
        }
    }

    #[test]
    fn jobs_after_the_workers_parked_still_run() {
        let pool = WorkerPool::new(2).unwrap();
        for participants in [3, 2, 3] {
            std::thread::sleep(SPIN * 3);
            assert!(run_counting(&pool, 50, participants));
        }
    }

    #[test]
    fn a_limited_job_never_runs_on_more_threads_than_its_limit() {
        let pool = WorkerPool::new(5).unwrap();
        // Alternate wide and narrow jobs, so that workers invited to a wide one are still around
        // (spinning, or late) when a narrow one is published.
        for round in 0..200usize {
            let limit = [1usize, 2, 6, 3][round % 4];
            let seen = Mutex::new(HashSet::<ThreadId>::new());
            let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
            assert!(
                pool.run(24, limit, &|_| {
                    seen.lock().insert(std::thread::current().id());
                    most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    std::hint::black_box((0..2000u64).sum::<u64>());
                    now.fetch_sub(1, Ordering::SeqCst);
                })
                .ok
            );
            assert!(seen.lock().len() <= limit, "round {round}: {} threads, limit {limit}", seen.lock().len());
            assert!(most.load(Ordering::SeqCst) <= limit, "round {round}");
        }
    }

    #[test]
    fn a_narrow_job_invites_only_the_first_workers() {
        let pool = WorkerPool::new(4).unwrap();
        let _ = pool.run(8, 2, &|_| {});
        let invited: Vec<u32> = pool.shared.slots.iter().map(|s| s.invited.load(Ordering::Relaxed)).collect();
        assert_eq!(invited, [1, 0, 0, 0]);
    }

    #[test]
    fn the_work_estimate_covers_every_task() {
        let pool = WorkerPool::new(2).unwrap();
        let done = pool.run(6, 3, &|_| std::thread::sleep(Duration::from_millis(2)));
        assert!(done.ok);
        assert!(done.work_ns >= 6 * 2_000_000, "{}", done.work_ns);
    }

    #[test]
    fn a_panicking_task_is_reported_not_propagated() {
        let pool = WorkerPool::new(2).unwrap();
        assert!(!pool.run(10, 3, &|t| assert!(t != 5, "boom")).ok);
        assert!(pool.run(3, 3, &|_| {}).ok);
    }

    #[test]
    fn a_call_while_another_holds_the_workers_runs_on_its_own_thread() {
        let pool = WorkerPool::new(2).unwrap();
        let me = std::thread::current().id();
        let _held = pool.busy.lock();
        let foreign = AtomicBool::new(false);
        assert!(
            pool.run(20, 3, &|_| {
                if std::thread::current().id() != me {
                    foreign.store(true, Ordering::Relaxed);
                }
            })
            .ok
        );
        assert!(!foreign.load(Ordering::Relaxed));
    }
}
