//! top-p without sorting the vocabulary.
//!
//! top-p needs the logit θ of the first token (by logit, descending) whose cumulative mass
//! reaches `top_p * Z`. A cut `vc <= θ` is found, every kept token `x >= vc` is gathered with
//! its exact f64 weight, and Z is bounded by the cheapest tier that decides (`crate::mass`): θ
//! is known when the walk down the gathered tokens reaches `top_p * Z_lo` and `top_p * Z_hi` at
//! the same logit. Otherwise the next tier runs, up to the exact one, whose value decides. So the
//! threshold is what exact arithmetic gives (the exact tier: float64, with its rounding), on
//! every SIMD level and thread count.
//!
//! - [`peaked`], rows whose mass sits in the maxima of at most 256 blocks: cheap bounds of every
//!   block; the heavy blocks by maximum, descending, get their f32-exp mass until their maxima
//!   alone reach `top_p` of the upper bound of Z, which proves `θ >= vc`, the last maximum
//!   visited (every token `>= vc` lies in a visited block). Tiers: cheap bounds for the other
//!   blocks, their f32-exp mass, the f64 mass of the visited blocks with the f32-exp bounds of
//!   the others, the f64 Z.
//! - [`general`]: `vc` from a sample of blocks (high enough that the gathered tokens are few, low
//!   enough that they reach the target with high probability); one pass gathers the tokens
//!   `>= vc` and sums the f32-exp mass R of those below, block by block. Tiers: the f32-exp
//!   bounds of R, the f64 R. When the gathered tokens do not reach the target after all, θ is
//!   below `vc`: the blocks holding most of R are weighed token by token until their heaviest
//!   tokens make up what is missing, which gives a second cut below θ ([`refine`]); a gather
//!   (no exps) of the tokens between the two cuts, and the same tiers, decide. Every kept token
//!   is gathered only when not even the whole of R is shown to reach the target (rounding, with
//!   top-p within 1e-4 of 1).
//! - after a top-k, the few candidates are sorted ([`floor_of_candidates`]).

