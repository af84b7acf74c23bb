//! One row on one thread: which way it is drawn ([`path`], the one place that decides), and
//! the row without a step: its first pass, its filters' floor, its race, its token.

use super::kept::BLOCK_MAX;
use super::output::LogprobSlots;
use super::range;
use super::stepped;
use super::{Drawn, RowPlan};
use crate::alloc;
use crate::batch::{flags, Batch};
use crate::error::Result;
use crate::filter;
use crate::kernels::{Best, Kernels, RaceParams, BLOCK};
use crate::logprob::{row_logprobs_given, RowInfo};
use crate::row::{with_row, RaceNoise, RowValues};
use crate::step::{self, RowStep};

/// The ways a row is drawn. Every way gives the token of the race over the row's processed
/// values (the row as given when it has no step): they differ only in what they read.
pub(super) enum RowPath<'a> {
    /// A greedy row with no step and no logprobs: one pass finds its first maximum, without
    /// block maxima ([`draw_greedy`]).
    Greedy,
    /// A row with no step (or one that leaves the row as given): its block maxima, its filters'
    /// floor (decided after the race when nothing reads it), the race, its logprobs
    /// ([`draw_race`]).
    Race,
    /// A sampling row with filters and a step: the filters read values, so the processed row is
    /// written out and drawn as a row as given, unless its filters can be decided after a race
    /// by blocks ([`stepped::draw_filtered`]).
    Filtered(RowStep<'a>),
    /// A greedy row, or a sampling row without filters, whose step no penalty raises: bounds of
    /// the blocks from one pass over the row as given, then only the touched tokens the race
    /// cannot skip ([`stepped::draw_by_blocks`]).
    ByBlocks(RowStep<'a>),
    /// As [`RowPath::ByBlocks`], with long histories left unmarked: the blocks the race visits
    /// find their touched tokens ([`stepped::draw_deferred`]).
    Deferred(RowStep<'a>),
    /// Any other row with a step (a penalty raises values): a masked pass over the kept tokens,
    /// the touched ones raced one by one ([`stepped::draw_masked`]).
    Masked(RowStep<'a>),
    /// A sampling row whose filters keep a range of values (typical sampling, XTC), with its
    /// step if it has one: its values written out and raced over that range
    /// ([`range::draw_range`]).
    Range(Option<RowStep<'a>>),
}

/// Which way row `r` of `batch` is drawn with `plan` (`logprobs`: its task computes its
/// logprobs), with the row's step when it has one. Fails if the step's storage cannot be
/// allocated.
pub(super) fn path<'a>(k: &Kernels, batch: &Batch<'a>, r: usize, plan: RowPlan, logprobs: bool) -> Result<RowPath<'a>> {
    if greedy_as_given(batch, r, plan, logprobs) {
        return Ok(RowPath::Greedy);
    }
    let as_given = if matches!(plan, RowPlan::Greedy) && !logprobs { RowPath::Greedy } else { RowPath::Race };
    let sampling = matches!(plan, RowPlan::Sample { .. });
    if sampling && filter::Filters::of(batch, r).is_some_and(|f| f.keeps_range() && range::draws_a_range(&f, plan)) {
        let has_step = batch.has_step() && step::row_has_step(batch, r);
        let e = if has_step { step::build(k, batch, r, false).map_err(|e| e.in_row(r))? } else { None };
        return Ok(RowPath::Range(e));
    }
    if !(batch.has_step() && step::row_has_step(batch, r)) {
        return Ok(as_given);
    }
    let filters = sampling && filter::Filters::of(batch, r).is_some();
    // A row raced block by block with nothing that reads the whole row (filters, logprobs,
    // external noise) may leave its histories to the blocks it visits.
    let defer = !logprobs
        && match plan {
            RowPlan::Greedy => true,
            RowPlan::Sample { noise: RaceNoise::Inline(_), .. } => !filters,
            RowPlan::Sample { .. } => false,
        };
    let Some(e) = step::build(k, batch, r, defer).map_err(|e| e.in_row(r))? else { return Ok(as_given) };
    Ok(if filters {
        RowPath::Filtered(e)
    } else if !e.by_blocks() {
        RowPath::Masked(e)
    } else if e.deferred() {
        RowPath::Deferred(e)
    } else {
        RowPath::ByBlocks(e)
    })
}

/// Whether row `r` is a greedy row with no logprobs and no step: [`RowPath::Greedy`] without
/// building the path (its step, filters), which [`draw_row`] checks first so that such a row
/// costs its one pass and little more (a call of many short greedy rows is mostly this
/// dispatch).
fn greedy_as_given(batch: &Batch, r: usize, plan: RowPlan, logprobs: bool) -> bool {
    matches!(plan, RowPlan::Greedy) && !logprobs && !(batch.has_step() && step::row_has_step(batch, r))
}

/// Draws row `r` of `batch` on this thread, the way [`path`] chooses. With `logprobs`, the
/// row's logprobs are computed here too: for a row without a step while its block maxima are at
/// hand; for a row with a step from the row as given (raw) or its processed values (processed).
pub(super) fn draw_row(
    k: &Kernels,
    batch: &Batch,
    r: usize,
    plan: RowPlan,
    logprobs: Option<&LogprobSlots>,
) -> Result<Drawn> {
    // The row's ids, left to its task by `validate_but_ids` (`Ids::InRows`): read here, on the
    // thread that reads them next.
    crate::batch::row_ids_in_range(k, batch, r)?;
    if greedy_as_given(batch, r, plan, logprobs.is_some()) {
        return Ok(with_row!(batch, r, |v| forced(batch, r, draw_greedy(k, v))));
    }
    let path = path(k, batch, r, plan, logprobs.is_some())?;
    with_row!(batch, r, |v| {
        let (drawn, mut e) = match path {
            RowPath::Greedy => return Ok(forced(batch, r, draw_greedy(k, v))),
            RowPath::Race => return draw_race(k, (batch, r), v, plan, logprobs).map(|d| forced(batch, r, d)),
            RowPath::Range(mut e) => {
                return range::draw_range(k, (batch, r), v, e.as_mut(), plan, logprobs).map(|d| forced(batch, r, d))
            }
            RowPath::Filtered(mut e) => (stepped::draw_filtered(k, (batch, r), v, &mut e, plan)?, e),
            RowPath::ByBlocks(mut e) => (stepped::draw_by_blocks(k, r, v, &mut e, plan)?, e),
            RowPath::Deferred(mut e) => (stepped::draw_deferred(k, (batch, r), v, &mut e, plan)?, e),
            RowPath::Masked(mut e) => (stepped::draw_masked(k, r, v, &mut e, plan)?, e),
        };
        stepped::with_logprobs(k, r, v, &mut e, plan, forced(batch, r, drawn), logprobs)
    })
}

/// Row `r`'s draw `drawn` with its token replaced by the row's forced token, if it has one
/// (flagged when its step bans it). The row was drawn all the same: its noise, a pure function
/// of the row's key, is consumed as a drawn row's is, and the rows after it draw what they
/// would draw had it not been forced.
pub(super) fn forced(batch: &Batch, r: usize, drawn: Drawn) -> Drawn {
    let Some(t) = batch.forced(r) else { return drawn };
    let banned = if batch.step_bans(r, t) { flags::FORCED_BANNED } else { 0 };
    Drawn { token: t, flags: drawn.flags | banned, ..drawn }
}

/// What the first pass found in a row.
pub(super) struct Scanned {
    pub top: f32,
    pub flags: u32,
}

/// The row's flags and maximum, from its block maxima and `listed`, the largest of the values
/// the row's step changed (-inf: none).
pub(super) fn summarize(bmax: &[f32], listed: f32, has_nan: bool, plan: RowPlan) -> Scanned {
    // `+ 0.0` turns a maximum of -0 into +0: which zero a SIMD max keeps depends on the level's
    // reduction order, and the mass kernels need `x - m <= +0` bit-wise, which a maximum of -0
    // breaks for the +0 values (their weight became 0 on AVX-512: found by fuzz/draw_c_abi).
    let top = crate::kernels::largest(bmax, listed) + 0.0;
    let mut fl = if has_nan { flags::HAS_NAN } else { 0 };
    if matches!(plan, RowPlan::Greedy) {
        fl |= flags::GREEDY;
    }
    if top == f32::INFINITY {
        fl |= flags::HAS_POSINF;
    } else if top == f32::NEG_INFINITY {
        fl |= flags::EMPTY;
    }
    Scanned { top, flags: fl }
}

/// The race parameters of a row that needs a race, with its filters' floor, or `None` if its
/// token is decided without one (greedy, +inf present, or empty).
pub(super) fn race_params<V: RowValues + ?Sized>(
    k: &Kernels,
    batch: &Batch,
    r: usize,
    v: &V,
    bmax: &[f32],
    sc: &Scanned,
    plan: RowPlan,
) -> Result<Option<(RaceParams, RaceNoise)>> {
    match plan {
        RowPlan::Sample { inv_t, filter_inv_t, noise, .. } if sc.top.is_finite() => {
            let floor = filter::row_floor(k, batch, r, v, bmax, sc.top, filter_inv_t).map_err(|e| e.in_row(r))?;
            Ok(Some((RaceParams { m: sc.top, inv_t, floor }, noise)))
        }
        _ => Ok(None),
    }
}

/// The most races [`race_row`] runs before it computes the filters' floor: each after a winner
/// that top-p surely drops, over the tokens above it. A race and its judgement cost a few passes
/// over the row, the floor of a flat row far more (its tens of thousands of kept tokens each
/// weighed in f64: a seeded N(0, 1) row at 262144, top-p 0.9, whose winners crept up through
/// four drops took 1.08 ms that way against 0.54 ms with a fifth race), so the limit is high;
/// it only bounds the work of a row whose winners keep falling just below the threshold.
const RACES_AFTER_DROPS: usize = 16;

/// The race of a row that needs one, and its filters' floor.
///
/// A sampling row with top-k or top-p (with or without min-p) on a row whose mass sits in a few
/// blocks, or with top-p without top-k on any row ([`filter::decided_by_mass`]: its threshold
/// may need most of a heavy tail), races first over the tokens min-p keeps. When top-k and
/// top-p surely keep the winner ([`filter::surely_keeps`], from the few tokens above it;
/// [`filter::judge_by_mass`] on the other rows, from a pass of mass per tier), the winner is
/// the race's over the kept tokens too (the same keys; the kept tokens a subset that holds it), and their
/// threshold, which for top-p needs the mass of the whole row, is never computed: the floor
/// returned is then min-p's alone, which nothing after this draw reads (`filters_after_race`).
/// When the mass shows that top-p surely drops the winner, the threshold lies above it: the row
/// races again over the tokens above the winner (a set holding every kept token), and that
/// winner is judged the same way, up to [`RACES_AFTER_DROPS`] races. A row of few heavy
/// blocks whose heavy blocks give top-p's threshold races over it. Otherwise the row races
/// once more, with the whole floor.
fn race_row<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    (v, bmax, sc): (&V, &[f32], &Scanned),
    plan: RowPlan,
) -> Result<(Option<Best>, f32)> {
    if let RowPlan::Sample { inv_t, filter_inv_t, noise, filters_after_race: true, .. } = plan {
        let m = sc.top;
        let after_race = m.is_finite().then(|| filter::decided_after_race(batch, r, m, filter_inv_t)).flatten();
        if let Some((f, floor)) = after_race {
            let few = filter::few_heavy_blocks(bmax, m, filter_inv_t);
            if few || filter::decided_by_mass(f) {
                let around = (m, filter_inv_t, floor);
                // The race's floor: min-p's, raised above each winner the filters surely drop
                // (every kept token lies above it too, so the kept set's winner stays in the race).
                let mut lo = floor;
                let mut z_known =
                    if few { filter::top_p::ZBounds::exps_only() } else { filter::top_p::ZBounds::default() };
                for _ in 0..RACES_AFTER_DROPS {
                    let won = v
                        .race(k, 0, v.n(), bmax, RaceParams { m, inv_t, floor: lo }, noise)
                        .map_err(|e| e.in_row(r))?;
                    if won.token == usize::MAX {
                        break;
                    }
                    let x = v.at(won.token);
                    let values_ge = |lo| filter::row_values_ge(k, v, bmax, lo);
                    // A row of few heavy blocks first gathers the values above its winner. A
                    // winner that most blocks reach (one from the tail of a peaked row) is then
                    // left to the threshold when the heavy blocks give it cheaply, else judged
                    // from the row's mass, as a row of many heavy blocks is, rather than by the
                    // whole threshold (a gather of the tail, often its f64 mass).
                    let surely_kept = few
                        && filter::surely_keeps(k, v, bmax, around, f, (x, &values_ge as filter::ValuesGe))
                            .map_err(|e| e.in_row(r))?;
                    let in_few = if few && !surely_kept {
                        filter::top_p_in_few_blocks(k, v, bmax, around, f).map_err(|e| e.in_row(r))?
                    } else {
                        None
                    };
                    if let Some(theta) = in_few {
                        // The filters' whole floor (top-p over min-p's floor, no top-k): the
                        // race over it is the one `race_params` runs, without computing it again.
                        let won = v
                            .race(k, 0, v.n(), bmax, RaceParams { m, inv_t, floor: theta }, noise)
                            .map_err(|e| e.in_row(r))?;
                        return Ok((Some(won), theta));
                    }
                    let judged = if surely_kept {
                        Ok(Some(true))
                    } else {
                        filter::judge_by_mass(k, v, bmax, around, f, x, &mut z_known)
                    };
                    match judged.map_err(|e| e.in_row(r))? {
                        Some(true) => return Ok((Some(won), floor)),
                        Some(false) => lo = x.next_up(),
                        None => break,
                    }
                }
            }
        }
    }
    let params = race_params(k, batch, r, v, bmax, sc, plan)?;
    let won = params.map(|(p, noise)| v.race(k, 0, v.n(), bmax, p, noise)).transpose().map_err(|e| e.in_row(r))?;
    Ok((won, params.map_or(f32::NEG_INFINITY, |(p, _)| p.floor)))
}

/// The filters' floor of a scored row, without its race: the floor [`race_params`] gives when
/// something after the draw reads it (processed logprobs), else -inf, as nothing does.
fn scored_floor<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    (v, bmax, sc): (&V, &[f32], &Scanned),
    plan: RowPlan,
) -> Result<f32> {
    if matches!(plan, RowPlan::Sample { filters_after_race: true, .. }) {
        return Ok(f32::NEG_INFINITY);
    }
    Ok(race_params(k, batch, r, v, bmax, sc, plan)?.map_or(f32::NEG_INFINITY, |(p, _)| p.floor))
}

