//! Logprobs of the sampled token, its rank, and each row's top-n.
//!
//! A row's logprob function `f` is monotone in the logit:
//! - finite maximum `m`: `f(x) = (x - m) * s - ln Z` for `x` in the set, -inf outside it, where
//!   RAW uses `s = 1` and every finite logit, PROCESSED (sampling rows) uses `s = inv_t` and the
//!   tokens the filters keep (`x >= floor`), and `Z = Σ exp((x - m) * s)` over the set, all in f64
//!   and rounded to f32 at the end; greedy rows use RAW in both modes;
//! - a row with +inf logits: each +inf token has `-ln(count of +inf)`, every other -inf;
//! - an empty row (no finite or +inf logit): -inf everywhere.
//!
//! NaN logits are outside every set (logprob -inf). The rank of the sampled token is the count
//! of tokens whose reported logprob is >= its own; the top-n are ordered by logprob descending,
//! then id ascending.

use crate::alloc;
use crate::batch::LogprobMode;
use crate::error::Result;
use crate::kernels::{Kernels, BLOCK};
use crate::mass::RowMass;
use crate::row::RowValues;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// What a drawn row leaves for the logprobs: the maximum (NaN ignored) of the values it was
/// drawn from and the filters' floor, and whether it was drawn from its processed values (a row
/// with a step: then these are of its processed values).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowInfo {
    pub top: f32,
    pub floor: f32,
    pub processed: bool,
}

impl Default for RowInfo {
    fn default() -> Self {
        RowInfo { top: f32::NEG_INFINITY, floor: f32::NEG_INFINITY, processed: false }
    }
}

/// The block maxima of a row into `bmax` and its largest value (NaN ignored), for the logprobs
/// of a row not computed by the task that drew it. Fails only if `bmax` cannot grow to a slot
/// per block (with that room already, it allocates nothing).
pub(crate) fn block_maxima<V: RowValues + ?Sized>(k: &Kernels, v: &V, bmax: &mut Vec<f32>) -> Result<f32> {
    bmax.clear();
    alloc::resize(bmax, v.n().div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima")?;
    v.scan(k, 0, v.n(), bmax);
    Ok(crate::kernels::largest(bmax, f32::NEG_INFINITY) + 0.0)
}

/// What a row's logprobs go into.
pub(crate) struct RowOut<'a> {
    pub logprob: &'a mut f32,
    pub rank: &'a mut i32,
    /// `top_n` slots each (empty when top-n is not asked for).
    pub ids: &'a mut [i32],
    pub lps: &'a mut [f32],
    pub want_rank: bool,
}

/// Where a row's logprobs of given token ids go: one logprob (and, when asked, one rank) per id.
pub(crate) struct GivenOut<'a> {
    pub ids: &'a [i32],
    pub lps: &'a mut [f32],
    /// Empty when ranks are not asked for.
    pub ranks: &'a mut [i32],
}

/// The monotone map from a logit to its logprob.
#[derive(Clone, Copy)]
pub(crate) enum LogprobFn {
    Finite { m: f64, s: f64, floor: f32, ln_z: f64 },
    PosInf { lp: f32 },
    Empty,
}

impl LogprobFn {
    #[inline(always)]
    pub(crate) fn of(&self, x: f32) -> f32 {
        match *self {
            LogprobFn::Finite { m, s, floor, ln_z } => {
                if x >= floor && x.is_finite() {
                    ((x as f64 - m) * s - ln_z) as f32
                } else {
                    f32::NEG_INFINITY
                }
            }
            LogprobFn::PosInf { lp } => {
                if x == f32::INFINITY {
                    lp
                } else {
                    f32::NEG_INFINITY
                }
            }
            LogprobFn::Empty => f32::NEG_INFINITY,
        }
    }
}

/// A top-n entry: larger is better (logprob, then lower id).
#[derive(Clone, Copy, PartialEq)]
struct Entry(f32, i32);
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0).then(o.1.cmp(&self.1))
    }
}

