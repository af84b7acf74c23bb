//! The sampling step on a rank's slice (`docs/semantics.md`, "Sharded rows", the step): every
//! rank is given the row's step inputs with global token ids (the same arrays on every rank may
//! do), builds the row's step from the lists alone, and reads it for its slice's ids. A token's
//! processed value depends only on its global id, its logit and the row's lists, so a slice's
//! processed values are those the unsharded draw computes for its ids, bit for bit: every round
//! then reads them in place of the logits, as the unsharded draw reads its processed row.

use super::ShardRows;
use crate::alloc;
use crate::batch::{validate_step_inputs, BadWords, Batch, LogitBias, Logits, TokenBitmask, TokenLists};
use crate::error::{Error, Result};
use crate::kernels::Kernels;
use crate::noise::splitmix64;

/// The sampling step's inputs of a sharded call: [`Batch`]'s fields of the same names and rules,
/// for the whole rows (global token ids; the bitmask in the whole row's layout, `ceil(vocab_size /
/// 32)` words per row). Each rank applies what falls inside its slice. All `None`: no step.
#[derive(Clone, Copy, Debug, Default)]
pub struct ShardStep<'a> {
    /// As `Batch::prompt_tokens`.
    pub prompt_tokens: Option<TokenLists<'a>>,
    /// As `Batch::output_tokens`.
    pub output_tokens: Option<TokenLists<'a>>,
    /// As `Batch::repetition_penalty`.
    pub repetition_penalty: Option<&'a [f32]>,
    /// As `Batch::frequency_penalty`.
    pub frequency_penalty: Option<&'a [f32]>,
    /// As `Batch::presence_penalty`.
    pub presence_penalty: Option<&'a [f32]>,
    /// As `Batch::penalty_last_n`.
    pub penalty_last_n: Option<&'a [i32]>,
    /// As `Batch::logit_bias`.
    pub logit_bias: Option<LogitBias<'a>>,
    /// As `Batch::allowed_tokens`.
    pub allowed_tokens: Option<TokenLists<'a>>,
    /// As `Batch::allowed_rows`.
    pub allowed_rows: Option<&'a [u8]>,
    /// As `Batch::banned_tokens`.
    pub banned_tokens: Option<TokenLists<'a>>,
    /// As `Batch::token_bitmask` (the whole row's words).
    pub token_bitmask: Option<TokenBitmask<'a>>,
    /// As `Batch::min_tokens`.
    pub min_tokens: Option<&'a [i32]>,
    /// As `Batch::stop_tokens`.
    pub stop_tokens: Option<TokenLists<'a>>,
    /// As `Batch::bad_words`.
    pub bad_words: Option<BadWords<'a>>,
    /// As `Batch::dry_multiplier`.
    pub dry_multiplier: Option<&'a [f32]>,
    /// As `Batch::dry_base`.
    pub dry_base: Option<&'a [f32]>,
    /// As `Batch::dry_allowed_length`.
    pub dry_allowed_length: Option<&'a [i32]>,
    /// As `Batch::dry_penalty_last_n`.
    pub dry_penalty_last_n: Option<&'a [i32]>,
    /// As `Batch::dry_breakers`.
    pub dry_breakers: Option<BadWords<'a>>,
}

impl<'a> ShardStep<'a> {
    /// Whether any input of the step is given.
    pub fn is_on(&self) -> bool {
        let ShardStep {
            prompt_tokens,
            output_tokens,
            repetition_penalty,
            frequency_penalty,
            presence_penalty,
            penalty_last_n,
            logit_bias,
            allowed_tokens,
            allowed_rows,
            banned_tokens,
            token_bitmask,
            min_tokens,
            stop_tokens,
            bad_words,
            dry_multiplier,
            dry_base,
            dry_allowed_length,
            dry_penalty_last_n,
            dry_breakers,
        } = self;
        prompt_tokens.is_some()
            || output_tokens.is_some()
            || repetition_penalty.is_some()
            || frequency_penalty.is_some()
            || presence_penalty.is_some()
            || penalty_last_n.is_some()
            || logit_bias.is_some()
            || allowed_tokens.is_some()
            || allowed_rows.is_some()
            || banned_tokens.is_some()
            || token_bitmask.is_some()
            || min_tokens.is_some()
            || stop_tokens.is_some()
            || bad_words.is_some()
            || dry_multiplier.is_some()
            || dry_base.is_some()
            || dry_allowed_length.is_some()
            || dry_penalty_last_n.is_some()
            || dry_breakers.is_some()
    }

