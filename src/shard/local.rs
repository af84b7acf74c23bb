//! What a rank computes from its slice: round 1 (the slice's maximum, its first id, the row's
//! key) and round 2 (the race of the slice with the row's global maximum).

use super::{race_fingerprint, step, ShardPartial, ShardRow, ShardRows, ROUND_RACE, ROUND_TOP};
use crate::alloc;
use crate::batch::{flags, inv_temperature, validate, Batch, Logits, Output};
use crate::config::FilterOrder;
use crate::draw::RowPlan;
use crate::error::{Error, Result};
use crate::filter;
use crate::kernels::{Best, Kernels, RaceParams, BLOCK};
use crate::noise::splitmix64;
use crate::plan::plan;
use crate::row::{race_inline_at, RaceNoise, RowValues};
use crate::sampler::Sampler;

impl Sampler {
    /// Round 1 of a sharded call on this rank: one [`ShardPartial`] per row of `rows` into
    /// `out` (at least `rows.rows` long). Unseeded sampling rows take one key each from the
    /// sampler's stream, in row order, exactly as [`Sampler::draw`] of the same rows would: so
    /// ranks whose samplers share a seed and make the same calls agree on them. On error
    /// nothing is written and no key is taken.
    pub fn shard_top(&self, rows: &ShardRows, out: &mut [ShardPartial]) -> Result<()> {
        let (k, keys, has_pool) = self.shard_parts();
        let batch = self.shard_batch(k, rows)?;
        check_out_len("out", out.len(), rows.rows)?;
        if has_pool {
            return Err(Error::invalid_argument(
                "sampler: takes unseeded rows' noise from a pool; sharded rows use inline noise \
                 (make the sampler with noise = inline, or auto without a pool)",
            ));
        }
        // (Before the plan takes any key: a failure here takes none.)
        let mut buf = Vec::new();
        let processed = step::processed(k, rows, &mut buf)?;
        let cfg = self.config();
        let planned = plan(&batch, (cfg.greedy_below, cfg.filter_order), keys, None)?;
        let partials = alloc::collect(
            (0..rows.rows).map(|r| {
                let mut p = self.top_of_row(k, &processed, &batch, r, planned.rows[r]);
                if rows.step.is_on() {
                    // HAS_NAN reports the row as given, masked tokens too (the processed slice
                    // holds -inf where a mask banned a NaN).
                    let nan = if step::raw_has_nan(rows, r) { flags::HAS_NAN } else { 0 };
                    p.flags = p.flags & !flags::HAS_NAN | nan;
                }
                p
            }),
            "the shard partials",
        );
        match partials {
            Ok(p) => {
                out[..rows.rows].copy_from_slice(&p);
                Ok(())
            }
            Err(e) => {
                planned.give_back(keys);
                Err(e)
            }
        }
    }

    /// Round 2 of a sharded call on this rank: the race of its slice of each row with the row's
    /// combined first round (`combined`, from [`super::combine_top`]), one [`ShardPartial`] per
    /// row into `out`. `rows` must be the same rows (settings and slice) as in round 1. Rows
    /// that do not race ([`ShardRow::races`]) get a partial with no winner. Takes no key. On
    /// error nothing is written.
    pub fn shard_race(&self, rows: &ShardRows, combined: &[ShardRow], out: &mut [ShardPartial]) -> Result<()> {
        self.shard_race_top_k(rows, combined, &[], out)
    }

