//! Verifying draft tokens (speculative decoding) by rejection sampling, one request at a time.
//!
//! Each target row is scanned and judged by its filters exactly as a draw of that row would be,
//! so `p_j`, the distribution the row's draw samples from, is the one the drafts are checked
//! against:
//!
//! - **greedy rows**: draft `d` is accepted when it is the row's greedy token;
//! - **rows whose token needs no race** (+inf present, or nothing finite): `p` is a point mass at
//!   the token a draw returns;
//! - **sampling rows**: `d` is accepted when `u < p(d) / q(d)` in f64. `p(d) = w_d / Z` with the
//!   exact f64 weight `w_d`; `Z`, the mass of the kept tokens, is bounded first from the block
//!   maxima alone (no pass), then by one f32-exp pass (`mass.rs`), and computed exactly in f64
//!   only when `u` falls inside the bounds' band;
//! - **on a rejection**, the token comes from `max(p - q, 0)`: without `q` (one-hot at `d`) that
//!   is the row's own race with `d` left out (the race itself when `d` does not win it); with
//!   `q`, an exponential race over the residual in f64 ([`residual_race`]);
//! - **the bonus row** (every draft accepted) is a plain draw.
//!
//! Rows after a request's first rejection are not read.

use super::kept::{BLOCK_MAX, PROCESSED};
use super::row::{finish, race_params, summarize};
use super::split::{worker_panicked, FirstError, Workers};
use super::verify_step::{processed_row, raw_logprob, RequestStep};
use super::RowPlan;
use crate::alloc;
use crate::batch::{flags, Batch, LogprobMode, VerifyOutput};
use crate::config::NoiseKind;
use crate::error::{Error, Owner, Result};
use crate::kernels::generic::noise::key_words;
use crate::kernels::generic::race::{token_noise, token_noise_bound, BlockNoise};
use crate::kernels::{Kernels, RaceParams, BLOCK};
use crate::logprob::{row_logprobs, RowOut};
use crate::mass::{weight64, RowMass};
use crate::row::{with_row, RaceNoise, RowValues};

/// The draft id vLLM pads its draft lists with (`PLACEHOLDER_TOKEN_ID`): a position where no
/// draft was proposed, rejected without reading its probabilities.
pub(crate) const PLACEHOLDER_DRAFT: i32 = -1;

/// One request's drafts: ids, their q rows (`None`: one-hot), their acceptance uniforms.
pub(crate) struct Drafts<'a> {
    pub first_row: usize,
    /// The flat index of the first draft (for messages).
    pub first_draft: usize,
    pub ids: &'a [i32],
    /// The q rows of these drafts (`vocab` values each, `stride` apart).
    pub q: Option<(&'a [f32], usize)>,
    pub uniforms: &'a [f64],
    /// The request's draft tree: each node's parent (-1: the root); `None`: a chain.
    pub parents: Option<&'a [i32]>,
    /// The sampling step applied to each target row before it judges (`None`: rows as given).
    pub step: Option<RequestStep<'a>>,
}

/// What verifying one request gave: the emitted tokens (accepted drafts, then one more), their
/// logprobs when asked, and the flags of the rows looked at.
#[derive(Debug, Default)]
pub(crate) struct Verified {
    pub tokens: Vec<i32>,
    pub logprobs: Vec<f32>,
    pub flags: u32,
    /// The target rows read whose logits were not all finite (rows after the first rejection
    /// are never read).
    pub nonfinite_rows: u32,
    /// The accepted draft nodes, in path order.
    pub nodes: Vec<i32>,
}

/// One draft as its row judges it: the id (`None` for a placeholder), its q row (`None`:
/// one-hot), its acceptance uniform.
type Draft<'a> = (Option<usize>, Option<&'a [f32]>, f64);

/// What one target row gave.
struct RowVerdict {
    accepted: bool,
    token: i32,
    flags: u32,
    logprob: f32,
}

/// The verdict of a row, as [`judge!`] adjusts it.
trait HasVerdict {
    fn verdict(&mut self) -> &mut RowVerdict;
}

impl HasVerdict for RowVerdict {
    fn verdict(&mut self) -> &mut RowVerdict {
        self
    }
}

impl<T> HasVerdict for (T, RowVerdict) {
    fn verdict(&mut self) -> &mut RowVerdict {
        &mut self.1
    }
}

/// Runs `$body` (a judgement of row `$v`, logprobs in mode `$lp`) on target row `$r`
/// (request-local `$local` of drafts `$d`): on the row as given, or, when the request's step
/// changes it, on its processed values, with the caller's NaN flagged and raw logprobs taken
/// from the row as given (what a draw of the row with that step reports).
macro_rules! judge {
    ($k:expr, $batch:expr, ($r:expr, $local:expr), $d:expr, $logprobs:expr, |$v:ident, $lp:ident| $body:expr) => {{
        // (The thread's buffer is taken out while the row is judged, and put back after.)
        let processed = match $d.step.as_ref() {
            None => Ok(None),
            Some(s) => {
                let mut y = PROCESSED.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
                match processed_row($k, $batch, ($r, $local), s, $d, &mut y) {
                    Ok(Some(nan)) => Ok(Some((y, nan))),
                    other => {
                        PROCESSED.with(|cell| *cell.borrow_mut() = y);
                        other.map(|_| None)
                    }
                }
            }
        };
        match processed {
            Err(e) => Err(e),
            Ok(None) => {
                let $lp = $logprobs;
                with_row!($batch, $r, |$v| $body)
            }
            Ok(Some((y, nan))) => {
                let raw = $logprobs == Some(LogprobMode::Raw);
                let $lp = if raw { None } else { $logprobs };
                let judged = {
                    let $v = &y[..];
                    $body
                };
                PROCESSED.with(|cell| *cell.borrow_mut() = y);
                let mut judged = judged?;
                let verdict = judged.verdict();
                if nan {
                    verdict.flags |= flags::HAS_NAN;
                }
                if raw {
                    verdict.logprob = raw_logprob($k, $batch, $r, verdict.token)?;
                }
                Ok(judged)
            }
        }
    }};
}