use crate::alloc;
use crate::error::Result;
use crate::kernels::{DtypeKernels, Kernels, MassKind, MassParams, BLOCK};
use crate::mass::{cheap_bounds, exp_bounds, sum, weight64, RowMass, TINY};
use crate::row::RowValues;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How top-p thresholds were decided, for benchmarks and tests: [peaked path with cheap bounds,
/// f32-exp bounds, exact f64 mass (of the heavy blocks or of the row), every token gathered,
/// the general path's second cut].
static TIERS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

fn count(tier: usize) {
    TIERS[tier].fetch_add(1, Relaxed);
}

/// How many top-p thresholds (without top-k) each tier decided since the start: cheap bounds,
/// f32-exp bounds, the exact f64 mass, every token gathered; and how many of those the general
/// path decided at its second cut (counted in the tiers too).
#[cfg(feature = "internals")]
pub fn tier_counts() -> [u64; 5] {
    std::array::from_fn(|i| TIERS[i].load(Relaxed))
}

thread_local! {
    /// Tokens gathered with exact weights by this thread's top-p thresholds (what grows when a
    /// cut is too low), for tests: unlike the tier counters, other threads do not move it.
    static GATHERED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many tokens the top-p thresholds computed on this thread have gathered with exact
/// weights since it started.
#[cfg(feature = "internals")]
pub fn gathered_on_this_thread() -> u64 {
    GATHERED.with(|g| g.get())
}

thread_local! {
    /// Race winners that [`judge_by_mass`] showed top-p drops on this thread, for tests.
    static DROPPED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

thread_local! {
    /// Race winners that [`judge_by_mass`] decided from refined cheap bounds on this thread.
    static REFINED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many race winners this thread's draws kept or dropped from the cheap bounds refined by
/// the f32 exps of the heaviest blocks ([`judge_by_mass`]; `RowMass::split_refined`), for tests.
#[cfg(feature = "internals")]
pub fn refined_on_this_thread() -> u64 {
    REFINED.with(|d| d.get())
}

/// How many race winners this thread's draws found that top-p surely drops, from the mass
/// ([`judge_by_mass`]: each is followed by a race over the tokens above it).
#[cfg(feature = "internals")]
pub fn dropped_on_this_thread() -> u64 {
    DROPPED.with(|d| d.get())
}

/// Top blocks sampled exactly for the cut of a row that is not peaked.
const TOP_BLOCKS: usize = 16;
/// Most blocks visited for a peaked row.
const PEAKED_BLOCKS: usize = 256;
/// Candidates sorted directly; more go through a histogram first.
const SMALL: usize = 256;
/// Buckets of that histogram.
const BUCKETS: usize = 2048;

/// Every kept token `x >= vc`, with its exact weight.
fn gather<V: RowValues + ?Sized>(r: &RowMass<V>, bmax: &[f32], vc: f32) -> Result<Candidates> {
    let lo = vc.max(r.floor).max(-f32::MAX);
    let mut xs = alloc::with_capacity(super::room(bmax, lo, r.n), "top-p candidates")?;
    // SAFETY: the row has n values; bmax one per block.
    unsafe { (r.dk.gather_ge)(r.v.ptr(), r.n, bmax, lo, &mut xs) };
    let ws = r.weights(&xs)?;
    Ok(Candidates::new(lo, r.m, xs, ws))
}

/// The kept tokens below a cut: bounds of their mass, and each block's f32-exp mass of them
/// (empty when nothing below the cut weighs 2^-125 or more).
struct Below {
    bounds: (f64, f64),
    blocks: Vec<f64>,
}

/// Every kept token `x >= vc` with its exact weight, and the mass of the kept tokens below
/// (one pass: the f32-exp kernel that gathers).
fn gather_below<V: RowValues + ?Sized>(r: &RowMass<V>, bmax: &[f32], vc: f32) -> Result<(Candidates, Below)> {
    let lo = vc.max(r.floor).max(-f32::MAX);
    if lo <= r.mp.lo {
        // Nothing kept below but weights under 2^-125 (or nothing at all).
        let below = if lo <= r.floor.max(-f32::MAX) { 0.0 } else { r.count() as f64 * TINY };
        return Ok((gather(r, bmax, vc)?, Below { bounds: (0.0, below), blocks: Vec::new() }));
    }
    let mut xs = alloc::with_capacity(super::room(bmax, lo, r.n), "top-p candidates")?;
    let mut out = alloc::filled(r.n.div_ceil(BLOCK), 0.0, "top-p block masses")?;
    let mp = MassParams { cut: lo, ..r.mp };
    // SAFETY: the row has n values; out and bmax one per block.
    unsafe { (r.dk.mass_gather)(r.v.ptr(), r.n, bmax, mp, &mut out, &mut xs) };
    let ws = r.weights(&xs)?;
    let bounds = exp_bounds(sum(&out), r.count());
    Ok((Candidates::new(lo, r.m, xs, ws), Below { bounds, blocks: out }))
}

/// Gathered tokens (`x >= lo`, row order) and their exact weights.
struct Candidates {
    lo: f32,
    /// The row's maximum (the largest candidate).
    top: f32,
    xs: Vec<f32>,
    ws: Vec<f64>,
    total: f64,
    /// (x, w) by x descending, for few candidates.
    sorted: Option<Vec<(f32, f64)>>,
    /// For many: each one's bucket (by logit, descending), the mass of each bucket, and of each
    /// group of 16 buckets.
    hist: Option<Hist>,
}

type Hist = (Vec<u16>, Vec<f64>, Vec<f64>);

impl Candidates {
    fn new(lo: f32, top: f32, xs: Vec<f32>, ws: Vec<f64>) -> Candidates {
        GATHERED.with(|g| g.set(g.get() + xs.len() as u64));
        let total = sum(&ws);
        Candidates { lo, top, xs, ws, total, sorted: None, hist: None }
    }
}

/// Buckets uniform in logit over `[low, top]`, the span of the candidates (not the cut below
/// them, which may be -f32::MAX: every candidate would share bucket 0 and be sorted), the
/// largest logits in bucket 0 (the bucket is monotone in x, which is all the walk needs), and
/// the mass of each bucket.
fn histogram(xs: &[f32], ws: &[f64], top: f32) -> Result<Hist> {
    let low = xs.iter().fold(top, |a, &x| if x < a { x } else { a });
    let span = top as f64 - low as f64;
    let k = if span > 0.0 { (((BUCKETS - 1) as f64 / span) as f32).min(f32::MAX) } else { 0.0 };
    let last = (BUCKETS - 1) as f32;
    let idx = alloc::collect(
        xs.iter().map(|&x| {
            let b = (top - x) * k;
            let b = if b < last { b } else { last };
            // SAFETY: low <= x <= top, so b is in [0, last].
            unsafe { b.to_int_unchecked::<i32>() as u16 }
        }),
        "top-p histogram",
    )?;
    let mut mass = vec![0f64; BUCKETS];
    for (&b, &w) in idx.iter().zip(ws) {
        mass[b as usize] += w;
    }
    let group = mass.chunks(16).map(sum).collect();
    Ok((idx, mass, group))
}

/// What a walk down the candidates found.
#[derive(Debug, PartialEq)]
enum Walk {
    /// The threshold.
    Theta(f32),
    /// The bounds of the target straddle two logits.
    Uncertain,
    /// The candidates' mass is surely below the target: the threshold is below `lo`.
    Below,
}

fn desc(a: &(f32, f64), b: &(f32, f64)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0)
}

/// The logits at which `cum` (from `start`, down `sorted`) first reaches `t_lo` and `t_hi`
/// (the last logit when it does not).
fn crossings(sorted: &[(f32, f64)], start: f64, t_lo: f64, t_hi: f64) -> (f32, f32) {
    let last = sorted.last().map_or(f32::NEG_INFINITY, |s| s.0);
    let (mut x_lo, mut cum) = (None, start);
    for &(x, w) in sorted {
        cum += w;
        if x_lo.is_none() && cum >= t_lo {
            x_lo = Some(x);
        }
        if cum >= t_hi {
            return (x_lo.unwrap_or(x), x);
        }
    }
    (x_lo.unwrap_or(last), last)
}

impl Candidates {
    /// The threshold if the target `top_p * Z` lies in `[t_lo, t_hi]`.
    fn walk(&mut self, t_lo: f64, t_hi: f64) -> Result<Walk> {
        if self.total < t_lo {
            return Ok(Walk::Below);
        }
        if self.total < t_hi {
            return Ok(Walk::Uncertain);
        }
        let (x_lo, x_hi) = if self.xs.len() <= SMALL {
            let sorted = self.sorted.get_or_insert_with(|| {
                // At most SMALL elements.
                let mut s: Vec<(f32, f64)> = self.xs.iter().copied().zip(self.ws.iter().copied()).collect();
                s.sort_unstable_by(desc);
                s
            });
            crossings(sorted, 0.0, t_lo, t_hi)
        } else {
            if self.hist.is_none() {
                self.hist = Some(histogram(&self.xs, &self.ws, self.top)?);
            }
            let Some((idx, mass, group)) = &self.hist else { unreachable!("made above") };
            // Skip whole groups of 16 buckets while the target is beyond them.
            let (mut cum, mut b) = (0f64, 0);
            while b + 16 < BUCKETS && cum + group[b / 16] < t_lo {
                cum += group[b / 16];
                b += 16;
            }
            let (mut b_lo, mut b_hi, mut start) = (BUCKETS, BUCKETS - 1, 0f64);
            while b < BUCKETS {
                let w = mass[b];
                if b_lo == BUCKETS && cum + w >= t_lo {
                    (b_lo, start) = (b, cum);
                }
                if cum + w >= t_hi {
                    b_hi = b;
                    break;
                }
                cum += w;
                b += 1;
            }
            if b_lo == BUCKETS {
                b_lo = b_hi;
                start = cum;
            }
            let (b_lo, span) = (b_lo as u16, (b_hi - b_lo) as u16);
            let hit = |b: u16| b.wrapping_sub(b_lo) <= span;
            let mut inside: Vec<(f32, f64)> = Vec::new();
            for (c, chunk) in idx.chunks(32).enumerate() {
                // Few candidates are in the buckets sought: most chunks have none.
                if chunk.iter().fold(false, |a, &b| a | hit(b)) {
                    alloc::reserve(&mut inside, chunk.len(), "top-p candidates near the threshold")?;
                    for (j, &b) in chunk.iter().enumerate() {
                        if hit(b) {
                            inside.push((self.xs[c * 32 + j], self.ws[c * 32 + j]));
                        }
                    }
                }
            }
            if inside.len() > 4096 && span > 0 {
                return Ok(Walk::Uncertain);
            }
            inside.sort_unstable_by(desc);
            crossings(&inside, start, t_lo, t_hi)
        };
        Ok(if x_lo == x_hi { Walk::Theta(x_lo) } else { Walk::Uncertain })
    }
}

/// The top-p threshold of a row with finite maximum `m` among the tokens `x >= floor`.
pub(super) fn floor<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    m: f32,
    inv_t: f32,
    floor: f32,
    top_p: f64,
) -> Result<f32> {
    match RowMass::new(k, v, m, inv_t, floor) {
        Some(r) => match peaked(&r, bmax, top_p)? {
            Some(x) => Ok(x),
            None => general(&r, bmax, &top_blocks(bmax), top_p),
        },
        None => {
            let r = RowF64 { k, dk: V::kernels(k), v, m, inv_t, floor };
            full(r.gather_all(bmax)?, top_p)
        }
    }
}

/// Top-p's threshold (over the tokens `>= floor`, at `inv_t`) when it is found from the heavy
/// blocks alone ([`peaked`]): a row whose mass sits in the maxima of a few blocks, where the
/// threshold costs less than judging a winner from the row's mass ([`judge_by_mass`]). It is
/// the value [`floor`] returns for the row (its first step), so the caller races over it
/// rather than computing it again.
pub(super) fn found_in_few_blocks<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    (m, inv_t, floor): (f32, f32, f32),
    top_p: f64,
) -> Result<Option<f32>> {
    match RowMass::new(k, v, m, inv_t, floor) {
        Some(r) => peaked(&r, bmax, top_p),
        None => Ok(None),
    }
}

/// Whether top-p (over the tokens `>= floor`, at `inv_t`) surely keeps a token of logit `x`
/// (`floor <= x <= m`, the row's finite maximum): the mass of the tokens above `x` is below
/// `top_p` times the mass of the tokens at or above `x`, a lower bound of Z. Then the threshold
/// is at most `x` in exact arithmetic, and in the f64 arithmetic of the exact tier too (the
/// margin of 1e-6 covers its rounding), so the race over the kept tokens has the winner of the
/// race over every token `>= floor` (the same keys, a subset holding the winner). `false`: not
/// decided here (also when more than an eighth of the blocks reach `x`: then the gather would
/// cost more than it saves).
pub(super) fn surely_keeps<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    (m, inv_t, floor): (f32, f32, f32),
    top_p: f64,
    (x, values_ge): (f32, super::ValuesGe),
) -> Result<bool> {
    if x >= m {
        // The maximum is always kept.
        return Ok(true);
    }
    let Some(r) = RowMass::new(k, v, m, inv_t, floor) else { return Ok(false) };
    if !(x.is_finite() && x >= floor) || bmax.iter().filter(|&&b| b >= x).count() > bmax.len() / 8 + 1 {
        return Ok(false);
    }
    let xs = values_ge(x)?;
    let ws = r.weights(&xs)?;
    let (mut above, mut at_least) = (0f64, 0f64);
    for (&y, &w) in xs.iter().zip(&ws) {
        at_least += w;
        if y > x {
            above += w;
        }
    }
    Ok(above < top_p * at_least * (1.0 - 1e-6))
}