    /// [`Sampler::shard_race`] for rows with top-k: `candidates[rank]` is what
    /// [`top_k_candidates`] wrote on each rank (any order, the same width on every rank). The
    /// `top_k`-th largest finite value of the row is the `top_k`-th largest of the union of the
    /// ranks' candidates, since each rank sent its slice's largest ones; every rank computes it
    /// from the same gathered values, and it raises the row's floor as in the unsharded draw.
    pub fn shard_race_top_k(
        &self,
        rows: &ShardRows,
        combined: &[ShardRow],
        candidates: &[&[f32]],
        out: &mut [ShardPartial],
    ) -> Result<()> {
        if let Some(r) = (0..rows.rows)
            .find(|&r| rows.top_p.is_some_and(|p| p[r] < 1.0) && combined.get(r).is_some_and(ShardRow::races))
        {
            return Err(Error::invalid_argument(format!(
                "rows.top_p[{r}]: a row with top-p races with its cut (shard_cut_start, cut_advance, shard_race_cut)"
            )));
        }
        let kth = |r: usize| match effective_top_k(rows, r) {
            0 => Ok(None),
            top_k => kth_of_candidates(candidates, rows.rows, r, top_k),
        };
        self.shard_race_floors(rows, combined, &kth, out)
    }

    /// Round 2 with each racing row's floor raised to `extra_floor(r)` (top-k's k-th value, or
    /// the floor of a finished cut).
    pub(super) fn shard_race_floors(
        &self,
        rows: &ShardRows,
        combined: &[ShardRow],
        extra_floor: &dyn Fn(usize) -> Result<Option<f32>>,
        out: &mut [ShardPartial],
    ) -> Result<()> {
        let (k, _, _) = self.shard_parts();
        let batch = self.shard_batch(k, rows)?;
        check_out_len("combined", combined.len(), rows.rows)?;
        check_out_len("out", out.len(), rows.rows)?;
        let mut buf = Vec::new();
        let rows = &step::processed(k, rows, &mut buf)?;
        let mut partials = alloc::filled(rows.rows, ShardPartial::default(), "the shard partials")?;
        for (r, p) in partials.iter_mut().enumerate() {
            let row = combined[r];
            self.check_combined(rows, &batch, r, &row)?;
            let extra = if row.races() { extra_floor(r)? } else { None };
            let best = if row.races() { self.race_row(k, rows, &batch, r, &row, extra)? } else { Best::NONE };
            *p = ShardPartial {
                value: best.key,
                token: if best.token == usize::MAX { -1 } else { best.token as i32 },
                flags: 0,
                round: ROUND_RACE,
                fingerprint: race_fingerprint(&row),
                vocab_start: rows.vocab_start as u32,
                slice_len: rows.slice_len as u32,
                vocab_size: rows.vocab_size as u32,
                key: row.key,
            };
        }
        out[..rows.rows].copy_from_slice(&partials);
        Ok(())
    }

    /// Checks that `row` is the combination of this rank's row `r` (its round-1 fingerprint).
    pub(super) fn check_combined(&self, rows: &ShardRows, batch: &Batch, r: usize, row: &ShardRow) -> Result<()> {
        let fingerprint = self.row_fingerprint(rows, batch, r);
        if row.fingerprint != fingerprint {
            return Err(Error::invalid_argument(format!(
                "combined[{r}]: its fingerprint {:#010x} is not this rank's row {r}'s {fingerprint:#010x} \
                 (another call, row or settings)",
                row.fingerprint
            )));
        }
        Ok(())
    }