/// Verifies one request of the call whose target rows are `batch`.
pub(crate) fn verify_request(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    d: &Drafts,
    logprobs: Option<LogprobMode>,
) -> Result<Verified> {
    if let Some(parents) = d.parents {
        return verify_tree(k, batch, plans, d, parents, logprobs);
    }
    let mut v = Verified::default();
    for j in 0..=d.ids.len() {
        let r = d.first_row + j;
        let draft = d.ids.get(j).map(|&id| {
            let q = d.q.map(|(q, stride)| &q[j * stride..j * stride + batch.vocab]);
            ((id != PLACEHOLDER_DRAFT).then_some(id as usize), q, d.uniforms[j])
        });
        let verdict: Result<RowVerdict> =
            judge!(k, batch, (r, j), d, logprobs, |row, lp| verify_row(k, batch, r, row, plans[r], draft, lp));
        let verdict = verdict?;
        v.flags |= verdict.flags;
        v.nonfinite_rows += u32::from(verdict.flags & flags::NONFINITE != 0);
        v.tokens.push(verdict.token);
        if logprobs.is_some() {
            v.logprobs.push(verdict.logprob);
        }
        if !verdict.accepted {
            break;
        }
        v.nodes.push(j as i32);
    }
    Ok(v)
}

/// The draft `node` of request `d` as its parent's row judges it.
fn draft_of<'a>(batch: &Batch, d: &Drafts<'a>, node: usize) -> Draft<'a> {
    let id = d.ids[node];
    let q = d.q.map(|(q, stride)| &q[node * stride..node * stride + batch.vocab]);
    ((id != PLACEHOLDER_DRAFT).then_some(id as usize), q, d.uniforms[node])
}

/// Verifies one request's draft tree: from the root, the children of the node reached are
/// judged at its row in index order (recursive rejection sampling), until one is rejected
/// everywhere (the recovered token) or a leaf is accepted (the bonus token of its row). A node
/// with one child is judged exactly as a chain's draft.
fn verify_tree(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    d: &Drafts,
    parents: &[i32],
    logprobs: Option<LogprobMode>,
) -> Result<Verified> {
    let mut v = Verified::default();
    // The node reached (-1: the root), whose row judges its children.
    let mut node = -1i32;
    loop {
        let r = d.first_row + (node + 1) as usize;
        let first = (node + 1) as usize;
        let children: Vec<usize> = (first..d.ids.len()).filter(|&c| parents[c] == node).collect();
        let (chosen, verdict) = match children.len() {
            0 | 1 => {
                let draft = children.first().map(|&c| draft_of(batch, d, c));
                let verdict: Result<RowVerdict> = judge!(k, batch, (r, first), d, logprobs, |row, lp| verify_row(
                    k, batch, r, row, plans[r], draft, lp
                ));
                let verdict = verdict?;
                (children.first().copied().filter(|_| verdict.accepted), verdict)
            }
            _ => {
                let drafts: Vec<Draft> = children.iter().map(|&c| draft_of(batch, d, c)).collect();
                let judged: Result<(Option<usize>, RowVerdict)> =
                    judge!(k, batch, (r, first), d, logprobs, |row, lp| {
                        verify_siblings(k, batch, r, row, plans[r], &drafts, lp)
                    });
                let (chosen, verdict) = judged?;
                (chosen.map(|c| children[c]), verdict)
            }
        };
        v.flags |= verdict.flags;
        v.nonfinite_rows += u32::from(verdict.flags & flags::NONFINITE != 0);
        v.tokens.push(verdict.token);
        if logprobs.is_some() {
            v.logprobs.push(verdict.logprob);
        }
        match chosen {
            Some(c) => {
                v.nodes.push(c as i32);
                node = c as i32;
            }
            None => return Ok(v),
        }
    }
}