    /// The whole rows (`rows` of `vocab` tokens, no logits: the step is built from the lists
    /// alone) as a batch carrying the step.
    fn whole_rows(&self, rows: usize, vocab: usize) -> Batch<'a> {
        let mut b = Batch::new(Logits::F32(&[]), rows, vocab);
        b.prompt_tokens = self.prompt_tokens;
        b.output_tokens = self.output_tokens;
        b.repetition_penalty = self.repetition_penalty;
        b.frequency_penalty = self.frequency_penalty;
        b.presence_penalty = self.presence_penalty;
        b.penalty_last_n = self.penalty_last_n;
        b.logit_bias = self.logit_bias;
        b.allowed_tokens = self.allowed_tokens;
        b.allowed_rows = self.allowed_rows;
        b.banned_tokens = self.banned_tokens;
        b.token_bitmask = self.token_bitmask;
        b.min_tokens = self.min_tokens;
        b.stop_tokens = self.stop_tokens;
        b.bad_words = self.bad_words;
        b.dry_multiplier = self.dry_multiplier;
        b.dry_base = self.dry_base;
        b.dry_allowed_length = self.dry_allowed_length;
        b.dry_penalty_last_n = self.dry_penalty_last_n;
        b.dry_breakers = self.dry_breakers;
        b
    }

    /// A hash of row `r`'s step, in `O(1)`: its penalties and the lengths of its lists, so that
    /// partials of ranks given different steps for a row do not combine (a fingerprint's part).
    pub(super) fn hash_of_row(&self, r: usize) -> u64 {
        let f = |s: Option<&[f32]>| s.map_or(u64::MAX, |s| u64::from(s[r].to_bits()));
        let i = |s: Option<&[i32]>| s.map_or(u64::MAX, |s| s[r] as u32 as u64);
        let len = |l: Option<TokenLists>| l.map_or(u64::MAX, |l| l.row(r).len() as u64);
        let parts = [
            len(self.prompt_tokens),
            len(self.output_tokens),
            f(self.repetition_penalty),
            f(self.frequency_penalty),
            f(self.presence_penalty),
            i(self.penalty_last_n),
            self.logit_bias.map_or(u64::MAX, |b| b.row(r).0.len() as u64),
            len(self.allowed_tokens),
            self.allowed_rows.map_or(u64::MAX, |a| u64::from(a[r])),
            len(self.banned_tokens),
            u64::from(self.token_bitmask.is_some()),
            i(self.min_tokens),
            len(self.stop_tokens),
            self.bad_words.map_or(u64::MAX, |w| w.row(r).count() as u64),
            f(self.dry_multiplier),
            f(self.dry_base),
            i(self.dry_allowed_length),
            i(self.dry_penalty_last_n),
            self.dry_breakers.map_or(u64::MAX, |w| w.row(r).count() as u64),
        ];
        parts.iter().fold(0x7374_6570, |h, &x| splitmix64(h ^ x))
    }
}

/// Checks `rows.step` as the draw checks a batch's step (the offsets, every id in `[0,
/// vocab_size)`, the penalties, the bias values, the bitmask's length, min_tokens, bad words,
/// DRY), errors naming the field as `rows.FIELD[ROW]`.
pub(super) fn check_step(k: &Kernels, rows: &ShardRows) -> Result<()> {
    if !rows.step.is_on() {
        return Ok(());
    }
    let batch = rows.step.whole_rows(rows.rows, rows.vocab_size);
    validate_step_inputs(k, &batch).map_err(|e| {
        let message = e.message.replacen("batch.", "rows.", 1);
        Error { message, ..e }
    })
}

/// The rows a rank's rounds read: `rows` itself when no step is given; else the processed values
/// of its slices written into `buf` (row after row, `slice_len` apart; a row without a step
/// copied as given) and `rows` reading them (the step kept, for the fingerprints). `rows` must
/// have passed [`check_step`] (through `shard_batch`). Nothing but `buf` is written.
pub(super) fn processed<'b>(k: &Kernels, rows: &ShardRows<'b>, buf: &'b mut Vec<f32>) -> Result<ShardRows<'b>> {
    if !rows.step.is_on() {
        return Ok(*rows);
    }
    let n = rows.slice_len;
    let total =
        rows.rows.checked_mul(n).ok_or_else(|| Error::invalid_argument("rows.rows: rows x slice_len overflows"))?;
    buf.clear();
    alloc::resize(buf, total, f32::NEG_INFINITY, "the slices' processed values")?;
    let batch = rows.step.whole_rows(rows.rows, rows.vocab_size);
    for (r, out) in buf.chunks_mut(n.max(1)).take(rows.rows).enumerate() {
        let x = &rows.logits[r * rows.row_stride..][..n];
        let step = if crate::step::row_has_step(&batch, r) {
            crate::step::build(k, &batch, r, false).map_err(|e| e.in_row(r))?
        } else {
            None
        };
        match step {
            Some(step) => step.write_slice(x, rows.vocab_start, out),
            None => out.copy_from_slice(x),
        }
    }
    let buf: &'b Vec<f32> = buf;
    Ok(ShardRows { logits: buf, row_stride: n, ..*rows })
}

/// Whether row `r`'s slice of the caller's logits holds a NaN (masked or not: the flag reports
/// the row as given, as the unsharded draw's).
pub(super) fn raw_has_nan(rows: &ShardRows, r: usize) -> bool {
    // (In blocks, each folded without an early exit, so that the test vectorises.)
    let nan_in = |c: &[f32]| c.iter().fold(false, |a, &x| a | x.is_nan());
    rows.logits[r * rows.row_stride..][..rows.slice_len].chunks(256).any(nan_in)
}
