//! The sampling step before temperature and the filters: the allowed list, the grammar bitmask
//! and the banned list (masks), the logit bias, and the penalties (`docs/semantics.md`, The
//! sampling step). The caller's logits are never written.
//!
//! A row's step is built in `O(vocab / 32 + history + list lengths)`, never a pass over the
//! logits:
//! - `keep`, one bit per token: set for the tokens whose value is the caller's logit as given
//!   (neither masked nor changed by the bias or the penalties);
//! - `overrides`, the (token, value) pairs of the tokens that bias or penalties changed (masked
//!   tokens are never among them: a mask wins over everything).
//!
//! The processed row, which the rest of the draw sees, is then `y_i = override_i`, else `x_i`
//! where the bit is set, else -inf. Each override is computed in f32 by
//! [`processed_value`](penalties::processed_value), in vLLM's order.
//!
//! The parts:
//! - `build.rs`: building a row's step from the batch ([`build()`], [`RowStep::complete`]);
//! - `penalties.rs`: the penalties and the arithmetic of a touched token's value;
//! - `listed.rs`: the table of the tokens the bias names;
//! - `scratch.rs`: the storage a thread keeps between rows;
//! - `processed.rs`: reading the processed row (the overrides, the scan, the race's bounds);
//! - `deferred.rs`: a row whose histories are searched only in the blocks the draw visits;
//! - `slice.rs`: the processed values of one slice of a row (sharded sampling).

mod build;
mod deferred;
mod dry;
mod listed;
mod penalties;
mod processed;
mod scratch;
mod slice;
#[cfg(test)]
mod tests;

pub(crate) use build::{build, row_has_step};
pub(crate) use deferred::DeferredRow;
pub(crate) use scratch::kept;

use listed::Listed;
use penalties::Penalties;

/// The step of one row: see the module doc. Three bitsets of one bit per token
/// (`vocab.div_ceil(32)` words; bits past the vocabulary are clear): `keep`, and the two that
/// say which kept tokens the lists touched, `seen` (a token of the histories: the penalties
/// apply) and `listed` (an entry in the table: a bias); and the output's count of each token.
/// A touched token's bit is clear in `keep`.
pub(crate) struct RowStep<'a> {
    /// The row's mask less its touched tokens (see above); read it through [`RowStep::keep`],
    /// which is the caller's bitmask words while `given` holds them.
    keep: Vec<u32>,
    /// The caller's bitmask words of a deferred row that no other list masks, read in place
    /// instead of a copy into `keep` (19 KiB a row of 151,936 tokens, a tenth of the time that
    /// the step of a row with a bitmask and long histories adds): `keep` of a deferred row is its mask, which they are, but for the
    /// bits past the vocabulary in the last word, which nothing reads
    /// ([`DeferredRow`] clears them in the blocks it works out).
    /// [`RowStep::complete`] copies them into `keep` (its storage reserved) before it changes
    /// them.
    given: Option<&'a [u32]>,
    /// Whether a mask (the allowed list, the bitmask, the banned list) bans any token.
    masked: bool,
    /// The tokens no mask bans (`keep` and the touched ones), when the lists touched any of a
    /// masked row (else `keep` is the mask, or nothing is masked).
    mask: Vec<u32>,
    /// The tokens whose step may raise their value (a positive bias), in no particular order
    /// (a token may repeat).
    raised: Vec<u32>,
    /// Empty when the lists touch nothing (then every touched word is 0).
    seen: Vec<u32>,
    listed_bits: Vec<u32>,
    listed: Listed,
    /// The kept tokens of the output, when the frequency or presence penalty is on (else empty).
    output_bits: Vec<u32>,
    /// Per token, its occurrences in the output after the first (kept tokens only; a
    /// vocabulary of them, zero outside this row's repeats, reused by the thread's next row):
    /// a token of the output has `1 + counts[t]`. Most outputs repeat few tokens, so most rows
    /// never touch it (a dense count of every occurrence missed the cache once a token).
    counts: Vec<u32>,
    /// The repeats of the output: the nonzero entries of `counts`.
    counted: Vec<u32>,
    /// At least how many tokens the lists touched, and 0 when they touched none.
    touched: usize,
    /// The histories are not marked yet: `seen`, `output_bits` and `counts` are all zero, `keep`
    /// is the mask with the histories' bits set, and a block's touched tokens are found when it
    /// is visited ([`DeferredRow`]), until [`RowStep::complete`] marks them.
    deferred: bool,
    /// Whether the histories touch tokens densely enough (two words of `seen` in eight hold
    /// one, or more) that the race tests a visited block's touched tokens on its own vectors
    /// ([`RowStep::bounded_by_row`]) rather than one by one: the vector test costs the same
    /// for any count, the token-by-token one a bit walk and a load a token. A bitmask thins
    /// the touched tokens (those it bans are not touched), often below that.
    dense: bool,
    /// Scratch of [`RowStep::resolve_words`]: the touched tokens of a range, room for
    /// `touched + 4`.
    ids: Vec<u32>,
    /// Scratch beside `ids`: their values.
    vals: Vec<f32>,
    /// The words of the touched tokens (with repeats), when the lists name few tokens against
    /// the vocabulary: then only those words are worked out and cleared again, instead of a
    /// pass over every word (which cost a row of 16 biased ids a fifth of its draw). Empty when
    /// the pass went over every word.
    words: Vec<u32>,
    penalties: Penalties,
    /// The kept tokens that DRY penalises (listed in the table with their penalty): the sparse
    /// pass works out their words as it does the bias's.
    dry_ids: Vec<u32>,
    /// (token, value) of the touched tokens that can still be drawn (their value is neither
    /// -inf nor NaN), in no particular order (whoever reads them takes the lowest token of a
    /// tie); made by [`RowStep::resolve`] or [`RowStep::scan`].
    pub overrides: Vec<(u32, f32)>,
}

/// The touched tokens of a row with a step, block by block, for the race ([`RowStep::listed_of`]).
pub(crate) struct StepBlocks<'a, V: ?Sized> {
    pub step: &'a RowStep<'a>,
    pub values: &'a V,
}