/// Judges the children `drafts` (at least two, in index order) of one node at its row `r` by
/// recursive rejection sampling (`docs/semantics.md`, "Draft trees"): the residual `r` starts
/// as the row's `p`; each child `x` in turn is accepted when `u < r(x) / q(x)`, else `r`
/// becomes `max(r - q, 0)` normalized (one-hot q: `x` leaves it). Gives the accepted child's
/// position in `drafts` and its token, or `None` and the token raced over the last residual.
fn verify_siblings<V: RowValues + ?Sized>(
    k: &Kernels,
    batch: &Batch,
    r: usize,
    v: &V,
    plan: RowPlan,
    drafts: &[Draft],
    logprobs: Option<LogprobMode>,
) -> Result<(Option<usize>, RowVerdict)> {
    BLOCK_MAX.with(|cell| {
        let mut bmax = cell.borrow_mut();
        alloc::resize(&mut bmax, v.n().div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima").map_err(|e| e.in_row(r))?;
        let has_nan = v.scan(k, 0, v.n(), &mut bmax);
        let sc = summarize(&bmax, f32::NEG_INFINITY, has_nan, plan);
        let params = race_params(k, batch, r, v, &bmax, &sc, plan)?;
        let (chosen, token) = match params {
            // Greedy, +inf or empty: p is a point mass; the first child holding it is accepted.
            None => {
                let t = finish(k, v, &bmax, &sc, None);
                (drafts.iter().position(|&(d, ..)| d == Some(t as usize)), t)
            }
            Some((p, noise)) => {
                let judged = match drafts[0].1 {
                    None => siblings_one_hot(k, v, &bmax, p, noise, drafts),
                    Some(q) => siblings_with_q(k, v, &bmax, p, noise, drafts, q),
                };
                match judged.map_err(|e| e.in_row(r))? {
                    (chosen, Some(t)) => (chosen, t),
                    // A residual with no mass falls back to a draw from p.
                    (_, None) => {
                        let won = v.race(k, 0, v.n(), &bmax, p, noise).map_err(|e| e.in_row(r))?;
                        (None, finish(k, v, &bmax, &sc, Some(won)))
                    }
                }
            }
        };
        let mut logprob = f32::NAN;
        if let Some(mode) = logprobs {
            let floor = params.map_or(f32::NEG_INFINITY, |(p, _)| p.floor);
            let (mut rank, out) = (0, &mut logprob);
            let o = RowOut { logprob: out, rank: &mut rank, ids: &mut [], lps: &mut [], want_rank: false };
            row_logprobs(k, v, &bmax, plan.inv_t(), mode, sc.top, floor, token, o).map_err(|e| e.in_row(r))?;
        }
        Ok((chosen, RowVerdict { accepted: chosen.is_some(), token, flags: sc.flags, logprob }))
    })
}

/// Deterministic siblings: child `x` is accepted when `u < w_x / (Z - W)`, `W` the weight of
/// the children rejected before it (a repeated token has no residual left: rejected); when all
/// are rejected, the row's race with every rejected token left out.
fn siblings_one_hot<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    p: RaceParams,
    noise: RaceNoise,
    drafts: &[Draft],
) -> Result<(Option<usize>, Option<i32>)> {
    let z = mass(k, v, bmax, p)?;
    let (mut gone, mut rejected) = (0.0f64, Vec::with_capacity(drafts.len()));
    for (c, &(d, _, u)) in drafts.iter().enumerate() {
        // A placeholder is rejected without changing the residual (as a chain's draws from p).
        let Some(d) = d else { continue };
        let x = v.at(d);
        let kept = x >= p.floor && x.is_finite() && !rejected.contains(&d);
        let w = if kept { weight64(x, p.m, p.inv_t) } else { 0.0 };
        // The residual's mass is at least `w`: a rounding below it cannot reject.
        if w > 0.0 && u < w / (z - gone).max(w) {
            return Ok((Some(c), Some(d as i32)));
        }
        gone += w;
        rejected.push(d);
    }
    Ok((None, race_without_all(k, v, bmax, p, noise, &rejected)?))
}

/// Siblings drawn from `q`: the residual kept dense in f64 (`p(x) = w_x / Z` with the exact
/// `Z`); the recovered token is the lowest of the largest `ln r(x) - ln E_x` over `r(x) > 0`,
/// with the row's own noise E.
fn siblings_with_q<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    p: RaceParams,
    noise: RaceNoise,
    drafts: &[Draft],
    q: &[f32],
) -> Result<(Option<usize>, Option<i32>)> {
    let z = mass(k, v, bmax, p)?;
    let n = v.n();
    let mut r = alloc::filled(n, 0.0f64, "the siblings' residual")?;
    for (i, ri) in r.iter_mut().enumerate() {
        let x = v.at(i);
        if x >= p.floor && x.is_finite() {
            *ri = weight64(x, p.m, p.inv_t) / z;
        }
    }
    for (c, &(d, _, u)) in drafts.iter().enumerate() {
        if let Some(d) = d {
            let (rd, qd) = (r[d], q[d] as f64);
            // As a chain's test: `u < r(x) / q(x)`; a q(x) of 0 accepts any r(x) > 0.
            if rd > 0.0 && (qd == 0.0 || u < rd / qd) {
                return Ok((Some(c), Some(d as i32)));
            }
        }
        // A residual with no mass (r = q up to rounding) is left as it was.
        let s: f64 = r.iter().zip(q).map(|(&ri, &qi)| (ri - qi as f64).max(0.0)).sum();
        if s > 0.0 {
            r.iter_mut().zip(q).for_each(|(ri, &qi)| *ri = (*ri - qi as f64).max(0.0) / s);
        }
    }
    let noise_at = block_noise_reader(k, noise, bmax, p)?;
    let mut best = (f64::NEG_INFINITY, usize::MAX);
    for (i, &ri) in r.iter().enumerate().filter(|&(_, &ri)| ri > 0.0) {
        let key = ri.ln() - noise_at.ln_e(i);
        if key > best.0 {
            best = (key, i);
        }
    }
    Ok((None, (best.1 != usize::MAX).then_some(best.1 as i32)))
}

/// The token of the row's race with every token of `left_out` left out, or `None` if no other
/// token races.
fn race_without_all<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    p: RaceParams,
    noise: RaceNoise,
    left_out: &[usize],
) -> Result<Option<i32>> {
    let won = v.race(k, 0, v.n(), bmax, p, noise)?;
    if !left_out.contains(&won.token) && won.token != usize::MAX {
        return Ok(Some(won.token as i32));
    }
    let mut keep = alloc::filled(v.n().div_ceil(32), u32::MAX, "the mask without the drafts")?;
    for &d in left_out {
        keep[d / 32] &= !(1u32 << (d % 32));
    }
    let won = v.race_processed(k, &keep, bmax, &[], p, noise)?;
    Ok((won.token != usize::MAX).then_some(won.token as i32))
}

