//! min-p, top-k and top-p without sorting the vocabulary.
//!
//! Every filter keeps a set `{i : x_i >= θ}` (ties kept), and renormalising does not change the
//! order of the tokens, so the composition (min-p, then top-k, then top-p, each on what the
//! previous one left) is one threshold: the race's `RaceParams::floor`.
//!
//! Probabilities are `p_i ∝ w_i = exp((x_i - m) * inv_t)` computed in f64 (`m` the row's finite
//! maximum, `inv_t` the f32 `1/T` of the race), over the finite logits; NaN and -inf are never
//! kept.
//!
//! - min-p: keep `w_i >= min_p` (that is `p_i >= min_p * p_max`; `w` is 1 at the maximum). `w` is
//!   monotone in `x`, so the smallest f32 value that passes is found by a bisection over the
//!   order-preserving integer image of f32 (32 evaluations of `exp`, no pass over the row).
//! - top-k: the k-th largest finite logit. The k-th largest of the block maxima (from the first
//!   pass) is a lower bound of it, so only the values above that bound, in the blocks whose
//!   maximum reaches it, are gathered and selected (`select_nth_unstable`); when there are fewer
//!   blocks than k, every finite value is gathered.
//! - top-p: the smallest set of most probable tokens whose mass reaches `top_p` of the mass left.
//!   After a top-k the candidates are few and are sorted. Otherwise (`mass.rs`) the tokens above
//!   a cut are gathered with exact weights and the mass below the cut is bounded by SIMD kernels
//!   until the bounds decide (or computed in f64 when they do not). The threshold is the logit of
//!   the token whose cumulative mass reaches `top_p * Z`; tokens tied with it stay.
//!
//! The thresholds do not depend on the SIMD level (every mass kernel gives bit-identical sums on
//! every level) or on the number of threads.

use super::batch::{Batch, Logits};
use crate::kernels::simd::Elem;
use crate::kernels::{Bf16, DtypeKernels, Kernels, BLOCK, F16};

/// A row's values as f32, and the kernels of its dtype.
pub(crate) trait Vals {
    type E: Elem;
    fn n(&self) -> usize;
    fn at(&self, i: usize) -> f32;
    fn ptr(&self) -> *const Self::E;
    fn kernels(k: &Kernels) -> &DtypeKernels<Self::E>;
}

/// `Vals` for a slice of one dtype: `$table` is its field in `Kernels`, `$to_f32` its conversion.
macro_rules! impl_vals {
    ($elem:ty, $table:ident, |$x:ident| $to_f32:expr) => {
        impl Vals for [$elem] {
            type E = $elem;
            #[inline(always)]
            fn n(&self) -> usize {
                self.len()
            }
            #[inline(always)]
            fn at(&self, i: usize) -> f32 {
                let $x = self[i];
                $to_f32
            }
            fn ptr(&self) -> *const $elem {
                self.as_ptr()
            }
            fn kernels(k: &Kernels) -> &DtypeKernels<$elem> {
                &k.$table
            }
        }
    };
}
impl_vals!(f32, f32, |x| x);
impl_vals!(Bf16, bf16, |x| x.to_f32());
impl_vals!(F16, f16, |x| x.to_f32());

/// Calls `$body` with `$v` bound to row `$r` of `$batch` as a `&[E]` (monomorphised per dtype).
macro_rules! with_vals {
    ($batch:expr, $r:expr, |$v:ident| $body:expr) => {{
        let start = $r * $batch.row_stride;
        let end = start + $batch.vocab;
        match $batch.logits {
            Logits::F32(s) => {
                let $v = &s[start..end];
                $body
            }
            Logits::Bf16(s) => {
                let $v = &s[start..end];
                $body
            }
            Logits::F16(s) => {
                let $v = &s[start..end];
                $body
            }
        }
    }};
}
pub(crate) use with_vals;

/// One row's filter settings, already normalised: `None`/off values removed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Filters {
    /// 0: off.
    pub top_k: usize,
    /// 1: off.
    pub top_p: f64,
    /// 0: off.
    pub min_p: f64,
}

impl Filters {
    /// The filters of row `r`, or `None` if none is on.
    pub(crate) fn of(batch: &Batch, r: usize) -> Option<Filters> {
        let k = batch.top_k.map_or(0, |k| k[r]);
        let top_k = if k <= 0 || k as usize >= batch.vocab { 0 } else { k as usize };
        let top_p = batch.top_p.map_or(1.0, |p| p[r] as f64);
        let min_p = batch.min_p.map_or(0.0, |p| p[r] as f64);
        let f = Filters { top_k, top_p, min_p };
        (top_k != 0 || top_p < 1.0 || min_p > 0.0).then_some(f)
    }
}

#[inline(always)]
fn weight(x: f32, m: f32, inv_t: f32) -> f64 {
    ((x as f64 - m as f64) * inv_t as f64).exp()
}

/// The order-preserving map of f32 (no NaN) to u32, and back.
pub(crate) fn ord_key(x: f32) -> u32 {
    let b = x.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}
pub(crate) fn from_ord_key(k: u32) -> f32 {
    f32::from_bits(if k >> 31 == 1 { k & 0x7fff_ffff } else { !k })
}

/// The smallest f32 `v <= m` with `weight(v) >= min_p` (min_p in (0, 1]).
fn min_p_floor(m: f32, inv_t: f32, min_p: f64) -> f32 {
    let (mut lo, mut hi) = (ord_key(-f32::MAX), ord_key(m));
    if weight(-f32::MAX, m, inv_t) >= min_p {
        return f32::NEG_INFINITY;
    }
    // Invariant: lo fails, hi passes.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if weight(from_ord_key(mid), m, inv_t) >= min_p {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    from_ord_key(hi)
}