/// Whether top-p alone (no top-k; over the tokens `>= floor`, at `inv_t`) surely keeps a token
/// of logit `x` (`floor <= x <= m`, the row's finite maximum), or surely drops it, from a pass
/// of f32 mass per tier rather than the tokens above `x`: the split kernel sums the mass above
/// `x` and below it at once, Z their sum (when `z_known` holds the bounds of Z from an earlier
/// token of the row, the mass above `x` alone). Kept (`Some(true)`): the mass A of the tokens above `x` is
/// below `top_p` times the lower bound of Z (the mass of the kept tokens, one pass); then the threshold is at most `x` (in exact arithmetic and,
/// with the margin of 1e-6 of [`surely_keeps`], in the exact tier's f64). Dropped
/// (`Some(false)`): A reaches `top_p` times the upper bound of Z, by the same margin (the tokens
/// below the mass kernels' `lo` weigh under 2^-125 each, far below it, as A holds the maximum's
/// weight 1); then the threshold is above `x`, and so is every kept token. For rows whose kept
/// set is large (the tail holds much of the mass), where [`surely_keeps`] would gather most of
/// the row: the race's winner lies in the kept set with probability `top_p` or more, and then
/// this settles the filter without its threshold; a dropped winner raises the race's floor
/// above it. Cheap weights first (within -2% / +9%; unless `z_known` says f32 exps alone), then
/// the same cheap masses with the heaviest blocks weighed again by f32 exps
/// (`RowMass::split_refined`: tight where the mass sits in peaks, for a few blocks' cost), f32
/// exps over the row if they do not decide. `None`: not decided here.
pub(super) fn judge_by_mass<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    (m, inv_t, floor): (f32, f32, f32),
    top_p: f64,
    x: f32,
    z_known: &mut ZBounds,
) -> Result<Option<bool>> {
    if x >= m {
        return Ok(Some(true));
    }
    let Some(r) = RowMass::new(k, v, m, inv_t, floor) else { return Ok(None) };
    if !(x.is_finite() && x >= floor) {
        return Ok(None);
    }
    // The tokens above x are those at or above the next f32 (x < m, so it is finite).
    let above_x = x.next_up();
    if above_x <= r.mp.lo {
        // The kept tokens at or below x all weigh under 2^-125: nothing to gain here.
        return Ok(None);
    }
    let mut out = alloc::filled(r.n.div_ceil(BLOCK), 0.0, "top-p block masses")?;
    let mut below = Vec::new();
    // Keep (`Some(Some(true))`), drop (`Some(Some(false))`), give up (`Some(None)`) or go on
    // (`None`), from bounds of the mass above x and of Z.
    let verdict = |above: (f64, f64), z: (f64, f64)| {
        if above.1 < top_p * z.0 * (1.0 - 1e-6) {
            return Some(Some(true));
        }
        if above.0 >= top_p * z.1 * (1.0 + 1e-6) {
            DROPPED.with(|d| d.set(d.get() + 1));
            return Some(Some(false));
        }
        // Not even the upper bound of Z would do: the f32 exps cannot keep it either.
        (above.0 >= top_p * z.1).then_some(None)
    };
    let first_tier = usize::from(z_known.exps_only);
    for (tier, cheap) in [true, false].into_iter().enumerate().skip(first_tier) {
        let (kind, bounds): (MassKind, MassBounds) =
            if cheap { (MassKind::CheapCut, cheap_bounds) } else { (MassKind::Exp, exp_bounds) };
        let (above, z) = match z_known.z[tier] {
            Some(z) => {
                let mp = MassParams { lo: above_x, cut: f32::INFINITY, ..r.mp };
                // SAFETY: the row has n values; out and bmax one per block.
                unsafe { (r.dk.mass)(r.v.ptr(), r.n, bmax, mp, kind, &mut out) };
                (bounds(sum(&out), r.count()), z)
            }
            None => {
                // The mass above x and Z in one pass: Z is the mass above and below x.
                let (s_below, s_above) = r.split(bmax, cheap, above_x, (&mut below, &mut out))?;
                if cheap {
                    // Each block's cheap Z, for the bounds refined below (now and for the
                    // row's next winner).
                    z_known.cheap_blocks =
                        alloc::collect(below.iter().zip(&out).map(|(&b, &a)| b + a), "top-p block masses")?;
                }
                let z = *z_known.z[tier].insert(bounds(s_below + s_above, r.count()));
                (bounds(s_above, r.count()), z)
            }
        };
        if let Some(judged) = verdict(above, z) {
            return Ok(judged);
        }
        if cheap && !z_known.cheap_blocks.is_empty() {
            // The heaviest blocks by f32 exps: where they hold most of the mass (peaks), the
            // bounds tighten nearly to the f32 exps' at the cost of a few blocks.
            let refined = r.split_refined(above_x, &z_known.cheap_blocks, &out);
            if let Some(judged) = refined.and_then(|(a, z)| verdict(a, z)) {
                REFINED.with(|d| d.set(d.get() + 1));
                return Ok(judged);
            }
        }
    }
    Ok(None)
}

