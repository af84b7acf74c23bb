//! What a call takes and gives back: a draw's [`Batch`] and [`Output`] here, a verify call's
//! [`VerifyBatch`] and [`VerifyOutput`] in `verify.rs`, and the checks that run before anything
//! is written in `validate.rs`.
//!
//! [`validate`] is the one place a draw's arguments are checked; the C layer only turns raw
//! pointers into slices (with [`span`], the one overflow check of a strided layout) and leaves
//! every other rule to it. Errors carry their location (`batch.top_p[3]`) as data.

mod held;
mod validate;
mod verify;

pub(crate) use held::{check_request_params, with_held_params};

pub(crate) use validate::{
    logits_rows, row_ids_in_range, span_of, validate, validate_but_ids, validate_params, validate_step_inputs, Ids,
};
pub use validate::{noise_span, span};
pub use verify::{DraftProbs, VerifyBatch, VerifyOutput, VerifyStep};

use crate::config::NoiseKind;
use crate::kernels::{Bf16, F16};

/// Which logprobs a draw reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogprobMode {
    /// log_softmax of the logits as given (vLLM's default).
    #[default]
    Raw,
    /// log_softmax of `(x - m) / T` over the tokens the filters keep (-inf elsewhere), `x` the
    /// row after the sampling step's inputs (penalties, bias, masks); greedy rows: log_softmax
    /// of that row at temperature 1 without the filters (RAW when it has no such inputs).
    Processed,
}

/// 1/T of a sampling row as the race and the filters use it, capped at the largest f32 so that
/// a tiny T never turns `0 * inv_t` into NaN.
pub(crate) fn inv_temperature(t: f32) -> f32 {
    let inv = 1.0 / t;
    if inv.is_finite() {
        inv
    } else {
        f32::MAX
    }
}

/// The logits of a batch: `rows` rows of `vocab` values, `row_stride` elements apart.
#[derive(Clone, Copy, Debug)]
pub enum Logits<'a> {
    /// IEEE single precision.
    F32(&'a [f32]),
    /// bfloat16 (the upper half of an f32), read as its exact f32 value.
    Bf16(&'a [Bf16]),
    /// IEEE half precision, read as its exact f32 value.
    F16(&'a [F16]),
}

impl Logits<'_> {
    /// Bytes per element.
    pub fn elem_size(&self) -> usize {
        match self {
            Logits::F32(_) => 4,
            Logits::Bf16(_) | Logits::F16(_) => 2,
        }
    }
    /// Elements in the slice (at least `(rows - 1) * row_stride + vocab` in a valid batch).
    pub fn len(&self) -> usize {
        match self {
            Logits::F32(s) => s.len(),
            Logits::Bf16(s) => s.len(),
            Logits::F16(s) => s.len(),
        }
    }
    /// Whether the slice holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The value at `index`, as f32.
    pub fn get(&self, index: usize) -> f32 {
        match self {
            Logits::F32(s) => s[index],
            Logits::Bf16(s) => s[index].to_f32(),
            Logits::F16(s) => s[index].to_f32(),
        }
    }
}

/// Noise supplied by the caller: one value per token, E or ln E.
#[derive(Clone, Copy, Debug)]
pub struct ExternalNoise<'a> {
    /// One value per token of each row, `row_stride` elements between rows.
    pub values: &'a [f32],
    /// Whether the values are E (exponential draws, raced as `x / T - ln E`) or ln E.
    pub kind: NoiseKind,
    /// Elements between rows; 0 broadcasts one row to every row.
    pub row_stride: usize,
}

