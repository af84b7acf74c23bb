//! Fewer rows than threads: each row's vocabulary is split into tiles of whole blocks, drawn in
//! two stages (block maxima of every tile; then, once each row's maximum and filters' floor are
//! known, each tile's best), and the tiles' bests are merged per row.

use super::cells::{SyncCell, SyncPtr};
use super::row::{finish, race_params, summarize, Scanned};
use super::split::{worker_panicked, FirstError, Split};
use super::workers::WorkerPool;
use super::{Drawn, RowPlan};
use crate::alloc;
use crate::batch::Batch;
use crate::error::Result;
use crate::kernels::{Best, Kernels, RaceParams, BLOCK};
use crate::logprob::RowInfo;
use crate::row::{with_row, RaceNoise, RowValues};

/// Draws every row of `batch` split into tiles on `pool` as `split` says; returns the rows and
/// the tiles' estimated single-thread time. Fails if a worker panicked or memory ran out.
pub(super) fn draw_tiled(
    k: &Kernels,
    batch: &Batch,
    plans: &[RowPlan],
    pool: &WorkerPool,
    split: Split,
) -> Result<(Vec<Drawn>, u64)> {
    let (rows, n) = (batch.rows, batch.vocab);
    let blocks = n.div_ceil(BLOCK);
    let tile_blocks = blocks.div_ceil(split.tiles_per_row);
    let tiles = blocks.div_ceil(tile_blocks);
    let tile = |t: usize| {
        let start = t * tile_blocks * BLOCK;
        (start, ((t + 1) * tile_blocks * BLOCK).min(n) - start)
    };
    // Stage 1: block maxima of every tile.
    let mut bmax = alloc::filled(rows * blocks, f32::NEG_INFINITY, "block maxima")?;
    let bmax_out = SyncPtr(bmax.as_mut_ptr());
    let nan: Vec<SyncCell<bool>> = (0..rows * tiles).map(|_| SyncCell::default()).collect();
    let scanned_tiles = pool.run(rows * tiles, split.participants, &|task| {
        let (r, t) = (task / tiles, task % tiles);
        let (start, len) = tile(t);
        // SAFETY: the tiles of all rows cover disjoint ranges of `bmax`, which outlives the job.
        let out =
            unsafe { std::slice::from_raw_parts_mut(bmax_out.at(r * blocks + start / BLOCK), len.div_ceil(BLOCK)) };
        let has_nan = with_row!(batch, r, |v| v.scan(k, start, len, out));
        // SAFETY: task `task` is the one writer of its cell; it is read after the job.
        unsafe { nan[task].set(has_nan) };
    });
    if !scanned_tiles.ok {
        return Err(worker_panicked());
    }
    let row_bmax = |r: usize| &bmax[r * blocks..(r + 1) * blocks];
    // SAFETY: the job that wrote the cells has ended.
    let row_has_nan = |r: usize| (0..tiles).any(|t| unsafe { nan[r * tiles + t].get() });
    let scanned: Vec<Scanned> =
        (0..rows).map(|r| summarize(row_bmax(r), f32::NEG_INFINITY, row_has_nan(r), plans[r])).collect();
    // The filters' floors, on this thread.
    let params: Vec<Option<(RaceParams, RaceNoise)>> = (0..rows)
        .map(|r| with_row!(batch, r, |v| race_params(k, batch, r, v, row_bmax(r), &scanned[r], plans[r])))
        .collect::<Result<_>>()?;
    // Stage 2: each tile's best, merged per row.
    let best: Vec<SyncCell<Best>> = (0..rows * tiles).map(|_| SyncCell::new(Best::NONE)).collect();
    let failed = FirstError::default();
    let raced_tiles = pool.run(rows * tiles, split.participants, &|task| {
        let (r, t) = (task / tiles, task % tiles);
        if let Some((p, noise)) = params[r] {
            let (start, len) = tile(t);
            let b0 = r * blocks + start / BLOCK;
            let bm = &bmax[b0..b0 + len.div_ceil(BLOCK)];
            match with_row!(batch, r, |v| v.race(k, start, len, bm, p, noise)) {
                // SAFETY: task `task` is the one writer of its cell; it is read after the job.
                Ok(b) => unsafe { best[task].set(b) },
                Err(e) => failed.record(task, e.in_row(r)),
            }
        }
    });
    if !raced_tiles.ok {
        return Err(worker_panicked());
    }
    failed.into_result()?;
    let drawn = (0..rows)
        .map(|r| {
            let won = params[r].map(|_| {
                (0..tiles).fold(Best::NONE, |acc, t| {
                    // SAFETY: the job that wrote the cells has ended.
                    acc.merge(unsafe { best[r * tiles + t].get() })
                })
            });
            let sc = &scanned[r];
            super::row::forced(
                batch,
                r,
                Drawn {
                    token: with_row!(batch, r, |v| finish(k, v, row_bmax(r), sc, won)),
                    flags: sc.flags,
                    info: RowInfo {
                        top: sc.top,
                        floor: params[r].map_or(f32::NEG_INFINITY, |(p, _)| p.floor),
                        processed: false,
                    },
                    logprobs_done: false,
                    mirostat_mu: None,
                },
            )
        })
        .collect();
    Ok((drawn, scanned_tiles.work_ns + raced_tiles.work_ns))
}