/// Bounds of a mass from its f32 sum and its count of tokens ([`cheap_bounds`], [`exp_bounds`]).
type MassBounds = fn(f64, usize) -> (f64, f64);

/// The bounds of a row's Z (the mass of its tokens `>= floor`) that [`judge_by_mass`] found,
/// from cheap weights and from f32 exps, kept for the row's next winner: Z does not depend on
/// the token judged, so a winner after a dropped one costs one pass of mass, not two. Also
/// whether the row's winners are judged by f32 exps alone ([`ZBounds::exps_only`]).
#[derive(Default)]
pub(crate) struct ZBounds {
    z: [Option<(f64, f64)>; 2],
    /// Each block's cheap mass of the kept tokens (empty until the cheap tier ran).
    cheap_blocks: Vec<f64>,
    exps_only: bool,
}

impl ZBounds {
    /// For a row whose winners are judged by f32 exps alone: winners that most blocks of a row
    /// of few heavy blocks reach, which lie in its tail. There the cheap weights (-2% / +9%)
    /// seldom decide and their two passes were wasted (seeded peaked rows at 151936, top-p 0.9
    /// and 0.95: slowest 268 -> 186 us, N(0, 2) rows with peaks near 14 at T 0.8: 142 -> 102).
    pub(crate) fn exps_only() -> ZBounds {
        ZBounds { exps_only: true, ..ZBounds::default() }
    }
}

