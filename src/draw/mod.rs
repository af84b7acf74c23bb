//! Drawing a planned call: the first pass over each row, its filters' floor, the race, then the
//! logprobs, and the output written only once everything succeeded.
//!
//! - `mod.rs`: one row on one thread ([`draw_row`]), the split of a call, and the call ([`run`]);
//! - `tiles.rs`: fewer rows than threads, each row split into tiles of whole blocks;
//! - `workers.rs`: the persistent worker threads;
//! - `cost.rs`: the measured costs that choose how many threads a call uses;
//! - `cells.rs`: the cells tasks write their results through.
//!
//! Every split gives the same tokens as the single-threaded draw: each tile's best is exact,
//! and merging bests (highest key, then lowest token) does not depend on the order.

mod cells;
pub(crate) mod cost;
mod tiles;
pub(crate) mod verify;
pub(crate) mod workers;

use crate::alloc;
use crate::batch::{flags, Batch, FullMode, LogprobMode, Output};
use crate::error::{Error, ErrorKind, Result};
use crate::filter;
use crate::kernels::{Best, BlockValues, Kernels, RaceParams, BLOCK};
use crate::logprob::{processed_row_logprobs, row_logprobs, write_full, LogprobSlots, Logprobs, Processed, RowInfo};
use crate::row::{with_row, RaceNoise, RowValues};
use crate::step::{self, DeferredRow, RowStep, StepBlocks};
use cells::SyncCell;
use cost::{Mode, WorkCost};
use std::cell::RefCell;
use std::time::Instant;
use workers::WorkerPool;

/// Vocabulary tiles hold at least this many elements, so a row is tiled only from twice this. On
/// the 16-core AVX-512 host a single row of 151936-262144 logits split into tiles of 32768 was
/// 1.1-1.8x slower than on one thread at every thread count (two jobs, the floor computed in
/// between, the merge); rows of realistic vocabularies are therefore never tiled, and calls with
/// several rows are spread by rows (`docs/performance.md`, Threads at small batches).
const MIN_TILE: usize = 1024 * BLOCK;
/// The tile minimum when a test forces the participants: small enough that the tiled path runs
/// at the sizes tests draw (it must give the same tokens as every other split).
const FORCED_MIN_TILE: usize = 128 * BLOCK;

/// A sampler's worker threads and what its draws cost, which decides how many of them a call
/// uses.
pub(crate) struct Workers {
    pool: WorkerPool,
    work: WorkCost,
}

impl Workers {
    /// Starts `workers` threads (the calling thread of each call is one more).
    pub(crate) fn new(workers: usize) -> std::io::Result<Workers> {
        Ok(Workers { pool: WorkerPool::new(workers)?, work: WorkCost::default() })
    }
}

/// How a call is spread: on `participants` threads, each row in `tiles_per_row` tiles (1: rows
/// are the tasks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Split {
    participants: usize,
    tiles_per_row: usize,
}

impl Split {
    const ONE_THREAD: Split = Split { participants: 1, tiles_per_row: 1 };

    /// The most tiles of at least `min_tile` elements a row of `n` elements is split into.
    fn most_tiles(n: usize, min_tile: usize) -> usize {
        if n >= 2 * min_tile {
            n / min_tile
        } else {
            1
        }
    }

    /// The split of `rows` rows of `n` on `threads` threads: whole rows when there are enough,
    /// else each row in tiles (as many per row as the threads allow).
    fn on(threads: usize, rows: usize, n: usize, min_tile: usize) -> Split {
        if threads <= rows {
            return Split { participants: threads.max(1), tiles_per_row: 1 };
        }
        let tiles_per_row = (threads / rows.max(1)).clamp(1, Split::most_tiles(n, min_tile));
        Split { participants: rows * tiles_per_row, tiles_per_row }
    }

    /// The most threads a call of `rows` rows of `n` can use (the cost model's own tiles).
    fn most_threads(rows: usize, n: usize) -> usize {
        rows * Split::most_tiles(n, MIN_TILE)
    }

    /// The split the cost model estimates fastest for this call on `workers`.
    fn choose(workers: &Workers, rows: usize, n: usize, mode: Mode) -> Split {
        if let Some(forced) = cost::forced_participants() {
            let most = rows * Split::most_tiles(n, FORCED_MIN_TILE);
            return Split::on(forced.min(workers.pool.width()).min(most), rows, n, FORCED_MIN_TILE);
        }
        let most = Split::most_threads(rows, n);
        let work_ns = workers.work.estimate_ns(mode, rows * n);
        let wake = workers.pool.wake_cost();
        // A tiled call runs two jobs (the block maxima, then the race).
        let overhead_ns = |t: usize| wake.overhead_ns(t - 1, if t > rows { 2 } else { 1 });
        let threads = cost::participants(work_ns, overhead_ns, workers.pool.useful_width().min(most));
        Split::on(threads, rows, n, MIN_TILE)
    }
}

