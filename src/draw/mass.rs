//! Probability mass of a row, fast and with proven bounds: the normaliser of the logprobs and
//! the top-p threshold.
//!
//! The weight of a token is `w = exp(a)`, `a = (x - m) * inv_t` (exact in f64), as in
//! `filter.rs`. Three SIMD kernels sum weights over the tokens `lo <= x < cut` of a row, per block
//! of 256, in an order that does not depend on the SIMD level (`kernels/generic.rs`):
//!
//! - **cheap**: a weight within [-2.2%, +8.5%] of w from the exponent bits alone (a few
//!   operations per token);
//! - **exp**: an f32 `exp2` (relative error below 2^-22) of the f32 exponent `t = (x - m) * c`,
//!   whose three roundings move w by at most `|a| * 3 * 2^-24`, summed in f32 trees of depth 4;
//! - **exact**: an f64 exp (relative error below 1e-15) of the exact `a`, summed in f64.
//!
//! The first two come with rigorous bounds on the true mass (`cheap_bounds`, `exp_bounds`).
//!
//! **top-p** needs the logit θ of the first token (by logit, descending) whose cumulative mass
//! reaches `top_p * Z`. A cut `vc <= θ` is found, every kept token `x >= vc` is gathered with
//! its exact f64 weight, and Z is bounded by the cheapest tier that decides: θ is known when the
//! walk down the gathered tokens reaches `top_p * Z_lo` and `top_p * Z_hi` at the same logit.
//! Otherwise the next tier runs, up to the exact one, whose value decides. So the threshold is
//! what exact arithmetic gives (the exact tier: float64, with its rounding), on every SIMD level
//! and thread count.
//!
//! - `peaked`, rows whose mass sits in the maxima of at most 256 blocks: cheap bounds of every
//!   block; the heavy blocks by maximum, descending, get their f32-exp mass until their maxima
//!   alone reach `top_p` of the upper bound of Z, which proves `θ >= vc`, the last maximum
//!   visited (every token `>= vc` lies in a visited block). Tiers: cheap bounds for the other
//!   blocks, their f32-exp mass, the f64 Z.
//! - `general`: `vc` from a sample of blocks (high enough that the gathered tokens are few, low
//!   enough that they reach the target with high probability); one pass gathers the tokens
//!   `>= vc` and sums the f32-exp mass R of those below. Tiers: the f32-exp bounds of R, the f64
//!   R. When the gathered tokens do not reach the target after all, θ is below `vc`, and every
//!   kept token is gathered.

