//! The split of a call across threads: by rows, or, with fewer rows than threads, each row in
//! vocabulary tiles (`tiles.rs`); how many threads is the cost model's choice (`cost.rs`).

use super::cells::SyncCell;
use super::cost::{self, Mode, WorkCost};
use super::output::LogprobSlots;
use super::row::draw_row;
use super::tiles;
use super::workers::WorkerPool;
use super::{Drawn, RowPlan};
use crate::batch::Batch;
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::{Kernels, BLOCK};
use std::time::Instant;

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
    pub(super) pool: WorkerPool,
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
pub(super) struct Split {
    pub participants: usize,
    pub tiles_per_row: usize,
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

/// Draws every row of `batch`, on as many of `workers` as the call is worth: rows are split
/// across threads; with fewer rows than threads, each row's vocabulary is split into tiles.
/// Fails if a row's memory cannot be allocated (the first such row is named) or a worker
/// panicked.
pub(super) fn draw_rows(
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
    if split.tiles_per_row > 1 && (batch.has_step() || batch.keeps_ranges()) {
        // Rows with a step, or whose filters keep a range, are drawn whole (their processed
        // values live on one thread).
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
    if k.interleave_rows
        && logprobs.is_none()
        && !batch.has_step()
        && plans.iter().all(|p| matches!(p, RowPlan::Greedy))
    {
        // Greedy rows that need nothing else, two at a time, read in turn: two streams of reads
        // in flight. Only on a level with the registers for both rows (`Simd::INTERLEAVE_ROWS`).
        let mut drawn = crate::alloc::with_capacity(batch.rows, "the rows' draws")?;
        let mut r = 0;
        while r + 1 < batch.rows {
            drawn.extend(super::row::draw_greedy_pair(k, batch, r)?);
            r += 2;
        }
        if r < batch.rows {
            drawn.push(draw_row(k, batch, r, plans[r], logprobs)?);
        }
        return Ok(drawn);
    }
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

pub(super) fn worker_panicked() -> Error {
    Error::new(ErrorKind::Internal, "a worker thread panicked; nothing was written")
}

/// The error of the lowest row that failed, when rows run on several threads.
#[derive(Default)]
pub(super) struct FirstError(parking_lot::Mutex<Option<(usize, Error)>>);

impl FirstError {
    pub(super) fn record(&self, row: usize, e: Error) {
        let mut first = self.0.lock();
        if first.as_ref().is_none_or(|(r, _)| row < *r) {
            *first = Some((row, e));
        }
    }

    pub(super) fn into_result(self) -> Result<()> {
        self.0.into_inner().map_or(Ok(()), |(_, e)| Err(e))
    }

    /// The lowest failing index and its error.
    pub(super) fn into_first(self) -> Option<(usize, Error)> {
        self.0.into_inner()
    }
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