/// One draw call's inputs. Every per-row slice is optional and, when given, has at least `rows`
/// elements.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// The logits, in their dtype; read, never written.
    pub logits: Logits<'a>,
    /// Rows drawn by the call (one token each).
    pub rows: usize,
    /// Tokens per row; every id the call reads or writes is below it.
    pub vocab: usize,
    /// Elements between the starts of consecutive rows (>= vocab).
    pub row_stride: usize,
    /// Per-row temperature; `None` means 1.0 for every row.
    pub temperature: Option<&'a [f32]>,
    /// Per-row seeds; a seeded row's noise is a pure function of (seed, offset, token).
    pub seeds: Option<&'a [u64]>,
    /// Per-row offsets (e.g. the position of the token in its sequence); `None` means 0.
    pub offsets: Option<&'a [u64]>,
    /// Which rows use their seed (nonzero = seeded); `None` with `seeds` means every row.
    pub seeded: Option<&'a [u8]>,
    /// Noise for the unseeded sampling rows.
    pub noise: Option<ExternalNoise<'a>>,
    /// Per-row top-k; k <= 0 or k >= vocab is off. Sampling rows only.
    pub top_k: Option<&'a [i32]>,
    /// Per-row top-p in (0, 1]; 1 is off. Sampling rows only.
    pub top_p: Option<&'a [f32]>,
    /// Per-row min-p in [0, 1]; 0 is off. Sampling rows only.
    pub min_p: Option<&'a [f32]>,
    /// Per-row top-nσ n, finite; n <= 0 is off. Sampling rows only.
    pub top_n_sigma: Option<&'a [f32]>,
    /// The prompt's tokens of each row (repetition penalty).
    pub prompt_tokens: Option<TokenLists<'a>>,
    /// The tokens generated so far of each row (all three penalties).
    pub output_tokens: Option<TokenLists<'a>>,
    /// Per-row repetition penalty r > 0; 1 is off.
    pub repetition_penalty: Option<&'a [f32]>,
    /// Per-row frequency penalty, any finite value; 0 is off.
    pub frequency_penalty: Option<&'a [f32]>,
    /// Per-row presence penalty, any finite value; 0 is off.
    pub presence_penalty: Option<&'a [f32]>,
    /// Per-row penalty window n >= 0: only the last n tokens of (prompt ++ output) count for
    /// the penalties; 0 (and `None`) counts every token.
    pub penalty_last_n: Option<&'a [i32]>,
    /// Sparse (id, bias) pairs of each row.
    pub logit_bias: Option<LogitBias<'a>>,
    /// The only tokens each row may draw (rows that `allowed_rows` leaves out are unrestricted).
    pub allowed_tokens: Option<TokenLists<'a>>,
    /// Which rows carry an allowed list (nonzero); `None` with `allowed_tokens`: every row.
    pub allowed_rows: Option<&'a [u8]>,
    /// Tokens each row may not draw.
    pub banned_tokens: Option<TokenLists<'a>>,
    /// A grammar bitmask (xgrammar's packed layout).
    pub token_bitmask: Option<TokenBitmask<'a>>,
    /// Per-row minimum output length n >= 0: while the row's output list holds fewer than n
    /// tokens, its stop tokens are banned; `None` is 0 for every row.
    pub min_tokens: Option<&'a [i32]>,
    /// The stop tokens of each row, banned while its output is shorter than `min_tokens`.
    pub stop_tokens: Option<TokenLists<'a>>,
    /// The rows named by request id: their histories come from a [`Requests`](crate::Requests)
    /// state instead of `prompt_tokens` and `output_tokens` (which must then be `None`).
    pub requests: Option<crate::requests::RequestRows<'a>>,
    /// Per-row min_keep n >= 0 (llama.cpp's): top-p, min-p, locally typical sampling and XTC
    /// each keep at least n tokens of what they are given; 0 and 1 change nothing. Sampling
    /// rows only.
    pub min_keep: Option<&'a [i32]>,
    /// Per-row locally typical sampling p in (0, 1]; 1 is off. Sampling rows only.
    pub typical_p: Option<&'a [f32]>,
    /// Per-row XTC probability in [0, 1]; <= 0 is off. Sampling rows only.
    pub xtc_probability: Option<&'a [f32]>,
    /// Per-row XTC threshold in [0, 1]; > 0.5 is off. Sampling rows only.
    pub xtc_threshold: Option<&'a [f32]>,
    /// Per-row dynamic temperature range >= 0 (llama.cpp's `dynatemp_range`); 0 is off. Sampling
    /// rows only.
    pub dynatemp_range: Option<&'a [f32]>,
    /// Per-row dynamic temperature exponent >= 0; `None` is 1 for every row.
    pub dynatemp_exponent: Option<&'a [f32]>,
    /// The order of the filter stages for every row (each stage at most once; the temperature
    /// last when left out; `None`: the sampler's `filter_order`). A row applies the listed
    /// stages whose filter is on, in this order (docs/semantics.md, Filter order); a filter on
    /// for a row must have its stage listed.
    pub order: Option<&'a [crate::filter::chain::Stage]>,
    /// The bad words of each row, each a token sequence: a word bans its last token where the
    /// row's output list ends with the rest of it (a word of one token: always).
    pub bad_words: Option<BadWords<'a>>,
    /// Per-row forced token: a row whose entry is in `[0, vocab)` returns that token (its
    /// logprobs as if drawn, its noise consumed as if drawn); -1 draws the row.
    pub forced_tokens: Option<&'a [i32]>,
    /// Per-row token ids whose logprobs (and ranks) the call reports in
    /// `Output::token_logprobs` / `Output::token_ranks`, one entry per id.
    pub logprob_token_ids: Option<TokenLists<'a>>,
    /// Per-row DRY multiplier >= 0 (llama.cpp's `dry_multiplier`); 0 is off.
    pub dry_multiplier: Option<&'a [f32]>,
    /// Per-row DRY base, finite; below 1 turns DRY off for the row. `None` is 1.75.
    pub dry_base: Option<&'a [f32]>,
    /// Per-row DRY allowed length >= 0: repeats this long go unpenalised. `None` is 2.
    pub dry_allowed_length: Option<&'a [i32]>,
    /// Per-row DRY window: the last n tokens of (prompt ++ output); 0 is off, -1 (and `None`)
    /// every token.
    pub dry_penalty_last_n: Option<&'a [i32]>,
    /// The DRY sequence breakers of each row, each a token sequence (the head, then its tail):
    /// no repeat that DRY counts spans one.
    pub dry_breakers: Option<BadWords<'a>>,
    /// The logits row each row reads (several outputs from one logits row: vLLM's `n > 1`,
    /// FlashInfer's `indices`): row `r` reads logits row `row_index[r]`, never copied; `None`:
    /// row `r` reads row `r`. The logits then hold `max(row_index) + 1` rows, `row_stride`
    /// apart; every other per-row input (seeds, offsets, parameters, histories) and every
    /// output stays per row.
    pub row_index: Option<&'a [i32]>,
    /// Per-row mirostat (llama.cpp's final sampler in place of the plain draw): 0 off, 1 v1,
    /// 2 v2; `None`: off for every row. It narrows what the row's chain keeps, last (after the
    /// temperature), and the row is drawn from that set renormalised (docs/semantics.md).
    pub mirostat: Option<&'a [i32]>,
    /// Per-row target surprise tau in bits (finite); `None`: llama.cpp's default 5.
    pub mirostat_tau: Option<&'a [f32]>,
    /// Per-row learning rate eta (finite); `None`: llama.cpp's default 0.1.
    pub mirostat_eta: Option<&'a [f32]>,
    /// Per-row count m >= 1 of the most probable tokens v1 estimates s_hat from; `None`: 100.
    pub mirostat_m: Option<&'a [i32]>,
    /// Per-row mu going in (finite); `None`: 2 tau (a sequence's first draw).
    pub mirostat_mu: Option<&'a [f32]>,
}

