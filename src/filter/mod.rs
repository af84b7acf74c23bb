//! min-p, top-k and top-p without sorting the vocabulary.
//!
//! Every filter keeps a set `{i : x_i >= θ}` (ties kept), and renormalising does not change the
//! order of the tokens, so the composition (top-nσ and min-p, then top-k, then top-p, each on what the
//! previous one left) is one threshold: the race's `RaceParams::floor`.
//!
//! Probabilities are `p_i ∝ w_i = exp((x_i - m) * inv_t)` computed in f64 by the one f64 weight
//! of the crate ([`crate::mass::weight64`]; `m` the row's finite maximum, `inv_t` the f32 `1/T`
//! of the race), over the finite logits; NaN and -inf are never kept.
//!
//! - [`top_n_sigma`]: keep `x_i >= max - n * sigma` over the finite logits (in logit units, so
//!   the same before and after the temperature): one f64 pass for the mean, one for the
//!   variance.
//! - [`min_p`]: keep `w_i >= min_p` (that is `p_i >= min_p * p_max`; `w` is 1 at the maximum),
//!   found by a bisection over the values, no pass over the row.
//! - [`top_k`]: the k-th largest finite logit, selected among the values above a bound taken
//!   from the block maxima.
//! - [`top_p`]: the smallest set of most probable tokens whose mass reaches `top_p` of the mass
//!   left; after a top-k the few candidates are sorted, otherwise the tokens above a cut are
//!   gathered with exact weights and the mass below the cut is bounded by SIMD kernels until the
//!   bounds decide (or computed in f64 when they do not). Tokens tied with the threshold stay.
//!
//! The thresholds do not depend on the SIMD level (every mass kernel gives bit-identical sums on
//! every level) or on the number of threads.

mod min_p;
mod top_k;
pub(crate) mod top_n_sigma;
pub(crate) mod top_p;

use crate::batch::Batch;
use crate::error::Result;
use crate::kernels::{Kernels, BLOCK};
use crate::row::RowValues;

/// Room for every value of the blocks whose maximum reaches `lo` (of a row of `n` values), and
/// for the SIMD gathers' writes past the end (`gather_block` reserves `BLOCK + 64`).
fn room(bmax: &[f32], lo: f32, n: usize) -> usize {
    let blocks = bmax.iter().filter(|&&b| b >= lo).count();
    (blocks * BLOCK).min(n) + BLOCK + 64
}

/// One row's filter settings, already normalised: `None`/off values removed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Filters {
    /// 0: off.
    pub top_k: usize,
    /// 1: off.
    pub top_p: f64,
    /// 0: off.
    pub min_p: f64,
    /// 0: off (a row's value <= 0 is off).
    pub top_n_sigma: f64,
}

impl Filters {
    /// The filters of row `r`, or `None` if none is on.
    pub(crate) fn of(batch: &Batch, r: usize) -> Option<Filters> {
        let k = batch.top_k.map_or(0, |k| k[r]);
        let top_k = if k <= 0 || k as usize >= batch.vocab { 0 } else { k as usize };
        let top_p = batch.top_p.map_or(1.0, |p| p[r] as f64);
        let min_p = batch.min_p.map_or(0.0, |p| p[r] as f64);
        let top_n_sigma = batch.top_n_sigma.map_or(0.0, |n| (n[r] as f64).max(0.0));
        let f = Filters { top_k, top_p, min_p, top_n_sigma };
        (top_k != 0 || top_p < 1.0 || min_p > 0.0 || top_n_sigma > 0.0).then_some(f)
    }
}

/// The floor of a sampling row `v` with block maxima `bmax` and finite maximum `m` under
/// filters `f`: the race keeps `x >= floor`.
pub(crate) fn floor_of<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    m: f32,
    inv_t: f32,
    f: Filters,
) -> Result<f32> {
    let mut floor = f32::NEG_INFINITY;
    if f.min_p > 0.0 {
        floor = min_p::floor(m, inv_t, f.min_p);
    }
    // Both keep a top set relative to the maximum, so their order does not matter; top-k and
    // top-p then work on what they left.
    if f.top_n_sigma > 0.0 {
        floor = floor.max(top_n_sigma::floor(v, m, f.top_n_sigma));
    }
    let mut top_k_candidates = None;
    if f.top_k > 0 {
        if let Some((kth, cand)) = top_k::kth_largest(k, v, bmax, f.top_k)? {
            floor = floor.max(kth);
            top_k_candidates = Some(cand);
        }
    }
    if f.top_p < 1.0 {
        floor = match top_k_candidates {
            Some(cand) => top_p::floor_of_candidates(&cand, floor, m, inv_t, f.top_p)?,
            None => top_p::floor(k, v, bmax, m, inv_t, floor, f.top_p)?,
        };
    }
    Ok(floor)
}

/// Most blocks within a factor 1000 of the maximum's weight for the filters to be decided
/// after the race ([`surely_keeps`]): a row whose mass sits in a few blocks (most rows of a
/// language model), whose winner is nearly always one of the few tokens at the top.
const FEW_HEAVY_BLOCKS: usize = 16;

