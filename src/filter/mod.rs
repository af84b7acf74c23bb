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

pub(crate) mod chain;
pub(crate) mod llama;
mod min_p;
pub(crate) mod mirostat;
mod top_k;
pub(crate) mod top_n_sigma;
pub(crate) mod top_p;
mod typical;

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
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Filters {
    /// 0: off.
    pub top_k: usize,
    /// 1: off.
    pub top_p: f64,
    /// 0: off.
    pub min_p: f64,
    /// 0: off (a row's value <= 0 is off).
    pub top_n_sigma: f64,
    /// Top-p, min-p, typical and XTC keep at least this many tokens (0 and 1: no effect).
    pub min_keep: usize,
    /// 1: off.
    pub typical_p: f64,
    /// XTC is on when `xtc_probability > 0` and `xtc_threshold <= 0.5`.
    pub xtc_probability: f64,
    pub xtc_threshold: f64,
    /// 0: off.
    pub dynatemp_range: f64,
    pub dynatemp_exponent: f64,
    /// The stages in the caller's order, when they follow neither fixed order (drawn by
    /// [`chain::kept_range`]).
    pub chain: Option<chain::Chain>,
    /// The fixed order whose path draws the row, when the call gives an order its stages follow.
    pub preset: Option<crate::config::FilterOrder>,
    /// Mirostat, which ends the row's chain (its final sampler), when on.
    pub mirostat: Option<mirostat::Mirostat>,
}

impl Default for Filters {
    fn default() -> Self {
        Filters::OFF
    }
}

impl Filters {
    /// Every filter off.
    pub(crate) const OFF: Filters = Filters {
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        top_n_sigma: 0.0,
        min_keep: 0,
        typical_p: 1.0,
        xtc_probability: 0.0,
        xtc_threshold: 1.0,
        dynatemp_range: 0.0,
        dynatemp_exponent: 1.0,
        chain: None,
        preset: None,
        mirostat: None,
    };

    /// The filters of row `r`, or `None` if none is on.
    pub(crate) fn of(batch: &Batch, r: usize) -> Option<Filters> {
        let k = batch.top_k.map_or(0, |k| k[r]);
        let top_k = if k <= 0 || k as usize >= batch.vocab { 0 } else { k as usize };
        let top_p = batch.top_p.map_or(1.0, |p| p[r] as f64);
        let min_p = batch.min_p.map_or(0.0, |p| p[r] as f64);
        let top_n_sigma = batch.top_n_sigma.map_or(0.0, |n| (n[r] as f64).max(0.0));
        let min_keep = batch.min_keep.map_or(0, |n| n[r].max(0) as usize);
        let typical_p = batch.typical_p.map_or(1.0, |p| p[r] as f64);
        let xtc_probability = batch.xtc_probability.map_or(0.0, |p| p[r] as f64);
        let xtc_threshold = batch.xtc_threshold.map_or(1.0, |t| t[r] as f64);
        let dynatemp_range = batch.dynatemp_range.map_or(0.0, |d| d[r] as f64);
        let dynatemp_exponent = batch.dynatemp_exponent.map_or(1.0, |e| e[r] as f64);
        let mut f = Filters {
            top_k,
            top_p,
            min_p,
            top_n_sigma,
            min_keep,
            typical_p,
            xtc_probability,
            xtc_threshold,
            dynatemp_range,
            dynatemp_exponent,
            chain: None,
            preset: None,
            mirostat: mirostat::Mirostat::of(batch, r),
        };
        if let Some(order) = batch.order {
            match chain::route(order, &f, batch.temperature(r)) {
                chain::Route::Preset(p) => f.preset = Some(p),
                chain::Route::Custom(c) => f.chain = Some(c),
            }
        }
        // min_keep alone filters nothing: it only holds the other filters back.
        (top_k != 0 || top_p < 1.0 || min_p > 0.0 || top_n_sigma > 0.0 || f.keeps_range()).then_some(f)
    }

    /// Whether XTC is on (llama.cpp: a probability > 0 and a threshold <= 0.5).
    pub(crate) fn xtc_on(&self) -> bool {
        self.xtc_probability > 0.0 && self.xtc_threshold <= 0.5
    }

    /// Whether the row keeps a range of values rather than a top set (typical sampling or XTC),
    /// or sets its temperature from what its filters keep (a dynamic temperature), or ends its
    /// chain with mirostat: its filters are computed by [`llama::kept_range`], its draw by
    /// `draw::range`.
    pub(crate) fn keeps_range(&self) -> bool {
        self.mirostat.is_some()
            || self.typical_p < 1.0
            || self.xtc_on()
            || self.dynatemp_range > 0.0
            || self.chain.is_some_and(|c| !c.floor_only())
    }
}