/// Per-row lists of words, each a sequence of token ids (two-level CSR): word `k` is
/// `ids[word_offsets[k]..word_offsets[k + 1]]`, and row `r`'s words are those from
/// `row_offsets[r]` to `row_offsets[r + 1]`.
#[derive(Clone, Copy, Debug)]
pub struct BadWords<'a> {
    /// The tokens of every word, one word after the other; each in `[0, vocab)`.
    pub ids: &'a [i32],
    /// One more entry than there are words: non-decreasing positions into `ids`, each word at
    /// least one token long.
    pub word_offsets: &'a [u64],
    /// `rows + 1` non-decreasing positions into the words.
    pub row_offsets: &'a [u64],
}

impl<'a> BadWords<'a> {
    /// The words of row `r` (of a validated batch), in order.
    pub fn row(&self, r: usize) -> impl Iterator<Item = &'a [i32]> + 'a {
        let (ids, words) = (self.ids, self.word_offsets);
        (self.row_offsets[r] as usize..self.row_offsets[r + 1] as usize)
            .map(move |k| &ids[words[k] as usize..words[k + 1] as usize])
    }

    /// The tokens that row `r`'s words ban after `output` (the row's output list), in word
    /// order (a token may repeat): each word whose all-but-last tokens end `output` bans its
    /// last token (a word of one token always does; a word longer than `output` + 1 never).
    pub fn banned_after<'o>(&self, r: usize, output: &'o [i32]) -> impl Iterator<Item = i32> + 'o
    where
        'a: 'o,
    {
        self.row(r).filter_map(move |w| {
            let (prefix, last) = w.split_at(w.len() - 1);
            output.ends_with(prefix).then_some(last[0])
        })
    }
}