/// The logprob function of a row whose maximum is `top` (NaN ignored) and block maxima `bmax`:
/// scale `s`, the tokens `x >= floor` (finite ones; or the +inf ones, when `top` is +inf).
/// `mass`: scratch for the per-block masses, the one allocation (none when it has a slot per
/// block already).
pub(crate) fn logprob_fn<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    (s, floor, top): (f64, f32, f32),
    mass: &mut Vec<f64>,
) -> Result<LogprobFn> {
    let n = v.n();
    if top == f32::INFINITY {
        let c = (0..n).filter(|&i| v.at(i) == f32::INFINITY).count();
        return Ok(LogprobFn::PosInf { lp: -(c as f32).ln() });
    }
    if top == f32::NEG_INFINITY {
        return Ok(LogprobFn::Empty);
    }
    let m = top as f64;
    let z = match RowMass::new(k, v, top, s as f32, floor) {
        // One SIMD pass: f32 exps summed in a fixed order (relative error below 1e-5).
        Some(r) => r.z_exp(bmax, mass)?.0,
        None => {
            let mut z = 0f64;
            for i in 0..n {
                let x = v.at(i);
                if x >= floor && x.is_finite() {
                    z += ((x as f64 - m) * s).exp();
                }
            }
            z
        }
    };
    Ok(LogprobFn::Finite { m, s, floor, ln_z: z.ln() })
}

/// The scale and the kept tokens' floor of the logprobs in `mode` of a row drawn with `inv_t`
/// (`None`: greedy) and filters' floor `floor`.
pub(crate) fn scale_and_floor(mode: LogprobMode, inv_t: Option<f32>, floor: f32) -> (f64, f32) {
    match (mode, inv_t) {
        (LogprobMode::Processed, Some(inv_t)) => (inv_t as f64, floor),
        _ => (1.0, f32::NEG_INFINITY),
    }
}

impl LogprobFn {
    /// The smallest value whose logprob is at least `target` (finite), given that `x`'s is.
    /// The map is monotone in the value (an f64 subtraction, a product by `s > 0`, a
    /// subtraction and the rounding to f32, each monotone), so the tokens whose logprob is
    /// `>= target` are exactly those whose value is `>=` this one.
    fn least_value_reaching(&self, target: f32, x: f32) -> f32 {
        let LogprobFn::Finite { floor, .. } = *self else { unreachable!("only finite rows bisect") };
        crate::mass::first_passing(floor, x, |y| self.of(y) >= target)
    }
}

/// The rank of a token whose logprob `own` (finite) is that of value `x`: the count of the
/// values at or above the least one whose logprob reaches `own`, read from the blocks whose
/// maximum reaches it.
fn rank_by_count<V: RowValues + ?Sized>(k: &Kernels, v: &V, bmax: &[f32], lp: &LogprobFn, own: f32, x: f32) -> i32 {
    let lo = lp.least_value_reaching(own, x);
    // SAFETY: the row has n values and bmax one maximum per block.
    unsafe { (V::kernels(k).count_ge)(v.ptr(), v.n(), bmax, lo) as i32 }
}

/// The `ids.len().max(lps.len())` most probable tokens from the blocks that can hold them: every
/// one of them has a value at or above the top-n-th block maximum `t` (n blocks reach it), and
/// every token whose logprob equals `t`'s has a value at or above the least one reaching it, so
/// the candidates are the values at or above that. `false` (nothing written) when fewer than n
/// blocks have a kept maximum: then tokens outside the kept set (logprob -inf) belong to the
/// top-n, and only a pass over every token orders them.
fn top_by_blocks<V: RowValues + ?Sized>(
    v: &V,
    bmax: &[f32],
    lp: &LogprobFn,
    ids: &mut [i32],
    lps: &mut [f32],
) -> Result<bool> {
    let (top_n, LogprobFn::Finite { floor, .. }) = (ids.len().max(lps.len()), *lp) else { return Ok(false) };
    if top_n > bmax.len() {
        return Ok(false);
    }
    let mut maxima = alloc::collect(bmax.iter().copied(), "the top-n's block maxima")?;
    let (_, &mut t, _) = maxima.select_nth_unstable_by(top_n - 1, |a, b| b.total_cmp(a));
    if !(t.is_finite() && t >= floor) {
        return Ok(false);
    }
    let lo = lp.least_value_reaching(lp.of(t), t);
    let mut candidates = alloc::with_capacity(4 * top_n, "the top-n's candidates")?;
    for (b, _) in bmax.iter().enumerate().filter(|&(_, &m)| m >= lo) {
        // Room for the whole block, so that the pushes below never grow the vector.
        alloc::reserve(&mut candidates, BLOCK, "the top-n's candidates")?;
        for i in b * BLOCK..((b + 1) * BLOCK).min(v.n()) {
            let x = v.at(i);
            if x >= lo {
                candidates.push(Entry(lp.of(x), i as i32));
            }
        }
    }
    candidates.sort_unstable_by(|a, b| b.cmp(a));
    write_top(candidates.into_iter(), ids, lps);
    Ok(true)
}