/// Whether row `r` of `batch` has XTC on (its coin is drawn from the row's key).
pub(crate) fn xtc_on(batch: &Batch, r: usize) -> bool {
    Filters::of(batch, r).is_some_and(|f| f.xtc_on())
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
    Ok(floor_and_candidates(k, v, bmax, (m, inv_t), f, false)?.0)
}

/// [`floor_of`], and top-k's candidates when it has top-k: a superset of the row's values
/// `>= floor`, all finite, in index order. `narrow`: top-k gathers only values at or above the
/// floor of the filters before it ([`top_k::kth_largest_at_least`]; the same floor).
fn floor_and_candidates<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    (m, inv_t): (f32, f32),
    f: Filters,
    narrow: bool,
) -> Result<(f32, Option<Vec<f32>>)> {
    // The caller's order of stages, one floor (`Chain::floor_only`; other chains keep a range).
    if let Some(chain) = f.chain {
        return Ok((chain::floor(k, v, bmax, (m, inv_t), f, chain)?, None));
    }
    let mut floor = f32::NEG_INFINITY;
    // min_keep's value: the min_keep-th largest finite value, -inf when the row has fewer
    // (min-p and top-p keep every token at or above it); `None` when min_keep filters nothing.
    let keep_floor = if f.min_keep > 1 && (f.min_p > 0.0 || f.top_p < 1.0) {
        Some(top_k::kth_largest(k, v, bmax, f.min_keep)?.map_or(f32::NEG_INFINITY, |(kth, _)| kth))
    } else {
        None
    };
    if f.min_p > 0.0 {
        floor = min_p::floor(m, inv_t, f.min_p);
        if let Some(keep) = keep_floor {
            floor = floor.min(keep);
        }
    }
    // Both keep a top set relative to the maximum, so their order does not matter; top-k and
    // top-p then work on what they left.
    if f.top_n_sigma > 0.0 {
        floor = floor.max(top_n_sigma::floor(v, m, f.top_n_sigma));
    }
    let mut top_k_candidates = None;
    if f.top_k > 0 {
        let found = if narrow {
            top_k::kth_largest_at_least(k, v, bmax, f.top_k, floor)?
        } else {
            top_k::kth_largest(k, v, bmax, f.top_k)?
        };
        if let Some((kth, cand)) = found {
            floor = floor.max(kth);
            top_k_candidates = Some(cand);
        }
    }
    if f.top_p < 1.0 {
        let before = floor;
        floor = match &top_k_candidates {
            Some(cand) => top_p::floor_of_candidates(cand, floor, m, inv_t, f.top_p)?,
            None => top_p::floor(k, v, bmax, m, inv_t, floor, f.top_p)?,
        };
        // What top-p is given is a top set, so its min_keep largest are the row's (or all of it).
        if let Some(keep) = keep_floor {
            floor = floor.min(keep.max(before));
        }
    }
    Ok((floor, top_k_candidates))
}