/// Per-row lists of token ids in CSR form: row `r`'s ids are `ids[offsets[r]..offsets[r + 1]]`
/// (`offsets` has `rows + 1` non-decreasing entries, the last at most `ids.len()`).
#[derive(Clone, Copy, Debug)]
pub struct TokenLists<'a> {
    /// The ids of every row, one after the other; each in `[0, vocab)`.
    pub ids: &'a [i32],
    /// `rows + 1` non-decreasing positions into `ids`.
    pub offsets: &'a [u64],
}

impl<'a> TokenLists<'a> {
    /// The ids of row `r` (of a validated batch).
    pub fn row(&self, r: usize) -> &'a [i32] {
        &self.ids[self.offsets[r] as usize..self.offsets[r + 1] as usize]
    }
}

/// Sparse per-row logit bias in CSR form: row `r`'s pairs are `(ids[j], values[j])` for `j` in
/// `offsets[r]..offsets[r + 1]`. A finite bias is added, -inf bans the token; pairs of one id
/// add up.
#[derive(Clone, Copy, Debug)]
pub struct LogitBias<'a> {
    /// The biased ids of every row, one after the other; each in `[0, vocab)`.
    pub ids: &'a [i32],
    /// One bias per id: finite (added to the logit, before the temperature) or -inf (a ban).
    pub values: &'a [f32],
    /// `rows + 1` non-decreasing positions into `ids` and `values`.
    pub offsets: &'a [u64],
}

impl<'a> LogitBias<'a> {
    /// The (ids, values) of row `r` (of a validated batch).
    pub fn row(&self, r: usize) -> (&'a [i32], &'a [f32]) {
        let (a, b) = (self.offsets[r] as usize, self.offsets[r + 1] as usize);
        (&self.ids[a..b], &self.values[a..b])
    }
}

/// A grammar bitmask in xgrammar's layout: row `r` is `words[r * row_stride..]`, at least
/// `ceil(vocab / 32)` words; bit `j` of word `w` set means token `32 w + j` is allowed. Bits past
/// `vocab` in the last word are ignored.
#[derive(Clone, Copy, Debug)]
pub struct TokenBitmask<'a> {
    /// The packed bits of every row (32 tokens a word, little end first).
    pub words: &'a [i32],
    /// Words between the starts of consecutive rows (>= ceil(vocab / 32)).
    pub row_stride: usize,
}