/// The f64 paths only (when the f32 exponent scale overflows).
struct RowF64<'a, V: RowValues + ?Sized> {
    k: &'a Kernels,
    dk: &'a DtypeKernels<V::E>,
    v: &'a V,
    m: f32,
    inv_t: f32,
    floor: f32,
}

impl<V: RowValues + ?Sized> RowF64<'_, V> {
    fn gather_all(&self, bmax: &[f32]) -> Result<Candidates> {
        let lo = self.floor.max(-f32::MAX);
        let mut xs = alloc::with_capacity(super::room(bmax, lo, self.v.n()), "top-p candidates")?;
        // SAFETY: the row has n values; bmax one per block.
        unsafe { (self.dk.gather_ge)(self.v.ptr(), self.v.n(), bmax, lo, &mut xs) };
        let mut ws = alloc::filled(xs.len(), 0.0, "top-p weights")?;
        // SAFETY: the level is supported.
        unsafe { (self.k.weights64)(&xs, self.m as f64, self.inv_t as f64, &mut ws) };
        Ok(Candidates::new(lo, self.m, xs, ws))
    }
}

/// Every kept token gathered: the threshold from exact weights alone.
fn full(mut c: Candidates, top_p: f64) -> Result<f32> {
    count(3);
    let t = top_p * c.total;
    Ok(match c.walk(t, t)? {
        Walk::Theta(x) => x,
        // Only when rounding left the target above the whole mass: keep everything.
        _ => c.lo,
    })
}

/// Up to TOP_BLOCKS blocks with the largest finite maxima, largest first (ties: lower index).
fn top_blocks(bmax: &[f32]) -> Vec<usize> {
    let mut top: Vec<usize> = Vec::with_capacity(TOP_BLOCKS + 1);
    for (b, &x) in bmax.iter().enumerate() {
        if x == f32::NEG_INFINITY {
            continue;
        }
        if top.len() == TOP_BLOCKS && x <= bmax[top[TOP_BLOCKS - 1]] {
            continue;
        }
        let at = top.iter().position(|&o| x > bmax[o]).unwrap_or(top.len());
        top.insert(at, b);
        top.truncate(TOP_BLOCKS);
    }
    top
}

/// Decides with `bounds` of R (the kept mass below the candidates), then, if they do not decide,
/// with R computed by the f64 kernel over the blocks whose maximum in `bm` reaches `lo`.
/// `None`: the threshold is below the candidates.
fn decide<V: RowValues + ?Sized>(
    r: &RowMass<V>,
    c: &mut Candidates,
    bm: &[f32],
    bounds: (f64, f64),
    top_p: f64,
) -> Result<Option<f32>> {
    let cut = c.lo;
    let base = c.total;
    match c.walk(top_p * (base + bounds.0), top_p * (base + bounds.1))? {
        Walk::Theta(x) => {
            count(1);
            return Ok(Some(x));
        }
        Walk::Below => return Ok(None),
        Walk::Uncertain => {}
    }
    let rest = if cut <= r.lo64 { 0.0 } else { r.exact(bm, cut)? };
    let t = top_p * (base + rest);
    Ok(match c.walk(t, t)? {
        Walk::Theta(x) => {
            count(2);
            Some(x)
        }
        _ => None,
    })
}

