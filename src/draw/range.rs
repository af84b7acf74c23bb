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
use crate::batch::{inv_temperature, Batch, Logits};
use crate::error::Result;
use crate::filter::mirostat::{self, MirostatKept};
use crate::filter::{self, llama::xtc_coin, llama::KeptRange, Filters};
use crate::kernels::{Best, Kernels, RaceParams, BLOCK};
use crate::logprob::{block_maxima, row_logprobs_given, RowInfo};
use crate::row::{race_inline_at, RaceNoise, RowValues};
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
    let drawn = match (e.is_none(), as_given_f32(batch, r), plan) {
        // An f32 row as given with inline noise: raced where it lies, no copy.
        (true, Some(x), RowPlan::Sample { noise: RaceNoise::Inline(key), .. }) => BLOCK_MAX
            .with(|bmax| {
                let bmax = &mut *bmax.borrow_mut();
                alloc::resize(bmax, x.n().div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima")?;
                let has_nan = x.scan(k, 0, x.n(), bmax);
                race_in_range_as_given(k, (batch, r), (x, bmax, has_nan), plan, key)
            })
            .map_err(|e| e.in_row(r))?,
        _ => draw_range_copied(k, (batch, r), v, e, plan)?,
    };
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

/// Row `r`'s logits when they are f32 (the values `with_row` gives the row).
fn as_given_f32<'a>(batch: &Batch<'a>, r: usize) -> Option<&'a [f32]> {
    let Logits::F32(s) = batch.logits else { return None };
    let start = batch.logits_row(r) * batch.row_stride;
    Some(&s[start..start + batch.vocab])
}

/// Whether the range path must draw row `r` (filters `f`, `plan`): XTC alone (no typical
/// sampling, no dynamic temperature, no caller's order, no mirostat) keeps what the floor of the other
/// filters keeps when its coin does not fall, and such a row is drawn as a row of top-set
/// filters is (the same floor, race and logprobs). A scored row keeps the range path.
pub(super) fn draws_a_range(f: &Filters, plan: RowPlan) -> bool {
    let xtc_alone = f.typical_p >= 1.0 && f.dynatemp_range <= 0.0 && f.chain.is_none() && f.mirostat.is_none();
    !xtc_alone || plan.is_scored() || xtc_applies(f, plan)
}

/// Whether XTC's coin fell for a row of filters `f` drawn with `plan`: rows with XTC on are keyed
/// (`validate` refuses caller noise for unseeded ones); a row with caller noise has no coin.
fn xtc_applies(f: &Filters, plan: RowPlan) -> bool {
    matches!(plan, RowPlan::Sample { noise: RaceNoise::Inline(key), .. } if xtc_coin(key) < f.xtc_probability)
}

/// [`draw_range`] of a row with a step or with another dtype or noise: its values (processed, or
/// as given) written out, and the copy raced with the tokens above the range set to -inf.
fn draw_range_copied<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    v: &V,
    e: Option<&mut RowStep>,
    plan: RowPlan,
) -> Result<Drawn> {
    let processed = e.is_some();
    PROCESSED
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
        .map_err(|e| e.in_row(r))
}

/// The range a sampling row's filters keep over its values `y` (block maxima `bmax`, finite
/// maximum `top`) and its dynamic temperature; `None` for a row with no filters.
fn range_of(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    (y, bmax, top): (&[f32], &[f32], f32),
    plan: RowPlan,
) -> Result<Option<Ranged>> {
    let (RowPlan::Sample { inv_t, filter_inv_t, .. }, Some(f)) = (plan, Filters::of(batch, r)) else { return Ok(None) };
    let xtc_applies = xtc_applies(&f, plan);
    let t = batch.temperature(r);
    let range = match f.chain {
        // The caller's order of stages, the temperature among them.
        Some(chain) => filter::chain::kept_range(k, y, bmax, (top, t), (f, chain, xtc_applies))?,
        None => filter::kept_range(k, y, bmax, (top, filter_inv_t), f, xtc_applies)?,
    };
    let dynamic = filter::llama::dynamic_temperature(y, range, t, f);
    // Mirostat, the chain's final sampler, narrows what the chain kept at the draw's 1/T (a
    // temperature of 0 keeps the maximum alone).
    let mirostat = match (f.mirostat, dynamic) {
        (None, _) => None,
        (Some(ms), Some(t)) if t <= 0.0 => Some((ms, MirostatKept::greedy(range.hi))),
        (Some(ms), dynamic) => {
            let draw_inv_t = dynamic.map_or(inv_t, |t| inv_temperature(t as f32));
            Some((ms, mirostat::narrow(y, range, draw_inv_t, ms, batch.vocab)?))
        }
    };
    let range = mirostat.map_or(range, |(_, m)| m.range);
    Ok(Some(Ranged { range, dynamic, mirostat }))
}