impl<'a> Batch<'a> {
    /// A batch of contiguous rows with no per-row options.
    pub fn new(logits: Logits<'a>, rows: usize, vocab: usize) -> Self {
        Batch {
            logits,
            rows,
            vocab,
            row_stride: vocab,
            temperature: None,
            seeds: None,
            offsets: None,
            seeded: None,
            noise: None,
            top_k: None,
            top_p: None,
            min_p: None,
            top_n_sigma: None,
            prompt_tokens: None,
            output_tokens: None,
            repetition_penalty: None,
            frequency_penalty: None,
            presence_penalty: None,
            penalty_last_n: None,
            logit_bias: None,
            allowed_tokens: None,
            allowed_rows: None,
            banned_tokens: None,
            token_bitmask: None,
            min_tokens: None,
            stop_tokens: None,
            requests: None,
            min_keep: None,
            typical_p: None,
            xtc_probability: None,
            xtc_threshold: None,
            dynatemp_range: None,
            dynatemp_exponent: None,
            order: None,
            bad_words: None,
            forced_tokens: None,
            logprob_token_ids: None,
            dry_multiplier: None,
            dry_base: None,
            dry_allowed_length: None,
            dry_penalty_last_n: None,
            dry_breakers: None,
            row_index: None,
            mirostat: None,
            mirostat_tau: None,
            mirostat_eta: None,
            mirostat_m: None,
            mirostat_mu: None,
        }
    }

    /// The logits row that row `r` (of a validated batch) reads.
    #[inline]
    pub(crate) fn logits_row(&self, r: usize) -> usize {
        self.row_index.map_or(r, |ix| ix[r] as usize)
    }

    /// Whether the batch carries anything of the sampling step before the filters (histories,
    /// penalties, bias, allowed or banned lists, a bitmask).
    pub(crate) fn has_step(&self) -> bool {
        self.prompt_tokens.is_some()
            || self.output_tokens.is_some()
            || self.requests.is_some()
            || self.logit_bias.is_some()
            || self.allowed_tokens.is_some()
            || self.banned_tokens.is_some()
            || self.token_bitmask.is_some()
            || (self.min_tokens.is_some() && self.stop_tokens.is_some())
            || self.bad_words.is_some()
            || self.dry_multiplier.is_some()
    }

    /// The token row `r` (of a validated batch) is forced to return, if any.
    pub(crate) fn forced(&self, r: usize) -> Option<i32> {
        self.forced_tokens.map(|f| f[r]).filter(|&t| t >= 0)
    }

    /// Whether the sampling step of row `r` (of a validated batch) bans token `t` outright: a
    /// mask (allowed list, bitmask, banned list, stop tokens before `min_tokens`, bad words) or
    /// a -inf bias. (The penalties and finite biases only move a value.)
    pub(crate) fn step_bans(&self, r: usize, t: i32) -> bool {
        let i = t as usize;
        let in_list = |l: Option<TokenLists>| l.is_some_and(|l| l.row(r).contains(&t));
        let restricted = self.allowed_tokens.is_some() && self.allowed_rows.is_none_or(|a| a[r] != 0);
        let bitmask_bans = self.token_bitmask.is_some_and(|m| m.words[r * m.row_stride + i / 32] >> (i % 32) & 1 == 0);
        let bias_bans = self.logit_bias.is_some_and(|b| {
            let (ids, values) = b.row(r);
            ids.iter().zip(values).any(|(&id, &v)| id == t && v == f32::NEG_INFINITY)
        });
        (restricted && !in_list(self.allowed_tokens))
            || bitmask_bans
            || in_list(self.banned_tokens)
            || self.banned_stops(r).contains(&t)
            || self.banned_by_words(r).any(|b| b == t)
            || bias_bans
    }