/// The most a thread keeps, after a call, of the buffers it reuses from call to call (block
/// maxima, the race's per-block scratch, a row's edits and processed values, the rank's values):
/// what exceeds it is given back at the end of the call, largest buffer first, on the calling
/// thread and on each worker that took part. At the largest vocabularies in use (262,144 tokens)
/// a row with every input keeps about 3.3 MiB (1 MiB each for the processed row, the rank's
/// values and the output's counts, and the bitsets and per-block arrays), so that such rows keep
/// reusing their buffers; a history of millions of ids or a vocabulary of tens of millions gives
/// its buffers back after the call (their allocation then costs far less than reading the row).
pub const KEPT_PER_THREAD: usize = 4 << 20;

/// Every buffer this thread keeps from call to call.
fn kept_buffers() -> [alloc::Kept; 7] {
    let [scratch, block_noise] = crate::row::kept();
    let [edits, deferred] = step::kept();
    [
        alloc::kept_vec(&BLOCK_MAX, || alloc::release_vec(&BLOCK_MAX)),
        alloc::kept_vec(&PROCESSED, || alloc::release_vec(&PROCESSED)),
        scratch,
        block_noise,
        edits,
        deferred,
        crate::logprob::kept(),
    ]
}

/// The bytes this thread keeps from call to call (test seam: `internals::thread_kept_bytes`).
#[cfg(feature = "internals")]
pub fn kept_bytes() -> usize {
    kept_buffers().iter().map(|b| b.bytes).sum()
}

/// Gives back this thread's largest buffers until what it keeps is at most [`KEPT_PER_THREAD`].
pub(crate) fn trim_kept() {
    let mut buffers = kept_buffers();
    let mut total: usize = buffers.iter().map(|b| b.bytes).sum();
    if total <= KEPT_PER_THREAD {
        return;
    }
    buffers.sort_unstable_by_key(|b| std::cmp::Reverse(b.bytes));
    for b in buffers {
        if total <= KEPT_PER_THREAD {
            break;
        }
        (b.release)();
        total -= b.bytes;
    }
}

thread_local! {
    /// Block maxima of the row being drawn on this thread.
    static BLOCK_MAX: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The processed values of the row being drawn on this thread, when it has edits.
    static PROCESSED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// What to do with one row (decided by `plan`, on the calling thread).
#[derive(Clone, Copy, Debug)]
pub(crate) enum RowPlan {
    Greedy,
    /// `filter_inv_t` is the 1/T the filters judge the row at: `inv_t` (temperature first) or 1
    /// (filters first).
    ///
    /// `filters_after_race`: nothing after the draw reads the row's filters' floor (no processed
    /// logprobs, no processed full-vocabulary output), so a row with top-k or top-p may decide
    /// them after its race ([`race_row`]).
    Sample {
        inv_t: f32,
        filter_inv_t: f32,
        noise: RaceNoise,
        filters_after_race: bool,
    },
}

impl RowPlan {
    /// The plan with `filters_after_race` set (a sampling row).
    fn with_filters_after_race(self) -> RowPlan {
        match self {
            RowPlan::Sample { inv_t, filter_inv_t, noise, .. } => {
                RowPlan::Sample { inv_t, filter_inv_t, noise, filters_after_race: true }
            }
            greedy => greedy,
        }
    }

    /// 1/T of a sampling row; `None` for a greedy one.
    pub(crate) fn inv_t(self) -> Option<f32> {
        match self {
            RowPlan::Greedy => None,
            RowPlan::Sample { inv_t, .. } => Some(inv_t),
        }
    }
}

/// One drawn row.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Drawn {
    pub token: i32,
    pub flags: u32,
    pub info: RowInfo,
    /// The row's logprobs were computed by the task that drew it.
    pub logprobs_done: bool,
}

/// What the first pass found in a row.
struct Scanned {
    top: f32,
    flags: u32,
}