/// Verifies draft `draft` (id, q row, uniform) at row `r`, or draws the bonus token (`None`).
/// A placeholder draft (id `None`) is rejected without reading anything by its id: the token
/// comes from the residual `max(p - q, 0)` as for any rejection (from p itself without q), as
/// vLLM's rejection sampler does.
fn verify_row<V: RowValues + ?Sized>(
    k: &Kernels,
    batch: &Batch,
    r: usize,
    v: &V,
    plan: RowPlan,
    draft: Option<Draft>,
    logprobs: Option<LogprobMode>,
) -> Result<RowVerdict> {
    BLOCK_MAX.with(|cell| {
        let mut bmax = cell.borrow_mut();
        alloc::resize(&mut bmax, v.n().div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima").map_err(|e| e.in_row(r))?;
        let has_nan = v.scan(k, 0, v.n(), &mut bmax);
        let sc = summarize(&bmax, f32::NEG_INFINITY, has_nan, plan);
        let params = race_params(k, batch, r, v, &bmax, &sc, plan)?;
        let (accepted, token) = match (draft, params) {
            // Greedy, +inf or empty: the row's token is decided without noise.
            (_, None) => {
                let t = finish(k, v, &bmax, &sc, None);
                (draft.is_some_and(|(d, ..)| d == Some(t as usize)), t)
            }
            (None, Some((p, noise))) => {
                let won = v.race(k, 0, v.n(), &bmax, p, noise).map_err(|e| e.in_row(r))?;
                (false, finish(k, v, &bmax, &sc, Some(won)))
            }
            (Some((d, q, u)), Some((p, noise))) => {
                let (accept, z) = match d {
                    Some(d) => {
                        accepts(k, v, &bmax, p, d, q.map_or(1.0, |q| q[d] as f64), u).map_err(|e| e.in_row(r))?
                    }
                    None => (false, KnownZ::Nothing),
                };
                if let (true, Some(d)) = (accept, d) {
                    (true, d as i32)
                } else {
                    let t = match (q, d) {
                        (None, Some(d)) => race_without(k, v, &bmax, p, noise, d).map_err(|e| e.in_row(r))?,
                        (None, None) => None,
                        (Some(q), _) => residual_token(k, v, &bmax, p, z, q, noise).map_err(|e| e.in_row(r))?,
                    };
                    // A residual with no mass falls back to a draw from p.
                    let t = match t {
                        Some(t) => t,
                        None => {
                            let won = v.race(k, 0, v.n(), &bmax, p, noise).map_err(|e| e.in_row(r))?;
                            finish(k, v, &bmax, &sc, Some(won))
                        }
                    };
                    (false, t)
                }
            }
        };
        let mut logprob = f32::NAN;
        if let Some(mode) = logprobs {
            let floor = params.map_or(f32::NEG_INFINITY, |(p, _)| p.floor);
            let (mut rank, out) = (0, &mut logprob);
            let o = RowOut { logprob: out, rank: &mut rank, ids: &mut [], lps: &mut [], want_rank: false };
            row_logprobs(k, v, &bmax, plan.inv_t(), mode, sc.top, floor, token, o).map_err(|e| e.in_row(r))?;
        }
        Ok(RowVerdict { accepted: accepted && draft.is_some(), token, flags: sc.flags, logprob })
    })
}

/// The exact f64 mass `Z` of the kept tokens (`x >= floor`) of a sampling row.
fn mass<V: RowValues + ?Sized>(k: &Kernels, v: &V, bmax: &[f32], p: RaceParams) -> Result<f64> {
    match RowMass::new(k, v, p.m, p.inv_t, p.floor) {
        Some(rm) => rm.exact(bmax, f32::INFINITY),
        // 1/T so large that its f32 exp2 scale overflows: every weight is 0 or 1.
        None => Ok((0..v.n())
            .map(|i| v.at(i))
            .filter(|&x| x >= p.floor && x.is_finite())
            .map(|x| weight64(x, p.m, p.inv_t))
            .sum()),
    }
}

/// What an acceptance test learnt of a row's `Z`: nothing yet, loose bounds (the cheap
/// weights' with the heaviest blocks weighed again), the f32-exp pass's bounds, or the exact
/// value.
#[derive(Clone, Copy)]
enum KnownZ {
    Nothing,
    Loose(f64, f64),
    Within(f64, f64),
    Exact(f64),
}

/// The token drawn from the residual `max(p - q, 0)` of a rejected draft, `None` if it has no
/// mass. The race runs with `Z` at both ends of its bounds at once; when both ends pick the same
/// token, so does the exact `Z` between them (see [`residual_race`]). The bounds tighten only
/// while the ends differ: the loose ones (computed here if acceptance did not), the f32-exp
/// pass's, then the exact `Z`.
#[allow(clippy::too_many_arguments)]
fn residual_token<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    p: RaceParams,
    known: KnownZ,
    q: &[f32],
    noise: RaceNoise,
) -> Result<Option<i32>> {
    let race = |(lo, hi): (f64, f64)| match lo > 0.0 {
        true => residual_race(k, v, bmax, p, (lo, hi), q, noise),
        false => Ok(None),
    };
    let rm = RowMass::new(k, v, p.m, p.inv_t, p.floor);
    if let KnownZ::Nothing | KnownZ::Loose(..) = known {
        let loose = match known {
            KnownZ::Loose(lo, hi) => Some((lo, hi)),
            _ => rm.as_ref().map(|rm| rm.z_cheap(bmax).map(|c| rm.z_refined(&c.2))).transpose()?,
        };
        if let Some(t) = loose.map(race).transpose()?.flatten() {
            return Ok(t);
        }
    }
    let within = match known {
        KnownZ::Exact(z) => Some((z, z)),
        KnownZ::Within(lo, hi) => Some((lo, hi)),
        KnownZ::Nothing | KnownZ::Loose(..) => {
            rm.as_ref().map(|rm| rm.z_exp(bmax, &mut Vec::new()).map(|z| z.1)).transpose()?
        }
    };
    if let Some(t) = within.map(race).transpose()?.flatten() {
        return Ok(t);
    }
    let z = mass(k, v, bmax, p)?;
    Ok(residual_race(k, v, bmax, p, (z, z), q, noise)?.expect("one Z gives one winner"))
}

