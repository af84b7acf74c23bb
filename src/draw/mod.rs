//! Drawing a planned call: the first pass over each row, its filters' floor, the race, then the
//! logprobs, and the output written only once everything succeeded.
//!
//! - `mod.rs`: the call ([`run`]): the rows drawn, then the outputs computed and written;
//! - `split.rs`: the split of a call across threads (by rows, or rows in tiles);
//! - `row.rs`: one row on one thread: which way it is drawn (`row::path`, the one decision),
//!   and a row without a step;
//! - `stepped.rs`: a row with a sampling step, drawn from its processed values;
//! - `output.rs`: the call's logprob outputs and its full-vocabulary output;
//! - `kept.rs`: the buffers a thread reuses from call to call;
//! - `tiles.rs`: fewer rows than threads, each row split into tiles of whole blocks;
//! - `workers.rs`: the persistent worker threads;
//! - `cost.rs`: the measured costs that choose how many threads a call uses;
//! - `cells.rs`: the cells tasks write their results through;
//! - `verify.rs`: a verify call, whose target rows are drawn by the same first pass and race.
//!
//! Every split gives the same tokens as the single-threaded draw: each tile's best is exact,
//! and merging bests (highest key, then lowest token) does not depend on the order.

mod cells;
pub(crate) mod cost;
mod kept;
mod output;
mod range;
mod row;
mod split;
mod stepped;
mod tiles;
pub(crate) mod verify;
mod verify_step;
pub(crate) use verify_step::RequestStep;
pub(crate) mod workers;

use crate::alloc;
use crate::batch::{flags, Batch, FullMode, LogprobMode, Output};
use crate::error::{Error, Result};
use crate::kernels::Kernels;
use crate::logprob::RowInfo;
use crate::row::RaceNoise;
pub(crate) use kept::trim_kept;
#[cfg(feature = "internals")]
pub use kept::{kept_bytes, KEPT_PER_THREAD};
use output::{write_full, KeptSets, Logprobs, Processed};
pub(crate) use split::Workers;

/// What to do with one row (decided by `plan`, on the calling thread).
#[derive(Clone, Copy, Debug)]
pub(crate) enum RowPlan {
    Greedy,
    /// `filter_inv_t` is the 1/T the filters judge the row at: `inv_t` (temperature first) or 1
    /// (filters first).
    ///
    /// `filters_after_race`: nothing after the draw reads the row's filters' floor (no processed
    /// logprobs, no processed full-vocabulary output), so a row with top-k or top-p may decide
    /// them after its race (`row::race_row`).
    ///
    /// `scored`: the row is scored, not drawn (`Sampler::score`): its forced token is the
    /// target, and a row drawn from its values as given skips its race, whose winner nothing
    /// would read.
    Sample {
        inv_t: f32,
        filter_inv_t: f32,
        noise: RaceNoise,
        filters_after_race: bool,
        scored: bool,
    },
}

impl RowPlan {
    /// The plan with `filters_after_race` set (a sampling row).
    fn with_filters_after_race(self) -> RowPlan {
        match self {
            RowPlan::Sample { inv_t, filter_inv_t, noise, scored, .. } => {
                RowPlan::Sample { inv_t, filter_inv_t, noise, filters_after_race: true, scored }
            }
            greedy => greedy,
        }
    }

    /// The 1/T the filters judge a sampling row at; 1 for a greedy one.
    fn filter_inv_t(&self) -> f32 {
        match *self {
            RowPlan::Greedy => 1.0,
            RowPlan::Sample { filter_inv_t, .. } => filter_inv_t,
        }
    }

    /// The plan of a scored row (a sampling row marked `scored`; a greedy row has no race).
    pub(crate) fn scored(self) -> RowPlan {
        match self {
            RowPlan::Sample { inv_t, filter_inv_t, noise, filters_after_race, .. } => {
                RowPlan::Sample { inv_t, filter_inv_t, noise, filters_after_race, scored: true }
            }
            greedy => greedy,
        }
    }

    /// Whether the row is scored rather than drawn.
    fn is_scored(&self) -> bool {
        matches!(self, RowPlan::Sample { scored: true, .. })
    }

    /// 1/T of a sampling row; `None` for a greedy one.
    pub(crate) fn inv_t(self) -> Option<f32> {
        match self {
            RowPlan::Greedy => None,
            RowPlan::Sample { inv_t, .. } => Some(inv_t),
        }
    }
}

/// One drawn row.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Drawn {
    pub token: i32,
    pub flags: u32,
    pub info: RowInfo,
    /// The row's logprobs were computed by the task that drew it.
    pub logprobs_done: bool,
    /// A mirostat row's mu after its draw (`None`: no mirostat, or no finite value to draw).
    pub mirostat_mu: Option<f32>,
}