/// What a row's filters keep ([`range_of`]): the range, the dynamic temperature when the row
/// has one, and mirostat's settings and narrowed set when it is on.
struct Ranged {
    range: KeptRange,
    dynamic: Option<f64>,
    mirostat: Option<(mirostat::Mirostat, MirostatKept)>,
}

impl Ranged {
    /// The row's mu after drawing `token` whose value is `x` (mirostat rows only).
    fn mirostat_mu(&self, token: i32, x: impl Fn(usize) -> f32) -> Option<f32> {
        match self.mirostat {
            Some((ms, kept)) if token >= 0 => Some(ms.updated_mu(kept.surprise(x(token as usize)))),
            _ => None,
        }
    }
}

/// The 1/T a row drawn at `inv_t` races at with its dynamic temperature `dynamic`; `None`: a
/// temperature of 0 takes the first maximum of the kept tokens (`finish`), as llama.cpp's
/// temperature sampler does at `t <= 0`.
fn race_inv_t(inv_t: f32, dynamic: Option<f64>) -> Option<f32> {
    match dynamic {
        Some(t) if t <= 0.0 => None,
        dynamic => Some(dynamic.map_or(inv_t, |t| inv_temperature(t as f32))),
    }
}

/// [`race_in_range`] on an f32 row as given, `x` (block maxima `bmax`), with inline noise
/// `key`, without writing it out: the blocks holding no value above the range race where they
/// lie, and each block that does is copied (256 values) with those values at -inf and raced at
/// its place in the row ([`race_inline_at`]: the same keys). The race is the largest key, ties
/// to the lower token, so the best of the parts is the best of the copy the other path races;
/// the block maxima of the parts are the copy's, and so are the kept maximum and `finish`.
fn race_in_range_as_given(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    (x, bmax, has_nan): (&[f32], &[f32], bool),
    plan: RowPlan,
    key: u64,
) -> Result<Drawn> {
    let sc = summarize(bmax, f32::NEG_INFINITY, has_nan, plan);
    let range = if sc.top.is_finite() { range_of(k, (batch, r), (x, bmax, sc.top), plan)? } else { None };
    let (RowPlan::Sample { inv_t, noise, .. }, Some(ranged)) = (plan, range) else {
        return draw_scanned(k, (batch, r), (x, bmax, has_nan), plan, false, None);
    };
    let Ranged { range, dynamic, .. } = ranged;
    let kept_bmax = masked_block_maxima(k, x, bmax, range.hi)?;
    let kept = summarize(&kept_bmax, f32::NEG_INFINITY, has_nan, plan);
    let won = match race_inv_t(inv_t, dynamic) {
        None => None,
        Some(inv_t) => {
            let p = RaceParams { m: kept.top, inv_t, floor: range.lo };
            Some(race_below(k, x, (bmax, &kept_bmax), range.hi, p, (key, noise))?)
        }
    };
    let token = finish(k, x, &kept_bmax, &kept, won);
    let info = RowInfo { top: sc.top, floor: range.lo, processed: false };
    let mirostat_mu = ranged.mirostat_mu(token, |i| x[i]);
    Ok(Drawn { token, flags: sc.flags, info, logprobs_done: false, mirostat_mu })
}