    /// `rows` checked and seen as a batch of the slice's rows (the draw's checks of its
    /// settings, by the draw's validation).
    pub(super) fn shard_batch<'a>(&self, k: &Kernels, rows: &ShardRows<'a>) -> Result<Batch<'a>> {
        let limit = i32::MAX as usize;
        if rows.vocab_size == 0 || rows.vocab_size > limit {
            return Err(Error::invalid_argument(format!(
                "rows.vocab_size: {} is not in [1, 2^31 - 1]",
                rows.vocab_size
            )));
        }
        let cfg = self.config();
        if cfg.vocab_size != 0 && cfg.vocab_size != rows.vocab_size {
            return Err(Error::invalid_argument(format!(
                "rows.vocab_size: {} differs from the sampler's vocab_size {}",
                rows.vocab_size, cfg.vocab_size
            )));
        }
        if rows.slice_len == 0 {
            return Err(Error::invalid_argument("rows.slice_len: is 0 (every rank holds at least one token)"));
        }
        if rows.vocab_start >= rows.vocab_size || rows.slice_len > rows.vocab_size - rows.vocab_start {
            return Err(Error::invalid_argument(format!(
                "rows.vocab_start: the slice [{}, {} + {}) is not inside the row [0, {})",
                rows.vocab_start, rows.vocab_start, rows.slice_len, rows.vocab_size
            )));
        }
        let mut batch = Batch::new(Logits::F32(rows.logits), rows.rows, rows.slice_len);
        batch.row_stride = rows.row_stride;
        batch.temperature = rows.temperature;
        batch.seeds = rows.seeds;
        batch.offsets = rows.offsets;
        batch.seeded = rows.seeded;
        batch.min_p = rows.min_p;
        batch.top_p = rows.top_p;
        let mut tokens = alloc::filled(rows.rows, 0i32, "the shard check")?;
        validate(k, &batch, &Output::new(&mut tokens), cfg.max_rows, 0).map_err(|e| {
            // The batch's names are the rows' names here.
            let message = e.message.replacen("batch.", "rows.", 1).replacen("batch.vocab", "rows.slice_len", 1);
            Error { message, ..e }
        })?;
        step::check_step(k, rows)?;
        // top-p was checked as the draw checks it; its threshold comes from the cut, never from
        // one slice.
        batch.top_p = None;
        Ok(batch)
    }

    /// Round 1 of row `r` of `rows` planned as `plan`.
    fn top_of_row(&self, k: &Kernels, rows: &ShardRows, batch: &Batch, r: usize, plan: RowPlan) -> ShardPartial {
        let v = &rows.logits[r * rows.row_stride..][..rows.slice_len];
        let (top, b, has_nan) = v.top_block(k);
        let token = if top == f32::NEG_INFINITY {
            -1
        } else {
            let first = v.find_first(k, b * BLOCK, ((b + 1) * BLOCK).min(v.len()), top).unwrap_or(0);
            (rows.vocab_start + first) as i32
        };
        let (greedy, key) = match plan {
            RowPlan::Greedy => (flags::GREEDY, 0),
            RowPlan::Sample { noise: RaceNoise::Inline(key), .. } => (0, key),
            RowPlan::Sample { .. } => unreachable!("sharded rows are planned without external noise"),
        };
        ShardPartial {
            value: top,
            token,
            flags: greedy | if has_nan { flags::HAS_NAN } else { 0 },
            round: ROUND_TOP,
            fingerprint: self.row_fingerprint(rows, batch, r),
            vocab_start: rows.vocab_start as u32,
            slice_len: rows.slice_len as u32,
            vocab_size: rows.vocab_size as u32,
            key,
        }
    }

    /// The round-1 fingerprint of row `r`: its index, the call's size and the row's settings
    /// (temperature, whether it is greedy, seed, offset, min-p).
    fn row_fingerprint(&self, rows: &ShardRows, batch: &Batch, r: usize) -> u32 {
        let t = batch.temperature(r);
        let greedy = t < self.config().greedy_below;
        let (seeded, seed, offset) = batch.seed_of(r).map_or((0, 0, 0), |(s, o)| (1, s, o));
        let min_p = rows.min_p.map_or(0, |p| p[r].to_bits());
        let top_k = effective_top_k(rows, r) as u64;
        // (Rows without top-p keep the fingerprints they had before top-p was sharded.)
        let top_p = rows.top_p.map_or(1.0, |p| p[r]);
        let top_p = if top_p < 1.0 { u64::from(top_p.to_bits()) } else { 0 };
        let parts = [
            rows.vocab_size as u64,
            rows.rows as u64,
            r as u64,
            u64::from(t.to_bits()) << 1 | u64::from(greedy),
            seeded,
            seed,
            offset,
            u64::from(min_p),
            top_k,
        ];
        let h = parts.iter().fold(0x0073_6861_7264_u64, |h, &x| splitmix64(h ^ x));
        let h = if top_p == 0 { h } else { splitmix64(h ^ top_p) };
        // (Rows of a call without a step keep the fingerprints they had before the step was
        // sharded.)
        let h = if rows.step.is_on() { splitmix64(h ^ rows.step.hash_of_row(r)) } else { h };
        (h >> 32) as u32
    }

    /// Round 2 of row `r` of `rows`, a sampling row whose combined first round is `row` (a finite
    /// maximum): the best key of the slice's race, with its global id.
    pub(super) fn race_row(
        &self,
        k: &Kernels,
        rows: &ShardRows,
        batch: &Batch,
        r: usize,
        row: &ShardRow,
        kth: Option<f32>,
    ) -> Result<Best> {
        let v = &rows.logits[r * rows.row_stride..][..rows.slice_len];
        let inv_t = inv_temperature(batch.temperature(r));
        let filter_inv_t = if self.config().filter_order == FilterOrder::FiltersFirst { 1.0 } else { inv_t };
        // The batch holds min-p alone: its floor is a function of the row's maximum. Top-k's
        // k-th value raises it, as `filter::floor_of` does.
        let floor = filter::row_floor(k, batch, r, v, &[], row.top, filter_inv_t).map_err(|e| e.in_row(r))?;
        let floor = kth.map_or(floor, |kth| floor.max(kth));
        let p = RaceParams { m: row.top, inv_t, floor };
        race_slice(k, v, (rows.vocab_start, rows.vocab_size), p, row.key).map_err(|e| e.in_row(r))
    }
}