/// Writes the first entries of `best` (descending) into `ids` and `lps`.
fn write_top(best: impl Iterator<Item = Entry>, ids: &mut [i32], lps: &mut [f32]) {
    for (j, e) in best.take(ids.len().max(lps.len())).enumerate() {
        if let Some(id) = ids.get_mut(j) {
            *id = e.1;
        }
        if let Some(l) = lps.get_mut(j) {
            *l = e.0;
        }
    }
}

/// The rank of the token whose logprob is `own` and the top-n, from the logprob of every token
/// of the row: the reference of the faster ways above, and the way for the rows they do not
/// cover (+inf, empty, a sampled token outside the kept set, fewer kept blocks than n).
fn rank_and_top_by_scan<V: RowValues + ?Sized>(
    v: &V,
    lp: &LogprobFn,
    own: f32,
    out: &mut RowOut,
    rank: bool,
    top: bool,
) -> Result<()> {
    let top_n = if top { out.ids.len().max(out.lps.len()) } else { 0 };
    let mut count = 0i32;
    let mut heap: BinaryHeap<std::cmp::Reverse<Entry>> =
        BinaryHeap::from(alloc::with_capacity(top_n + 1, "the top-n's heap")?);
    for i in 0..v.n() {
        let l = lp.of(v.at(i));
        count += (l >= own) as i32;
        if top_n > 0 {
            let e = Entry(l, i as i32);
            if heap.len() < top_n {
                heap.push(std::cmp::Reverse(e));
            } else if e > heap.peek().unwrap().0 {
                heap.pop();
                heap.push(std::cmp::Reverse(e));
            }
        }
    }
    if rank {
        *out.rank = count;
    }
    if top_n > 0 {
        // Ascending Reverse = descending Entry.
        write_top(heap.into_sorted_vec().into_iter().map(|r| r.0), out.ids, out.lps);
    }
    Ok(())
}

/// Computes row logprobs. `bmax` holds the row's block maxima, `top` its maximum (NaN ignored),
/// `floor` the filters' floor. Fails only if the rank's or the top-n's scratch cannot be
/// allocated.
#[allow(clippy::too_many_arguments)]
pub(crate) fn row_logprobs<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    inv_t: Option<f32>,
    mode: LogprobMode,
    top: f32,
    floor: f32,
    token: i32,
    out: RowOut,
) -> Result<()> {
    row_logprobs_given(k, v, bmax, inv_t, mode, (top, floor), token, out, None)
}

/// [`row_logprobs`], with the logprobs (and ranks) of the given ids of `given` from the same
/// map from a value to its logprob (no second sum over the row).
#[allow(clippy::too_many_arguments)]
pub(crate) fn row_logprobs_given<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    inv_t: Option<f32>,
    mode: LogprobMode,
    (top, floor): (f32, f32),
    token: i32,
    mut out: RowOut,
    given: Option<GivenOut>,
) -> Result<()> {
    let (s, floor) = scale_and_floor(mode, inv_t, floor);
    let lp = logprob_fn(k, v, bmax, (s, floor, top), &mut Vec::new())?;
    if let Some(g) = given {
        given_logprobs(k, v, bmax, &lp, g)?;
    }
    let x = v.at(token as usize);
    let own = lp.of(x);
    *out.logprob = own;
    let wants_top = out.ids.len().max(out.lps.len()) > 0;
    let finite = matches!(lp, LogprobFn::Finite { .. }) && own > f32::NEG_INFINITY;
    let rank_by_scan = out.want_rank && !finite;
    if out.want_rank && finite {
        *out.rank = rank_by_count(k, v, bmax, &lp, own, x);
    }
    let top_by_scan = wants_top && !(finite && top_by_blocks(v, bmax, &lp, out.ids, out.lps)?);
    if rank_by_scan || top_by_scan {
        rank_and_top_by_scan(v, &lp, own, &mut out, rank_by_scan, top_by_scan)?;
    }
    Ok(())
}