/// Whether `u < p(d) / q(d)` (`q(d)` is `qd`), and what was learnt of `Z` on the way.
/// `p(d)` is 0 for a NaN, -inf or filtered-out `d`; a `q(d)` of 0 accepts any `p(d) > 0`.
/// Fails only if the per-block masses cannot be allocated.
fn accepts<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    p: RaceParams,
    d: usize,
    qd: f64,
    u: f64,
) -> Result<(bool, KnownZ)> {
    let x = v.at(d);
    let w = if x >= p.floor && x.is_finite() { weight64(x, p.m, p.inv_t) } else { 0.0 };
    if w == 0.0 {
        return Ok((false, KnownZ::Nothing));
    }
    if qd == 0.0 {
        return Ok((true, KnownZ::Nothing));
    }
    let mut masses = Vec::new();
    // Z from the block maxima alone, without reading the row: every kept block holds its
    // maximum (at least one token of weight w(bmax)) and at most BLOCK tokens no heavier. The
    // maxima's mass is one f32-exp pass over them, with its rigorous bounds (an f64 exp per
    // block cost more than the pass over the row the tier is there to save).
    let bounds = match RowMass::new(k, bmax, p.m, p.inv_t, p.floor) {
        Some(rm) => rm.z_exp(&[], &mut masses)?.1,
        None => bmax.iter().filter(|&&b| b >= p.floor).fold((0.0, 0.0), |(lo, hi), &b| {
            let w = weight64(b, p.m, p.inv_t);
            (lo + w, hi + w)
        }),
    };
    if let Some(accept) = decide(w, qd, u, (bounds.0, bounds.1 * BLOCK as f64)) {
        return Ok((accept, KnownZ::Nothing));
    }
    if let Some(rm) = RowMass::new(k, v, p.m, p.inv_t, p.floor) {
        // Z in [lo, hi] (rigorous bounds of one pass) puts p(d)/q(d) in a band; only a uniform
        // inside it needs a tighter Z. The cheap weights (a few operations per token, Z within
        // about 11%) decide about 9 uniforms in 10; the heaviest blocks weighed again by the
        // f32 exp (16 blocks) most of the rest on a peaked row; the f32-exp pass (Z within 1e-6)
        // nearly all the rest; the exact Z the remainder. A rejection passes on the tightest
        // bounds known, from which the residual race starts.
        let (_, cheap, blocks) = rm.z_cheap(bmax)?;
        if let Some(accept) = decide(w, qd, u, cheap) {
            return Ok((accept, if accept { KnownZ::Nothing } else { KnownZ::Loose(cheap.0, cheap.1) }));
        }
        let loose = rm.z_refined(&blocks);
        if let Some(accept) = decide(w, qd, u, loose) {
            return Ok((accept, KnownZ::Loose(loose.0, loose.1)));
        }
        let bounds = rm.z_exp(bmax, &mut masses)?.1;
        if let Some(accept) = decide(w, qd, u, bounds) {
            return Ok((accept, KnownZ::Within(bounds.0, bounds.1)));
        }
    }
    let z = mass(k, v, bmax, p)?;
    Ok((u < w / z / qd, KnownZ::Exact(z)))
}

/// Whether `u < w / Z / qd` for every Z in `[lo, hi]` (Some(true)), for none (Some(false)), or
/// either (None). 1e-12 covers the roundings of the quotients.
fn decide(w: f64, qd: f64, u: f64, (lo, hi): (f64, f64)) -> Option<bool> {
    if u < w / hi / qd * (1.0 - 1e-12) {
        Some(true)
    } else if lo > 0.0 && u >= w / lo / qd * (1.0 + 1e-12) {
        Some(false)
    } else {
        None
    }
}

/// The token of the row's race with `d` left out, or `None` if no other token races.
fn race_without<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    p: RaceParams,
    noise: RaceNoise,
    d: usize,
) -> Result<Option<i32>> {
    let won = v.race(k, 0, v.n(), bmax, p, noise)?;
    if won.token != d && won.token != usize::MAX {
        return Ok(Some(won.token as i32));
    }
    // `d` won: race again without it (block maxima that still count it only bound the keys).
    let mut keep = alloc::filled(v.n().div_ceil(32), u32::MAX, "the mask without the draft")?;
    keep[d / 32] &= !(1u32 << (d % 32));
    let won = v.race_processed(k, &keep, bmax, &[], p, noise)?;
    Ok((won.token != usize::MAX).then_some(won.token as i32))
}

