//! A row with a sampling step (penalties, bias, allowed and banned lists, bitmask): drawn from
//! its processed values, by the way [`super::row::path`] chose, and its logprobs.

use super::kept::{BLOCK_MAX, PROCESSED};
use super::output::LogprobSlots;
use super::row::{draw_scanned, summarize, Scanned};
use super::{Drawn, RowPlan};
use crate::alloc;
use crate::batch::{flags, Batch, LogprobMode};
use crate::error::Result;
use crate::filter;
use crate::kernels::{BlockValues, Kernels, RaceParams, BLOCK};
use crate::logprob::{block_maxima, row_logprobs_given, GivenOut, RowInfo, RowOut};
use crate::row::{RaceNoise, RowValues};
use crate::step::{DeferredRow, RowStep, StepBlocks};

/// The block maxima of row `r` (`n` values) in this thread's buffer, sized for it.
fn with_block_maxima<T>(r: usize, n: usize, f: impl FnOnce(&mut Vec<f32>) -> Result<T>) -> Result<T> {
    BLOCK_MAX.with(|cell| {
        let mut bmax = cell.borrow_mut();
        alloc::resize(&mut bmax, n.div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima").map_err(|e| e.in_row(r))?;
        f(&mut bmax)
    })
}

/// Draws row `r` (sampling, with filters) with step `e`: when no penalty raises a value, first
/// by blocks with the filters decided after the race ([`draw_by_blocks_after_race`]); otherwise,
/// or when that does not decide, from its processed values written out, with their block maxima
/// (the filters read values).
pub(super) fn draw_filtered<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    v: &V,
    e: &mut RowStep,
    plan: RowPlan,
) -> Result<Drawn> {
    if e.by_blocks() {
        if let Some(d) = draw_by_blocks_after_race(k, (batch, r), v, e, plan)? {
            return Ok(d);
        }
    }
    // The processed values written out, with their block maxima (the copy is not scanned
    // again).
    PROCESSED.with(|cell| {
        with_block_maxima(r, v.n(), |bmax| {
            let y = &mut *cell.borrow_mut();
            let nan = e.materialize(k, v, y, bmax).map_err(|e| e.in_row(r))?;
            draw_scanned(k, (batch, r), (&y[..], &bmax[..], nan), plan, true, None)
        })
    })
}

/// Draws row `r` (sampling, with filters, on inline noise) with step `e` that no penalty raises,
/// without writing its processed values out, when its filters can be decided after the race as
/// a row as given does: bounds of the blocks, the race over the kept and touched tokens, then
/// the filters for the winner alone, from the processed values above it
/// (`RowStep::values_ge`). The same token as the race of the processed row, with the floor or
/// without: the same values, keys and noise. `None`: not such a row, or not decided (then the
/// row is drawn from its processed values, written out).
fn draw_by_blocks_after_race<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    v: &V,
    e: &RowStep,
    plan: RowPlan,
) -> Result<Option<Drawn>> {
    let RowPlan::Sample { inv_t, filter_inv_t, noise: RaceNoise::Inline(key), filters_after_race: true, .. } = plan
    else {
        return Ok(None);
    };
    with_block_maxima(r, v.n(), |bmax| {
        let has_nan = e.bounds(k, v, bmax);
        let sc = summarize(bmax, f32::NEG_INFINITY, has_nan, plan);
        let m = sc.top;
        if !m.is_finite() || !filter::few_heavy_blocks(bmax, m, filter_inv_t) {
            return Ok(None);
        }
        let Some((f, floor)) = filter::decided_after_race(batch, r, m, filter_inv_t) else { return Ok(None) };
        let touched = StepBlocks { step: e, values: v };
        let won =
            v.race_blocks(k, e.keep(), bmax, RaceParams { m, inv_t, floor }, key, &touched).map_err(|e| e.in_row(r))?;
        if won.token == usize::MAX {
            return Ok(None);
        }
        let values_ge = |lo| e.values_ge(v, bmax, lo);
        let at = (e.value_of(v, won.token), &values_ge as filter::ValuesGe);
        if !filter::surely_keeps(k, v, bmax, (m, filter_inv_t, floor), f, at).map_err(|e| e.in_row(r))? {
            return Ok(None);
        }
        let info = RowInfo { top: m, floor, processed: true };
        Ok(Some(Drawn { token: won.token as i32, flags: sc.flags, info, logprobs_done: false, mirostat_mu: None }))
    })
}