/// Rows whose mass sits in the maxima of their blocks: the cut from the block maxima alone.
///
/// Cheap bounds of every block's mass first; then the blocks by maximum, descending, get their
/// f32-exp mass (with its bounds) until their maxima alone reach `top_p` of the upper bound of
/// Z (the visited blocks' bound plus the cheap bound of the others): the threshold is at least
/// the last maximum visited, `vc`, and every token `>= vc` lies in a visited block.
fn peaked<V: RowValues + ?Sized>(r: &RowMass<V>, bmax: &[f32], top_p: f64) -> Result<Option<f32>> {
    let nb = bmax.len();
    // f32 weights of every block maximum; the blocks within a factor 1000 of the heaviest, in
    // order, must carry top_p of their sum.
    let mut block_w = alloc::filled(nb, 0f32, "top-p block weights")?;
    // SAFETY: bmax is an f32 row of nb values; wb as long.
    unsafe { (r.k.f32.mass_weights)(bmax.as_ptr(), nb, r.mp, block_w.as_mut_ptr()) };
    let heaviest = block_w.iter().fold(0f32, |a, &b| if b > a { b } else { a });
    let mut order: Vec<usize> = Vec::new();
    for (b, &w) in block_w.iter().enumerate() {
        if w >= heaviest * 1e-3 {
            if order.len() == PEAKED_BLOCKS {
                return Ok(None);
            }
            order.push(b);
        }
    }
    let all = sum(&alloc::collect(block_w.iter().map(|&w| w as f64), "top-p block weights")?);
    let in_order: f64 = order.iter().map(|&b| block_w[b] as f64).sum();
    if in_order < top_p * all * (1.0 - 1e-3) {
        return Ok(None);
    }
    order.sort_unstable_by(|&a, &b| bmax[b].total_cmp(&bmax[a]).then(a.cmp(&b)));
    let mut cheap = Vec::new();
    let kind = if r.unmasked() { MassKind::CheapAll } else { MassKind::CheapCut };
    let cheap_all = r.blocks(&[], kind, f32::INFINITY, &mut cheap)?;
    // (At most PEAKED_BLOCKS of them.)
    let wmax = r.weights(&order.iter().map(|&b| bmax[b]).collect::<Vec<_>>())?;
    let (mut s_exp, mut s_cheap, mut cum, mut vc) = (0f64, 0f64, 0f64, None);
    let z_bounds = |s_exp: f64, s_cheap: f64, visited: usize| {
        let (a, b) = exp_bounds(s_exp, visited * BLOCK);
        // The cheap mass of the blocks not visited, up to the rounding of the two f64 sums of
        // at most 2^32 non-negative terms and of the difference (far below 1e-6 of the total).
        let (rest, slop) = (cheap_all - s_cheap, 1e-6 * cheap_all);
        let (c, _) = cheap_bounds((rest - slop).max(0.0), r.count());
        let (_, d) = cheap_bounds(rest + slop, r.count());
        (a + c, b + d)
    };
    for (i, &b) in order.iter().enumerate() {
        s_exp += r.exp_block(b);
        s_cheap += cheap[b];
        cum += wmax[i];
        // Stop only after every block tied with this maximum.
        if order.get(i + 1).is_some_and(|&o| bmax[o] == bmax[b]) {
            continue;
        }
        if cum >= top_p * z_bounds(s_exp, s_cheap, i + 1).1 {
            vc = Some((bmax[b], i + 1));
            break;
        }
    }
    let Some((vc, visited)) = vc else { return Ok(None) };
    // The rest of the heavy blocks (all below vc) get their f32-exp mass too: most of R is in
    // them.
    for &b in &order[visited..] {
        s_exp += r.exp_block(b);
        s_cheap += cheap[b];
    }
    // Every other block must lie wholly below vc (the f32 weights that chose the heavy blocks
    // need not be monotone to the last bit).
    let mut seen = alloc::filled(nb, false, "top-p visited blocks")?;
    for &b in &order {
        seen[b] = true;
    }
    if bmax.iter().zip(&seen).any(|(&x, &s)| !s && x >= vc) {
        return Ok(None);
    }
    let mut c = gather(r, bmax, vc)?;
    let (lo, hi) = z_bounds(s_exp, s_cheap, order.len());
    if let Walk::Theta(x) = c.walk(top_p * lo, top_p * hi)? {
        count(0);
        return Ok(Some(x));
    }
    // The blocks not visited by f32 exps as well.
    let rest = bmax.iter().zip(&seen).map(|(&x, &s)| if s { f32::NEG_INFINITY } else { x });
    let rest = alloc::collect(rest, "top-p blocks not visited")?;
    let mut blocks = Vec::new();
    let kind = if r.unmasked() { MassKind::ExpAll } else { MassKind::Exp };
    let s_rest = r.blocks(&rest, kind, f32::INFINITY, &mut blocks)?;
    let (a, b) = exp_bounds(s_exp + s_rest, r.count());
    if let Walk::Theta(x) = c.walk(top_p * a, top_p * b)? {
        count(1);
        return Ok(Some(x));
    }
    // The visited blocks, which hold nearly all of Z, in float64, and the bounds of the others
    // alone: far tighter than the bounds of the whole (which allow each token the error of the
    // lightest), for a few blocks of f64 exps rather than the row's.
    let visited = bmax.iter().zip(&seen).map(|(&x, &s)| if s { x } else { f32::NEG_INFINITY });
    let z_visited = r.exact(&alloc::collect(visited, "top-p visited blocks")?, f32::INFINITY)?;
    let (a, b) = exp_bounds(s_rest, r.count());
    // (The f64 sum errs by far less than 1e-12 of it.)
    let (lo, hi) = (z_visited * (1.0 - 1e-12) + a, z_visited * (1.0 + 1e-12) + b);
    if let Walk::Theta(x) = c.walk(top_p * lo, top_p * hi)? {
        count(2);
        return Ok(Some(x));
    }
    // Z in float64.
    let t = top_p * r.exact(&[], f32::INFINITY)?;
    Ok(match c.walk(t, t)? {
        Walk::Theta(x) => {
            count(2);
            Some(x)
        }
        _ => None,
    })
}