use super::filter::{from_ord_key, ord_key, Vals};
use crate::kernels::generic::{A_MIN64, T_MIN};
use crate::kernels::{DtypeKernels, Kernels, Mass64Params, MassKind, MassParams, BLOCK};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How top-p thresholds were decided, for benchmarks and tests: [peaked path with cheap bounds,
/// f32-exp bounds, exact f64 mass, every token gathered].
static TIERS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

fn count(tier: usize) {
    TIERS[tier].fetch_add(1, Relaxed);
}

/// How many top-p thresholds (without top-k) each tier decided since the start: cheap bounds,
/// f32-exp bounds, the exact f64 mass, every token gathered.
pub fn tier_counts() -> [u64; 4] {
    std::array::from_fn(|i| TIERS[i].load(Relaxed))
}

const U: f64 = 5.960_464_477_539_063e-8; // 2^-24
/// Bound of `|ln(w_f32 / exp2(t))|` per unit of `|a|` from the roundings of `t`: three f32
/// roundings (x - m, c, the product) and the f64 one of `c`.
const BETA: f64 = 3.000_001 * U;
/// Relative error bound of the kernels' `exp2` (1.93e-7 measured).
const EPS_EXP2: f64 = 2.384_185_791_015_625e-7; // 2^-22
/// Relative error bound of a kernel's block sums of non-negative weights: four f32 levels and
/// four f64 levels.
const SIGMA: f64 = 4.01 * U;
/// Bound of the weight of a token below `lo` (t < -125).
const TINY: f64 = 2.350_988_701_644_575e-38; // 2^-125
/// The cheap weight S of a token with true weight w: `S / CHEAP_HI <= w <= S / CHEAP_LO`.
const CHEAP_LO: f64 = 0.9785;
const CHEAP_HI: f64 = 1.0848;
/// Top blocks sampled exactly for the cut of a row that is not peaked.
const TOP_BLOCKS: usize = 16;
/// Most blocks visited for a peaked row.
const PEAKED_BLOCKS: usize = 256;
/// Candidates sorted directly; more go through a histogram first.
const SMALL: usize = 256;
/// Buckets of that histogram.
const BUCKETS: usize = 2048;

/// A sum in a fixed order that the compiler can vectorise: eight interleaved partial sums.
pub(crate) fn sum(xs: &[f64]) -> f64 {
    let mut acc = [0f64; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            acc[j] += c[j];
        }
    }
    for (j, &x) in chunks.remainder().iter().enumerate() {
        acc[j] += x;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// `c = fl32(inv_t * log2 e)`, or `None` if it overflows.
pub(crate) fn exp2_scale(inv_t: f32) -> Option<f32> {
    let c = (inv_t as f64 * std::f64::consts::LOG2_E) as f32;
    (c.is_finite() && c > 0.0).then_some(c)
}

/// The smallest finite f32 `v >= floor` whose f32 exponent `(v - m) * c` is at least `T_MIN`
/// (the kernels' `lo`); `floor <= m`.
pub(crate) fn mass_lo(m: f32, c: f32, floor: f32) -> f32 {
    let t = |v: f32| (v - m) * c;
    first_passing(floor, m, |v| t(v) >= T_MIN)
}

/// The smallest finite f32 `v >= floor` with `(v - m) * inv_t >= A_MIN64` in f64.
pub(crate) fn mass_lo64(m: f32, inv_t: f32, floor: f32) -> f32 {
    first_passing(floor, m, |v| (v as f64 - m as f64) * inv_t as f64 >= A_MIN64)
}

/// The smallest finite `v` in `[floor, m]` passing a monotone test that `m` passes.
fn first_passing(floor: f32, m: f32, pass: impl Fn(f32) -> bool) -> f32 {
    let start = if floor > -f32::MAX { floor } else { -f32::MAX };
    if pass(start) {
        return start;
    }
    let (mut lo, mut hi) = (ord_key(start), ord_key(m));
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if pass(from_ord_key(mid)) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    from_ord_key(hi)
}

/// Bounds of the true mass of at most `count` tokens (all with `x >= floor`, below `cut`) whose
/// exp-kernel mass is `s` (the kinds without a mask add at most 2^-125 per token read). Tokens with `|a| <= A` are off by at most `e^(BETA A)` and the
/// exp2 error; the rest weigh at most `e^-A` each; A is chosen to give the tightest bounds.
pub(crate) fn exp_bounds(s: f64, count: usize) -> (f64, f64) {
    /// For each cap A: (e^(BETA A), e^(-BETA A), e^-A, e^(-A (1 - BETA))).
    static CAPS: std::sync::OnceLock<Vec<[f64; 4]>> = std::sync::OnceLock::new();
    let caps = CAPS.get_or_init(|| {
        [0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0, 87.0]
            .iter()
            .map(|&a: &f64| [(BETA * a).exp(), (-BETA * a).exp(), (-a).exp(), (-a * (1.0 - BETA)).exp()])
            .collect()
    });
    let n = count as f64;
    let mut best = (0.0, f64::INFINITY);
    for &[up, down, tail_hi, tail_lo] in caps {
        let hi = s * (1.0 + SIGMA) * up / (1.0 - EPS_EXP2) + n * tail_hi + n * TINY;
        let tail = n * tail_lo * (1.0 + EPS_EXP2);
        let lo = (s * (1.0 - SIGMA) - tail - n * TINY).max(0.0) * down / (1.0 + EPS_EXP2);
        if hi - lo < best.1 - best.0 {
            best = (lo, hi);
        }
    }
    (best.0 * (1.0 - 1e-12), best.1 * (1.0 + 1e-12))
}

/// Bounds of the true mass of at most `count` tokens whose cheap-kernel mass is `s`.
pub(crate) fn cheap_bounds(s: f64, count: usize) -> (f64, f64) {
    let n = count as f64;
    let lo = (s * (1.0 - SIGMA) - n * TINY).max(0.0) / CHEAP_HI;
    (lo * (1.0 - 1e-12), (s * (1.0 + SIGMA) / CHEAP_LO + n * TINY) * (1.0 + 1e-12))
}

/// One row and its kernels, with the constants of its mass.
pub(crate) struct RowMass<'a, V: Vals + ?Sized> {
    k: &'a Kernels,
    dk: &'a DtypeKernels<V::E>,
    v: &'a V,
    n: usize,
    pub m: f32,
    pub inv_t: f32,
    /// The filters' floor before this one (-inf: none).
    pub floor: f32,
    /// f32 mass constants (`cut` is set per call).
    mp: MassParams,
    lo64: f32,
    /// The floor keeps every token with `t >= T_MIN`.
    unmasked: bool,
}

impl<'a, V: Vals + ?Sized> RowMass<'a, V> {
    /// `None` when `inv_t * log2 e` overflows f32 (then only the f64 paths apply).
    pub(crate) fn new(k: &'a Kernels, v: &'a V, m: f32, inv_t: f32, floor: f32) -> Option<Self> {
        let c = exp2_scale(inv_t)?;
        let lo = mass_lo(m, c, floor);
        let mp = MassParams { m, c, lo, cut: f32::INFINITY };
        let lo64 = mass_lo64(m, inv_t, floor);
        let unmasked = floor == f32::NEG_INFINITY || floor <= mass_lo(m, c, f32::NEG_INFINITY);
        Some(RowMass { k, dk: V::kernels(k), v, n: v.n(), m, inv_t, floor, mp, lo64, unmasked })
    }

    /// Per-block f32 masses of the tokens `x < cut` into `out` (blocks whose maximum in `bmax`
    /// is below `lo` are skipped); their sum.
    fn blocks(&self, bmax: &[f32], kind: MassKind, cut: f32, out: &mut Vec<f64>) -> f64 {
        out.clear();
        out.resize(self.n.div_ceil(BLOCK), 0.0);
        let mp = MassParams { cut, ..self.mp };
        // SAFETY: the row has n values; out has one slot per block, bmax as many or none.
        unsafe { (self.dk.mass)(self.v.ptr(), self.n, bmax, mp, kind, out) };
        sum(out)
    }

    /// Exact (f64) mass of the tokens `floor <= x < cut`, block by block as in `blocks`.
    fn exact(&self, bmax: &[f32], cut: f32) -> f64 {
        let mut out = vec![0.0; self.n.div_ceil(BLOCK)];
        let p = Mass64Params { m: self.m as f64, s: self.inv_t as f64, lo: self.lo64, cut };
        // SAFETY: as in `blocks`.
        unsafe { (self.dk.mass64)(self.v.ptr(), self.n, bmax, p, &mut out) };
        sum(&out)
    }

    /// Whether the kept tokens are exactly those with `t >= T_MIN` (no floor above it), so that
    /// the kernels without a mask apply.
    fn unmasked(&self) -> bool {
        self.unmasked
    }

    /// Tokens the bounds must allow for: the row, and the padding of its last block.
    fn count(&self) -> usize {
        self.n + BLOCK
    }

    /// The f32-exp mass of the kept tokens of block `b` (bounds: `exp_bounds` of `BLOCK` tokens).
    fn exp_block(&self, b: usize) -> f64 {
        let start = b * BLOCK;
        let len = BLOCK.min(self.n - start);
        let mut out = [0.0];
        let kind = if self.unmasked() { MassKind::ExpAll } else { MassKind::Exp };
        // SAFETY: the block lies inside the row.
        unsafe { (self.dk.mass)(self.v.ptr().add(start), len, &[], self.mp, kind, &mut out) };
        out[0]
    }

    /// The f32-exp mass of every kept token, with its error bounds: the logprob normaliser.
    pub(crate) fn z_exp(&self) -> (f64, (f64, f64)) {
        let mut out = Vec::new();
        let kind = if self.unmasked() { MassKind::ExpAll } else { MassKind::Exp };
        let s = self.blocks(&[], kind, f32::INFINITY, &mut out);
        (s, exp_bounds(s, self.count()))
    }

    /// Exact f64 weights of `xs`.
    fn weights(&self, xs: &[f32]) -> Vec<f64> {
        let mut ws = vec![0.0; xs.len()];
        // SAFETY: the level is supported.
        unsafe { (self.k.weights64)(xs, self.m as f64, self.inv_t as f64, &mut ws) };
        ws
    }

    /// Every kept token `x >= vc`, with its exact weight.
    fn gather(&self, bmax: &[f32], vc: f32) -> Cands {
        let lo = vc.max(self.floor).max(-f32::MAX);
        let mut xs = Vec::new();
        // SAFETY: the row has n values; bmax one per block.
        unsafe { (self.dk.gather_ge)(self.v.ptr(), self.n, bmax, lo, &mut xs) };
        let ws = self.weights(&xs);
        let total = sum(&ws);
        Cands { lo, top: self.m, xs, ws, total, sorted: None, hist: None }
    }

    /// Every kept token `x >= vc` with its exact weight, and bounds of the mass of the kept
    /// tokens below (one pass: the f32-exp kernel that gathers).
    fn gather_below(&self, bmax: &[f32], vc: f32) -> (Cands, (f64, f64)) {
        let lo = vc.max(self.floor).max(-f32::MAX);
        if lo <= self.mp.lo {
            // Nothing kept below but weights under 2^-125 (or nothing at all).
            let below = if lo <= self.floor.max(-f32::MAX) { 0.0 } else { self.count() as f64 * TINY };
            return (self.gather(bmax, vc), (0.0, below));
        }
        let mut xs = Vec::new();
        let mut out = vec![0.0; self.n.div_ceil(BLOCK)];
        let mp = MassParams { cut: lo, ..self.mp };
        // SAFETY: the row has n values; out and bmax one per block.
        unsafe { (self.dk.mass_gather)(self.v.ptr(), self.n, bmax, mp, &mut out, &mut xs) };
        let ws = self.weights(&xs);
        let total = sum(&ws);
        let c = Cands { lo, top: self.m, xs, ws, total, sorted: None, hist: None };
        (c, exp_bounds(sum(&out), self.count()))
    }
}

/// Gathered tokens (`x >= lo`, row order) and their exact weights.
struct Cands {
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
fn histogram(xs: &[f32], ws: &[f64], low: f32, top: f32) -> Hist {
    let span = top as f64 - low as f64;
    let k = if span > 0.0 { (((BUCKETS - 1) as f64 / span) as f32).min(f32::MAX) } else { 0.0 };
    let last = (BUCKETS - 1) as f32;
    let idx: Vec<u16> = xs
        .iter()
        .map(|&x| {
            let b = (top - x) * k;
            let b = if b < last { b } else { last };
            // SAFETY: low <= x <= top, so b is in [0, last].
            unsafe { b.to_int_unchecked::<i32>() as u16 }
        })
        .collect();
    let mut mass = vec![0f64; BUCKETS];
    for (&b, &w) in idx.iter().zip(ws) {
        mass[b as usize] += w;
    }
    let group = mass.chunks(16).map(sum).collect();
    (idx, mass, group)
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

impl Cands {
    /// The threshold if the target `top_p * Z` lies in `[t_lo, t_hi]`.
    fn walk(&mut self, t_lo: f64, t_hi: f64) -> Walk {
        if self.total < t_lo {
            return Walk::Below;
        }
        if self.total < t_hi {
            return Walk::Uncertain;
        }
        let (x_lo, x_hi) = if self.xs.len() <= SMALL {
            let sorted = self.sorted.get_or_insert_with(|| {
                let mut s: Vec<(f32, f64)> = self.xs.iter().copied().zip(self.ws.iter().copied()).collect();
                s.sort_unstable_by(desc);
                s
            });
            crossings(sorted, 0.0, t_lo, t_hi)
        } else {
            let (low, top) = (self.lo, self.top);
            let (idx, mass, group) = self.hist.get_or_insert_with(|| histogram(&self.xs, &self.ws, low, top));
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
                    for (j, &b) in chunk.iter().enumerate() {
                        if hit(b) {
                            inside.push((self.xs[c * 32 + j], self.ws[c * 32 + j]));
                        }
                    }
                }
            }
            if inside.len() > 4096 && span > 0 {
                return Walk::Uncertain;
            }
            inside.sort_unstable_by(desc);
            crossings(&inside, start, t_lo, t_hi)
        };
        if x_lo == x_hi {
            Walk::Theta(x_lo)
        } else {
            Walk::Uncertain
        }
    }
}

/// The top-p threshold of a row with finite maximum `m` among the tokens `x >= floor`.
pub(crate) fn top_p_floor<V: Vals + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    m: f32,
    inv_t: f32,
    floor: f32,
    top_p: f64,
) -> f32 {
    match RowMass::new(k, v, m, inv_t, floor) {
        Some(r) => peaked(&r, bmax, top_p).unwrap_or_else(|| general(&r, bmax, &top_blocks(bmax), top_p)),
        None => {
            let r = RowF64 { k, dk: V::kernels(k), v, m, inv_t, floor };
            full(r.gather_all(bmax), top_p)
        }
    }
}

