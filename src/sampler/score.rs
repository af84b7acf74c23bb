//! Scoring: the logprobs, ranks and top-n of given target tokens, one per row, with the draw's
//! own code and nothing drawn (prompt logprobs over many positions in one call).

use super::Sampler;
use crate::alloc;
use crate::batch::{validate, validate_but_ids, with_held_params, Batch, Ids, Output};
use crate::error::{Error, Result};
use crate::plan::plan;

impl Sampler {
    /// Scores `targets` (one token id per row of `batch`) into `out`: each row's outputs are
    /// those [`Sampler::draw`] writes for a row that drew its target (its logprob, rank and top-n
    /// in `out.logprob_mode`, the logprobs of the batch's `logprob_token_ids`, the
    /// full-vocabulary output, the flags), bit for bit, and `out.tokens` receives the targets.
    /// Nothing is drawn: no key of the sampler's stream and no pool noise is taken, and the
    /// sampler's counters do not move.
    ///
    /// The batch is a draw's, without `forced_tokens` (the targets take their place), external
    /// `noise` (a score reads none) or `mirostat` (whose mu follows a drawn token). Its seeds are read only by XTC rows, whose coin
    /// comes from the row's key: a seeded row tosses its own coin, an unseeded one that of seed
    /// 0 at offset 0. On error nothing is written.
    pub fn score(&self, batch: &Batch, targets: &[i32], out: &mut Output) -> Result<()> {
        with_held_params(batch, |batch| self.score_held(batch, targets, out))
    }

    /// [`Sampler::score`] of a batch whose arrays hold its requests' parameters.
    fn score_held(&self, batch: &Batch, targets: &[i32], out: &mut Output) -> Result<()> {
        if batch.forced_tokens.is_some() {
            return Err(Error::invalid_argument(
                "batch.forced_tokens: must be absent in a score call (target_ids gives each row its token)",
            ));
        }
        if batch.noise.is_some() {
            return Err(Error::invalid_argument("batch.noise: must be absent in a score call (nothing is drawn)"));
        }
        if batch.mirostat.is_some() || out.mirostat_mu.is_some() {
            return Err(Error::invalid_argument(
                "batch.mirostat: must be absent in a score call (mirostat's mu follows a drawn token)",
            ));
        }
        let limits = (self.cfg.max_rows, self.cfg.vocab_size);
        validate_but_ids(self.kernels, batch, out, limits, Ids::InRows)?;
        check_targets(targets, batch.rows, batch.vocab)?;
        let with_targets = Batch { forced_tokens: Some(targets), ..*batch };
        // Every row keyed by its own seed (0 for an unseeded row): planning then takes nothing
        // from the stream or the pool.
        let keys: Vec<(u64, u64)> =
            alloc::collect((0..batch.rows).map(|r| batch.seed_of(r).unwrap_or((0, 0))), "the rows' seeds")?;
        let seeds = alloc::collect(keys.iter().map(|k| k.0), "the rows' seeds")?;
        let offsets = alloc::collect(keys.iter().map(|k| k.1), "the rows' offsets")?;
        let scored = Batch { seeds: Some(&seeds), offsets: Some(&offsets), seeded: None, ..with_targets };
        let stream = &self.keys;
        let planned = plan(&scored, (self.cfg.greedy_below, self.cfg.filter_order), stream, None)?;
        let plans = alloc::collect(planned.rows.iter().map(|p| p.scored()), "the row plans")?;
        let drawn = crate::draw::run(self.kernels, &scored, &plans, self.workers.as_ref(), out);
        planned.give_back(stream); // took nothing: every row is seeded or greedy
        drawn.map(|_| ()).map_err(|e| validate(self.kernels, &with_targets, out, limits.0, limits.1).err().unwrap_or(e))
    }
}

/// Refuses a target list that is not one token id in `[0, vocab)` per row.
fn check_targets(targets: &[i32], rows: usize, vocab: usize) -> Result<()> {
    if targets.len() != rows {
        return Err(Error::invalid_argument(format!(
            "target_ids: has {} entries, the batch has {rows} rows (one target per row)",
            targets.len()
        )));
    }
    match targets.iter().position(|&t| t < 0 || t as usize >= vocab) {
        Some(r) => Err(Error::invalid_argument(format!(
            "target_ids: row {r}: {} is not a token id in [0, {vocab}); nothing was written",
            targets[r]
        ))),
        None => Ok(()),
    }
}