/// The floor of the filters before typical sampling (min-p, top-nσ, top-k) of a row whose
/// filters `f` keep a range ([`Filters::keeps_range`]), and the range kept by the rest
/// ([`llama::kept_range`]); `xtc_applies`: the row's XTC coin fell below its probability.
pub(crate) fn kept_range<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    (m, inv_t): (f32, f32),
    f: Filters,
    xtc_applies: bool,
) -> Result<llama::KeptRange> {
    if f.typical_p >= 1.0 {
        // XTC after top sets only: their floor (top-p's too), then XTC over what it keeps,
        // without sorting it.
        let (floor, cand) = floor_and_candidates(k, v, bmax, (m, inv_t), f, true)?;
        return llama::xtc_above(k, (v, bmax, cand), (m, inv_t, floor), f, xtc_applies);
    }
    let before_typical = Filters { top_p: 1.0, typical_p: 1.0, xtc_probability: 0.0, ..f };
    let (floor, cand) = floor_and_candidates(k, v, bmax, (m, inv_t), before_typical, true)?;
    llama::kept_range(k, (v, bmax, cand), (m, inv_t, floor), f, xtc_applies)
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
    if (f.top_k == 0 && f.top_p >= 1.0) || f.top_n_sigma > 0.0 || f.min_keep > 1 || f.keeps_range() || f.chain.is_some()
    {
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

/// Whether the filters `f` of a row whose mass is not in a few blocks may be decided after the
/// race from the row's mass ([`judge_by_mass`]): top-p without top-k. Such a row's
/// top-p threshold may lie deep in a heavy tail (tens of thousands of kept tokens, each
/// gathered with an f64 weight), while the race's winner is kept with probability `top_p`.
pub(crate) fn decided_by_mass(f: Filters) -> bool {
    f.top_k == 0 && f.top_p < 1.0
}

/// The top-p threshold of filters `f` (after min-p's `floor`, at `inv_t`) when it is found from
/// the row's few heavy blocks ([`top_p::found_in_few_blocks`]), so that computing it costs less
/// than judging a winner from the row's mass: then it is the floor of the filters, the one
/// [`floor_of`] gives. `None` without top-p, with top-k, or when the heavy blocks do not give it.
pub(crate) fn top_p_in_few_blocks<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    around: (f32, f32, f32),
    f: Filters,
) -> Result<Option<f32>> {
    if !decided_by_mass(f) {
        return Ok(None);
    }
    top_p::found_in_few_blocks(k, v, bmax, around, f.top_p)
}

/// Whether top-p alone (filters `f`, [`decided_by_mass`]; at `inv_t`, after min-p's `floor`)
/// surely keeps (`Some(true)`) or surely drops (`Some(false)`) a token of value `x` of the row as
/// given `v` (`floor <= x <= m`), from a pass of f32 mass over the row per tier (the mass above
/// `x` and Z at once; Z's bounds kept in `z_known` for the row's next token)
/// ([`top_p::judge_by_mass`]). `None`: not decided here.
pub(crate) fn judge_by_mass<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    (m, inv_t, floor): (f32, f32, f32),
    f: Filters,
    x: f32,
    z_known: &mut top_p::ZBounds,
) -> Result<Option<bool>> {
    if !decided_by_mass(f) {
        return Ok(None);
    }
    top_p::judge_by_mass(k, v, bmax, (m, inv_t, floor), f.top_p, x, z_known)
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
    let f = Filters { top_k, top_p: top_p as f64, min_p: min_p as f64, top_n_sigma, ..Filters::OFF };
    floor_of(crate::kernels::kernels(level), x, &bmax, m, crate::batch::inv_temperature(t), f)
        .expect("the test rows fit in memory")
}

/// [`kept_floor_at`] at the best level of this CPU.
#[cfg(feature = "internals")]
pub fn kept_floor(x: &[f32], t: f32, top_k: i32, top_p: f32, min_p: f32) -> f32 {
    kept_floor_at(crate::kernels::best_level(), x, t, top_k, top_p, min_p)
}

/// llama.cpp's filters of one row for [`kept_range_at`]: `min_keep`, typical sampling and XTC
/// (off: 0, 1.0, 0.0 and 1.0), with top-k, top-p and min-p (off: 0, 1.0 and 0.0).
#[cfg(feature = "internals")]
#[derive(Clone, Copy, Debug)]
pub struct LlamaFilters {
    /// top-k (<= 0 or >= vocab: off).
    pub top_k: i32,
    /// top-p in (0, 1].
    pub top_p: f32,
    /// min-p in [0, 1].
    pub min_p: f32,
    /// min_keep >= 0.
    pub min_keep: i32,
    /// typical p in (0, 1].
    pub typical_p: f32,
    /// XTC probability in [0, 1]; the test seam applies XTC whenever it is on.
    pub xtc_probability: f32,
    /// XTC threshold in [0, 1].
    pub xtc_threshold: f32,
}

/// Test seam: the values `[lo, hi]` the filters `lf` keep of one f32 row at temperature `t`
/// (> 0) with the kernels of `level` (the kept set is the finite values in it), XTC applied
/// when on. For a row whose filters keep a top set, `hi` is the row's maximum and `lo` its
/// floor. `None` when the row has no finite maximum.
#[cfg(feature = "internals")]
pub fn kept_range_at(level: crate::SimdLevel, x: &[f32], t: f32, lf: LlamaFilters) -> Option<(f32, f32)> {
    let bmax: Vec<f32> =
        x.chunks(BLOCK).map(|c| c.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })).collect();
    let m = bmax.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a }) + 0.0;
    if !m.is_finite() {
        return None;
    }
    let f = Filters {
        top_k: if lf.top_k <= 0 || lf.top_k as usize >= x.len() { 0 } else { lf.top_k as usize },
        top_p: lf.top_p as f64,
        min_p: lf.min_p as f64,
        min_keep: lf.min_keep.max(0) as usize,
        typical_p: lf.typical_p as f64,
        xtc_probability: lf.xtc_probability as f64,
        xtc_threshold: lf.xtc_threshold as f64,
        ..Filters::OFF
    };
    let (k, inv_t) = (crate::kernels::kernels(level), crate::batch::inv_temperature(t));
    Some(if f.keeps_range() {
        let r = kept_range(k, x, &bmax, (m, inv_t), f, true).expect("the test rows fit in memory");
        (r.lo, r.hi)
    } else {
        (floor_of(k, x, &bmax, m, inv_t, f).expect("the test rows fit in memory"), m)
    })
}