/// The race of the slice `v` of tokens `[start, start + v.len())` of a row of `vocab` tokens,
/// with the keys the whole row's race computes. The kernels race whole blocks of BLOCK tokens
/// (a token's noise depends on its block's minimum), so a slice whose ends cut a block races
/// that block from a copy padded with -inf (which never races): the middle, whole blocks (and a
/// last block cut by the row's end), from the slice itself.
fn race_slice(k: &Kernels, v: &[f32], (start, vocab): (usize, usize), p: RaceParams, key: u64) -> Result<Best> {
    let end = start + v.len();
    let mut best = Best::NONE;
    // The whole blocks: from the first block boundary at or after `start` to the last at or
    // before `end` (or to `end` itself at the row's end).
    let middle_start = start.next_multiple_of(BLOCK);
    let middle_end = if end == vocab { end } else { end / BLOCK * BLOCK };
    if middle_start < middle_end {
        let part = &v[middle_start - start..middle_end - start];
        let mut bmax = alloc::filled(part.len().div_ceil(BLOCK), f32::NEG_INFINITY, "block maxima")?;
        part.scan(k, 0, part.len(), &mut bmax);
        best = best.merge(race_inline_at(k, part, &bmax, p, key, middle_start)?);
    }
    // The cut blocks: the one holding `start` if the slice starts inside it, the one holding
    // `end` if the slice ends inside it (the same block when the slice lies inside one).
    let mut cut = Vec::with_capacity(2);
    if !start.is_multiple_of(BLOCK) {
        cut.push(start / BLOCK);
    }
    if end != vocab && !end.is_multiple_of(BLOCK) && middle_start <= end && cut.last() != Some(&(end / BLOCK)) {
        cut.push(end / BLOCK);
    }
    for b in cut {
        let (block_start, block_end) = (b * BLOCK, ((b + 1) * BLOCK).min(vocab));
        let mut padded = [f32::NEG_INFINITY; BLOCK];
        let (from, to) = (start.max(block_start), end.min(block_end));
        padded[from - block_start..to - block_start].copy_from_slice(&v[from - start..to - start]);
        let padded = &padded[..block_end - block_start];
        let bmax = [padded.iter().fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a })];
        best = best.merge(race_inline_at(k, padded, &bmax, p, key, block_start)?);
    }
    Ok(best)
}

/// Row `r`'s top-k, 0 when off (as `filter::Filters::of` judges it against the whole row).
pub(super) fn effective_top_k(rows: &ShardRows, r: usize) -> usize {
    let k = rows.top_k.map_or(0, |k| k[r]);
    if k <= 0 || k as usize >= rows.vocab_size {
        0
    } else {
        k as usize
    }
}