/// The row's flags and maximum, from its block maxima and `listed`, the largest of the values
/// the row's edits changed (-inf: none).
fn summarize(bmax: &[f32], listed: f32, has_nan: bool, plan: RowPlan) -> Scanned {
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
fn race_params<V: RowValues + ?Sized>(
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
            let floor = filter::row_floor(k, batch, r, v, bmax, sc.top, filter_inv_t).map_err(|e| in_row(r, e))?;
            Ok(Some((RaceParams { m: sc.top, inv_t, floor }, noise)))
        }
        _ => Ok(None),
    }
}

/// The race of a row that needs one, and its filters' floor.
///
/// A sampling row with top-k or top-p (with or without min-p) on a row whose mass sits in a few
/// blocks races first over the tokens min-p keeps. When top-k and top-p surely keep the winner
/// ([`filter::surely_keeps`], from the few tokens above it), the winner is the race's over the
/// kept tokens too (the same keys; the kept tokens a subset that holds it), and their
/// threshold, which for top-p needs the mass of the whole row, is never computed: the floor
/// returned is then min-p's alone, which nothing after this draw reads (`filters_after_race`).
/// Otherwise the row races once more, with the whole floor.
fn race_row<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    (v, bmax, sc): (&V, &[f32], &Scanned),
    plan: RowPlan,
) -> Result<(Option<Best>, f32)> {
    if let RowPlan::Sample { inv_t, filter_inv_t, noise, filters_after_race: true } = plan {
        let m = sc.top;
        let few = m.is_finite() && filter::few_heavy_blocks(bmax, m, filter_inv_t);
        if let Some((f, floor)) = few.then(|| filter::decided_after_race(batch, r, m, filter_inv_t)).flatten() {
            let won = v.race(k, 0, v.n(), bmax, RaceParams { m, inv_t, floor }, noise).map_err(|e| in_row(r, e))?;
            if won.token != usize::MAX {
                let values_ge = |lo| filter::row_values_ge(k, v, bmax, lo);
                let at = (v.at(won.token), &values_ge as filter::ValuesGe);
                if filter::surely_keeps(k, v, bmax, (m, filter_inv_t, floor), f, at).map_err(|e| in_row(r, e))? {
                    return Ok((Some(won), floor));
                }
            }
        }
    }
    let params = race_params(k, batch, r, v, bmax, sc, plan)?;
    let won = params.map(|(p, noise)| v.race(k, 0, v.n(), bmax, p, noise)).transpose().map_err(|e| in_row(r, e))?;
    Ok((won, params.map_or(f32::NEG_INFINITY, |(p, _)| p.floor)))
}

/// An error of row `r` (an allocation of its filters), named so; nothing is written.
pub(crate) fn in_row(r: usize, e: Error) -> Error {
    let message = format!("row {r}: {}; nothing was written", e.message);
    Error { message, ..e }
}

/// An error of the call, not of one row (an allocation for every row); nothing is written.
fn nothing_written(e: Error) -> Error {
    let message = format!("{}; nothing was written", e.message);
    Error { message, ..e }
}