/// The token of a row once its race (if any) is done: the winner, else the first index of the
/// maximum (greedy, +inf, or no key above -inf), else 0 for an empty row.
pub(super) fn finish<V: RowValues + ?Sized>(k: &Kernels, v: &V, bmax: &[f32], sc: &Scanned, won: Option<Best>) -> i32 {
    if sc.flags & flags::EMPTY != 0 {
        return 0;
    }
    match won {
        Some(b) if b.token != usize::MAX => b.token as i32,
        _ => {
            let b = bmax.iter().position(|&x| x == sc.top).unwrap_or(0);
            v.find_first(k, b * BLOCK, ((b + 1) * BLOCK).min(v.n()), sc.top).unwrap_or(0) as i32
        }
    }
}

/// Draws row `r` of `batch` from its values as given ([`RowPath::Race`]); with `logprobs`,
/// computes its logprobs.
fn draw_race<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    v: &V,
    plan: RowPlan,
    logprobs: Option<&LogprobSlots>,
) -> Result<Drawn> {
    BLOCK_MAX.with(|cell| {
        let mut bmax = cell.borrow_mut();
        alloc::resize(&mut bmax, v.n().div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima").map_err(|e| e.in_row(r))?;
        let has_nan = v.scan(k, 0, v.n(), &mut bmax);
        draw_scanned(k, (batch, r), (v, &bmax, has_nan), plan, false, logprobs)
    })
}

/// The race of the values `v` once scanned: their block maxima `bmax`, and whether the row held
/// a NaN; `processed`: `v` are a row's processed values. With `logprobs`, computes the row's
/// logprobs from them.
pub(super) fn draw_scanned<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    (v, bmax, has_nan): (&V, &[f32], bool),
    plan: RowPlan,
    processed: bool,
    logprobs: Option<&LogprobSlots>,
) -> Result<Drawn> {
    let sc = summarize(bmax, f32::NEG_INFINITY, has_nan, plan);
    let (won, floor) = if plan.is_scored() {
        (None, scored_floor(k, (batch, r), (v, bmax, &sc), plan)?)
    } else {
        race_row(k, (batch, r), (v, bmax, &sc), plan)?
    };
    let info = RowInfo { top: sc.top, floor, processed };
    // A forced row's logprobs are its forced token's.
    let token = batch.forced(r).unwrap_or_else(|| finish(k, v, bmax, &sc, won));
    if let Some(slots) = logprobs {
        // SAFETY: r is a row of the call, and this task draws it alone.
        let (o, given) = unsafe { (slots.row(r), slots.given(r)) };
        row_logprobs_given(k, v, bmax, plan.inv_t(), slots.mode, (sc.top, floor), token, o, given)
            .map_err(|e| e.in_row(r))?;
    }
    Ok(Drawn { token, flags: sc.flags, info, logprobs_done: logprobs.is_some(), mirostat_mu: None })
}

