//! The cost model that picks how many threads a call uses: a call of `work` nanoseconds on one
//! thread takes about `work / t + overhead(t)` on `t` threads, where the overhead is what the
//! invited workers add (waking them, their late start, waiting for the last one). Both sides
//! are measured: the work per element of the draws a sampler ran ([`WorkCost`], per [`Mode`]),
//! and by the pool itself, the time each job took beyond `work / t` ([`WakeCost`], for workers
//! still spinning after the last job and for parked ones). A call uses more than one thread only when that is
//! estimated to be faster, so a small call on a wide sampler stays on the calling thread. The
//! choice never changes a token: every split draws the same ones.

use crate::batch::Batch;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::RowPlan;

/// How much of each new measurement an estimate takes in.
const WEIGHT: f64 = 1.0 / 8.0;
/// One measurement moves an estimate by at most this factor's share: a worker preempted once
/// must not keep the pool from being used for the rest of the run.
const MOST_CHANGE: f64 = 4.0;

/// A positive quantity estimated from measurements: an exponentially weighted mean, in an
/// atomic (updates race harmlessly: a lost update is a lost sample).
pub(crate) struct Estimate(AtomicU64);

impl Estimate {
    pub(crate) fn new(initial: f64) -> Estimate {
        Estimate(AtomicU64::new(initial.to_bits()))
    }

    pub(crate) fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    pub(crate) fn update(&self, sample: f64) {
        let now = self.get();
        let sample = sample.clamp(now / MOST_CHANGE, now * MOST_CHANGE);
        let next = now + (sample - now) * WEIGHT;
        if next.is_finite() && next > 0.0 {
            self.0.store(next.to_bits(), Ordering::Relaxed);
        }
    }
}

/// What inviting workers costs, per invited worker: the first `spinning` workers are still
/// spinning after the last job, the others are parked and must be woken.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WakeCost {
    pub spinning: usize,
    pub spinning_ns: f64,
    pub parked_ns: f64,
}

impl WakeCost {
    /// The estimated delay of a call that runs `jobs` jobs with `workers` invited workers: the
    /// first job may have to wake parked ones; by the next, they all spin.
    pub(crate) fn overhead_ns(&self, workers: usize, jobs: usize) -> f64 {
        let spinning = workers.min(self.spinning);
        let first = spinning as f64 * self.spinning_ns + (workers - spinning) as f64 * self.parked_ns;
        first + jobs.saturating_sub(1) as f64 * workers as f64 * self.spinning_ns
    }
}

/// The number of threads (1 to `most`) with the least estimated time for `work_ns` of work, when
/// `overhead_ns(t)` is the cost of `t` threads over one; ties go to fewer threads, so more than
/// one is used only when it is estimated to be strictly faster.
pub(crate) fn participants(work_ns: f64, overhead_ns: impl Fn(usize) -> f64, most: usize) -> usize {
    let estimated = |t: usize| work_ns / t as f64 + overhead_ns(t);
    let mut best = (1, work_ns);
    for t in 2..=most {
        let time = estimated(t);
        if time < best.1 {
            best = (t, time);
        }
    }
    best.0
}

/// What a call does to its rows, as far as its cost per element goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every row greedy: one pass.
    Greedy,
    /// Sampling rows without filters: the pass and the race.
    Race,
    /// Some row has top-k, top-p or min-p: their thresholds too (top-p reads the whole row).
    Filtered,
}

impl Mode {
    pub(crate) fn of(batch: &Batch, plans: &[RowPlan]) -> Mode {
        if batch.top_k.is_some() || batch.top_p.is_some() || batch.min_p.is_some() || batch.top_n_sigma.is_some() {
            Mode::Filtered
        } else if plans.iter().all(|p| matches!(p, RowPlan::Greedy)) {
            Mode::Greedy
        } else {
            Mode::Race
        }
    }
}

/// Before the first measurement, ns per element by mode: about what the AVX2 and AVX-512 hosts
/// measured for one hot row (docs/performance.md); the measurements take over within calls.
const INITIAL_NS_PER_ELEMENT: [f64; 3] = [0.06, 0.1, 0.2];

/// Nanoseconds per element (rows x vocab) of the draws a sampler ran, by mode, on one thread.
pub(crate) struct WorkCost {
    per_element_ns: [Estimate; 3],
}

impl Default for WorkCost {
    fn default() -> WorkCost {
        WorkCost { per_element_ns: INITIAL_NS_PER_ELEMENT.map(Estimate::new) }
    }
}

impl WorkCost {
    /// The estimated single-thread time of `elements` elements in `mode`.
    pub(crate) fn estimate_ns(&self, mode: Mode, elements: usize) -> f64 {
        self.per_element_ns[mode as usize].get() * elements as f64
    }