/// The block maxima of `x` (block maxima `bmax`) with its values above `hi` set to -inf: those of
/// the blocks that hold such a value scanned again from a masked copy of the block.
fn masked_block_maxima(k: &Kernels, x: &[f32], bmax: &[f32], hi: f32) -> Result<Vec<f32>> {
    let mut kept = alloc::collect(bmax.iter().copied(), "block maxima below the range")?;
    let mut copy = [0.0; BLOCK];
    for (b, m) in kept.iter_mut().enumerate().filter(|(_, m)| **m > hi) {
        let block = masked_block(x, b, hi, &mut copy);
        block.scan(k, 0, block.len(), std::slice::from_mut(m));
    }
    Ok(kept)
}

/// Block `b` of `x` with its values above `hi` set to -inf, in `copy` (the last block may be
/// short).
fn masked_block<'c>(x: &[f32], b: usize, hi: f32, copy: &'c mut [f32; BLOCK]) -> &'c [f32] {
    let block = &x[b * BLOCK..((b + 1) * BLOCK).min(x.len())];
    for (c, &v) in copy.iter_mut().zip(block) {
        *c = if v > hi { f32::NEG_INFINITY } else { v };
    }
    &copy[..block.len()]
}

/// The race over `x` with its values above `hi` at -inf: runs of blocks whose maximum in `bmax`
/// is at most `hi` race in place (their maxima unchanged in `kept_bmax`), every other block from
/// its masked copy, each at its place in the row (`key`: the row's inline noise).
fn race_below(
    k: &Kernels,
    x: &[f32],
    (bmax, kept_bmax): (&[f32], &[f32]),
    hi: f32,
    p: RaceParams,
    (key, noise): (u64, RaceNoise),
) -> Result<Best> {
    let (mut best, mut copy) = (Best::NONE, [0.0; BLOCK]);
    let mut b = 0;
    while b < bmax.len() {
        if bmax[b] > hi {
            let block = masked_block(x, b, hi, &mut copy);
            best = best.merge(race_inline_at(k, block, &kept_bmax[b..b + 1], p, key, b * BLOCK)?);
            b += 1;
            continue;
        }
        // Not above `hi` (a NaN maximum too, as the test above reads it): the run is never empty.
        let run = bmax[b..].iter().take_while(|m| m.partial_cmp(&&hi) != Some(std::cmp::Ordering::Greater)).count();
        let (start, len) = (b * BLOCK, (run * BLOCK).min(x.len() - b * BLOCK));
        best = best.merge(x.race(k, start, len, &kept_bmax[b..b + run], p, noise)?);
        b += run;
    }
    Ok(best)
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
    let range = if sc.top.is_finite() { range_of(k, (batch, r), (&y[..], &bmax[..], sc.top), plan)? } else { None };
    let (RowPlan::Sample { inv_t, noise, .. }, Some(ranged)) = (plan, range) else {
        return draw_scanned(k, (batch, r), (&y[..], &bmax[..], has_nan), plan, processed, None);
    };
    let Ranged { range, dynamic, .. } = ranged;
    if range.hi < sc.top {
        for x in y.iter_mut().filter(|x| **x > range.hi) {
            *x = f32::NEG_INFINITY;
        }
        y.scan(k, 0, y.len(), bmax);
    }
    let kept = summarize(bmax, f32::NEG_INFINITY, has_nan, plan);
    let won = match race_inv_t(inv_t, dynamic) {
        None => None,
        Some(inv_t) => Some(y.race(k, 0, y.len(), bmax, RaceParams { m: kept.top, inv_t, floor: range.lo }, noise)?),
    };
    let token = finish(k, &y[..], bmax, &kept, won);
    let info = RowInfo { top: sc.top, floor: range.lo, processed };
    let mirostat_mu = ranged.mirostat_mu(token, |i| y[i]);
    Ok(Drawn { token, flags: sc.flags, info, logprobs_done: false, mirostat_mu })
}
