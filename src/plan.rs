//! Planning a draw call: what each row does and where its noise comes from, decided on the
//! calling thread before any row is drawn.
//!
//! Unseeded sampling rows take their keys from the sampler's stream (or their rows of one pool
//! lease) in row order, one per row, so a row's token never depends on how the rows are later
//! spread over threads or on the SIMD level.

use crate::batch::{inv_temperature, Batch};
use crate::config::FilterOrder;
use crate::draw::RowPlan;
use crate::error::Result;
use crate::noise::pool::{Lease, Pool};
use crate::noise::{seeded_row_key, KeyStream, TakenKeys};
use crate::row::RaceNoise;

/// How many rows of a call took each path (for the sampler's counters).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RowCounts {
    pub greedy: u64,
    pub seeded: u64,
    pub external: u64,
    /// Unseeded sampling rows on inline noise of the key stream.
    pub inline: u64,
    /// Unseeded sampling rows on pool noise.
    pub pool: u64,
}

/// A planned call: one plan per row, and the pool lease whose rows the plans point into (it
/// must outlive the draw, and is released when the plan is dropped).
pub(crate) struct Plan {
    pub rows: Vec<RowPlan>,
    pub counts: RowCounts,
    lease: Option<Lease>,
    keys: Option<TakenKeys>,
}

impl Plan {
    /// Undoes what planning took from the sampler, for a call refused after it was planned: the
    /// unseeded rows' keys go back to `stream` and their pool rows back to the pool, so that the
    /// next call draws what it would have drawn had this one never run (unless another call took
    /// keys or rows in between: see [`KeyStream::give_back`] and [`Lease::give_back`]).
    pub(crate) fn give_back(self, stream: &KeyStream) {
        if let Some(keys) = self.keys {
            stream.give_back(keys);
        }
        if let Some(lease) = self.lease {
            lease.give_back();
        }
    }
}

/// Plans every row of a validated `batch`: rows with `T < greedy_below` are greedy, the others
/// judged by the filters as `order` says; seeded rows
/// key their own noise; unseeded rows take the batch's external noise, else one row each of a
/// single lease of `pool`, else one key each of `keys`. Fails only when the pool does.
pub(crate) fn plan(
    batch: &Batch,
    (greedy_below, order): (f32, FilterOrder),
    keys: &KeyStream,
    pool: Option<&Pool>,
) -> Result<Plan> {
    let mut rows = Vec::with_capacity(batch.rows);
    let mut unseeded = Vec::new();
    // Unseeded rows keyed from the stream although a pool is given (XTC rows).
    let mut keyed = Vec::new();
    let mut counts = RowCounts::default();
    for r in 0..batch.rows {
        let t = batch.temperature(r);
        if t < greedy_below {
            counts.greedy += 1;
            rows.push(RowPlan::Greedy);
            continue;
        }
        let noise = if let Some((seed, offset)) = batch.seed_of(r) {
            counts.seeded += 1;
            RaceNoise::Inline(seeded_row_key(seed, offset))
        } else if let Some(n) = &batch.noise {
            counts.external += 1;
            // In bounds: `validate` checked the noise span of every row.
            RaceNoise::External(n.values[r * n.row_stride..].as_ptr(), n.kind)
        } else {
            unseeded.push(r);
            RaceNoise::Inline(0) // keyed below, in row order
        };
        if pool.is_some() && unseeded.last() == Some(&r) && crate::filter::xtc_on(batch, r) {
            // XTC's coin comes from the row's key: such a row is keyed from the stream even when
            // the other unseeded rows take pool rows.
            unseeded.pop();
            keyed.push(r);
        }
        let inv_t = inv_temperature(t);
        // A call's order of stages that follows a fixed order draws the row by that order's path;
        // any other order places the temperature itself (its stages are given the row's 1/T).
        let filters = if batch.order.is_some() { crate::filter::Filters::of(batch, r) } else { None };
        let row_order = match filters {
            Some(f) if f.chain.is_some() => FilterOrder::TemperatureFirst,
            Some(f) => f.preset.unwrap_or(order),
            None => order,
        };
        let filter_inv_t = if row_order == FilterOrder::FiltersFirst { 1.0 } else { inv_t };
        rows.push(RowPlan::Sample { inv_t, filter_inv_t, noise, filters_after_race: false, scored: false });
    }
    let (mut lease, mut taken) = (None, None);
    match pool {
        Some(pool) if !unseeded.is_empty() => {
            let l = pool.borrow(unseeded.len()).map_err(|e| {
                let message = format!("noise pool: {}", e.message);
                crate::error::Error { message, ..e }
            })?;
            for (i, &r) in unseeded.iter().enumerate() {
                set_noise(&mut rows[r], RaceNoise::External(l.row(i).as_ptr(), l.kind()));
            }
            counts.pool = unseeded.len() as u64;
            lease = Some(l);
        }
        _ => keyed.append(&mut unseeded),
    }
    if !keyed.is_empty() {
        keyed.sort_unstable();
        let mut row_keys = vec![0u64; keyed.len()];
        taken = Some(keys.take_keys(&mut row_keys));
        for (&r, &key) in keyed.iter().zip(&row_keys) {
            set_noise(&mut rows[r], RaceNoise::Inline(key));
        }
        counts.inline = keyed.len() as u64;
    }
    Ok(Plan { rows, counts, lease, keys: taken })
}

fn set_noise(plan: &mut RowPlan, noise: RaceNoise) {
    if let RowPlan::Sample { noise: n, .. } = plan {
        *n = noise;
    }
}
