//! Vocabulary-sharded sampling: each tensor-parallel rank holds the logits of one slice of the
//! vocabulary, computes a fixed-size partial result per row from its slice, and the partials of
//! all ranks combine into the token and flags the unsharded draw of the whole row returns, bit
//! for bit (`docs/semantics.md`, "Sharded rows").
//!
//! It works because every quantity of the draw decomposes over a split of the vocabulary: the
//! row's maximum (and its first position) is the maximum of the slices' maxima, the noise of a
//! token is a pure function of (row key, global token id), and the race's winner is the best of
//! the slices' winners (highest key, then lowest id) once every slice computes its keys with the
//! row's global maximum. So a call is two rounds, and the library moves no bytes itself:
//!
//! 1. [`Sampler::shard_top`] on every rank: per row its slice's maximum, the first global id
//!    holding it, its flags and the row key (unseeded rows take theirs from the sampler's
//!    stream here, as an unsharded draw of the same rows would). [`combine_top`] of all ranks'
//!    partials (on every rank, or on one) gives each row's maximum and first-max token: the
//!    answer of greedy rows, of rows holding +inf, and of empty rows.
//! 2. [`Sampler::shard_race`] on every rank: the race of its slice with the global maximum and
//!    the row's min-p floor. [`finish`] of all ranks' partials gives the tokens and flags.
//!
//! - `local.rs`: what a rank computes from its slice (both rounds);
//! - `combine.rs`: the combination of the ranks' partials, and the checks that they belong
//!   together;
//! - `step.rs`: the sampling step's inputs, applied to each rank's slice.

mod combine;
mod cut;
mod local;
mod logprob;
mod step;

pub use combine::{combine_top, finish};
pub use cut::{cut_advance, cut_pending, phase as cut_phase, ShardCut, ShardMass, CUT_BINS};
pub use local::top_k_candidates;
pub use logprob::{shard_logprobs, ShardLogprobPartial, ShardTopEntry};
pub use step::ShardStep;

/// One rank's rows of a sharded call: the f32 logits of its slice of the vocabulary, tokens
/// `[vocab_start, vocab_start + slice_len)` of rows of `vocab_size` tokens, and the rows'
/// settings (every rank passes the same settings).
#[derive(Clone, Copy, Debug)]
pub struct ShardRows<'a> {
    /// `rows` runs of `slice_len` values, `row_stride` apart.
    pub logits: &'a [f32],
    /// The call's rows.
    pub rows: usize,
    /// The distance between the starts of two rows in `logits` (at least `slice_len`).
    pub row_stride: usize,
    /// The global id of the slice's first token.
    pub vocab_start: usize,
    /// The slice's length (at least 1).
    pub slice_len: usize,
    /// The whole row's length.
    pub vocab_size: usize,
    /// Per row, as `Batch::temperature` (None: 1).
    pub temperature: Option<&'a [f32]>,
    /// Per row, as `Batch::seeds`.
    pub seeds: Option<&'a [u64]>,
    /// Per row, as `Batch::offsets`.
    pub offsets: Option<&'a [u64]>,
    /// Per row, as `Batch::seeded`.
    pub seeded: Option<&'a [u8]>,
    /// Per row, as `Batch::min_p` (None, or 0: off).
    pub min_p: Option<&'a [f32]>,
    /// Per row, as `Batch::top_k` (None, 0, negative or at least `vocab_size`: off). A row with
    /// top-k races with the ranks' candidates ([`top_k_candidates`], [`crate::Sampler::shard_race_top_k`]).
    pub top_k: Option<&'a [i32]>,
    /// Per row, as `Batch::top_p` (None, or 1: off). A row with top-p races with the floor of its
    /// cut ([`crate::Sampler::shard_cut_start`], [`cut_advance`], [`crate::Sampler::shard_race_cut`]).
    pub top_p: Option<&'a [f32]>,
    /// The sampling step's inputs for the whole rows, global ids (default: none). Every round
    /// reads the slice's processed values ([`ShardStep`]).
    pub step: ShardStep<'a>,
}

impl<'a> ShardRows<'a> {
    /// Contiguous rows of a slice with no per-row settings (temperature 1, unseeded, no min-p).
    pub fn new(logits: &'a [f32], rows: usize, vocab_start: usize, slice_len: usize, vocab_size: usize) -> Self {
        ShardRows {
            logits,
            rows,
            row_stride: slice_len,
            vocab_start,
            slice_len,
            vocab_size,
            temperature: None,
            seeds: None,
            offsets: None,
            seeded: None,
            min_p: None,
            top_k: None,
            top_p: None,
            step: ShardStep::default(),
        }
    }
}

/// What one rank sends for one row in either round (40 bytes; C: `tokenrace_shard_partial`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShardPartial {
    /// Round 1: the slice's largest value (NaN ignored; -inf: none). Round 2: the best key of
    /// the slice's race (-inf: none races).
    pub value: f32,
    /// The global id of `value`'s first token (round 1) or of the slice's winner (round 2); -1
    /// when there is none.
    pub token: i32,
    /// Round 1: `flags::HAS_NAN` (a NaN in the slice) and `flags::GREEDY`. Round 2: 0.
    pub flags: u32,
    /// 1 or 2.
    pub round: u32,
    /// A hash of the call's row (its index, the call's size, its settings; in round 2 the
    /// combined maximum too): partials of different rows or calls do not combine.
    pub fingerprint: u32,
    /// The global id of the rank's slice's first token.
    pub vocab_start: u32,
    /// The rank's slice's length.
    pub slice_len: u32,
    /// The whole row's length.
    pub vocab_size: u32,
    /// The row's noise key (0 for greedy rows): the same on every rank, checked when combined.
    pub key: u64,
}

/// One row combined from the first round of all ranks (24 bytes; C: `tokenrace_shard_row`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShardRow {
    /// The row's largest value (NaN ignored; +0 for a largest zero; -inf: empty).
    pub top: f32,
    /// The lowest global id holding `top` (0 for an empty row): the token of greedy rows, of
    /// rows holding +inf, and of sampling rows where no key is above -inf.
    pub token: i32,
    /// The row's flags: GREEDY, HAS_NAN, HAS_POSINF, EMPTY as the unsharded draw reports them.
    pub flags: u32,
    /// The rows' round-1 fingerprint.
    pub fingerprint: u32,
    /// The row's noise key.
    pub key: u64,
}

impl ShardRow {
    /// Whether the row's token needs the second round (a race): a sampling row with a finite
    /// maximum.
    pub fn races(&self) -> bool {
        self.flags & crate::flags::GREEDY == 0 && self.top.is_finite()
    }
}

/// The fingerprint's domains.
const ROUND_TOP: u32 = 1;
const ROUND_RACE: u32 = 2;
const ROUND_CUT: u32 = 3;
const ROUND_LOGPROB: u32 = 4;

/// The round-2 fingerprint of a combined row.
fn race_fingerprint(row: &ShardRow) -> u32 {
    let h = crate::noise::splitmix64(u64::from(row.fingerprint) ^ (u64::from(row.top.to_bits()) << 32) ^ 0x7261_6365);
    (crate::noise::splitmix64(h ^ row.key) >> 32) as u32
}
