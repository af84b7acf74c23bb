//! The fused draw: greedy rows, the exponential race, and the batch driver.
//!
//! A call is planned first (which rows are greedy, which noise each sampling row takes; the
//! unseeded rows' keys are taken from the stream in row order), then its rows are drawn, each
//! independently, so the result of a row never depends on how rows are spread over threads.

pub mod batch;
pub mod filter;
pub mod logprob;
#[doc(hidden)]
pub mod mass;
pub(crate) mod workers;

use crate::config::NoiseKind;
use crate::kernels::{Best, BlockNoise, DtypeKernels, ExtKind, Kernels, RaceParams, BLOCK};
use batch::{flags, Batch, Logits};
use std::cell::RefCell;
use workers::WorkerPool;

/// Where a sampling row's noise comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum NoiseSrc {
    /// Counter-based noise of the row key.
    Inline(u64),
    /// One value per token at this pointer (the caller's noise or a pool lease), valid for the call.
    External(*const f32, ExtKind),
}

/// What to do with one row.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RowPlan {
    Greedy,
    Sample { inv_t: f32, noise: NoiseSrc },
}

// SAFETY: the raw noise pointers in a plan point into buffers that outlive the draw call and are
// only read.
unsafe impl Send for RowPlan {}
unsafe impl Sync for RowPlan {}
unsafe impl Send for NoiseSrc {}
unsafe impl Sync for NoiseSrc {}

pub(crate) fn ext_kind(kind: NoiseKind) -> ExtKind {
    match kind {
        NoiseKind::Exp => ExtKind::Exp,
        NoiseKind::LogExp => ExtKind::LogExp,
    }
}

/// 1/T for a sampling row, capped so that a tiny T never turns `0 * inv_t` into NaN.
pub(crate) fn inv_temperature(t: f32) -> f32 {
    let inv = 1.0 / t;
    if inv.is_finite() {
        inv
    } else {
        f32::MAX
    }
}

/// Vocabulary tiles hold at least this many elements: a smaller tile saves less than waking a
/// worker and merging its result cost.
const MIN_TILE: usize = 128 * BLOCK;
/// Calls with fewer elements than this in all run on the calling thread.
const MIN_PARALLEL: usize = 64 * 1024;

thread_local! {
    /// Block maxima of the row being drawn on this thread.
    static BLOCK_MAX: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Block noise of the race running on this thread.
    static BLOCK_NOISE: RefCell<Vec<BlockNoise>> = const { RefCell::new(Vec::new()) };
}

/// A row's values and its kernels, with the dtype erased behind closures of one shape.
trait RowKernels {
    /// Block maxima of elements `[start, start + n)` into `bmax`; whether any was NaN.
    fn scan(&self, start: usize, n: usize, bmax: &mut [f32]) -> bool;
    fn find_first(&self, start: usize, end: usize, target: f32) -> Option<usize>;
    fn race(&self, start: usize, n: usize, bmax: &[f32], p: RaceParams, noise: NoiseSrc) -> Best;
}

struct Row<'k, E> {
    k: &'k DtypeKernels<E>,
    row: *const E,
}

impl<E> RowKernels for Row<'_, E> {
    fn scan(&self, start: usize, n: usize, bmax: &mut [f32]) -> bool {
        // SAFETY: the row was bounds-checked by `validate`; callers stay inside [0, vocab).
        unsafe { (self.k.scan)(self.row.add(start), n, bmax) }
    }
    fn find_first(&self, start: usize, end: usize, target: f32) -> Option<usize> {
        // SAFETY: as above.
        unsafe { (self.k.find_first)(self.row, start, end, target) }
    }
    fn race(&self, start: usize, n: usize, bmax: &[f32], p: RaceParams, noise: NoiseSrc) -> Best {
        // SAFETY: as above; external noise rows were bounds-checked the same way.
        unsafe {
            match noise {
                NoiseSrc::Inline(key) => BLOCK_NOISE
                    .with(|b| (self.k.race_inline)(self.row.add(start), n, bmax, p, key, start, &mut b.borrow_mut())),
                NoiseSrc::External(ptr, kind) => {
                    (self.k.race_external)(self.row.add(start), ptr.add(start), n, p, kind, start)
                }
            }
        }
    }
}

/// Calls `f` with row `r` of `batch` behind [`RowKernels`].
fn with_row<T>(k: &Kernels, batch: &Batch, r: usize, f: impl FnOnce(&dyn RowKernels) -> T) -> T {
    let start = r * batch.row_stride;
    match batch.logits {
        Logits::F32(s) => f(&Row { k: &k.f32, row: s[start..].as_ptr() }),
        Logits::Bf16(s) => f(&Row { k: &k.bf16, row: s[start..].as_ptr() }),
        Logits::F16(s) => f(&Row { k: &k.f16, row: s[start..].as_ptr() }),
    }
}