    /// The tokens that row `r`'s bad words ban ([`BadWords::banned_after`] of its output: its
    /// list's, or its request's).
    pub(crate) fn banned_by_words(&self, r: usize) -> impl Iterator<Item = i32> + 'a {
        let output = self.output_row(r);
        self.bad_words.into_iter().flat_map(move |b| b.banned_after(r, output))
    }

    /// Whether some row may keep a range of values or set its temperature from what it keeps
    /// (typical sampling, XTC or a dynamic temperature given): such rows are drawn whole, from
    /// their values written out.
    pub(crate) fn keeps_ranges(&self) -> bool {
        self.typical_p.is_some()
            || self.xtc_probability.is_some()
            || self.dynatemp_range.is_some()
            || self.order.is_some()
            || self.mirostat.is_some()
    }

    /// The stop tokens that row `r` (of a validated batch) may not draw yet: its whole stop list
    /// while its output list holds fewer than `min_tokens[r]` tokens, else none.
    pub(crate) fn banned_stops(&self, r: usize) -> &'a [i32] {
        let (Some(min), Some(stops)) = (self.min_tokens, self.stop_tokens) else { return &[] };
        let produced = self.output_row(r).len();
        if (produced as u64) < min[r].max(0) as u64 {
            stops.row(r)
        } else {
            &[]
        }
    }

    /// The prompt of row `r` (of a validated batch), whole: its list's, or its request's.
    pub(crate) fn prompt_row(&self, r: usize) -> &'a [i32] {
        match self.requests {
            Some(q) => q.row(r).map_or(&[][..], |q| q.prompt()),
            None => self.prompt_tokens.map_or(&[][..], |l| l.row(r)),
        }
    }

    /// The output of row `r` (of a validated batch), whole: its list's, or its request's.
    pub(crate) fn output_row(&self, r: usize) -> &'a [i32] {
        match self.requests {
            Some(q) => q.row(r).map_or(&[][..], |q| q.output()),
            None => self.output_tokens.map_or(&[][..], |l| l.row(r)),
        }
    }

    /// The temperature of `row` (1.0 without a temperature array).
    pub fn temperature(&self, row: usize) -> f32 {
        self.temperature.map_or(1.0, |t| t[row])
    }

    /// The seed of `row` if it is seeded.
    pub fn seed_of(&self, row: usize) -> Option<(u64, u64)> {
        let seeds = self.seeds?;
        if let Some(mask) = self.seeded {
            if mask[row] == 0 {
                return None;
            }
        }
        Some((seeds[row], self.offsets.map_or(0, |o| o[row])))
    }
}

/// Row flags reported in `Output::flags`.
pub mod flags {
    /// The row held at least one NaN logit (NaN never wins).
    pub const HAS_NAN: u32 = 1;
    /// The row held a +inf logit; the first +inf won.
    pub const HAS_POSINF: u32 = 2;
    /// The row had no finite and no +inf logit; token 0 was returned.
    pub const EMPTY: u32 = 4;
    /// The row was drawn greedily (temperature below the greedy threshold).
    pub const GREEDY: u32 = 8;
    /// The row's forced token is one its sampling step bans (a mask or a -inf bias): it was
    /// returned all the same, with a processed logprob of -inf.
    pub const FORCED_BANNED: u32 = 16;
    /// The flags of a row whose logits were not all finite (the sampler's `nonfinite_rows`).
    pub const NONFINITE: u32 = HAS_NAN | HAS_POSINF | EMPTY;
}