/// The logprob of each id of `g` under `lp`, and its rank when asked: counted from the blocks
/// for a finite logprob of a finite map, else by a scan of the row (a row with +inf values,
/// or an id of logprob -inf, whose rank counts every token at or above it).
fn given_logprobs<V: RowValues + ?Sized>(k: &Kernels, v: &V, bmax: &[f32], lp: &LogprobFn, g: GivenOut) -> Result<()> {
    let finite_map = matches!(lp, LogprobFn::Finite { .. });
    for (j, &id) in g.ids.iter().enumerate() {
        let x = v.at(id as usize);
        let own = lp.of(x);
        g.lps[j] = own;
        if let Some(rank) = g.ranks.get_mut(j) {
            *rank = if finite_map && own > f32::NEG_INFINITY {
                rank_by_count(k, v, bmax, lp, own, x)
            } else {
                (0..v.n()).filter(|&i| lp.of(v.at(i)) >= own).count() as i32
            };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{kernels, supported_levels};

    /// A small generator of test rows (xorshift).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 40) as f32 / (1u64 << 24) as f32
        }
    }

    /// Rows that exercise the rounding of logprobs to f32 (values closer than a logprob's ulp),
    /// ties, NaN, -inf and blocks whose maxima are alike.
    fn rows(vocab: usize) -> Vec<Vec<f32>> {
        let mut g = Rng(0x2545_f491_4f6c_dd1d);
        let normal: Vec<f32> = (0..vocab).map(|_| (g.next() - 0.5) * 12.0).collect();
        // One token far above the rest, whose values are 2^-20 apart: thousands of distinct
        // values share each logprob (about -100, ulp 7.6e-6).
        let mut close: Vec<f32> = (0..vocab).map(|i| (i % 97) as f32 * 9.5e-7).collect();
        close[vocab / 3] = 100.0;
        let ties: Vec<f32> = (0..vocab).map(|_| ((g.next() * 8.0) as i32) as f32 * 0.5).collect();
        let mut special = normal.clone();
        for i in (0..vocab).step_by(37) {
            special[i] = if i % 2 == 0 { f32::NAN } else { f32::NEG_INFINITY };
        }
        vec![normal, close, ties, special]
    }

    #[test]
    fn ranks_and_top_n_from_the_blocks_match_the_full_scan() {
        let vocab = 3000; // 12 blocks, the last one partial
        for level in supported_levels() {
            let k = kernels(level);
            for (ri, row) in rows(vocab).iter().enumerate() {
                let v: &[f32] = row;
                let mut bmax = vec![f32::NEG_INFINITY; vocab.div_ceil(BLOCK)];
                v.scan(k, 0, vocab, &mut bmax);
                let top = bmax.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a }) + 0.0;
                let mut sorted: Vec<f32> = row.iter().copied().filter(|x| x.is_finite()).collect();
                sorted.sort_by(|a, b| a.total_cmp(b));
                for (inv_t, floor) in [(1.0, f32::NEG_INFINITY), (0.1, f32::NEG_INFINITY), (3.7, sorted[vocab / 2])] {
                    for top_n in [0, 1, 5, 20, 13] {
                        for token in [vocab / 3, 17, 1001, 2999] {
                            let mode = LogprobMode::Processed;
                            let (mut lp, mut rank, mut ids, mut lps) = (0f32, 0i32, vec![0; top_n], vec![0f32; top_n]);
                            let o = RowOut {
                                logprob: &mut lp,
                                rank: &mut rank,
                                ids: &mut ids,
                                lps: &mut lps,
                                want_rank: true,
                            };
                            row_logprobs(k, v, &bmax, Some(inv_t), mode, top, floor, token as i32, o).unwrap();
                            let f = logprob_fn(k, v, &bmax, (inv_t as f64, floor, top), &mut Vec::new()).unwrap();
                            let own = f.of(v[token]);
                            let (mut rank2, mut ids2, mut lps2) = (0i32, vec![0; top_n], vec![0f32; top_n]);
                            let mut o2 = RowOut {
                                logprob: &mut 0.0,
                                rank: &mut rank2,
                                ids: &mut ids2,
                                lps: &mut lps2,
                                want_rank: true,
                            };
                            rank_and_top_by_scan(v, &f, own, &mut o2, true, true).unwrap();
                            let at = format!("{level:?} row {ri} 1/T {inv_t} floor {floor} top-{top_n} token {token}");
                            assert_eq!(lp.to_bits(), own.to_bits(), "{at}");
                            assert_eq!(rank, rank2, "{at}: rank");
                            assert_eq!(ids, ids2, "{at}: ids");
                            assert_eq!(lps, lps2, "{at}: logprobs");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn logprobs_of_close_values_do_round_together() {
        // The test above means something only if its row of close values has tokens of equal
        // logprob and different values.
        let vocab = 3000;
        let row = &rows(vocab)[1];
        let k = kernels(supported_levels()[0]);
        let v: &[f32] = row;
        let f = logprob_fn(k, v, &[], (1.0, f32::NEG_INFINITY, 100.0), &mut Vec::new()).unwrap();
        let (a, b) = (row[1], row[2]);
        assert!(a != b && f.of(a) == f.of(b), "{a} {b}: {} {}", f.of(a), f.of(b));
    }
}