    /// Learns from a draw of `elements` elements that took (or would take) `work_ns` on one thread.
    pub(crate) fn record(&self, mode: Mode, elements: usize, work_ns: u64) {
        if elements > 0 {
            self.per_element_ns[mode as usize].update(work_ns as f64 / elements as f64);
        }
    }
}

/// Test seam: a participant count that overrides the model (0: the model decides), so that the
/// tests exercise every split whatever the machine measures.
static FORCED_PARTICIPANTS: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn forced_participants() -> Option<usize> {
    Some(FORCED_PARTICIPANTS.load(Ordering::Relaxed)).filter(|&n| n > 0)
}

/// Makes every call of every sampler in this process use `participants` threads (capped at its
/// `threads` and at what the call can be split into); 0 returns the choice to the cost model.
#[cfg(feature = "internals")]
pub fn force_participants(participants: usize) {
    FORCED_PARTICIPANTS.store(participants, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    const WIDE: usize = 16;

    fn wake(spinning: usize, spinning_ns: f64, parked_ns: f64) -> WakeCost {
        WakeCost { spinning, spinning_ns, parked_ns }
    }

    fn linear(per_thread_ns: f64) -> impl Fn(usize) -> f64 {
        move |t| (t - 1) as f64 * per_thread_ns
    }

    #[test]
    fn small_work_stays_on_one_thread() {
        assert_eq!(participants(0.0, linear(1000.0), WIDE), 1);
        assert_eq!(participants(3_000.0, linear(2_000.0), WIDE), 1); // 1500 + 2000 > 3000
        assert_eq!(participants(3_000.0, linear(1_500.0), WIDE), 1); // a tie stays on one
    }

    #[test]
    fn more_work_takes_more_threads_up_to_the_optimum() {
        // work / t + (t - 1) c is least near t = sqrt(work / c).
        assert_eq!(participants(4_000.0, linear(1_000.0), WIDE), 2);
        assert_eq!(participants(100_000.0, linear(1_000.0), WIDE), 10);
        assert_eq!(participants(10_000_000.0, linear(1_000.0), WIDE), WIDE);
        assert_eq!(participants(10_000_000.0, linear(1_000.0), 3), 3);
    }

    #[test]
    fn the_answer_never_exceeds_most_nor_falls_below_one() {
        for work in [0.0, 1.0, 1e3, 1e6, 1e9] {
            for c in [0.0, 1.0, 1e3, 1e6] {
                for most in [0, 1, 2, 16] {
                    let t = participants(work, linear(c), most);
                    assert!(t >= 1 && t <= most.max(1), "{work} {c} {most}: {t}");
                }
            }
        }
    }

    #[test]
    fn parked_workers_cost_more_than_spinning_ones() {
        let w = wake(1, 500.0, 20_000.0);
        assert_eq!(w.overhead_ns(0, 1), 0.0);
        assert_eq!(w.overhead_ns(1, 1), 500.0);
        assert_eq!(w.overhead_ns(3, 1), 500.0 + 2.0 * 20_000.0);
        // A second job finds every worker of the first spinning.
        assert_eq!(w.overhead_ns(3, 2), 500.0 + 2.0 * 20_000.0 + 3.0 * 500.0);
        // 30 us of work: worth one spinning worker, not two more parked ones.
        assert_eq!(participants(30_000.0, |t| w.overhead_ns(t - 1, 1), WIDE), 2);
        // With every worker parked, the same call stays on one thread.
        assert_eq!(participants(30_000.0, |t| wake(0, 500.0, 20_000.0).overhead_ns(t - 1, 1), WIDE), 1);
    }

    #[test]
    fn an_estimate_follows_its_samples_a_bounded_step_at_a_time() {
        let e = Estimate::new(1000.0);
        e.update(1000.0);
        assert_eq!(e.get(), 1000.0);
        e.update(1e9); // an outlier counts as 4x the estimate at most
        assert_eq!(e.get(), 1000.0 + 3000.0 * WEIGHT);
        for _ in 0..200 {
            e.update(10.0);
        }
        assert!((e.get() - 10.0).abs() < 0.01, "{}", e.get());
        e.update(f64::NAN);
        assert!(e.get().is_finite());
    }

    #[test]
    fn the_work_is_learned_per_mode() {
        let w = WorkCost::default();
        assert_eq!(w.estimate_ns(Mode::Race, 1000), INITIAL_NS_PER_ELEMENT[1] * 1000.0);
        for _ in 0..200 {
            w.record(Mode::Race, 1000, 50);
        }
        assert!((w.estimate_ns(Mode::Race, 1000) - 50.0).abs() < 0.1);
        assert_eq!(w.estimate_ns(Mode::Greedy, 1000), INITIAL_NS_PER_ELEMENT[0] * 1000.0);
        w.record(Mode::Filtered, 0, 1); // nothing to learn from
        assert_eq!(w.estimate_ns(Mode::Filtered, 1), INITIAL_NS_PER_ELEMENT[2]);
    }
}
