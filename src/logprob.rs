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
use crate::batch::{Batch, FullMode, LogprobMode, Output};
use crate::edits::RowEdits;
use crate::error::Result;
use crate::kernels::Kernels;
use crate::mass::RowMass;
use crate::row::{with_row, RowValues};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// What a drawn row leaves for the logprobs: the maximum (NaN ignored) of the values it was
/// drawn from and the filters' floor, and whether the row had edits (then these are of its
/// processed values).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowInfo {
    pub top: f32,
    pub floor: f32,
    pub edited: bool,
}

impl Default for RowInfo {
    fn default() -> Self {
        RowInfo { top: f32::NEG_INFINITY, floor: f32::NEG_INFINITY, edited: false }
    }
}

/// The largest value of a row (NaN ignored), for the raw logprobs of a row drawn from its
/// processed values.
fn row_max<V: RowValues + ?Sized>(k: &Kernels, v: &V) -> f32 {
    let mut bmax = vec![f32::NEG_INFINITY; v.n().div_ceil(crate::kernels::BLOCK)];
    v.scan(k, 0, v.n(), &mut bmax);
    bmax.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a }) + 0.0
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

/// The monotone map from a logit to its logprob.
enum LogprobFn {
    Finite { m: f64, s: f64, floor: f32, ln_z: f64 },
    PosInf { lp: f32 },
    Empty,
}