/// Draws a greedy row that needs nothing else from its values `v` ([`RowPath::Greedy`]) in one
/// pass without block maxima: the token and flags [`finish`] gives from the block maxima of the
/// same row.
fn draw_greedy<V: RowValues + ?Sized>(k: &Kernels, v: &V) -> Drawn {
    greedy_drawn(k, v, v.top_block(k))
}

/// Rows `r` and `r + 1` of `batch`, both greedy rows that need nothing else (no step, no
/// logprobs), drawn as [`draw_row`] draws each: both passes first ([`RowValues::top_block_pair`],
/// read in turn where the level allows), then each row's token.
pub(super) fn draw_greedy_pair(k: &Kernels, batch: &Batch, r: usize) -> Result<[Drawn; 2]> {
    crate::batch::row_ids_in_range(k, batch, r)?;
    crate::batch::row_ids_in_range(k, batch, r + 1)?;
    let span = |r: usize| {
        let start = batch.logits_row(r) * batch.row_stride;
        start..start + batch.vocab
    };
    let (a, b) = (span(r), span(r + 1));
    let [x, y] = match batch.logits {
        crate::batch::Logits::F32(s) => greedy_pair_of(k, &s[a], &s[b]),
        crate::batch::Logits::Bf16(s) => greedy_pair_of(k, &s[a], &s[b]),
        crate::batch::Logits::F16(s) => greedy_pair_of(k, &s[a], &s[b]),
    };
    Ok([forced(batch, r, x), forced(batch, r + 1, y)])
}

/// The draws of two greedy rows `v` and `w` of one length, their passes taken together.
fn greedy_pair_of<V: RowValues + ?Sized>(k: &Kernels, v: &V, w: &V) -> [Drawn; 2] {
    let [p, q] = v.top_block_pair(w, k);
    [greedy_drawn(k, v, p), greedy_drawn(k, w, q)]
}

/// The draw of a greedy row from its values `v` and its pass ([`RowValues::top_block`]).
fn greedy_drawn<V: RowValues + ?Sized>(k: &Kernels, v: &V, (top, b, has_nan): (f32, usize, bool)) -> Drawn {
    let sc = summarize(&[top], f32::NEG_INFINITY, has_nan, RowPlan::Greedy);
    let token = if sc.flags & flags::EMPTY != 0 {
        0
    } else {
        v.find_first(k, b * BLOCK, ((b + 1) * BLOCK).min(v.n()), sc.top).unwrap_or(0) as i32
    };
    let info = RowInfo { top: sc.top, floor: f32::NEG_INFINITY, processed: false };
    Drawn { token, flags: sc.flags, info, logprobs_done: false, mirostat_mu: None }
}