/// The exponential race over the residual `max(p - q, 0)` of a row: the lowest token of the
/// largest `ln(p(x) - q(x)) - ln E_x` over the tokens with `p(x) > q(x)`, in f64, with the
/// row's own noise E, and `p(x) = w_x / Z`, run for `Z = lo` and `Z = hi` at once (`0 < lo <=
/// hi`). `Some(winner)` (`None` inside: no token has `p(x) > q(x)`) when both give the same
/// one; then every `Z` in between gives it too, since with `s = 1/Z` the difference of two
/// tokens' keys, `ln(w_t s - q_t) - ln(w_u s - q_u)`, is monotone in `s` (its derivative keeps
/// the sign of `w_u q_t - w_t q_u`), and a residual only shrinks as `Z` grows. `None` when they
/// differ.
///
/// Every residual key is at most the race's own key `a_x - ln E_x` minus `ln Z`, so blocks are
/// visited in the order of their race bound (the largest logit's `a` plus the block's largest
/// `-ln E`) and the visit stops at the first block whose bound cannot beat the best keys found.
fn residual_race<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    p: RaceParams,
    (z_lo, z_hi): (f64, f64),
    q: &[f32],
    noise: RaceNoise,
) -> Result<Option<Option<i32>>> {
    let n = v.n();
    let nb = bmax.len();
    let noise_at = block_noise_reader(k, noise, bmax, p)?;
    let mut order = alloc::collect((0..nb).map(|b| (noise_at.bound(v, b), b)), "the residual's block order")?;
    order.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let ln_z = [z_lo.ln(), z_hi.ln()];
    let mut best = [(f64::NEG_INFINITY, usize::MAX); 2];
    let (m, inv_t) = (p.m as f64, p.inv_t as f64);
    for &(bound, b) in &order {
        // An inline block's bound is an f32 sum of f32 roundings of `a` and of `-ln E`: 1e-5
        // relative covers them.
        let slack = 1e-5 * (1.0 + bound.abs());
        let reach = |e: usize| bound - ln_z[e] + slack;
        if reach(0).is_nan() || (reach(0) < best[0].0 && reach(1) < best[1].0) {
            break;
        }
        let g_max = noise_at.g_max(v, b);
        let mut x_min = least_logit_reaching(&best, ln_z, g_max, m, inv_t);
        let end = ((b + 1) * BLOCK).min(n);
        for (i, &qi) in q.iter().enumerate().take(end).skip(b * BLOCK) {
            let x = v.at(i);
            // Most tokens of a visited block stop here, at one comparison: even the block's
            // largest `-ln E` cannot lift them to the cut below.
            if (x as f64) < x_min || !(x >= p.floor && x.is_finite()) {
                continue;
            }
            // A token whose race key `a - ln E` cannot reach `best + ln Z` at either end has no
            // residual key above the bests either: first with the block's largest `-ln E`,
            // then with its own noise bits' bound, then with its own noise.
            let a = (x as f64 - m) * inv_t;
            let cut = |e: usize| best[e].0 + ln_z[e] - 1e-9 * (1.0 + a.abs() + best[e].0.abs());
            let cut = cut(0).min(cut(1));
            if a + g_max < cut || a + noise_at.g_token(b, i) < cut {
                continue;
            }
            let ln_e = noise_at.ln_e(i);
            if ln_e.is_nan() || a - ln_e < cut {
                continue;
            }
            let w = weight64(x, p.m, p.inv_t);
            let mut improved = false;
            for (e, z) in [z_lo, z_hi].into_iter().enumerate() {
                let resid = w / z - qi as f64;
                if resid.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
                    continue;
                }
                let key = resid.ln() - ln_e;
                if key > best[e].0 || (key == best[e].0 && i < best[e].1) {
                    best[e] = (key, i);
                    improved = true;
                }
            }
            if improved {
                x_min = least_logit_reaching(&best, ln_z, g_max, m, inv_t);
            }
        }
    }
    let winner = |e: usize| (best[e].1 != usize::MAX).then_some(best[e].1 as i32);
    Ok((winner(0) == winner(1)).then(|| winner(0)))
}

/// A logit below which a token of a block whose largest `-ln E` is `g_max` fails the residual
/// race's first test (`a + g_max < cut`, `a = (x - m) inv_t`, the cut the lower of both ends',
/// less its slack `1e-9 (1 + |a| + |best|)`), so that the scan of a block can skip it at one
/// comparison. Conservative on purpose: with `C` the cut less `g_max` and its `|a|`-free slack,
/// every `a <= C - 1e-8 (1 + |C|)` fails the test whatever `|a|` is (for `|a| <= 2|C| + 1` the
/// margin exceeds `1e-9 |a|`; beyond, `a` is below `-|C|`), and the logit margin covers the
/// roundings of `m + a / inv_t`. -inf (nothing skipped) while a best is missing; NaN inputs give
/// NaN, which skips nothing either.
fn least_logit_reaching(best: &[(f64, usize); 2], ln_z: [f64; 2], g_max: f64, m: f64, inv_t: f64) -> f64 {
    let cut = |e: usize| best[e].0 + ln_z[e] - 1e-9 * (1.0 + best[e].0.abs());
    let c = cut(0).min(cut(1)) - g_max;
    let a = c - 1e-8 * (1.0 + c.abs());
    let x = m + a / inv_t;
    x - 1e-12 * (x.abs() + m.abs())
}

/// A row's noise, read one token at a time in f64, with a bound of each block's race keys.
enum NoiseReader<'a> {
    Inline { k: (u32, u32), blocks: Vec<BlockNoise> },
    External { values: *const f32, kind: NoiseKind, p: RaceParams, bmax: &'a [f32] },
}