/// How `general` samples for its cut: about this many evenly spaced blocks besides the top ones,
/// and the margin (in standard deviations of the sampled estimate) that the mass above the cut
/// must clear. A guess that is cheap; when it is too high after all (a row whose heavy blocks
/// the samples miss) [`refine`] finds a second cut from the mass below the first.
const SAMPLES: usize = 16;
const SIGMAS: f64 = 3.0;
/// Blocks that [`refine`] weighs token by token first; then four times as many, and so on.
const REFINE_BLOCKS: usize = 16;
/// Buckets of the f32 weights, by their bits: 16 per octave, bucket 0 the zero weights.
const WEIGHT_BUCKETS: usize = 2048;

fn weight_bucket(w: f32) -> usize {
    (w.to_bits() >> 19) as usize
}

/// The least f32 weight of bucket `j`, as a power of two: `2^(t_j)`.
fn bucket_exponent(j: usize) -> f64 {
    (f32::from_bits((j as u32) << 19) as f64).log2()
}

/// Any row: the cut from a sample of blocks (the top blocks, and evenly spaced others); when
/// that cut proves too high, a second one from the mass below it.
fn general<V: RowValues + ?Sized>(r: &RowMass<V>, bmax: &[f32], top: &[usize], top_p: f64) -> Result<f32> {
    let vc = sample_cut(r, bmax, top, top_p, SAMPLES, SIGMAS)?;
    let (mut c, below) = gather_below(r, bmax, vc)?;
    if let Some(x) = decide(r, &mut c, bmax, below.bounds, top_p)? {
        return Ok(x);
    }
    if let Some(x) = refine(r, bmax, &c, &below, top_p)? {
        count(4);
        return Ok(x);
    }
    // Not even the whole mass below the cut was shown to reach the target: every kept token.
    full(gather(r, bmax, f32::NEG_INFINITY)?, top_p)
}

/// A second cut after the cut of `c` proved too high (θ is below it), and the threshold from
/// it. The kept tokens below the first cut must add `need`: the target at the upper bound of Z,
/// less the candidates' mass. The blocks holding the most of their mass (`below.blocks`) are
/// weighed token by token (f32 exps, below the first cut), more and more of them, until the
/// heaviest of those tokens alone make up `need`: the tokens of the other blocks only add to
/// it, so the lightest of them is at or below θ, up to the f32 weights' error (a margin covers
/// it; were the cut too high all the same, `decide` finds out). A gather without exps brings the
/// tokens between the two cuts, whose exact weights, taken off the bounds of the mass below the
/// first cut, bound the mass below the second. `None`: no cut was found, or it is too high.
fn refine<V: RowValues + ?Sized>(
    r: &RowMass<V>,
    bmax: &[f32],
    c: &Candidates,
    below: &Below,
    top_p: f64,
) -> Result<Option<f32>> {
    let (r_lo, r_hi) = below.bounds;
    let need = top_p * (c.total + r_hi) - c.total;
    let blocks = &below.blocks;
    let mut order = alloc::collect((0..blocks.len()).filter(|&b| blocks[b] > 0.0), "top-p blocks below the cut")?;
    order.sort_unstable_by(|&a, &b| blocks[b].total_cmp(&blocks[a]).then(a.cmp(&b)));
    let mp = MassParams { cut: c.lo, ..r.mp };
    let mut mass = vec![0f64; WEIGHT_BUCKETS];
    let mut w = [0f32; BLOCK];
    let (mut weighed, mut want) = (0, REFINE_BLOCKS);
    let j = loop {
        let upto = want.min(order.len());
        for &b in &order[weighed..upto] {
            let start = b * BLOCK;
            let len = BLOCK.min(r.n - start);
            // SAFETY: the block lies inside the row; w holds BLOCK values.
            unsafe { (r.dk.mass_weights)(r.v.ptr().add(start), len, mp, w.as_mut_ptr()) };
            // Under a floor most weights are 0: whole chunks of them are skipped.
            for chunk in w[..len].chunks(16) {
                if chunk.iter().fold(0f32, |a, &x| a.max(x)) > 0.0 {
                    for &x in chunk {
                        mass[weight_bucket(x)] += x as f64;
                    }
                }
            }
        }
        weighed = upto;
        // The f32 weights are within 2e-5 of the exact ones (`crate::mass`).
        let mut acc = 0.0;
        let reached = (1..WEIGHT_BUCKETS).rev().find(|&j| {
            acc += mass[j];
            acc * (1.0 - 1e-4) >= need
        });
        if let Some(j) = reached {
            break j;
        }
        if weighed == order.len() {
            return Ok(None);
        }
        want *= 4;
    };
    // Every token counted has an f32 weight of at least 2^(t_j), so a logit of at least about
    // m + t_j / c: lowered by more than the roundings of x - m, of c, of their product and of the
    // f32 exp2 can move it.
    let (t_j, m) = (bucket_exponent(j), r.m as f64);
    let x = m + t_j / r.mp.c as f64;
    let x = x - (x.abs() + m.abs() + (t_j / r.mp.c as f64).abs() + 1.0 / r.mp.c as f64) * 1e-6 - 1e-30;
    let vc = if x > f32::MAX as f64 { r.m } else { (x as f32).max(-f32::MAX) };
    if vc >= c.lo {
        return Ok(None);
    }
    let lo = vc.max(r.floor).max(-f32::MAX);
    let mut xs = alloc::with_capacity(super::room(bmax, lo, r.n), "top-p candidates")?;
    // SAFETY: the row has n values; bmax one per block.
    unsafe { (r.dk.gather_ge)(r.v.ptr(), r.n, bmax, lo, &mut xs) };
    let ws = r.weights(&xs)?;
    let between: f64 = xs.iter().zip(&ws).filter(|&(&x, _)| x < c.lo).map(|(_, &w)| w).sum();
    // (The f64 weights and their sum err by far less than 1e-12 of it.)
    let bounds = ((r_lo - between * (1.0 + 1e-12)).max(0.0), (r_hi - between * (1.0 - 1e-12)).max(0.0));
    let mut c = Candidates::new(lo, r.m, xs, ws);
    decide(r, &mut c, bmax, bounds, top_p)
}