/// The f64 paths only (when the f32 exponent scale overflows).
struct RowF64<'a, V: Vals + ?Sized> {
    k: &'a Kernels,
    dk: &'a DtypeKernels<V::E>,
    v: &'a V,
    m: f32,
    inv_t: f32,
    floor: f32,
}

impl<V: Vals + ?Sized> RowF64<'_, V> {
    fn gather_all(&self, bmax: &[f32]) -> Cands {
        let lo = self.floor.max(-f32::MAX);
        let mut xs = Vec::new();
        // SAFETY: the row has n values; bmax one per block.
        unsafe { (self.dk.gather_ge)(self.v.ptr(), self.v.n(), bmax, lo, &mut xs) };
        let mut ws = vec![0.0; xs.len()];
        // SAFETY: the level is supported.
        unsafe { (self.k.weights64)(&xs, self.m as f64, self.inv_t as f64, &mut ws) };
        let total = sum(&ws);
        Cands { lo, top: self.m, xs, ws, total, sorted: None, hist: None }
    }
}

/// Every kept token gathered: the threshold from exact weights alone.
fn full(mut c: Cands, top_p: f64) -> f32 {
    count(3);
    let t = top_p * c.total;
    match c.walk(t, t) {
        Walk::Theta(x) => x,
        // Only when rounding left the target above the whole mass: keep everything.
        _ => c.lo,
    }
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
fn decide<V: Vals + ?Sized>(r: &RowMass<V>, c: &mut Cands, bm: &[f32], bounds: (f64, f64), top_p: f64) -> Option<f32> {
    let cut = c.lo;
    let base = c.total;
    match c.walk(top_p * (base + bounds.0), top_p * (base + bounds.1)) {
        Walk::Theta(x) => {
            count(1);
            return Some(x);
        }
        Walk::Below => return None,
        Walk::Uncertain => {}
    }
    let rest = if cut <= r.lo64 { 0.0 } else { r.exact(bm, cut) };
    let t = top_p * (base + rest);
    match c.walk(t, t) {
        Walk::Theta(x) => {
            count(2);
            Some(x)
        }
        _ => None,
    }
}

/// Rows whose mass sits in the maxima of their blocks: the cut from the block maxima alone.
///
/// Cheap bounds of every block's mass first; then the blocks by maximum, descending, get their
/// f32-exp mass (with its bounds) until their maxima alone reach `top_p` of the upper bound of
/// Z (the visited blocks' bound plus the cheap bound of the others): the threshold is at least
/// the last maximum visited, `vc`, and every token `>= vc` lies in a visited block.
fn peaked<V: Vals + ?Sized>(r: &RowMass<V>, bmax: &[f32], top_p: f64) -> Option<f32> {
    let nb = bmax.len();
    // f32 weights of every block maximum; the blocks within a factor 1000 of the heaviest, in
    // order, must carry top_p of their sum.
    let mut wb = vec![0f32; nb];
    // SAFETY: bmax is an f32 row of nb values; wb as long.
    unsafe { (r.k.f32.mass_weights)(bmax.as_ptr(), nb, r.mp, wb.as_mut_ptr()) };
    let heaviest = wb.iter().fold(0f32, |a, &b| if b > a { b } else { a });
    let mut order: Vec<usize> = Vec::new();
    for (b, &w) in wb.iter().enumerate() {
        if w >= heaviest * 1e-3 {
            if order.len() == PEAKED_BLOCKS {
                return None;
            }
            order.push(b);
        }
    }
    let all = sum(&wb.iter().map(|&w| w as f64).collect::<Vec<_>>());
    let in_order: f64 = order.iter().map(|&b| wb[b] as f64).sum();
    if in_order < top_p * all * (1.0 - 1e-3) {
        return None;
    }
    order.sort_unstable_by(|&a, &b| bmax[b].total_cmp(&bmax[a]).then(a.cmp(&b)));
    let mut cheap = Vec::new();
    let kind = if r.unmasked() { MassKind::CheapAll } else { MassKind::CheapCut };
    let cheap_all = r.blocks(&[], kind, f32::INFINITY, &mut cheap);
    let wmax = r.weights(&order.iter().map(|&b| bmax[b]).collect::<Vec<_>>());
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
    let (vc, visited) = vc?;
    // The rest of the heavy blocks (all below vc) get their f32-exp mass too: most of R is in
    // them.
    for &b in &order[visited..] {
        s_exp += r.exp_block(b);
        s_cheap += cheap[b];
    }
    // Every other block must lie wholly below vc (the f32 weights that chose the heavy blocks
    // need not be monotone to the last bit).
    let mut seen = vec![false; nb];
    for &b in &order {
        seen[b] = true;
    }
    if bmax.iter().zip(&seen).any(|(&x, &s)| !s && x >= vc) {
        return None;
    }
    let mut c = r.gather(bmax, vc);
    let (lo, hi) = z_bounds(s_exp, s_cheap, order.len());
    if let Walk::Theta(x) = c.walk(top_p * lo, top_p * hi) {
        count(0);
        return Some(x);
    }
    // The blocks not visited by f32 exps as well.
    let rest: Vec<f32> = bmax.iter().zip(&seen).map(|(&x, &s)| if s { f32::NEG_INFINITY } else { x }).collect();
    let mut blocks = Vec::new();
    let kind = if r.unmasked() { MassKind::ExpAll } else { MassKind::Exp };
    let s_rest = r.blocks(&rest, kind, f32::INFINITY, &mut blocks);
    let (a, b) = exp_bounds(s_exp + s_rest, r.count());
    if let Walk::Theta(x) = c.walk(top_p * a, top_p * b) {
        count(1);
        return Some(x);
    }
    // Z in float64.
    let t = top_p * r.exact(&[], f32::INFINITY);
    match c.walk(t, t) {
        Walk::Theta(x) => {
            count(2);
            Some(x)
        }
        _ => None,
    }
}

/// Any row: the cut from a sample of blocks (the top blocks, and evenly spaced others).
fn general<V: Vals + ?Sized>(r: &RowMass<V>, bmax: &[f32], top: &[usize], top_p: f64) -> f32 {
    let vc = sample_cut(r, bmax, top, top_p);
    let (mut c, bounds) = r.gather_below(bmax, vc);
    if let Some(x) = decide(r, &mut c, bmax, bounds, top_p) {
        return x;
    }
    // The threshold is below the cut: gather every kept token.
    full(r.gather(bmax, f32::NEG_INFINITY), top_p)
}

/// A cut below the threshold with high probability, from the f32 weights of a sample: the top
/// blocks (counted once) and about 16 evenly spaced blocks (scaled up to the others).
fn sample_cut<V: Vals + ?Sized>(r: &RowMass<V>, bmax: &[f32], top: &[usize], top_p: f64) -> f32 {
    let nb = bmax.len();
    let mut in_top = vec![false; nb];
    for &b in top {
        in_top[b] = true;
    }
    let stride = (nb / 16).max(1);
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
        if hm[j] > 0.0 && d >= 3.0 * var.sqrt() + 1e-9 * z {
            // Weights of at least 2^(t_j): logits of at least m + t_j / c, lowered a little.
            let t_j = (f32::from_bits((j as u32) << 19) as f64).log2();
            let x = r.m as f64 + t_j / r.mp.c as f64;
            let x = x - x.abs() * 1e-6 - 1e-30;
            return if x > f32::MAX as f64 { r.m } else { (x as f32).max(-f32::MAX) };
        }
    }
    f32::NEG_INFINITY
}

