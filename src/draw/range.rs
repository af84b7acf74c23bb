//! A sampling row whose filters keep a range of values (locally typical sampling, XTC:
//! [`filter::Filters::keeps_range`]): its values (processed, when it has a step) are written
//! out, the range `[lo, hi]` its filters keep is computed ([`filter::kept_range`]), the values
//! above `hi` are set to -inf in the copy, and the copy races with `lo` as its floor. The race
//! keys each token by its index, so the copy draws what a race over the kept tokens alone
//! draws.

use super::kept::{BLOCK_MAX, PROCESSED};
use super::output::LogprobSlots;
use super::row::{draw_scanned, finish, summarize};
use super::{Drawn, RowPlan};
use crate::alloc;
use crate::batch::{inv_temperature, Batch};
use crate::error::Result;
use crate::filter::mirostat::{self, MirostatKept};
use crate::filter::{self, llama::xtc_coin, Filters};
use crate::kernels::{Kernels, RaceParams, BLOCK};
use crate::logprob::{block_maxima, row_logprobs_given, RowInfo};
use crate::row::{RaceNoise, RowValues};
use crate::step::RowStep;

/// Draws sampling row `r` of `batch` (values `v`, step `e` when it has one) whose filters keep a
/// range; with `logprobs`, its logprobs (raw: `validate` refuses processed ones for such rows).
pub(super) fn draw_range<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    v: &V,
    e: Option<&mut RowStep>,
    plan: RowPlan,
    logprobs: Option<&LogprobSlots>,
) -> Result<Drawn> {
    let processed = e.is_some();
    let drawn = PROCESSED
        .with(|y| {
            BLOCK_MAX.with(|bmax| {
                let (y, bmax) = (&mut *y.borrow_mut(), &mut *bmax.borrow_mut());
                alloc::resize(bmax, v.n().div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima")?;
                let has_nan = match e {
                    Some(e) => e.materialize(k, v, y, bmax)?,
                    None => {
                        y.clear();
                        alloc::resize(y, v.n(), 0.0, "the row's values")?;
                        for (i, d) in y.iter_mut().enumerate() {
                            *d = v.at(i);
                        }
                        y[..].scan(k, 0, v.n(), bmax)
                    }
                };
                race_in_range(k, (batch, r), (y, bmax, has_nan), plan, processed)
            })
        })
        .map_err(|e| e.in_row(r))?;
    let Some(slots) = logprobs else { return Ok(drawn) };
    // SAFETY: r is a row of the call, and this task draws it alone.
    let (o, given) = unsafe { (slots.row(r), slots.given(r)) };
    let mut bmax = Vec::new();
    let top = block_maxima(k, v, &mut bmax).map_err(|e| e.in_row(r))?;
    // A forced row's logprobs are its forced token's, as on every other path.
    let token = batch.forced(r).unwrap_or(drawn.token);
    row_logprobs_given(k, v, &bmax, plan.inv_t(), slots.mode, (top, f32::NEG_INFINITY), token, o, given)
        .map_err(|e| e.in_row(r))?;
    Ok(Drawn { logprobs_done: true, ..drawn })
}

/// The race of the row's values `y` (block maxima `bmax`; `has_nan`: the row held a NaN) over
/// the range its filters keep; a row without a finite maximum is drawn as any row is.
fn race_in_range(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    (y, bmax, has_nan): (&mut [f32], &mut [f32], bool),
    plan: RowPlan,
    processed: bool,
) -> Result<Drawn> {
    let sc = summarize(bmax, f32::NEG_INFINITY, has_nan, plan);
    let (RowPlan::Sample { inv_t, filter_inv_t, noise, .. }, Some(f)) = (plan, Filters::of(batch, r)) else {
        return draw_scanned(k, (batch, r), (&y[..], &bmax[..], has_nan), plan, processed, None);
    };
    if !sc.top.is_finite() {
        return draw_scanned(k, (batch, r), (&y[..], &bmax[..], has_nan), plan, processed, None);
    }
    // Rows with XTC on are keyed (`plan`; `validate` refuses caller noise for unseeded ones).
    let xtc_applies = matches!(noise, RaceNoise::Inline(key) if xtc_coin(key) < f.xtc_probability);
    let t = batch.temperature(r);
    let range = match f.chain {
        // The caller's order of stages, the temperature among them.
        Some(chain) => filter::chain::kept_range(k, &y[..], bmax, (sc.top, t), (f, chain, xtc_applies))?,
        None => filter::kept_range(k, &y[..], bmax, (sc.top, filter_inv_t), f, xtc_applies)?,
    };
    let dynamic = filter::llama::dynamic_temperature(&y[..], range, t, f);
    // Mirostat, the chain's final sampler, narrows what the chain kept at the draw's 1/T (a
    // temperature of 0 keeps the maximum alone).
    let mirostat = match (f.mirostat, dynamic) {
        (None, _) => None,
        (Some(_), Some(t)) if t <= 0.0 => Some(MirostatKept::greedy(range.hi)),
        (Some(ms), dynamic) => {
            let draw_inv_t = dynamic.map_or(inv_t, |t| inv_temperature(t as f32));
            Some(mirostat::narrow(&y[..], range, draw_inv_t, ms, batch.vocab)?)
        }
    };
    let range = mirostat.map_or(range, |m| m.range);
    if range.hi < sc.top {
        for x in y.iter_mut().filter(|x| **x > range.hi) {
            *x = f32::NEG_INFINITY;
        }
        y.scan(k, 0, y.len(), bmax);
    }
    let kept = summarize(bmax, f32::NEG_INFINITY, has_nan, plan);
    let won = match dynamic {
        // A temperature of 0 takes the first maximum of the kept tokens (`finish`), as llama.cpp's
        // temperature sampler does at `t <= 0`.
        Some(t) if t <= 0.0 => None,
        dynamic => {
            let inv_t = dynamic.map_or(inv_t, |t| inv_temperature(t as f32));
            Some(y.race(k, 0, y.len(), bmax, RaceParams { m: kept.top, inv_t, floor: range.lo }, noise)?)
        }
    };
    let token = finish(k, &y[..], bmax, &kept, won);
    let info = RowInfo { top: sc.top, floor: range.lo, processed };
    let mirostat_mu = match (f.mirostat, mirostat) {
        (Some(ms), Some(kept)) if token >= 0 => Some(ms.updated_mu(kept.surprise(y[token as usize]))),
        _ => None,
    };
    Ok(Drawn { token, flags: sc.flags, info, logprobs_done: false, mirostat_mu })
}