/// A cut below the threshold with high probability, from the f32 weights of a sample: the top
/// blocks (counted once) and about `samples` evenly spaced blocks (scaled up to the others),
/// with a margin of `sigmas` standard deviations of the sampled estimate. When no cut clears
/// that margin (a sampled block holds a token heavy enough to swamp the estimate), the cut where
/// the estimate alone reaches the target (`general` checks it, and goes lower if need be).
fn sample_cut<V: RowValues + ?Sized>(
    r: &RowMass<V>,
    bmax: &[f32],
    top: &[usize],
    top_p: f64,
    samples: usize,
    sigmas: f64,
) -> Result<f32> {
    let nb = bmax.len();
    let mut in_top = alloc::filled(nb, false, "top-p sampled blocks")?;
    for &b in top {
        in_top[b] = true;
    }
    let stride = (nb / samples).max(1);
    // (About `samples` of them.)
    let strided: Vec<usize> = (stride / 2..nb).step_by(stride).filter(|&b| !in_top[b]).collect();
    let others = nb - top.len();
    let scale = if strided.is_empty() { 0.0 } else { others as f64 / strided.len() as f64 };
    // Mass by weight bucket: exact part, sampled part and its squares.
    let (mut hm, mut hq) = (vec![0f64; WEIGHT_BUCKETS], vec![0f64; WEIGHT_BUCKETS]);
    let mut w = [0f32; BLOCK];
    let mut add = |b: usize, sc: f64, hm: &mut [f64], hq: &mut [f64]| {
        let start = b * BLOCK;
        let len = BLOCK.min(r.n - start);
        // SAFETY: the block lies inside the row; w holds BLOCK values.
        unsafe { (r.dk.mass_weights)(r.v.ptr().add(start), len, r.mp, w.as_mut_ptr()) };
        if sc == 1.0 {
            for &x in &w[..len] {
                hm[weight_bucket(x)] += x as f64;
            }
        } else {
            for &x in &w[..len] {
                let j = weight_bucket(x);
                let x = x as f64 * sc;
                hm[j] += x;
                hq[j] += x * x;
            }
        }
    };
    for &b in top {
        add(b, 1.0, &mut hm, &mut hq);
    }
    for &b in &strided {
        add(b, scale, &mut hm, &mut hq);
    }
    let z = sum(&hm);
    let q = sum(&hq);
    let (mut above, mut q_above) = (0f64, 0f64);
    let mut estimate = None;
    // (Bucket 0 holds the zero weights.)
    for j in (1..WEIGHT_BUCKETS).rev() {
        above += hm[j];
        q_above += hq[j];
        let d = above - top_p * z;
        let var = (1.0 - top_p).powi(2) * q_above + top_p * top_p * (q - q_above);
        if hm[j] > 0.0 && d >= 1e-9 * z && estimate.is_none() {
            estimate = Some(j);
        }
        if hm[j] > 0.0 && d >= sigmas * var.sqrt() + 1e-9 * z {
            return Ok(sample_cut_of(r, j));
        }
    }
    Ok(estimate.map_or(f32::NEG_INFINITY, |j| sample_cut_of(r, j)))
}

/// The cut of the sampled weight bucket `j`: weights of at least 2^(t_j) are logits of at
/// least m + t_j / c, lowered a little.
fn sample_cut_of<V: RowValues + ?Sized>(r: &RowMass<V>, j: usize) -> f32 {
    let x = r.m as f64 + bucket_exponent(j) / r.mp.c as f64;
    let x = x - x.abs() * 1e-6 - 1e-30;
    if x > f32::MAX as f64 {
        r.m
    } else {
        (x as f32).max(-f32::MAX)
    }
}

/// top-p among the candidates `cand` that are `>= floor` (a set that holds every kept token,
/// few: what a top-k left), sorted.
pub(super) fn floor_of_candidates(cand: &[f32], floor: f32, m: f32, inv_t: f32, top_p: f64) -> Result<f32> {
    let kept = cand.iter().filter(|&&x| x >= floor).map(|&x| (x, weight64(x, m, inv_t)));
    let mut kept = alloc::collect(kept, "top-p candidates after top-k")?;
    let z: f64 = kept.iter().map(|e| e.1).sum();
    kept.sort_unstable_by(desc);
    let target = top_p * z;
    let mut cum = 0.0;
    for &(x, w) in &kept {
        cum += w;
        if cum >= target {
            return Ok(x);
        }
    }
    Ok(kept.last().map_or(f32::NEG_INFINITY, |s| s.0))
}