fn block_noise_reader<'a>(k: &Kernels, noise: RaceNoise, bmax: &'a [f32], p: RaceParams) -> Result<NoiseReader<'a>> {
    match noise {
        RaceNoise::Inline(key) => {
            let none = BlockNoise { e_min: 0.0, j_min: 0, g_max: 0.0, bound: 0.0 };
            let mut blocks = alloc::filled(bmax.len(), none, "the residual's block noise")?;
            // SAFETY: `bmax` and `blocks` have one element per block; `k` is a supported level's.
            unsafe { (k.block_noise)(key, 0, bmax, p, &mut blocks) };
            Ok(NoiseReader::Inline { k: key_words(key), blocks })
        }
        RaceNoise::External(values, kind) => Ok(NoiseReader::External { values, kind, p, bmax }),
    }
}

impl NoiseReader<'_> {
    /// `ln E` of token `i` in f64 (NaN for a value that never races: E <= 0 or NaN).
    fn ln_e(&self, i: usize) -> f64 {
        match self {
            NoiseReader::Inline { k, blocks } => {
                let e = token_noise(*k, &blocks[i / BLOCK], (i % BLOCK) as u32, i as u32);
                (e as f64).ln()
            }
            NoiseReader::External { values, kind, .. } => {
                // SAFETY: an external noise row holds one value per token of the row.
                let x = unsafe { *values.add(i) } as f64;
                match kind {
                    NoiseKind::Exp if x > 0.0 => x.ln(),
                    NoiseKind::Exp => f64::NAN,
                    NoiseKind::LogExp => x,
                }
            }
        }
    }

    /// An upper bound of `-ln E` of token `i` of block `b` that costs a few integer operations
    /// (+inf for external noise, which has none).
    fn g_token(&self, b: usize, i: usize) -> f64 {
        match self {
            NoiseReader::Inline { k, blocks } => token_noise_bound(*k, &blocks[b], (i % BLOCK) as u32, i as u32),
            NoiseReader::External { .. } => f64::INFINITY,
        }
    }

    /// An upper bound of `-ln E` over block `b`.
    fn g_max<V: RowValues + ?Sized>(&self, v: &V, b: usize) -> f64 {
        match self {
            // `g_max` bounds the f32 `-ln E` of the race with room for its rounding (1e-4).
            NoiseReader::Inline { blocks, .. } => blocks[b].g_max as f64,
            NoiseReader::External { .. } => {
                let end = ((b + 1) * BLOCK).min(v.n());
                (b * BLOCK..end).map(|i| -self.ln_e(i)).fold(f64::NEG_INFINITY, |a, g| if g > a { g } else { a })
            }
        }
    }

    /// An upper bound of the race keys `a_x - ln E_x` of block `b` (-inf when the filters keep
    /// none of it).
    fn bound<V: RowValues + ?Sized>(&self, v: &V, b: usize) -> f64 {
        match self {
            NoiseReader::Inline { blocks, .. } => blocks[b].bound as f64,
            NoiseReader::External { p, bmax, .. } => {
                if bmax[b] < p.floor || bmax[b].is_nan() {
                    return f64::NEG_INFINITY;
                }
                let end = ((b + 1) * BLOCK).min(v.n());
                let g =
                    (b * BLOCK..end).map(|i| -self.ln_e(i)).fold(f64::NEG_INFINITY, |a, g| if g > a { g } else { a });
                (bmax[b] as f64 - p.m as f64) * p.inv_t as f64 + g
            }
        }
    }
}

/// Checks q row `j` of request `request` (whose drafts are `d`): every value finite and >= 0,
/// the row summing to 1 within 1e-3 (a placeholder draft's too: its residual reads it).
fn check_q_row(k: &Kernels, vocab: usize, request: usize, d: &Drafts, j: usize) -> Result<()> {
    let Some((q, stride)) = d.q else { return Ok(()) };
    let row = &q[j * stride..j * stride + vocab];
    // SAFETY: the row holds `vocab` values; `k` is a supported level's.
    let (sum, negative) = unsafe { (k.prob_sum)(row.as_ptr(), vocab) };
    // A NaN or +inf makes the sum non-finite; a negative value (or -inf) is flagged.
    if sum.is_finite() && !negative && (sum - 1.0).abs() <= 1e-3 {
        return Ok(());
    }
    let why = match row.iter().position(|x| !(0.0..f32::INFINITY).contains(x)) {
        Some(t) => format!("token {t}: {} is not a finite probability >= 0", row[t]),
        None => format!("sums to {sum}, not 1 within 1e-3"),
    };
    Err(Error::arg(
        Owner::Batch,
        "draft_probs",
        Some(d.first_draft + j),
        format!("request {request}, draft {j}: {why}"),
    ))
}

/// Whether request `d`'s q rows are checked: a sampling request's (greedy ones ignore q).
fn checks_q(plans: &[RowPlan], d: &Drafts) -> bool {
    d.q.is_some() && matches!(plans[d.first_row], RowPlan::Sample { .. })
}

/// Verifies every request (`drafts`, with their validated q rows) into `out` (`width`: its
/// tokens' row stride, resolved), spread over `workers` by requests when the call is large
/// enough to be worth it. Fails with the lowest failing request's error, and then writes
/// nothing. Returns the count of target rows read whose flags reported NaN, +inf or an empty
/// row. Either way this thread then keeps at most [`super::kept::KEPT_PER_THREAD`].
pub(crate) fn run(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    drafts: &[Drafts],
    workers: Option<&Workers>,
    (out, width): (&mut VerifyOutput, usize),
) -> Result<u64> {
    let logprobs = out.logprobs.is_some().then_some(out.logprob_mode);
    let verified = run_call(k, batch, plans, drafts, workers, logprobs);
    super::trim_kept();
    let verified = verified?;
    write(&verified, out, width);
    Ok(verified.iter().map(|v| v.nonfinite_rows as u64).sum())
}