/// Descending order of finite f32 values.
fn desc(a: &f32, b: &f32) -> std::cmp::Ordering {
    b.total_cmp(a)
}

/// The finite values `>= lo` of the blocks whose maximum reaches `lo` (NaN and -inf never).
fn gather<V: Vals + ?Sized>(v: &V, bmax: &[f32], lo: f32, out: &mut Vec<f32>) {
    out.clear();
    let n = v.n();
    for (b, &bm) in bmax.iter().enumerate() {
        if !(bm >= lo && bm > f32::NEG_INFINITY) {
            continue;
        }
        for i in b * BLOCK..((b + 1) * BLOCK).min(n) {
            let x = v.at(i);
            if x >= lo && x > f32::NEG_INFINITY {
                out.push(x);
            }
        }
    }
}

/// The k-th largest finite value of the row (1 <= k), or `None` if it has fewer than k; `cand`
/// receives a superset of the values `>=` it (all of them finite).
fn kth_largest<V: Vals + ?Sized>(v: &V, bmax: &[f32], k: usize, cand: &mut Vec<f32>) -> Option<f32> {
    let mut bm: Vec<f32> = bmax.iter().copied().filter(|&b| b > f32::NEG_INFINITY).collect();
    let lo = if bm.len() >= k { *bm.select_nth_unstable_by(k - 1, desc).1 } else { f32::NEG_INFINITY };
    gather(v, bmax, lo, cand);
    if cand.len() < k {
        return None;
    }
    let mut sel = cand.clone();
    Some(*sel.select_nth_unstable_by(k - 1, desc).1)
}

/// Walks `(x, w)` pairs sorted by `x` descending from cumulative mass `cum`; the first `x` at
/// which the mass reaches `target` (or the last `x` if it never does).
fn walk(sorted: &[(f32, f64)], mut cum: f64, target: f64) -> f32 {
    for &(x, w) in sorted {
        cum += w;
        if cum >= target {
            return x;
        }
    }
    sorted.last().map_or(f32::NEG_INFINITY, |s| s.0)
}

/// top-p among the candidates `cand` that are `>= floor` (a set that holds every kept token).
fn top_p_of_candidates(cand: &[f32], floor: f32, m: f32, inv_t: f32, top_p: f64) -> f32 {
    let mut kept: Vec<(f32, f64)> = cand.iter().filter(|&&x| x >= floor).map(|&x| (x, weight(x, m, inv_t))).collect();
    let z: f64 = kept.iter().map(|e| e.1).sum();
    kept.sort_unstable_by(|a, b| desc(&a.0, &b.0));
    walk(&kept, 0.0, top_p * z)
}

/// The floor of a sampling row with finite maximum `m`: the race keeps `x >= floor`.
pub(crate) fn row_floor<V: Vals + ?Sized>(k: &Kernels, v: &V, bmax: &[f32], m: f32, inv_t: f32, f: Filters) -> f32 {
    let mut floor = f32::NEG_INFINITY;
    if f.min_p > 0.0 {
        floor = min_p_floor(m, inv_t, f.min_p);
    }
    let mut cand = Vec::new();
    let mut have_cand = false;
    if f.top_k > 0 {
        if let Some(kth) = kth_largest(v, bmax, f.top_k, &mut cand) {
            floor = floor.max(kth);
            have_cand = true;
        }
    }
    if f.top_p < 1.0 {
        floor = if have_cand {
            top_p_of_candidates(&cand, floor, m, inv_t, f.top_p)
        } else {
            super::mass::top_p_floor(k, v, bmax, m, inv_t, floor, f.top_p)
        };
    }
    floor
}

/// The floor of row `r` of `batch` (block maxima `bmax`, finite maximum `m`), or -inf.
pub(crate) fn batch_row_floor(k: &Kernels, batch: &Batch, r: usize, bmax: &[f32], m: f32, inv_t: f32) -> f32 {
    match Filters::of(batch, r) {
        None => f32::NEG_INFINITY,
        Some(f) => with_vals!(batch, r, |v| row_floor(k, v, bmax, m, inv_t, f)),
    }
}

/// Test hook: the floor the filters give one f32 row at temperature `t` (> 0): the kept set is
/// `{i : x_i >= floor}` among the finite logits. -inf when nothing is filtered or the row has
/// no finite maximum.
#[doc(hidden)]
pub fn kept_floor(x: &[f32], t: f32, top_k: i32, top_p: f32, min_p: f32) -> f32 {
    kept_floor_at(crate::kernels::best_level(), x, t, top_k, top_p, min_p)
}

/// [`kept_floor`] with the kernels of `level`.
#[doc(hidden)]
pub fn kept_floor_at(level: crate::SimdLevel, x: &[f32], t: f32, top_k: i32, top_p: f32, min_p: f32) -> f32 {
    let (k, p, mp) = ([top_k], [top_p], [min_p]);
    let batch = Batch { top_k: Some(&k), top_p: Some(&p), min_p: Some(&mp), ..Batch::new(Logits::F32(x), 1, x.len()) };
    let bmax: Vec<f32> =
        x.chunks(BLOCK).map(|c| c.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })).collect();
    let m = bmax.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    if !m.is_finite() {
        return f32::NEG_INFINITY;
    }
    batch_row_floor(crate::kernels::kernels(level), &batch, 0, &bmax, m, super::inv_temperature(t))
}