/// Draws a validated, planned call into `out`. On error nothing is written. Returns the count of
/// rows whose flags reported NaN, +inf or an empty row. Either way this thread then keeps at
/// most [`kept::KEPT_PER_THREAD`] (the workers trim theirs as they leave a job).
pub(crate) fn run(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    workers: Option<&Workers>,
    out: &mut Output,
) -> Result<u64> {
    let drawn = run_call(k, batch, plans, workers, out);
    trim_kept();
    Ok(drawn?.iter().filter(|d| d.flags & flags::NONFINITE != 0).count() as u64)
}

fn run_call(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    workers: Option<&Workers>,
    out: &mut Output,
) -> Result<Vec<Drawn>> {
    let mut logprobs = Logprobs::new(out, batch);
    let slots = logprobs.as_mut().map(Logprobs::slots);
    let after_race;
    // Only processed logprobs, processed full outputs and the kept sets read the filters' floor.
    let floor_read = (logprobs.is_some() && out.logprob_mode == LogprobMode::Processed)
        || (out.full_logprobs.is_some() && out.full_mode != FullMode::Raw)
        || out.wants_kept();
    // (A greedy plan stays as it is: a call of greedy rows alone copies nothing.)
    let all_greedy = plans.iter().all(|p| matches!(p, RowPlan::Greedy));
    let plans = if !floor_read && !all_greedy {
        after_race = alloc::collect(plans.iter().map(|&p| p.with_filters_after_race()), "the row plans")?;
        &after_race[..]
    } else {
        plans
    };
    let drawn = split::draw_rows(k, batch, plans, workers, slots.as_ref())?;
    // The rows' summaries and temperatures, read only by the outputs after the draw (logprobs,
    // full-vocabulary outputs, kept sets): a call of tokens and flags alone builds neither.
    let outputs_after = logprobs.is_some() || out.full_logprobs.is_some() || out.wants_kept();
    let info: Vec<RowInfo> = if outputs_after { drawn.iter().map(|d| d.info).collect() } else { Vec::new() };
    let inv_t: Vec<Option<f32>> = if outputs_after { plans.iter().map(|p| p.inv_t()).collect() } else { Vec::new() };
    // The processed values of the rows with a step, for the full-vocabulary outputs that need
    // them, and the logprobs of the rows their tasks left (both before anything is written:
    // nothing after them can fail).
    let needs_processed = (out.full_logprobs.is_some() && out.full_mode != FullMode::Raw) || out.wants_kept();
    let mut processed = if needs_processed {
        Processed::build(k, batch, &info)?
    } else {
        // (Only the full-vocabulary output reads a row's entry.)
        Processed::none(if out.full_logprobs.is_some() { batch.rows } else { 0 })
    };
    if out.full_logprobs.is_some() {
        processed.reserve_full(batch.vocab).map_err(Error::nothing_written)?;
    }
    if let Some(l) = logprobs.as_mut() {
        let tokens: Vec<i32> = drawn.iter().map(|d| d.token).collect();
        let done: Vec<bool> = drawn.iter().map(|d| d.logprobs_done).collect();
        l.compute_rest(k, batch, &inv_t, &info, &tokens, &done)?;
    }
    let kept = if out.wants_kept() {
        let filter_inv_t: Vec<f32> = plans.iter().map(RowPlan::filter_inv_t).collect();
        Some(KeptSets::compute(k, batch, &filter_inv_t, &info, out, &mut processed)?)
    } else {
        None
    };
    write_full(k, batch, &inv_t, &info, out, &mut processed);
    if let Some(kept) = kept {
        kept.write(out, batch.rows);
    }
    let rows = batch.rows;
    for (t, d) in out.tokens[..rows].iter_mut().zip(&drawn) {
        *t = d.token;
    }
    if let Some(f) = out.flags.as_deref_mut() {
        for (f, d) in f[..rows].iter_mut().zip(&drawn) {
            *f = d.flags;
        }
    }
    if let Some(l) = logprobs {
        l.write(out, rows);
    }
    if let Some(mu) = out.mirostat_mu.as_deref_mut() {
        for (r, (mu, d)) in mu[..rows].iter_mut().zip(&drawn).enumerate() {
            *mu = mirostat_mu_after(batch, r, plans[r], d);
        }
    }
    Ok(drawn)
}

/// Row `r`'s mu after its draw `d`: NaN without mirostat; a greedy row keeps its maximum alone
/// (probability 1, surprise 0); a row with no finite value to draw keeps its mu.
fn mirostat_mu_after(batch: &Batch, r: usize, plan: RowPlan, d: &Drawn) -> f32 {
    let Some(ms) = crate::filter::mirostat::Mirostat::of(batch, r) else { return f32::NAN };
    match plan {
        RowPlan::Greedy => ms.updated_mu(0.0),
        RowPlan::Sample { .. } => d.mirostat_mu.unwrap_or(ms.mu),
    }
}