/// Writes every request's emitted tokens (then -1, vLLM's placeholder), their count, flags and
/// logprobs (then NaN) into `out`, whose rows are `width` apart.
fn write(verified: &[Verified], out: &mut VerifyOutput, width: usize) {
    for (i, v) in verified.iter().enumerate() {
        let emitted = v.tokens.len();
        let row = &mut out.tokens[i * width..(i + 1) * width];
        row[..emitted].copy_from_slice(&v.tokens);
        row[emitted..].fill(-1);
        out.counts[i] = emitted as i32;
        if let Some(f) = out.flags.as_deref_mut() {
            f[i] = v.flags;
        }
        if let Some(l) = out.logprobs.as_deref_mut() {
            let row = &mut l[i * width..(i + 1) * width];
            row[..emitted].copy_from_slice(&v.logprobs);
            row[emitted..].fill(f32::NAN);
        }
        if let Some(a) = out.accepted_nodes.as_deref_mut() {
            let row = &mut a[i * width..(i + 1) * width];
            row[..v.nodes.len()].copy_from_slice(&v.nodes);
            row[v.nodes.len()..].fill(-1);
        }
    }
}

fn run_call(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    drafts: &[Drafts],
    workers: Option<&Workers>,
    logprobs: Option<LogprobMode>,
) -> Result<Vec<Verified>> {
    let vocab = batch.vocab;
    // Below a million logits a call is done before the workers would wake.
    let big = batch.rows * vocab >= 1 << 20;
    let pool = workers.map(|w| &w.pool).filter(|p| p.width() > 1 && drafts.len() > 1 && big);
    let Some(pool) = pool else {
        let one = |i: usize| -> Result<Verified> {
            let d = &drafts[i];
            if checks_q(plans, d) {
                (0..d.ids.len()).try_for_each(|j| check_q_row(k, vocab, i, d, j))?;
            }
            verify_request(k, batch, plans, d, logprobs)
        };
        return (0..drafts.len()).map(one).collect();
    };
    // Every q row is read whatever the verdicts, so each is checked as a task of its own: the
    // requests come first (the long tasks; a request's target rows after its first rejection
    // are never read, so they balance badly) and the q rows fill the workers that run out of
    // requests. Nothing is written until every task is done, so a request verified before a
    // bad q row is found is only discarded. Failures keep the order of the serial call: the
    // lowest request's, its q rows' before its own.
    let q_rows = alloc::collect(
        drafts
            .iter()
            .enumerate()
            .filter(|(_, d)| checks_q(plans, d))
            .flat_map(|(i, d)| (0..d.ids.len()).map(move |j| (i, j))),
        "the q rows to check",
    )?;
    let requests = drafts.len();
    let out: Vec<parking_lot::Mutex<Option<Verified>>> = (0..requests).map(|_| Default::default()).collect();
    let (failed, q_failed) = (FirstError::default(), FirstError::default());
    let done = pool.run(requests + q_rows.len(), pool.useful_width(), &|t| {
        if t < requests {
            match verify_request(k, batch, plans, &drafts[t], logprobs) {
                Ok(v) => *out[t].lock() = Some(v),
                Err(e) => failed.record(t, e),
            }
        } else {
            let (i, j) = q_rows[t - requests];
            if let Err(e) = check_q_row(k, vocab, i, &drafts[i], j) {
                q_failed.record(t - requests, e);
            }
        }
    });
    if !done.ok {
        return Err(worker_panicked());
    }
    match (failed.into_first(), q_failed.into_first()) {
        (Some((i, _)), Some((t, e))) if q_rows[t].0 <= i => return Err(e),
        (Some((_, e)), _) | (None, Some((_, e))) => return Err(e),
        (None, None) => {}
    }
    pool.call_ended();
    Ok(out.into_iter().map(|m| m.into_inner().unwrap_or_default()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two tokens of weight 1 (Z = 2 exactly) whose residual race changes winner inside a band
    /// of Z: token 0's residual 1/Z - 0.499 is gone past Z = 2.004, while its noise makes it win
    /// whenever it is there.
    #[test]
    fn the_residual_race_answers_only_when_both_ends_of_z_agree() {
        let v: &[f32] = &[0.0, 0.0];
        let q = [0.499f32, 0.1];
        let ln_e = [(0.0035f32).ln() - 0.5, 0.0];
        let noise = RaceNoise::External(ln_e.as_ptr(), NoiseKind::LogExp);
        let p = RaceParams { m: 0.0, inv_t: 1.0, floor: f32::NEG_INFINITY };
        let bmax = [0.0f32];
        let k = crate::kernels::kernels(crate::kernels::best_level());
        let race = |lo: f64, hi: f64| residual_race(k, v, &bmax, p, (lo, hi), &q, noise).unwrap();
        assert_eq!(race(2.0, 2.0), Some(Some(0)));
        assert_eq!(race(1.99, 1.995), Some(Some(0)));
        assert_eq!(race(2.01, 2.02), Some(Some(1)));
        assert_eq!(race(1.99, 2.01), None, "the ends disagree: the exact Z must decide");
        // No residual at either end: none in between.
        let q = [0.9f32, 0.9];
        assert_eq!(residual_race(k, v, &bmax, p, (1.9, 2.0), &q, noise).unwrap(), Some(None));
    }
}