/// What a drawn row leaves for the logprobs: its maximum (NaN ignored) and the filters' floor.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowInfo {
    pub top: f32,
    pub floor: f32,
}

impl Default for RowInfo {
    fn default() -> Self {
        RowInfo { top: f32::NEG_INFINITY, floor: f32::NEG_INFINITY }
    }
}

/// The race parameters of row `r` with its filters' floor, computed on this thread.
fn filtered_params(
    k: &Kernels,
    batch: &Batch,
    r: usize,
    bmax: &[f32],
    sc: &Scanned,
    plan: RowPlan,
) -> Option<(RaceParams, NoiseSrc)> {
    race_params(sc, plan).map(|(mut p, noise)| {
        p.floor = filter::batch_row_floor(k, batch, r, bmax, p.m, p.inv_t);
        (p, noise)
    })
}

/// What the first pass found in a row.
struct Scanned {
    top: f32,
    flags: u32,
}

fn summarize(bmax: &[f32], has_nan: bool, plan: RowPlan) -> Scanned {
    let top = bmax.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
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

/// The first index of `top`, found in the first block whose maximum is `top`.
fn first_of(row: &dyn RowKernels, bmax: &[f32], n: usize, top: f32) -> usize {
    let b = bmax.iter().position(|&v| v == top).unwrap_or(0);
    row.find_first(b * BLOCK, ((b + 1) * BLOCK).min(n), top).unwrap_or(0)
}

/// The race parameters of a row that needs a race, or `None` if its token is decided without
/// one (greedy, +inf present, or empty).
fn race_params(sc: &Scanned, plan: RowPlan) -> Option<(RaceParams, NoiseSrc)> {
    match plan {
        RowPlan::Sample { inv_t, noise } if sc.top.is_finite() => {
            Some((RaceParams { m: sc.top, inv_t, floor: f32::NEG_INFINITY }, noise))
        }
        _ => None,
    }
}

/// The token of a row once its race (if any) is done.
fn finish(row: &dyn RowKernels, bmax: &[f32], n: usize, sc: &Scanned, won: Option<Best>) -> i32 {
    if sc.flags & flags::EMPTY != 0 {
        return 0;
    }
    match won {
        Some(b) if b.token != usize::MAX => b.token as i32,
        _ => first_of(row, bmax, n, sc.top) as i32,
    }
}

/// Draws row `r` of `batch` on this thread: returns (token, flags, info).
pub(crate) fn draw_row(k: &Kernels, batch: &Batch, r: usize, plan: RowPlan) -> (i32, u32, RowInfo) {
    let n = batch.vocab;
    with_row(k, batch, r, |row| {
        BLOCK_MAX.with(|cell| {
            let mut bmax = cell.borrow_mut();
            bmax.resize(n.div_ceil(BLOCK), f32::NEG_INFINITY);
            let has_nan = row.scan(0, n, &mut bmax);
            let sc = summarize(&bmax, has_nan, plan);
            let params = filtered_params(k, batch, r, &bmax, &sc, plan);
            let won = params.map(|(p, noise)| row.race(0, n, &bmax, p, noise));
            let floor = params.map_or(f32::NEG_INFINITY, |(p, _)| p.floor);
            (finish(row, &bmax, n, &sc, won), sc.flags, RowInfo { top: sc.top, floor })
        })
    })
}

/// Draws every row of `batch` into `tokens` and `row_flags`, on `workers` when the call is
/// large enough. Rows are split across threads; when there are fewer rows than threads, each
/// row's vocabulary is split into tiles (whole blocks) and reduced in two stages. Every split
/// gives the same tokens as the single-threaded draw: each tile's best is exact, and merging
/// bests (highest key, then lowest token) does not depend on the order.
pub(crate) fn draw_batch(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    workers: Option<&WorkerPool>,
    tokens: &mut [i32],
    row_flags: &mut [u32],
    info: &mut [RowInfo],
) -> bool {
    let rows = batch.rows;
    let n = batch.vocab;
    let width = workers.map_or(1, |w| w.width());
    let pool = match workers {
        Some(w) if rows * n >= MIN_PARALLEL && width > 1 => w,
        _ => {
            for r in 0..rows {
                (tokens[r], row_flags[r], info[r]) = draw_row(k, batch, r, plans[r]);
            }
            return true;
        }
    };
    if rows >= width || n < 2 * MIN_TILE {
        let out: Vec<SyncCell<(i32, u32, RowInfo)>> = (0..rows).map(|_| SyncCell::default()).collect();
        let ok = pool.run(rows, &|r| out[r].set(draw_row(k, batch, r, plans[r])));
        for r in 0..rows {
            (tokens[r], row_flags[r], info[r]) = out[r].get();
        }
        return ok;
    }
    draw_tiled(k, batch, plans, pool, tokens, row_flags, info)
}

/// Fewer rows than threads: split each row into tiles of whole blocks.
fn draw_tiled(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    pool: &WorkerPool,
    tokens: &mut [i32],
    row_flags: &mut [u32],
    info: &mut [RowInfo],
) -> bool {
    let (rows, n) = (batch.rows, batch.vocab);
    let blocks = n.div_ceil(BLOCK);
    let per_row = (pool.width() / rows).max(1).min(n / MIN_TILE).max(1);
    let tile_blocks = blocks.div_ceil(per_row);
    let tiles = blocks.div_ceil(tile_blocks);
    let tile = |t: usize| {
        let start = t * tile_blocks * BLOCK;
        (start, ((t + 1) * tile_blocks * BLOCK).min(n) - start)
    };
    // Stage 1: block maxima of every tile.
    let mut bmax = vec![f32::NEG_INFINITY; rows * blocks];
    let bmax_out = SyncPtr(bmax.as_mut_ptr());
    let nan: Vec<SyncCell<bool>> = (0..rows * tiles).map(|_| SyncCell::default()).collect();
    let ok1 = pool.run(rows * tiles, &|task| {
        let (r, t) = (task / tiles, task % tiles);
        let (start, len) = tile(t);
        // SAFETY: the tiles of all rows cover disjoint ranges of `bmax`, which outlives the job.
        let out =
            unsafe { std::slice::from_raw_parts_mut(bmax_out.at(r * blocks + start / BLOCK), len.div_ceil(BLOCK)) };
        nan[task].set(with_row(k, batch, r, |row| row.scan(start, len, out)));
    });
    let scanned: Vec<Scanned> = (0..rows)
        .map(|r| {
            let has_nan = (0..tiles).any(|t| nan[r * tiles + t].get());
            summarize(&bmax[r * blocks..(r + 1) * blocks], has_nan, plans[r])
        })
        .collect();
    // The filters' floors, on this thread.
    let params: Vec<Option<(RaceParams, NoiseSrc)>> = (0..rows)
        .map(|r| filtered_params(k, batch, r, &bmax[r * blocks..(r + 1) * blocks], &scanned[r], plans[r]))
        .collect();
    // Stage 2: each tile's best, merged per row.
    let best: Vec<SyncCell<Best>> = (0..rows * tiles).map(|_| SyncCell::new(Best::NONE)).collect();
    let ok2 = pool.run(rows * tiles, &|task| {
        let (r, t) = (task / tiles, task % tiles);
        if let Some((p, noise)) = params[r] {
            let (start, len) = tile(t);
            let b0 = r * blocks + start / BLOCK;
            let bm = &bmax[b0..b0 + len.div_ceil(BLOCK)];
            best[task].set(with_row(k, batch, r, |row| row.race(start, len, bm, p, noise)));
        }
    });
    for r in 0..rows {
        let won = params[r].map(|_| (0..tiles).fold(Best::NONE, |acc, t| acc.merge(best[r * tiles + t].get())));
        let rb = &bmax[r * blocks..(r + 1) * blocks];
        tokens[r] = with_row(k, batch, r, |row| finish(row, rb, n, &scanned[r], won));
        row_flags[r] = scanned[r].flags;
        info[r] = RowInfo { top: scanned[r].top, floor: params[r].map_or(f32::NEG_INFINITY, |(p, _)| p.floor) };
    }
    ok1 && ok2
}

/// A pointer that tasks write disjoint ranges through.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);

// SAFETY: every task writes its own disjoint range, and the owner reads only after the job ends.
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    fn at(self, i: usize) -> *mut f32 {
        // SAFETY: callers stay inside the allocation.
        unsafe { self.0.add(i) }
    }
}

/// A value written by exactly one task and read after the job ends.
#[derive(Default)]
struct SyncCell<T>(std::cell::UnsafeCell<T>);

// SAFETY: each cell is written by one task at most, and read only after `WorkerPool::run`
// returned, which orders every write before the reads.
unsafe impl<T: Send> Sync for SyncCell<T> {}

impl<T: Copy> SyncCell<T> {
    fn new(v: T) -> Self {
        SyncCell(std::cell::UnsafeCell::new(v))
    }
    fn set(&self, v: T) {
        // SAFETY: see the Sync impl.
        unsafe { *self.0.get() = v }
    }
    fn get(&self) -> T {
        // SAFETY: see the Sync impl.
        unsafe { *self.0.get() }
    }
}