/// Where a draw writes. Nothing is written unless the call succeeds. Every output but `tokens`
/// is optional; make one with [`Output::new`] and set the fields you want.
#[derive(Debug)]
pub struct Output<'a> {
    /// `rows` sampled token ids.
    pub tokens: &'a mut [i32],
    /// `rows` row flags ([`flags`]: NaN, +inf, empty, greedy).
    pub flags: Option<&'a mut [u32]>,
    /// `rows` logprobs of the sampled tokens, in `logprob_mode`.
    pub logprobs: Option<&'a mut [f32]>,
    /// `rows` ranks of the sampled tokens: the count of tokens whose logprob is >= its own.
    pub ranks: Option<&'a mut [i32]>,
    /// Entries per row of `topn_ids` / `topn_logprobs` (at most vocab); 0: none.
    pub top_n: usize,
    /// `rows x top_n` ids of the most probable tokens, descending, lowest id first on ties.
    pub topn_ids: Option<&'a mut [i32]>,
    /// `rows x top_n` logprobs of those tokens, in `logprob_mode`.
    pub topn_logprobs: Option<&'a mut [f32]>,
    /// Which distribution `logprobs`, `ranks` and the top-n describe: the raw row's or the
    /// processed one's (after the step, the temperature and the filters).
    pub logprob_mode: LogprobMode,
    /// `rows` rows of `vocab` values, `full_row_stride` apart: the logprob (or logit) of every
    /// token, in `full_mode`.
    pub full_logprobs: Option<&'a mut [f32]>,
    /// Elements between rows of `full_logprobs` (>= vocab).
    pub full_row_stride: usize,
    /// What `full_logprobs` receives for every token.
    pub full_mode: FullMode,
    /// One logprob per entry of the batch's `logprob_token_ids` (row `r`'s at its offsets), in
    /// `logprob_mode`.
    pub token_logprobs: Option<&'a mut [f32]>,
    /// One rank per entry of the batch's `logprob_token_ids`: the count of tokens whose
    /// logprob is >= the id's.
    pub token_ranks: Option<&'a mut [i32]>,
    /// `rows` thresholds of the kept sets: the smallest value a row's filters keep, in the
    /// values they judge (the row's logits, or its processed values when it has a sampling step,
    /// before the temperature); +inf when the row's +inf values are its kept set, NaN when it
    /// keeps nothing. A row keeps exactly its finite values at or above it.
    pub kept_threshold: Option<&'a mut [f32]>,
    /// `rows` counts of the tokens each row keeps.
    pub kept_count: Option<&'a mut [i32]>,
    /// `rows` kept masses: the share of the row's probability (softmax of its values at the
    /// temperature its filters judge it at: 1/T with temperature first, 1 with filters first;
    /// greedy rows: 1) its kept tokens hold, in f64.
    pub kept_mass: Option<&'a mut [f64]>,
    /// `rows x ceil(vocab / 32)` words: bit `i` of word `j` of a row is set when the row keeps
    /// token `32 j + i` (xgrammar's bitmask layout); bits past the vocabulary are 0.
    pub kept_bitmask: Option<&'a mut [i32]>,
    /// `rows` mu values after the draw: a mirostat row's updated mu (`mu - eta * (surprise -
    /// tau)`), NaN for a row without mirostat. Written only when the call succeeds.
    pub mirostat_mu: Option<&'a mut [f32]>,
}

/// What `Output::full_logprobs` receives for every token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FullMode {
    /// log_softmax of the logits as given.
    #[default]
    Raw,
    /// log_softmax of the processed row (masks, bias, penalties, temperature, filters), -inf
    /// outside the kept tokens; greedy rows: of the penalised row at temperature 1.
    Processed,
    /// The processed logits themselves: the penalised logit divided by T for the kept tokens
    /// (greedy rows: not divided), -inf elsewhere (vLLM's `processed_logits`).
    ProcessedLogits,
}

impl<'a> Output<'a> {
    /// Tokens only.
    pub fn new(tokens: &'a mut [i32]) -> Self {
        Output {
            tokens,
            flags: None,
            logprobs: None,
            ranks: None,
            top_n: 0,
            topn_ids: None,
            topn_logprobs: None,
            logprob_mode: LogprobMode::Raw,
            full_logprobs: None,
            full_row_stride: 0,
            full_mode: FullMode::Raw,
            token_logprobs: None,
            token_ranks: None,
            kept_threshold: None,
            kept_count: None,
            kept_mass: None,
            kept_bitmask: None,
            mirostat_mu: None,
        }
    }

    /// Whether any output of the rows' kept sets is asked for.
    pub(crate) fn wants_kept(&self) -> bool {
        self.kept_threshold.is_some()
            || self.kept_count.is_some()
            || self.kept_mass.is_some()
            || self.kept_bitmask.is_some()
    }

    /// Whether any logprob output is asked for.
    pub(crate) fn wants_logprobs(&self) -> bool {
        self.logprobs.is_some()
            || self.ranks.is_some()
            || (self.top_n > 0 && (self.topn_ids.is_some() || self.topn_logprobs.is_some()))
            || self.token_logprobs.is_some()
            || self.token_ranks.is_some()
    }
}