/// Draws row `r` (greedy, or sampling without filters) with step `e` that no penalty raises
/// ([`RowStep::by_blocks`]): one pass over the row as given bounds every block, and only the
/// touched tokens the race cannot skip on their logits (or, greedy, the blocks that can hold the
/// maximum) are worked out. On inline noise the race skips blocks too; on external noise it
/// reads every kept token's noise, then the touched tokens', block by block.
pub(super) fn draw_by_blocks<V: RowValues + ?Sized>(
    k: &Kernels,
    r: usize,
    v: &V,
    e: &mut RowStep,
    plan: RowPlan,
) -> Result<Drawn> {
    with_block_maxima(r, v.n(), |bmax| {
        let has_nan = e.bounds(k, v, bmax);
        let sc = summarize(bmax, f32::NEG_INFINITY, has_nan, plan);
        let touched = StepBlocks { step: e, values: v };
        race_by_blocks(k, v, (e.keep(), bmax, &sc), plan, &touched, |top| e.first_of(v, bmax, top))
            .map_err(|e| e.in_row(r))
    })
}

/// Draws a deferred row `r` ([`RowStep::deferred`]) as [`draw_by_blocks`] does: it finds the
/// touched tokens of the blocks the race visits alone, when few blocks lie within reach of its
/// largest value ([`DeferredRow::worth_it`]); otherwise its histories are marked once, after the
/// scan of its bounds, which is the same either way.
pub(super) fn draw_deferred<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    v: &V,
    e: &mut RowStep,
    plan: RowPlan,
) -> Result<Drawn> {
    with_block_maxima(r, v.n(), |bmax| {
        let d = DeferredRow::new(k, batch, r, e, v).map_err(|e| e.in_row(r))?;
        let has_nan = d.rough_bounds(bmax);
        if d.worth_it(bmax, plan.inv_t()) {
            d.refine(bmax);
            let sc = summarize(bmax, f32::NEG_INFINITY, has_nan, plan);
            return race_by_blocks(k, v, (e.keep(), bmax, &sc), plan, &d, |top| d.first_of(bmax, top))
                .map_err(|e| e.in_row(r));
        }
        drop(d);
        e.complete(k, batch, r);
        e.refine_bounds(k, v, bmax);
        let sc = summarize(bmax, f32::NEG_INFINITY, has_nan, plan);
        let touched = StepBlocks { step: e, values: v };
        race_by_blocks(k, v, (e.keep(), bmax, &sc), plan, &touched, |top| e.first_of(v, bmax, top))
            .map_err(|e| e.in_row(r))
    })
}

/// [`draw_by_blocks`] once the row's blocks are bounded (`bmax`, summarized in `sc`): the race
/// over the kept tokens (`keep`) and the touched ones (`touched`), and, for a greedy row or when
/// no key is above -inf, the lowest token of the largest value (`first_of`). Fails only if the
/// race's scratch cannot be allocated.
fn race_by_blocks<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    (keep, bmax, sc): (&[u32], &[f32], &Scanned),
    plan: RowPlan,
    touched: &dyn BlockValues,
    first_of: impl Fn(f32) -> usize,
) -> Result<Drawn> {
    let won = match plan {
        RowPlan::Sample { inv_t, noise, .. } if sc.top.is_finite() => {
            let p = RaceParams { m: sc.top, inv_t, floor: f32::NEG_INFINITY };
            Some(match noise {
                RaceNoise::Inline(key) => v.race_blocks(k, keep, bmax, p, key, touched)?,
                // SAFETY: the noise row holds `n` values (checked by `validate`, or a pool
                // lease of the row's length). (A deferred row is never on external noise: this
                // race reads every block's kept tokens from `keep`.)
                RaceNoise::External(values, kind) => unsafe {
                    v.race_external_blocks(k, keep, p, (values, kind), touched)
                },
            })
        }
        _ => None,
    };
    let token = match won {
        _ if sc.flags & flags::EMPTY != 0 => 0,
        Some(b) if b.token != usize::MAX => b.token as i32,
        _ => first_of(sc.top) as i32,
    };
    let info = RowInfo { top: sc.top, floor: f32::NEG_INFINITY, processed: true };
    Ok(Drawn { token, flags: sc.flags, info, logprobs_done: false, mirostat_mu: None })
}