impl LogprobFn {
    #[inline(always)]
    fn of(&self, x: f32) -> f32 {
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

/// The logprob function of a row whose maximum is `top` (NaN ignored): scale `s`, the tokens
/// `x >= floor` (finite ones; or the +inf ones, when `top` is +inf).
fn logprob_fn<V: RowValues + ?Sized>(k: &Kernels, v: &V, s: f64, floor: f32, top: f32) -> LogprobFn {
    let n = v.n();
    if top == f32::INFINITY {
        let c = (0..n).filter(|&i| v.at(i) == f32::INFINITY).count();
        return LogprobFn::PosInf { lp: -(c as f32).ln() };
    }
    if top == f32::NEG_INFINITY {
        return LogprobFn::Empty;
    }
    let m = top as f64;
    let z = match RowMass::new(k, v, top, s as f32, floor) {
        // One SIMD pass: f32 exps summed in a fixed order (relative error below 1e-5).
        Some(r) => r.z_exp().0,
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
    LogprobFn::Finite { m, s, floor, ln_z: z.ln() }
}

/// The scale and the kept tokens' floor of the logprobs in `mode` of a row drawn with `inv_t`
/// (`None`: greedy) and filters' floor `floor`.
fn scale_and_floor(mode: LogprobMode, inv_t: Option<f32>, floor: f32) -> (f64, f32) {
    match (mode, inv_t) {
        (LogprobMode::Processed, Some(inv_t)) => (inv_t as f64, floor),
        _ => (1.0, f32::NEG_INFINITY),
    }
}

/// Computes row logprobs. `top` is the row's maximum (NaN ignored), `floor` the filters' floor.
#[allow(clippy::too_many_arguments)]
pub(crate) fn row_logprobs<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    inv_t: Option<f32>,
    mode: LogprobMode,
    top: f32,
    floor: f32,
    token: i32,
    out: RowOut,
) {
    let n = v.n();
    let (s, floor) = scale_and_floor(mode, inv_t, floor);
    let lp = logprob_fn(k, v, s, floor, top);
    let own = lp.of(v.at(token as usize));
    *out.logprob = own;
    let top_n = out.ids.len().max(out.lps.len());
    if !out.want_rank && top_n == 0 {
        return;
    }
    let mut rank = 0i32;
    let mut heap: BinaryHeap<std::cmp::Reverse<Entry>> = BinaryHeap::with_capacity(top_n + 1);
    for i in 0..n {
        let l = lp.of(v.at(i));
        rank += (l >= own) as i32;
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
    *out.rank = rank;
    let sorted = heap.into_sorted_vec(); // ascending Reverse = descending Entry
    for (j, std::cmp::Reverse(e)) in sorted.into_iter().enumerate() {
        if let Some(id) = out.ids.get_mut(j) {
            *id = e.1;
        }
        if let Some(l) = out.lps.get_mut(j) {
            *l = e.0;
        }
    }
}

/// Every row's logprob outputs, computed into scratch so that nothing is written on failure.
pub(crate) struct Logprobs {
    top_n: usize,
    logprobs: Vec<f32>,
    ranks: Vec<i32>,
    ids: Vec<i32>,
    lps: Vec<f32>,
}

impl Logprobs {
    /// Computes what `out` asks for, row by row on this thread.
    pub(crate) fn compute(
        k: &Kernels,
        batch: &Batch,
        inv_t: &[Option<f32>],
        info: &[RowInfo],
        tokens: &[i32],
        out: &Output,
        processed: &mut Processed,
    ) -> Logprobs {
        let rows = batch.rows;
        let top_n = if out.topn_ids.is_some() || out.topn_logprobs.is_some() { out.top_n } else { 0 };
        let mut l = Logprobs {
            top_n,
            logprobs: vec![0.0; rows],
            ranks: vec![0; rows],
            ids: vec![0; rows * top_n],
            lps: vec![0.0; rows * top_n],
        };
        let want_rank = out.ranks.is_some();
        for r in 0..rows {
            let o = RowOut {
                logprob: &mut l.logprobs[r],
                rank: &mut l.ranks[r],
                ids: &mut l.ids[r * top_n..(r + 1) * top_n],
                lps: &mut l.lps[r * top_n..(r + 1) * top_n],
                want_rank,
            };
            let RowInfo { top, floor, edited } = info[r];
            let (mode, t) = (out.logprob_mode, tokens[r]);
            with_row!(batch, r, |v| match (edited, mode) {
                (true, LogprobMode::Raw) => row_logprobs(k, v, inv_t[r], mode, row_max(k, v), floor, t, o),
                (true, LogprobMode::Processed) => {
                    let y = processed.row(r, v);
                    row_logprobs(k, y, inv_t[r], mode, top, floor, t, o)
                }
                (false, _) => row_logprobs(k, v, inv_t[r], mode, top, floor, t, o),
            });
        }
        l
    }

    pub(crate) fn write(&self, out: &mut Output, rows: usize) {
        if let Some(d) = out.logprobs.as_deref_mut() {
            d[..rows].copy_from_slice(&self.logprobs);
        }
        if let Some(d) = out.ranks.as_deref_mut() {
            d[..rows].copy_from_slice(&self.ranks);
        }
        let n = rows * self.top_n;
        if let Some(d) = out.topn_ids.as_deref_mut() {
            d[..n].copy_from_slice(&self.ids);
        }
        if let Some(d) = out.topn_logprobs.as_deref_mut() {
            d[..n].copy_from_slice(&self.lps);
        }
    }
}

/// The processed values of the edited rows of a call, for the logprobs computed after the draw:
/// every row's edits are built before anything is written (they are the only part that can
/// fail), and each row is materialized into one buffer when needed.
pub(crate) struct Processed {
    edits: Vec<Option<RowEdits>>,
    y: Vec<f32>,
}

impl Processed {
    /// The edits of every row of `batch` that `info` says was drawn from processed values.
    pub(crate) fn build(batch: &Batch, info: &[RowInfo]) -> Result<Processed> {
        let mut edits = alloc::with_capacity(batch.rows, "the rows' edits")?;
        for (r, i) in info.iter().enumerate() {
            let e = if i.edited { crate::edits::build(batch, r)? } else { None };
            edits.push(e);
        }
        let y = alloc::filled(if info.iter().any(|i| i.edited) { batch.vocab } else { 0 }, 0.0, "the processed row")?;
        Ok(Processed { edits, y })
    }

    /// No processed values (no output that needs them).
    pub(crate) fn none(rows: usize) -> Processed {
        Processed { edits: (0..rows).map(|_| None).collect(), y: Vec::new() }
    }

    /// Row `r`'s processed values (its values `v` as given, with its edits applied).
    fn row<V: RowValues + ?Sized>(&mut self, r: usize, v: &V) -> &[f32] {
        match &mut self.edits[r] {
            Some(e) => {
                // The buffer already has the row's length, so this allocates nothing.
                e.materialize(v, &mut self.y).expect("the buffer has the row's length");
                &self.y
            }
            None => unreachable!("only edited rows have processed values"),
        }
    }

    fn is_edited(&self, r: usize) -> bool {
        self.edits[r].is_some()
    }
}

/// Writes every row's full-vocabulary output of `out.full_mode` into `out.full_logprobs`
/// (nothing can fail here: every allocation was made by [`Processed::build`]).
pub(crate) fn write_full(
    k: &Kernels,
    batch: &Batch,
    inv_t: &[Option<f32>],
    info: &[RowInfo],
    out: &mut Output,
    processed: &mut Processed,
) {
    let (mode, stride, vocab) = (out.full_mode, out.full_row_stride, batch.vocab);
    let Some(full) = out.full_logprobs.as_deref_mut() else { return };
    for r in 0..batch.rows {
        let dest = &mut full[r * stride..r * stride + vocab];
        let RowInfo { top, floor, edited } = info[r];
        with_row!(batch, r, |v| {
            if mode == FullMode::Raw {
                let top = if edited { row_max(k, v) } else { top };
                full_logprobs(k, v, 1.0, f32::NEG_INFINITY, top, dest);
            } else if processed.is_edited(r) {
                let y = processed.row(r, v);
                full_processed(k, batch, r, y, (inv_t[r], floor, top), mode, dest);
            } else {
                full_processed(k, batch, r, v, (inv_t[r], floor, top), mode, dest);
            }
        });
    }
}

/// The logprob of every token of `v` at scale `s` over the tokens `>= floor`.
fn full_logprobs<V: RowValues + ?Sized>(k: &Kernels, v: &V, s: f64, floor: f32, top: f32, dest: &mut [f32]) {
    let lp = logprob_fn(k, v, s, floor, top);
    for (i, d) in dest.iter_mut().enumerate() {
        *d = lp.of(v.at(i));
    }
}

/// The processed logprobs or logits of every token of the processed values `v` of row `r`,
/// drawn with `inv_t` (`None`: greedy), floor `floor`, maximum `top`.
fn full_processed<V: RowValues + ?Sized>(
    k: &Kernels,
    batch: &Batch,
    r: usize,
    v: &V,
    (inv_t, floor, top): (Option<f32>, f32, f32),
    mode: FullMode,
    dest: &mut [f32],
) {
    let (s, floor) = scale_and_floor(LogprobMode::Processed, inv_t, floor);
    if mode == FullMode::Processed {
        return full_logprobs(k, v, s, floor, top, dest);
    }
    // Processed logits: the value divided by T (greedy rows: not divided) for the kept tokens.
    let t = inv_t.map(|_| batch.temperature(r));
    for (i, d) in dest.iter_mut().enumerate() {
        let y = v.at(i);
        let kept = if top == f32::INFINITY { y == f32::INFINITY } else { y >= floor && y.is_finite() };
        *d = match (kept, t) {
            (false, _) => f32::NEG_INFINITY,
            (true, Some(t)) => y / t,
            (true, None) => y,
        };
    }
}