/// The token of a row once its race (if any) is done: the winner, else the first index of the
/// maximum (greedy, +inf, or no key above -inf), else 0 for an empty row.
fn finish<V: RowValues + ?Sized>(k: &Kernels, v: &V, bmax: &[f32], sc: &Scanned, won: Option<Best>) -> i32 {
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

/// Draws row `r` of `batch` on this thread: as given, or, when the sampling step before the
/// filters changes it (`edits.rs`), from the kept tokens and the edited ones.
/// With `logprobs`, the row's logprobs are computed here too: for a row drawn from its values as
/// given while its block maxima are at hand; for an edited row from the row as given (raw) or
/// its processed values (processed), written out once more.
fn draw_row(k: &Kernels, batch: &Batch, r: usize, plan: RowPlan, logprobs: Option<&LogprobSlots>) -> Result<Drawn> {
    // The row's ids, left to its task by `validate_but_ids` (`Ids::InRows`): read here, on the
    // thread that reads them next.
    crate::batch::row_ids_in_range(k, batch, r)?;
    with_row!(batch, r, |v| {
        if batch.has_step() && step::row_has_step(batch, r) {
            // A row raced block by block with nothing that reads the whole row (filters,
            // logprobs, external noise) may leave its histories to the blocks it visits.
            let defer = logprobs.is_none()
                && match plan {
                    RowPlan::Greedy => true,
                    RowPlan::Sample { noise: RaceNoise::Inline(_), .. } => filter::Filters::of(batch, r).is_none(),
                    RowPlan::Sample { .. } => false,
                };
            if let Some(mut e) = step::build(k, batch, r, defer).map_err(|e| in_row(r, e))? {
                let d = draw_processed(k, batch, r, v, &mut e, plan)?;
                if let Some(slots) = logprobs {
                    // SAFETY: r is a row of the call, and this task draws it alone.
                    let o = unsafe { slots.row(r) };
                    PROCESSED
                        .with(|y| {
                            processed_row_logprobs(
                                k,
                                v,
                                &mut e,
                                &mut y.borrow_mut(),
                                plan.inv_t(),
                                (d.info, d.token),
                                slots.mode,
                                o,
                            )
                        })
                        .map_err(|e| in_row(r, e))?;
                }
                return Ok(Drawn { logprobs_done: logprobs.is_some(), ..d });
            }
        }
        draw_values(k, batch, r, v, plan, None, logprobs)
    })
}

/// Draws row `r` of `batch` from the values `v`: the row as given, or (`nan`: the given row held
/// a NaN) its processed values; with `logprobs` (a row as given), computes its logprobs.
fn draw_values<V: RowValues + ?Sized>(
    k: &Kernels,
    batch: &Batch,
    r: usize,
    v: &V,
    plan: RowPlan,
    processed: Option<bool>,
    logprobs: Option<&LogprobSlots>,
) -> Result<Drawn> {
    if matches!(plan, RowPlan::Greedy) && logprobs.is_none() {
        return Ok(draw_greedy(k, v, processed));
    }
    BLOCK_MAX.with(|cell| {
        let mut bmax = cell.borrow_mut();
        alloc::resize(&mut bmax, v.n().div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima").map_err(|e| in_row(r, e))?;
        let has_nan = v.scan(k, 0, v.n(), &mut bmax) || processed == Some(true);
        draw_scanned(k, (batch, r), (v, &bmax, has_nan), plan, processed.is_some(), logprobs)
    })
}

/// [`draw_values`] once the values `v` are scanned: their block maxima `bmax`, and whether the
/// row held a NaN; `edited`: `v` are a row's processed values.
fn draw_scanned<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    (v, bmax, has_nan): (&V, &[f32], bool),
    plan: RowPlan,
    edited: bool,
    logprobs: Option<&LogprobSlots>,
) -> Result<Drawn> {
    let sc = summarize(bmax, f32::NEG_INFINITY, has_nan, plan);
    let (won, floor) = race_row(k, (batch, r), (v, bmax, &sc), plan)?;
    let info = RowInfo { top: sc.top, floor, edited };
    let token = finish(k, v, bmax, &sc, won);
    if let Some(slots) = logprobs {
        // SAFETY: r is a row of the call, and this task draws it alone.
        let o = unsafe { slots.row(r) };
        row_logprobs(k, v, bmax, plan.inv_t(), slots.mode, sc.top, floor, token, o).map_err(|e| in_row(r, e))?;
    }
    Ok(Drawn { token, flags: sc.flags, info, logprobs_done: logprobs.is_some() })
}

/// Draws a greedy row that needs nothing else from its values `v` (`processed` as in
/// [`draw_values`]) in one pass without block maxima: the token and flags [`finish`] gives from
/// the block maxima of the same row.
fn draw_greedy<V: RowValues + ?Sized>(k: &Kernels, v: &V, processed: Option<bool>) -> Drawn {
    let (top, b, has_nan) = v.top_block(k);
    let sc = summarize(&[top], f32::NEG_INFINITY, has_nan || processed == Some(true), RowPlan::Greedy);
    let token = if sc.flags & flags::EMPTY != 0 {
        0
    } else {
        v.find_first(k, b * BLOCK, ((b + 1) * BLOCK).min(v.n()), sc.top).unwrap_or(0) as i32
    };
    let info = RowInfo { top: sc.top, floor: f32::NEG_INFINITY, edited: processed.is_some() };
    Drawn { token, flags: sc.flags, info, logprobs_done: false }
}

/// Draws row `r` with edits `e`. A sampling row with filters is drawn from its processed values,
/// written out (the filters read values); every other row straight from its kept tokens (masked
/// kernels) and its edited ones (raced one by one), without a pass of its own.
fn draw_processed<V: RowValues + ?Sized>(
    k: &Kernels,
    batch: &Batch,
    r: usize,
    v: &V,
    e: &mut RowStep,
    plan: RowPlan,
) -> Result<Drawn> {
    if matches!(plan, RowPlan::Sample { .. }) && filter::Filters::of(batch, r).is_some() {
        if e.by_blocks() {
            if let Some(d) = draw_by_blocks_after_race(k, (batch, r), v, e, plan)? {
                return Ok(d);
            }
        }
        // The processed values written out, with their block maxima (the copy is not scanned
        // again).
        return PROCESSED.with(|cell| {
            BLOCK_MAX.with(|bcell| {
                let (y, bmax) = (&mut *cell.borrow_mut(), &mut *bcell.borrow_mut());
                let blocks = v.n().div_ceil(BLOCK);
                alloc::resize(bmax, blocks, f32::NEG_INFINITY, "block maxima").map_err(|e| in_row(r, e))?;
                let nan = e.materialize(k, v, y, bmax).map_err(|e| in_row(r, e))?;
                draw_scanned(k, (batch, r), (&y[..], &bmax[..], nan), plan, true, None)
            })
        });
    }
    if e.by_blocks() {
        return draw_by_blocks(k, (batch, r), v, e, plan);
    }
    BLOCK_MAX.with(|cell| {
        let mut bmax = cell.borrow_mut();
        alloc::resize(&mut bmax, v.n().div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima").map_err(|e| in_row(r, e))?;
        let has_nan = e.scan(k, v, &mut bmax);
        let listed_max = e.overrides.iter().fold(f32::NEG_INFINITY, |a, &(_, y)| if y > a { y } else { a });
        let sc = summarize(&bmax, listed_max, has_nan, plan);
        let won = match plan {
            RowPlan::Sample { inv_t, noise, .. } if sc.top.is_finite() => {
                let p = RaceParams { m: sc.top, inv_t, floor: f32::NEG_INFINITY };
                Some(v.race_processed(k, e.keep(), &bmax, &e.overrides, p, noise).map_err(|e| in_row(r, e))?)
            }
            _ => None,
        };
        let token = match won {
            _ if sc.flags & flags::EMPTY != 0 => 0,
            Some(b) if b.token != usize::MAX => b.token as i32,
            _ => first_of_top(v, e, &bmax, sc.top) as i32,
        };
        let info = RowInfo { top: sc.top, floor: f32::NEG_INFINITY, edited: true };
        Ok(Drawn { token, flags: sc.flags, info, logprobs_done: false })
    })
}

/// Draws row `r` (sampling, with filters, on inline noise) with edits `e` that no penalty raises,
/// without writing its processed values out, when its filters can be decided after the race as
/// a row as given does ([`race_row`]): bounds of the blocks, the race over the kept and edited
/// tokens ([`draw_by_blocks`]), then the filters for the winner alone, from the processed values
/// above it (`RowStep::values_ge`). The same token as the race of the processed row, with the
/// floor or without: the same values, keys and noise. `None`: not such a row, or not decided
/// (then the row is drawn from its processed values, written out).
fn draw_by_blocks_after_race<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    v: &V,
    e: &RowStep,
    plan: RowPlan,
) -> Result<Option<Drawn>> {
    let RowPlan::Sample { inv_t, filter_inv_t, noise: RaceNoise::Inline(key), filters_after_race: true } = plan else {
        return Ok(None);
    };
    BLOCK_MAX.with(|cell| {
        let mut bmax = cell.borrow_mut();
        alloc::resize(&mut bmax, v.n().div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima").map_err(|e| in_row(r, e))?;
        let has_nan = e.bounds(k, v, &mut bmax);
        let sc = summarize(&bmax, f32::NEG_INFINITY, has_nan, plan);
        let m = sc.top;
        if !m.is_finite() || !filter::few_heavy_blocks(&bmax, m, filter_inv_t) {
            return Ok(None);
        }
        let Some((f, floor)) = filter::decided_after_race(batch, r, m, filter_inv_t) else { return Ok(None) };
        let edited = StepBlocks { edits: e, values: v };
        let won = v
            .race_blocks(k, e.keep(), &bmax, RaceParams { m, inv_t, floor }, key, &edited)
            .map_err(|e| in_row(r, e))?;
        if won.token == usize::MAX {
            return Ok(None);
        }
        let values_ge = |lo| e.values_ge(v, &bmax, lo);
        let at = (e.value_of(v, won.token), &values_ge as filter::ValuesGe);
        if !filter::surely_keeps(k, v, &bmax, (m, filter_inv_t, floor), f, at).map_err(|e| in_row(r, e))? {
            return Ok(None);
        }
        let info = RowInfo { top: m, floor, edited: true };
        Ok(Some(Drawn { token: won.token as i32, flags: sc.flags, info, logprobs_done: false }))
    })
}

/// Draws row `r` (greedy, or sampling without filters) with edits `e` that no penalty raises
/// ([`RowStep::by_blocks`]): one pass over the row as given bounds every block, and only the
/// touched tokens the race cannot skip on their logits (or, greedy, the blocks that can hold the
/// maximum) are worked out. On inline noise the race skips blocks too; on external noise it
/// reads every kept token's noise, then the touched tokens', block by block. A deferred row
/// ([`RowStep::deferred`]) finds the touched tokens of those blocks alone, when few blocks lie
/// within reach of its largest value ([`DeferredRow::worth_it`]); otherwise its histories are
/// marked once, after the scan of its bounds, which is the same either way.
fn draw_by_blocks<V: RowValues + ?Sized>(
    k: &Kernels,
    (batch, r): (&Batch, usize),
    v: &V,
    e: &mut RowStep,
    plan: RowPlan,
) -> Result<Drawn> {
    BLOCK_MAX.with(|cell| {
        let mut bmax = cell.borrow_mut();
        alloc::resize(&mut bmax, v.n().div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima").map_err(|e| in_row(r, e))?;
        if e.deferred() {
            let d = DeferredRow::new(k, batch, r, e, v).map_err(|e| in_row(r, e))?;
            let has_nan = d.rough_bounds(&mut bmax);
            let inv_t = match plan {
                RowPlan::Sample { inv_t, .. } => Some(inv_t),
                RowPlan::Greedy => None,
            };
            if d.worth_it(&bmax, inv_t) {
                d.refine(&mut bmax);
                let sc = summarize(&bmax, f32::NEG_INFINITY, has_nan, plan);
                return race_by_blocks(k, v, (e.keep(), &bmax, &sc), plan, &d, |top| d.first_of(&bmax, top))
                    .map_err(|e| in_row(r, e));
            }
            drop(d);
            e.complete(k, batch, r);
            e.refine_bounds(k, v, &mut bmax);
            let sc = summarize(&bmax, f32::NEG_INFINITY, has_nan, plan);
            let edited = StepBlocks { edits: e, values: v };
            return race_by_blocks(k, v, (e.keep(), &bmax, &sc), plan, &edited, |top| e.first_of(v, &bmax, top))
                .map_err(|e| in_row(r, e));
        }
        let has_nan = e.bounds(k, v, &mut bmax);
        let sc = summarize(&bmax, f32::NEG_INFINITY, has_nan, plan);
        let edited = StepBlocks { edits: e, values: v };
        race_by_blocks(k, v, (e.keep(), &bmax, &sc), plan, &edited, |top| e.first_of(v, &bmax, top))
            .map_err(|e| in_row(r, e))
    })
}

/// [`draw_by_blocks`] once the row's blocks are bounded (`bmax`, summarized in `sc`): the race
/// over the kept tokens (`keep`) and the touched ones (`edited`), and, for a greedy row or when
/// no key is above -inf, the lowest token of the largest value (`first_of`). Fails only if the
/// race's scratch cannot be allocated.
fn race_by_blocks<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    (keep, bmax, sc): (&[u32], &[f32], &Scanned),
    plan: RowPlan,
    edited: &dyn BlockValues,
    first_of: impl Fn(f32) -> usize,
) -> Result<Drawn> {
    let won = match plan {
        RowPlan::Sample { inv_t, noise, .. } if sc.top.is_finite() => {
            let p = RaceParams { m: sc.top, inv_t, floor: f32::NEG_INFINITY };
            Some(match noise {
                RaceNoise::Inline(key) => v.race_blocks(k, keep, bmax, p, key, edited)?,
                // SAFETY: the noise row holds `n` values (checked by `validate`, or a pool
                // lease of the row's length). (A deferred row is never on external noise: this
                // race reads every block's kept tokens from `keep`.)
                RaceNoise::External(values, kind) => unsafe {
                    v.race_external_blocks(k, keep, p, (values, kind), edited)
                },
            })
        }
        _ => None,
    };
    let token = match won {
        _ if sc.flags & flags::EMPTY != 0 => 0,
        Some(b) if b.token != usize::MAX => b.token as i32,
        _ => first_of(sc.top) as i32,
    };
    let info = RowInfo { top: sc.top, floor: f32::NEG_INFINITY, edited: true };
    Ok(Drawn { token, flags: sc.flags, info, logprobs_done: false })
}

/// The lowest token whose processed value is `top`: among the kept tokens (the first block whose
/// maximum is `top`) and the edited ones.
fn first_of_top<V: RowValues + ?Sized>(v: &V, e: &RowStep, bmax: &[f32], top: f32) -> usize {
    let kept = bmax
        .iter()
        .position(|&b| b == top)
        .and_then(|b| (b * BLOCK..((b + 1) * BLOCK).min(v.n())).find(|&i| e.kept(i) && v.at(i) == top));
    let listed = e.overrides.iter().filter(|&&(_, y)| y == top).map(|&(t, _)| t as usize).min();
    match (kept, listed) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(0),
    }
}

/// Draws every row of `batch`, on as many of `workers` as the call is worth: rows are split
/// across threads; with fewer rows than threads, each row's vocabulary is split into tiles.
/// Fails if a row's memory cannot be allocated (the first such row is named) or a worker
/// panicked.
fn draw_rows(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    workers: Option<&Workers>,
    logprobs: Option<&LogprobSlots>,
) -> Result<Vec<Drawn>> {
    let (rows, n) = (batch.rows, batch.vocab);
    // A call that no split can spread (one row too short to tile) skips the cost model and its
    // clock reads, unless a test forces the participants.
    let spreadable = Split::most_threads(rows, n) > 1 || cost::forced_participants().is_some();
    let Some(workers) = workers.filter(|w| w.pool.width() > 1 && spreadable) else {
        return draw_on_this_thread(k, batch, plans, logprobs);
    };
    let mode = Mode::of(batch, plans);
    let mut split = Split::choose(workers, rows, n, mode);
    if split.tiles_per_row > 1 && batch.has_step() {
        // Rows with edits are drawn whole (their processed values live on one thread).
        split = Split { participants: split.participants.min(rows), tiles_per_row: 1 };
    }
    let (drawn, work_ns) = if split == Split::ONE_THREAD {
        let start = Instant::now();
        let drawn = draw_on_this_thread(k, batch, plans, logprobs)?;
        (drawn, start.elapsed().as_nanos() as u64)
    } else if split.tiles_per_row == 1 {
        draw_by_rows(k, batch, plans, &workers.pool, split.participants, logprobs)?
    } else {
        // (Tiles never draw a row with token lists, whose ids `draw_row` checks.)
        debug_assert!(!batch.has_step());
        tiles::draw_tiled(k, batch, plans, &workers.pool, split)?
    };
    workers.work.record(mode, rows * n, work_ns);
    workers.pool.call_ended();
    Ok(drawn)
}

fn draw_on_this_thread(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    logprobs: Option<&LogprobSlots>,
) -> Result<Vec<Drawn>> {
    (0..batch.rows).map(|r| draw_row(k, batch, r, plans[r], logprobs)).collect()
}

/// Draws each row as one task on `participants` threads of `pool`; returns the rows and their
/// estimated single-thread time.
fn draw_by_rows(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    pool: &WorkerPool,
    participants: usize,
    logprobs: Option<&LogprobSlots>,
) -> Result<(Vec<Drawn>, u64)> {
    let rows = batch.rows;
    let out: Vec<SyncCell<Drawn>> = (0..rows).map(|_| SyncCell::default()).collect();
    let failed = FirstError::default();
    let done = pool.run(rows, participants, &|r| match draw_row(k, batch, r, plans[r], logprobs) {
        // SAFETY: row `r`'s task is the one writer of its cell; it is read after the job.
        Ok(d) => unsafe { out[r].set(d) },
        Err(e) => failed.record(r, e),
    });
    if !done.ok {
        return Err(worker_panicked());
    }
    failed.into_result()?;
    // SAFETY: the job that wrote the cells has ended.
    Ok((out.iter().map(|c| unsafe { c.get() }).collect(), done.work_ns))
}

fn worker_panicked() -> Error {
    Error::new(ErrorKind::Internal, "a worker thread panicked; nothing was written")
}

/// The error of the lowest row that failed, when rows run on several threads.
#[derive(Default)]
struct FirstError(parking_lot::Mutex<Option<(usize, Error)>>);

impl FirstError {
    fn record(&self, row: usize, e: Error) {
        let mut first = self.0.lock();
        if first.as_ref().is_none_or(|(r, _)| row < *r) {
            *first = Some((row, e));
        }
    }

    fn into_result(self) -> Result<()> {
        self.0.into_inner().map_or(Ok(()), |(_, e)| Err(e))
    }

    /// The lowest failing index and its error.
    fn into_first(self) -> Option<(usize, Error)> {
        self.0.into_inner()
    }
}

/// Draws a validated, planned call into `out`. On error nothing is written. Either way this
/// thread then keeps at most [`KEPT_PER_THREAD`] (the workers trim theirs as they leave a job).
pub(crate) fn run(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    workers: Option<&Workers>,
    out: &mut Output,
) -> Result<Vec<Drawn>> {
    let drawn = run_call(k, batch, plans, workers, out);
    trim_kept();
    drawn
}

fn run_call(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    workers: Option<&Workers>,
    out: &mut Output,
) -> Result<Vec<Drawn>> {
    let mut logprobs = Logprobs::new(out, batch.rows);
    let slots = logprobs.as_mut().map(Logprobs::slots);
    let after_race;
    // Only processed logprobs and processed full outputs read the filters' floor.
    let floor_read = (logprobs.is_some() && out.logprob_mode == LogprobMode::Processed)
        || (out.full_logprobs.is_some() && out.full_mode != FullMode::Raw);
    let plans = if !floor_read {
        after_race = alloc::collect(plans.iter().map(|&p| p.with_filters_after_race()), "the row plans")?;
        &after_race[..]
    } else {
        plans
    };
    let drawn = draw_rows(k, batch, plans, workers, slots.as_ref())?;
    let info: Vec<RowInfo> = drawn.iter().map(|d| d.info).collect();
    let inv_t: Vec<Option<f32>> = plans.iter().map(|p| p.inv_t()).collect();
    // The edited rows' processed values, for the full-vocabulary outputs that need them, and the
    // logprobs of the rows their tasks left (both before anything is written: nothing after
    // them can fail).
    let needs_processed = out.full_logprobs.is_some() && out.full_mode != FullMode::Raw;
    let mut processed = if needs_processed { Processed::build(k, batch, &info)? } else { Processed::none(batch.rows) };
    if out.full_logprobs.is_some() {
        processed.reserve_full(batch.vocab).map_err(nothing_written)?;
    }
    if let Some(l) = logprobs.as_mut() {
        let tokens: Vec<i32> = drawn.iter().map(|d| d.token).collect();
        let done: Vec<bool> = drawn.iter().map(|d| d.logprobs_done).collect();
        l.compute_rest(k, batch, &inv_t, &info, &tokens, &done)?;
    }
    write_full(k, batch, &inv_t, &info, out, &mut processed);
    let rows = batch.rows;
    for (t, d) in out.tokens[..rows].iter_mut().zip(&drawn) {
        *t = d.token;
    }
    if let Some(f) = out.flags.as_deref_mut() {
        for (f, d) in f[..rows].iter_mut().zip(&drawn) {
            *f = d.flags;
        }
    }
    if let Some(l) = logprobs {
        l.write(out, rows);
    }
    Ok(drawn)
}

#[cfg(test)]
mod tests {
    use super::{Split, FORCED_MIN_TILE, MIN_TILE};

    fn split(participants: usize, tiles_per_row: usize) -> Split {
        Split { participants, tiles_per_row }
    }

    #[test]
    fn enough_rows_are_split_by_rows() {
        assert_eq!(Split::on(1, 1, 151_936, MIN_TILE), Split::ONE_THREAD);
        assert_eq!(Split::on(2, 4, 151_936, MIN_TILE), split(2, 1));
        assert_eq!(Split::on(4, 32, 32_000, MIN_TILE), split(4, 1));
    }

    #[test]
    fn rows_of_realistic_vocabularies_are_never_tiled() {
        for n in [32_000, 151_936, 262_144] {
            assert_eq!(Split::on(16, 1, n, MIN_TILE), Split::ONE_THREAD, "vocab {n}");
            assert_eq!(Split::most_threads(1, n), 1, "vocab {n}");
            assert_eq!(Split::on(16, 4, n, MIN_TILE), split(4, 1), "vocab {n}");
        }
    }

    #[test]
    fn fewer_rows_than_threads_are_tiled_up_to_the_smallest_tile() {
        assert_eq!(Split::on(16, 1, 1 << 20, MIN_TILE), split(4, 4)); // 4 tiles of at least MIN_TILE
        assert_eq!(Split::on(8, 2, 1 << 20, MIN_TILE), split(8, 4));
        assert_eq!(Split::on(6, 4, 1 << 20, MIN_TILE), split(4, 1)); // 6 threads do not tile 4 rows evenly
        assert_eq!(Split::on(16, 1, 151_936, FORCED_MIN_TILE), split(4, 4)); // what tests force
        assert_eq!(Split::on(8, 1, 32_000, FORCED_MIN_TILE), Split::ONE_THREAD);
        // too short to tile
    }
}