/// Draws row `r` with step `e` (a penalty raises values, no filters) straight from its kept
/// tokens (masked kernels) and its touched ones (raced one by one), without a pass of its own.
pub(super) fn draw_masked<V: RowValues + ?Sized>(
    k: &Kernels,
    r: usize,
    v: &V,
    e: &mut RowStep,
    plan: RowPlan,
) -> Result<Drawn> {
    with_block_maxima(r, v.n(), |bmax| {
        let has_nan = e.scan(k, v, bmax);
        let listed_max = e.overrides.iter().fold(f32::NEG_INFINITY, |a, &(_, y)| if y > a { y } else { a });
        let sc = summarize(bmax, listed_max, has_nan, plan);
        let won = match plan {
            RowPlan::Sample { inv_t, noise, .. } if sc.top.is_finite() => {
                let p = RaceParams { m: sc.top, inv_t, floor: f32::NEG_INFINITY };
                Some(v.race_processed(k, e.keep(), bmax, &e.overrides, p, noise).map_err(|e| e.in_row(r))?)
            }
            _ => None,
        };
        let token = match won {
            _ if sc.flags & flags::EMPTY != 0 => 0,
            Some(b) if b.token != usize::MAX => b.token as i32,
            _ => first_of_top(v, e, bmax, sc.top) as i32,
        };
        let info = RowInfo { top: sc.top, floor: f32::NEG_INFINITY, processed: true };
        Ok(Drawn { token, flags: sc.flags, info, logprobs_done: false, mirostat_mu: None })
    })
}

/// The lowest token whose processed value is `top`: among the kept tokens (the first block whose
/// maximum is `top`) and the touched ones.
fn first_of_top<V: RowValues + ?Sized>(v: &V, e: &RowStep, bmax: &[f32], top: f32) -> usize {
    let kept = bmax
        .iter()
        .position(|&b| b == top)
        .and_then(|b| (b * BLOCK..((b + 1) * BLOCK).min(v.n())).find(|&i| e.kept(i) && v.at(i) == top));
    let listed = e.overrides.iter().filter(|&&(_, y)| y == top).map(|&(t, _)| t as usize).min();
    match (kept, listed) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(0),
    }
}

/// Row `r`'s draw `drawn` with its logprobs, when its task computes them (`logprobs`), from the
/// row as given (raw) or its processed values (processed), written out once more.
pub(super) fn with_logprobs<V: RowValues + ?Sized>(
    k: &Kernels,
    r: usize,
    v: &V,
    e: &mut RowStep,
    plan: RowPlan,
    drawn: Drawn,
    logprobs: Option<&LogprobSlots>,
) -> Result<Drawn> {
    let Some(slots) = logprobs else { return Ok(drawn) };
    // SAFETY: r is a row of the call, and this task draws it alone.
    let (o, given) = unsafe { (slots.row(r), slots.given(r)) };
    let at = (drawn.info, drawn.token);
    PROCESSED
        .with(|y| processed_row_logprobs(k, v, e, &mut y.borrow_mut(), plan.inv_t(), at, slots.mode, (o, given)))
        .map_err(|e| e.in_row(r))?;
    Ok(Drawn { logprobs_done: true, ..drawn })
}

/// The logprobs of row `v` drawn with step `e` (what its draw left, and its token): raw ones
/// from the row as given, processed ones from its processed values, written into `y`. Fails
/// only if `y` or the scratch cannot grow.
#[allow(clippy::too_many_arguments)]
fn processed_row_logprobs<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    e: &mut RowStep,
    y: &mut Vec<f32>,
    inv_t: Option<f32>,
    (info, token): (RowInfo, i32),
    mode: LogprobMode,
    (out, given): (RowOut, Option<GivenOut>),
) -> Result<()> {
    let RowInfo { top, floor, .. } = info;
    match mode {
        LogprobMode::Raw => {
            let mut bmax = Vec::new();
            let top = block_maxima(k, v, &mut bmax)?;
            row_logprobs_given(k, v, &bmax, inv_t, mode, (top, floor), token, out, given)
        }
        LogprobMode::Processed => {
            // The copy records its block maxima as it writes (no second scan of it).
            let mut bmax = alloc::filled(v.n().div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima")?;
            e.materialize(k, v, y, &mut bmax)?;
            row_logprobs_given(k, &y[..], &bmax, inv_t, mode, (top, floor), token, out, given)
        }
    }
}