/// Whether at most [`FEW_HEAVY_BLOCKS`] blocks have a maximum within a factor of about 1000 of
/// the weight of the row's maximum `m` (at `inv_t`). Only a guess of which way is cheaper: both
/// ways give the same token.
pub(crate) fn few_heavy_blocks(bmax: &[f32], m: f32, inv_t: f32) -> bool {
    let near = m - 6.91 / inv_t;
    bmax.iter().filter(|&&b| b >= near).count() <= FEW_HEAVY_BLOCKS
}

/// For a row with top-k or top-p (with or without min-p): min-p's floor (-inf when off). Such a
/// row may race over what min-p keeps and decide top-k and top-p after the race, for its winner
/// alone ([`surely_keeps`]). Not a row with top-nσ, whose floor reads the whole row anyway.
pub(crate) fn decided_after_race(batch: &Batch, r: usize, m: f32, inv_t: f32) -> Option<(Filters, f32)> {
    let f = Filters::of(batch, r)?;
    if (f.top_k == 0 && f.top_p >= 1.0) || f.top_n_sigma > 0.0 {
        return None;
    }
    let floor = if f.min_p > 0.0 { min_p::floor(m, inv_t, f.min_p) } else { f32::NEG_INFINITY };
    Some((f, floor))
}

/// The finite values `>= lo` (`lo` finite) of a row, in any order: the row as given
/// ([`row_values_ge`]) or a row's processed values (`RowStep::values_ge`).
pub(crate) type ValuesGe<'a> = &'a dyn Fn(f32) -> Result<Vec<f32>>;

/// [`ValuesGe`] of a row as given, with block maxima `bmax`: the SIMD gather.
pub(crate) fn row_values_ge<V: RowValues + ?Sized>(k: &Kernels, v: &V, bmax: &[f32], lo: f32) -> Result<Vec<f32>> {
    top_k::gather(k, v, bmax, lo)
}

/// Whether top-k and top-p (filters `f`; at `inv_t`, after min-p's `floor`) surely keep a token
/// of value `x` (`floor <= x <= m`, the row's finite maximum), whose row's values at or above a
/// bound `values_ge` gives (`bmax`: upper bounds of its blocks' values): top-k keeps it when
/// fewer than k values lie above it; top-p, over what top-k keeps, when the mass above it is
/// below top_p times the mass at or above it ([`top_p::surely_keeps`]: every token at or above
/// a token top-k keeps is kept by top-k too, so that mass bounds top-p's Z from below).
/// `false`: not decided here. `v` is the row as given (its kernels weigh the values).
pub(crate) fn surely_keeps<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    (m, inv_t, floor): (f32, f32, f32),
    f: Filters,
    (x, values_ge): (f32, ValuesGe),
) -> Result<bool> {
    if f.top_k > 0 && !top_k::keeps(bmax, f.top_k, (x, values_ge))? {
        return Ok(false);
    }
    Ok(f.top_p >= 1.0 || top_p::surely_keeps(k, v, bmax, (m, inv_t, floor), f.top_p, (x, values_ge))?)
}

/// The floor of row `r` of `batch` (values `v`, block maxima `bmax`, finite maximum `m`), or
/// -inf when it has no filter.
pub(crate) fn row_floor<V: RowValues + ?Sized>(
    k: &Kernels,
    batch: &Batch,
    r: usize,
    v: &V,
    bmax: &[f32],
    m: f32,
    inv_t: f32,
) -> Result<f32> {
    Filters::of(batch, r).map_or(Ok(f32::NEG_INFINITY), |f| floor_of(k, v, bmax, m, inv_t, f))
}

/// Test seam: the floor the filters give one f32 row at temperature `t` (> 0) with the kernels
/// of `level`: the kept set is `{i : x_i >= floor}` among the finite logits. -inf when nothing is
/// filtered or the row has no finite maximum.
#[cfg(feature = "internals")]
pub fn kept_floor_at(level: crate::SimdLevel, x: &[f32], t: f32, top_k: i32, top_p: f32, min_p: f32) -> f32 {
    kept_floor_with_sigma_at(level, x, t, (top_k, top_p, min_p), 0.0)
}

/// [`kept_floor_at`] with top-nσ too (`top_n_sigma <= 0`: off).
#[cfg(feature = "internals")]
pub fn kept_floor_with_sigma_at(
    level: crate::SimdLevel,
    x: &[f32],
    t: f32,
    (top_k, top_p, min_p): (i32, f32, f32),
    top_n_sigma: f32,
) -> f32 {
    let bmax: Vec<f32> =
        x.chunks(BLOCK).map(|c| c.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })).collect();
    let m = bmax.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a }) + 0.0; // as `draw::summarize`
    if !m.is_finite() {
        return f32::NEG_INFINITY;
    }
    let top_k = if top_k <= 0 || top_k as usize >= x.len() { 0 } else { top_k as usize };
    let top_n_sigma = (top_n_sigma as f64).max(0.0);
    let f = Filters { top_k, top_p: top_p as f64, min_p: min_p as f64, top_n_sigma };
    floor_of(crate::kernels::kernels(level), x, &bmax, m, crate::batch::inv_temperature(t), f)
        .expect("the test rows fit in memory")
}

/// [`kept_floor_at`] at the best level of this CPU.
#[cfg(feature = "internals")]
pub fn kept_floor(x: &[f32], t: f32, top_k: i32, top_p: f32, min_p: f32) -> f32 {
    kept_floor_at(crate::kernels::best_level(), x, t, top_k, top_p, min_p)
}
