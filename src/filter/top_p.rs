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
//!   blocks, their f32-exp mass, the f64 Z.
//! - [`general`]: `vc` from a sample of blocks (high enough that the gathered tokens are few, low
//!   enough that they reach the target with high probability); one pass gathers the tokens
//!   `>= vc` and sums the f32-exp mass R of those below. Tiers: the f32-exp bounds of R, the f64
//!   R. When the gathered tokens do not reach the target after all, θ is below `vc`: a second,
//!   lower cut from a larger sample and a wider margin, one more pass; only when that one is
//!   too high as well is every kept token gathered.
//! - after a top-k, the few candidates are sorted ([`floor_of_candidates`]).

use crate::alloc;
use crate::error::Result;
use crate::kernels::{DtypeKernels, Kernels, MassKind, MassParams, BLOCK};
use crate::mass::{cheap_bounds, exp_bounds, sum, weight64, RowMass, TINY};
use crate::row::RowValues;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How top-p thresholds were decided, for benchmarks and tests: [peaked path with cheap bounds,
/// f32-exp bounds, exact f64 mass, every token gathered, the general path's second cut].
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
    let total = sum(&ws);
    Ok(Candidates { lo, top: r.m, xs, ws, total, sorted: None, hist: None })
}

/// Every kept token `x >= vc` with its exact weight, and bounds of the mass of the kept
/// tokens below (one pass: the f32-exp kernel that gathers).
fn gather_below<V: RowValues + ?Sized>(r: &RowMass<V>, bmax: &[f32], vc: f32) -> Result<(Candidates, (f64, f64))> {
    let lo = vc.max(r.floor).max(-f32::MAX);
    if lo <= r.mp.lo {
        // Nothing kept below but weights under 2^-125 (or nothing at all).
        let below = if lo <= r.floor.max(-f32::MAX) { 0.0 } else { r.count() as f64 * TINY };
        return Ok((gather(r, bmax, vc)?, (0.0, below)));
    }
    let mut xs = alloc::with_capacity(super::room(bmax, lo, r.n), "top-p candidates")?;
    let mut out = alloc::filled(r.n.div_ceil(BLOCK), 0.0, "top-p block masses")?;
    let mp = MassParams { cut: lo, ..r.mp };
    // SAFETY: the row has n values; out and bmax one per block.
    unsafe { (r.dk.mass_gather)(r.v.ptr(), r.n, bmax, mp, &mut out, &mut xs) };
    let ws = r.weights(&xs)?;
    let total = sum(&ws);
    let c = Candidates { lo, top: r.m, xs, ws, total, sorted: None, hist: None };
    Ok((c, exp_bounds(sum(&out), r.count())))
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

/// Buckets uniform in logit over `[low, top]` (which holds every candidate), the largest logits
/// in bucket 0 (the bucket is monotone in x, which is all the walk needs), and the mass of each
/// bucket.
fn histogram(xs: &[f32], ws: &[f64], low: f32, top: f32) -> Result<Hist> {
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
                self.hist = Some(histogram(&self.xs, &self.ws, self.lo, self.top)?);
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
        let total = sum(&ws);
        Ok(Candidates { lo, top: self.m, xs, ws, total, sorted: None, hist: None })
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

/// How `general` samples for its cut: evenly spaced blocks, and the margin (in standard
/// deviations of the sampled estimate) that the mass above the cut must clear. A first guess
/// that is cheap; when it was too high after all (a row whose heavy blocks the 16 samples miss:
/// none of 21,500 random rows of `tokenrace-bench --row-tail` was one, `tests/mass.rs` builds
/// some), a second one four times as well informed and far more cautious, which costs one more
/// pass; only then every kept token (issue 11: a serving step waits for its slowest row).
const GUESSES: [(usize, f64); 2] = [(16, 3.0), (64, 8.0)];

/// Any row: the cut from a sample of blocks (the top blocks, and evenly spaced others).
fn general<V: RowValues + ?Sized>(r: &RowMass<V>, bmax: &[f32], top: &[usize], top_p: f64) -> Result<f32> {
    let mut above = f32::INFINITY;
    for (i, &(samples, sigmas)) in GUESSES.iter().enumerate() {
        let vc = sample_cut(r, bmax, top, top_p, samples, sigmas)?;
        if vc >= above {
            // The sample puts the cut no lower than one already too high: it cannot be trusted.
            break;
        }
        let (mut c, bounds) = gather_below(r, bmax, vc)?;
        if let Some(x) = decide(r, &mut c, bmax, bounds, top_p)? {
            if i > 0 {
                count(4);
            }
            return Ok(x);
        }
        above = vc;
    }
    // The threshold is below every cut: gather every kept token.
    full(gather(r, bmax, f32::NEG_INFINITY)?, top_p)
}

/// A cut below the threshold with high probability, from the f32 weights of a sample: the top
/// blocks (counted once) and about `samples` evenly spaced blocks (scaled up to the others),
/// with a margin of `sigmas` standard deviations of the sampled estimate.
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
    // Mass by bucket of the f32 weight's bits (16 per octave): exact part, sampled part and its
    // squares.
    const NB: usize = 2048;
    let (mut hm, mut hq) = (vec![0f64; NB], vec![0f64; NB]);
    let mut w = [0f32; BLOCK];
    let mut add = |b: usize, sc: f64, hm: &mut [f64], hq: &mut [f64]| {
        let start = b * BLOCK;
        let len = BLOCK.min(r.n - start);
        // SAFETY: the block lies inside the row; w holds BLOCK values.
        unsafe { (r.dk.mass_weights)(r.v.ptr().add(start), len, r.mp, w.as_mut_ptr()) };
        if sc == 1.0 {
            for &x in &w[..len] {
                hm[(x.to_bits() >> 19) as usize] += x as f64;
            }
        } else {
            for &x in &w[..len] {
                let j = (x.to_bits() >> 19) as usize;
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
    // (Bucket 0 holds the zero weights.)
    for j in (1..NB).rev() {
        above += hm[j];
        q_above += hq[j];
        let d = above - top_p * z;
        let var = (1.0 - top_p).powi(2) * q_above + top_p * top_p * (q - q_above);
        if hm[j] > 0.0 && d >= sigmas * var.sqrt() + 1e-9 * z {
            // Weights of at least 2^(t_j): logits of at least m + t_j / c, lowered a little.
            let t_j = (f32::from_bits((j as u32) << 19) as f64).log2();
            let x = r.m as f64 + t_j / r.mp.c as f64;
            let x = x - x.abs() * 1e-6 - 1e-30;
            return Ok(if x > f32::MAX as f64 { r.m } else { (x as f32).max(-f32::MAX) });
        }
    }
    Ok(f32::NEG_INFINITY)
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