/// Test hooks: the mass kernels of a level on one row.
#[doc(hidden)]
pub mod hooks {
    use super::*;
    use crate::kernels::{kernels, SimdLevel};
    use crate::Logits;

    /// The kernels' constants for a row: (c, lo, lo64), or None if `c` overflows.
    pub fn consts(m: f32, inv_t: f32, floor: f32) -> Option<(f32, f32, f32)> {
        let c = exp2_scale(inv_t)?;
        Some((c, mass_lo(m, c, floor), mass_lo64(m, inv_t, floor)))
    }

    /// 2^t for `-125 <= t <= 0`, as every kernel computes it (one lane).
    pub fn exp2(t: f32) -> f32 {
        crate::kernels::generic::exp2_neg::<crate::kernels::simd::Scalar>(t)
    }

    /// exp(a) for `-700 <= a <= 0`, as the f64 kernels compute it.
    pub fn exp64(a: f64) -> f64 {
        crate::kernels::generic::exp64(a)
    }

    pub fn exp_bounds(s: f64, count: usize) -> (f64, f64) {
        super::exp_bounds(s, count)
    }

    pub fn cheap_bounds(s: f64, count: usize) -> (f64, f64) {
        super::cheap_bounds(s, count)
    }

    /// Per-token f32 weights of an f32 row (`exp2((x - m) * c)` for `lo <= x < cut`, else 0).
    pub fn weights(level: SimdLevel, x: &[f32], m: f32, c: f32, lo: f32, cut: f32) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        let mp = MassParams { m, c, lo, cut };
        // SAFETY: x and out have x.len() values; the level is supported (kernels() checks).
        unsafe { (kernels(level).f32.mass_weights)(x.as_ptr(), x.len(), mp, out.as_mut_ptr()) };
        out
    }

    /// Per-block masses of a row: kind 0 exp, 1 exp below `cut`, 2 cheap below `cut`, 3 exp
    /// and 4 cheap of every token (no mask: `lo` and `cut` unused).
    #[allow(clippy::too_many_arguments)]
    pub fn blocks(level: SimdLevel, x: Logits, m: f32, c: f32, lo: f32, cut: f32, kind: u8) -> Vec<f64> {
        let kind =
            [MassKind::Exp, MassKind::ExpCut, MassKind::CheapCut, MassKind::ExpAll, MassKind::CheapAll][kind as usize];
        let mp = MassParams { m, c, lo, cut };
        let k = kernels(level);
        let n = x.len();
        let mut out = vec![0f64; n.div_ceil(BLOCK)];
        // SAFETY: as above.
        unsafe {
            match x {
                Logits::F32(s) => (k.f32.mass)(s.as_ptr(), n, &[], mp, kind, &mut out),
                Logits::Bf16(s) => (k.bf16.mass)(s.as_ptr(), n, &[], mp, kind, &mut out),
                Logits::F16(s) => (k.f16.mass)(s.as_ptr(), n, &[], mp, kind, &mut out),
            }
        };
        out
    }

    /// The mass-and-gather kernel on an f32 row: per-block exp masses of `lo <= x < cut`, and the
    /// values `>= cut`; then the same from the separate kernels (mass of kind 1, gather).
    #[allow(clippy::type_complexity)]
    pub fn mass_gather(
        level: SimdLevel,
        x: &[f32],
        m: f32,
        c: f32,
        lo: f32,
        cut: f32,
    ) -> ((Vec<f64>, Vec<f32>), (Vec<f64>, Vec<f32>)) {
        let k = kernels(level);
        let mp = MassParams { m, c, lo, cut };
        let bmax: Vec<f32> =
            x.chunks(BLOCK).map(|b| b.iter().fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a })).collect();
        let (mut out, mut xs) = (vec![0f64; bmax.len()], Vec::new());
        // SAFETY: as above.
        unsafe { (k.f32.mass_gather)(x.as_ptr(), x.len(), &bmax, mp, &mut out, &mut xs) };
        let (mut out2, mut xs2) = (vec![0f64; bmax.len()], Vec::new());
        // SAFETY: as above.
        unsafe {
            (k.f32.mass)(x.as_ptr(), x.len(), &bmax, mp, MassKind::ExpCut, &mut out2);
            (k.f32.gather_ge)(x.as_ptr(), x.len(), &bmax, cut, &mut xs2);
        }
        ((out, xs), (out2, xs2))
    }

    /// Per-block f64 masses of an f32 row (tokens `lo <= x < cut`).
    pub fn blocks64(level: SimdLevel, x: &[f32], m: f32, inv_t: f32, lo: f32, cut: f32) -> Vec<f64> {
        let p = Mass64Params { m: m as f64, s: inv_t as f64, lo, cut };
        let mut out = vec![0f64; x.len().div_ceil(BLOCK)];
        // SAFETY: as above.
        unsafe { (kernels(level).f32.mass64)(x.as_ptr(), x.len(), &[], p, &mut out) };
        out
    }
}