/// The candidates of a rank for top-k: per row of `rows`, the `width` largest finite values of
/// its slice, in descending order, padded with -inf, into `out` (`rows.rows * width` values).
/// `width` must be at least every row's top-k. Round 1 of a call with top-k (sent with the
/// partials: `4 * width` bytes per row).
pub fn top_k_candidates(rows: &ShardRows, width: usize, out: &mut [f32]) -> Result<()> {
    if let Some(r) = (0..rows.rows).find(|&r| effective_top_k(rows, r) > width) {
        return Err(Error::invalid_argument(format!(
            "width: {width} is below rows.top_k[{r}] = {}",
            effective_top_k(rows, r)
        )));
    }
    let total = rows.rows.checked_mul(width).ok_or_else(|| Error::invalid_argument("width: rows x width overflows"))?;
    check_out_len("out", out.len(), total)?;
    if rows.rows > 0
        && (rows.row_stride < rows.slice_len || rows.logits.len() < (rows.rows - 1) * rows.row_stride + rows.slice_len)
    {
        return Err(Error::invalid_argument("rows.logits: shorter than rows x row_stride"));
    }
    // The candidates of rows with a step are their processed values' (the step's arithmetic is
    // the same at every level).
    let k = crate::kernels::kernels(crate::kernels::best_level());
    if rows.step.is_on() && (rows.vocab_start >= rows.vocab_size || rows.slice_len > rows.vocab_size - rows.vocab_start)
    {
        return Err(Error::invalid_argument("rows.vocab_start: the slice is not inside the row"));
    }
    step::check_step(k, rows)?;
    let mut buf = Vec::new();
    let rows = &step::processed(k, rows, &mut buf)?;
    let mut values = Vec::new();
    let mut all = alloc::filled(total, f32::NEG_INFINITY, "top-k candidates")?;
    for (r, dst) in all.chunks_mut(width.max(1)).take(rows.rows).enumerate() {
        if width == 0 {
            break;
        }
        let v = &rows.logits[r * rows.row_stride..][..rows.slice_len];
        values.clear();
        values.extend(v.iter().copied().filter(|x| x.is_finite()));
        let n = width.min(values.len());
        if n > 0 && n < values.len() {
            values.select_nth_unstable_by(n - 1, |a, b| b.total_cmp(a));
        }
        values[..n].sort_unstable_by(|a, b| b.total_cmp(a));
        dst[..n].copy_from_slice(&values[..n]);
    }
    out[..total].copy_from_slice(&all);
    Ok(())
}

/// The `top_k`-th largest finite value of row `r` from the ranks' candidates (`rows` rows of an
/// equal width each), or `None` when the row has fewer finite values (then top-k keeps them all).
pub(super) fn kth_of_candidates(candidates: &[&[f32]], rows: usize, r: usize, top_k: usize) -> Result<Option<f32>> {
    if candidates.is_empty() {
        return Err(Error::invalid_argument(format!(
            "candidates: none given, but row {r} has top-k {top_k} (gather the ranks' top_k_candidates)"
        )));
    }
    let width = candidates[0].len() / rows.max(1);
    if let Some(q) = candidates.iter().position(|c| c.len() != width * rows || width < top_k) {
        return Err(Error::invalid_argument(format!(
            "candidates[{q}]: {} values for {rows} rows of width {width} (at least top_k {top_k} per row)",
            candidates[q].len()
        )));
    }
    let mut union: Vec<f32> = candidates
        .iter()
        .flat_map(|c| c[r * width..(r + 1) * width].iter().copied().filter(|x| x.is_finite()))
        .collect();
    if union.len() < top_k {
        return Ok(None);
    }
    Ok(Some(*union.select_nth_unstable_by(top_k - 1, |a, b| b.total_cmp(a)).1))
}

/// A length argument: at least `rows`.
pub(super) fn check_out_len(name: &str, len: usize, rows: usize) -> Result<()> {
    if len < rows {
        return Err(Error::invalid_argument(format!("{name}: {len} elements for {rows} rows")));
    }
    Ok(())
}
