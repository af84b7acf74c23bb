//! The C functions of vocabulary-sharded sampling (`crate::shard`, `docs/semantics.md`,
//! "Sharded rows"): a rank's two rounds on its slice, and the combinations of the ranks'
//! partials. The library moves no bytes between ranks: the caller gathers the partials (an
//! all_gather of `ranks * rows` records, rank-major) and passes them back.

use super::api::tokenrace_sampler;
use super::convert::arg_enum;
use super::convert::{opt_slice, read_versioned, slice};
use super::draw::{bias, bitmask, lists, words, BAD_WORD_FIELDS, DRY_BREAKER_FIELDS};
use super::panic::guard;
use super::types::tokenrace_batch;
use super::types::tokenrace_logprob_mode;
use super::types::tokenrace_status;
use crate::batch::LogprobMode;
use crate::error::{Error, Owner, Result};
use crate::shard::{
    combine_top, cut_advance, finish, shard_logprobs, top_k_candidates, ShardCut, ShardLogprobPartial, ShardMass,
    ShardPartial, ShardRow, ShardRows, ShardStep, ShardTopEntry, CUT_BINS,
};

/// One rank's rows of a sharded call (docs/semantics.md, "Sharded rows"): the f32 logits of
/// tokens `[vocab_start, vocab_start + slice_len)` of rows of `vocab_size` tokens, and the rows'
/// settings, the same on every rank. Starts with `struct_size`; zero the fields you do not set.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tokenrace_shard_rows {
    /// sizeof(tokenrace_shard_rows) as the caller knows it.
    pub struct_size: u32,
    /// Must be 0.
    pub reserved0: u32,
    /// `rows` runs of `slice_len` f32 values, `row_stride` apart.
    pub logits: *const f32,
    /// The call's rows.
    pub rows: usize,
    /// Elements between the starts of two rows (at least `slice_len`; 0: `slice_len`).
    pub row_stride: usize,
    /// The global id of the slice's first token.
    pub vocab_start: usize,
    /// The slice's length (at least 1).
    pub slice_len: usize,
    /// The whole row's length.
    pub vocab_size: usize,
    /// `rows` temperatures (NULL: 1), as `tokenrace_batch.temperature`.
    pub temperature: *const f32,
    /// `rows` seeds (NULL: every row unseeded), as `tokenrace_batch.seeds`.
    pub seeds: *const u64,
    /// `rows` offsets (NULL: 0), as `tokenrace_batch.offsets`.
    pub offsets: *const u64,
    /// `rows` flags (NULL: every row with a seed is seeded), as `tokenrace_batch.seeded`.
    pub seeded: *const u8,
    /// `rows` min-p values (NULL: off), as `tokenrace_batch.min_p`.
    pub min_p: *const f32,
    /// `rows` top-k values (NULL: off), as `tokenrace_batch.top_k`: the race needs the ranks'
    /// `tokenrace_shard_top_k_candidates` through `tokenrace_shard_cut_start`.
    pub top_k: *const i32,
    /// `rows` top-p values (NULL: off), as `tokenrace_batch.top_p`: the race needs the rows' cuts
    /// (`tokenrace_shard_cut_start`, `_cut_round`, `_cut_advance`, `_race_cut`).
    pub top_p: *const f32,
    // Added after 0.2.0: the sampling step, applied to each rank's slice (docs/semantics.md,
    // "Sharded rows", the step). The fields, forms and rules of `tokenrace_batch`'s of the same
    // names, for the WHOLE rows: global token ids (every rank may be passed the same arrays;
    // each applies the entries inside its slice), the bitmask in the whole row's layout
    // (`ceil(vocab_size / 32)` words per row, at `bitmask_row_stride` words, 0: that). A caller
    // whose struct_size ends before them gets NULL (no step).
    /// Prompt tokens (CSR with `prompt_offsets`), as `tokenrace_batch.prompt_ids`.
    pub prompt_ids: *const i32,
    /// `rows + 1` offsets into `prompt_ids`.
    pub prompt_offsets: *const u64,
    /// Output tokens so far (CSR with `output_offsets`), as `tokenrace_batch.output_ids`.
    pub output_ids: *const i32,
    /// `rows + 1` offsets into `output_ids`.
    pub output_offsets: *const u64,
    /// `rows` repetition penalties (NULL: 1).
    pub repetition_penalty: *const f32,
    /// `rows` frequency penalties (NULL: 0).
    pub frequency_penalty: *const f32,
    /// `rows` presence penalties (NULL: 0).
    pub presence_penalty: *const f32,
    /// Logit bias ids (CSR with `bias_offsets`, values in `bias_values`).
    pub bias_ids: *const i32,
    /// Logit bias values, one per `bias_ids` entry.
    pub bias_values: *const f32,
    /// `rows + 1` offsets into `bias_ids`/`bias_values`.
    pub bias_offsets: *const u64,
    /// Allowed token lists (CSR with `allowed_offsets`).
    pub allowed_ids: *const i32,
    /// `rows + 1` offsets into `allowed_ids`.
    pub allowed_offsets: *const u64,
    /// `rows` flags: which rows the allowed lists restrict (NULL: all).
    pub allowed_rows: *const u8,
    /// Banned token lists (CSR with `banned_offsets`).
    pub banned_ids: *const i32,
    /// `rows + 1` offsets into `banned_ids`.
    pub banned_offsets: *const u64,
    /// The grammar bitmask of the whole rows: int32 words, bit `j` of word `w` allows token
    /// `32 w + j`.
    pub token_bitmask: *const i32,
    /// Words between two rows of `token_bitmask` (0: `ceil(vocab_size / 32)`).
    pub bitmask_row_stride: u64,
    /// `rows` penalty windows (NULL or 0: the whole history).
    pub penalty_last_n: *const i32,
    /// `rows` minimum output lengths (NULL: 0), with `stop_ids`.
    pub min_tokens: *const i32,
    /// Stop token lists (CSR with `stop_offsets`), banned while the output is shorter than
    /// `min_tokens`.
    pub stop_ids: *const i32,
    /// `rows + 1` offsets into `stop_ids`.
    pub stop_offsets: *const u64,
    /// Bad words' ids (two-level CSR), as `tokenrace_batch.bad_words_ids`.
    pub bad_words_ids: *const i32,
    /// Offsets of the words into `bad_words_ids`.
    pub bad_word_offsets: *const u64,
    /// `rows + 1` offsets of the rows into the words.
    pub bad_words_row_offsets: *const u64,
    /// `rows` DRY multipliers (NULL or 0: off).
    pub dry_multiplier: *const f32,
    /// `rows` DRY bases (NULL: 1.75).
    pub dry_base: *const f32,
    /// `rows` DRY allowed lengths (NULL: 2).
    pub dry_allowed_length: *const i32,
    /// `rows` DRY windows (NULL: -1, every token).
    pub dry_penalty_last_n: *const i32,
    /// DRY sequence breakers' ids (two-level CSR), as `tokenrace_batch.dry_breaker_ids`.
    pub dry_breaker_ids: *const i32,
    /// Offsets of the breakers into `dry_breaker_ids`.
    pub dry_breaker_offsets: *const u64,
    /// `rows + 1` offsets of the rows into the breakers.
    pub dry_breakers_row_offsets: *const u64,
}

/// What one rank sends for one row in either round: 40 bytes, a plain record to move between
/// ranks as bytes (no `struct_size`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct tokenrace_shard_partial {
    /// Round 1: the slice's largest value (NaN ignored; -inf: none). Round 2: the best key of
    /// the slice's race (-inf: none).
    pub value: f32,
    /// The global id of round 1's first maximum or of round 2's winner; -1: none.
    pub token: i32,
    /// Round 1: TOKENRACE_FLAG_HAS_NAN and TOKENRACE_FLAG_GREEDY. Round 2: 0.
    pub flags: u32,
    /// 1 or 2.
    pub round: u32,
    /// A hash of the row and call: partials of other rows or calls are refused when combined.
    pub fingerprint: u32,
    /// The global id of the rank's slice's first token.
    pub vocab_start: u32,
    /// The rank's slice's length.
    pub slice_len: u32,
    /// The whole row's length.
    pub vocab_size: u32,
    /// The row's noise key (0 for greedy rows), the same on every rank.
    pub key: u64,
}

/// One row combined from the first round of all ranks: 24 bytes, the same on every rank that
/// combines the same partials.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct tokenrace_shard_row {
    /// The row's largest value (NaN ignored; -inf: empty).
    pub top: f32,
    /// The lowest global id holding `top` (0 for an empty row).
    pub token: i32,
    /// The row's TOKENRACE_FLAG_* set.
    pub flags: u32,
    /// The row's round-1 fingerprint.
    pub fingerprint: u32,
    /// The row's noise key.
    pub key: u64,
}

// The C records are the library's, field for field (checked by `tests/shard_c.rs`'s layout
// test): the conversions below are copies.
const _: () = assert!(size_of::<tokenrace_shard_partial>() == size_of::<ShardPartial>());
const _: () = assert!(size_of::<tokenrace_shard_row>() == size_of::<ShardRow>());
use std::mem::size_of;

impl From<ShardPartial> for tokenrace_shard_partial {
    fn from(p: ShardPartial) -> Self {
        let ShardPartial { value, token, flags, round, fingerprint, vocab_start, slice_len, vocab_size, key } = p;
        tokenrace_shard_partial { value, token, flags, round, fingerprint, vocab_start, slice_len, vocab_size, key }
    }
}

impl From<tokenrace_shard_partial> for ShardPartial {
    fn from(p: tokenrace_shard_partial) -> Self {
        let tokenrace_shard_partial {
            value,
            token,
            flags,
            round,
            fingerprint,
            vocab_start,
            slice_len,
            vocab_size,
            key,
        } = p;
        ShardPartial { value, token, flags, round, fingerprint, vocab_start, slice_len, vocab_size, key }
    }
}

impl From<ShardRow> for tokenrace_shard_row {
    fn from(r: ShardRow) -> Self {
        tokenrace_shard_row { top: r.top, token: r.token, flags: r.flags, fingerprint: r.fingerprint, key: r.key }
    }
}

impl From<tokenrace_shard_row> for ShardRow {
    fn from(r: tokenrace_shard_row) -> Self {
        ShardRow { top: r.top, token: r.token, flags: r.flags, fingerprint: r.fingerprint, key: r.key }
    }
}

/// The caller's rows as [`ShardRows`].
///
/// # Safety
/// `c`'s non-NULL pointers cover the elements its sizes say, and outlive `'a`.
unsafe fn rows_from_c<'a>(c: &tokenrace_shard_rows) -> Result<ShardRows<'a>> {
    if c.reserved0 != 0 {
        return Err(Error::invalid_argument(format!("rows.reserved0: {} is not 0", c.reserved0)));
    }
    let n = c.rows;
    let stride = if c.row_stride == 0 { c.slice_len } else { c.row_stride };
    let span = if n == 0 {
        0
    } else {
        (n - 1)
            .checked_mul(stride)
            .and_then(|s| s.checked_add(c.slice_len))
            .ok_or_else(|| Error::invalid_argument("rows.row_stride: rows x row_stride overflows"))?
    };
    let o = Owner::Batch;
    // SAFETY: the caller's contract.
    unsafe {
        Ok(ShardRows {
            logits: slice(o, "logits", c.logits, span).map_err(rows_named)?,
            rows: n,
            row_stride: stride,
            vocab_start: c.vocab_start,
            slice_len: c.slice_len,
            vocab_size: c.vocab_size,
            temperature: opt_slice(o, "temperature", c.temperature, n).map_err(rows_named)?,
            seeds: opt_slice(o, "seeds", c.seeds, n).map_err(rows_named)?,
            offsets: opt_slice(o, "offsets", c.offsets, n).map_err(rows_named)?,
            seeded: opt_slice(o, "seeded", c.seeded, n).map_err(rows_named)?,
            min_p: opt_slice(o, "min_p", c.min_p, n).map_err(rows_named)?,
            top_k: opt_slice(o, "top_k", c.top_k, n).map_err(rows_named)?,
            top_p: opt_slice(o, "top_p", c.top_p, n).map_err(rows_named)?,
            step: step_from_c(c).map_err(rows_named)?,
        })
    }
}

/// The rows' step, read as `tokenrace_batch`'s fields of the same names are read (a batch of the
/// whole rows carrying only these fields).
///
/// # Safety
/// As [`rows_from_c`].
unsafe fn step_from_c<'a>(c: &tokenrace_shard_rows) -> Result<ShardStep<'a>> {
    let b = tokenrace_batch {
        prompt_ids: c.prompt_ids,
        prompt_offsets: c.prompt_offsets,
        output_ids: c.output_ids,
        output_offsets: c.output_offsets,
        bias_ids: c.bias_ids,
        bias_values: c.bias_values,
        bias_offsets: c.bias_offsets,
        allowed_ids: c.allowed_ids,
        allowed_offsets: c.allowed_offsets,
        banned_ids: c.banned_ids,
        banned_offsets: c.banned_offsets,
        token_bitmask: c.token_bitmask,
        bitmask_row_stride: c.bitmask_row_stride,
        stop_ids: c.stop_ids,
        stop_offsets: c.stop_offsets,
        bad_words_ids: c.bad_words_ids,
        bad_word_offsets: c.bad_word_offsets,
        bad_words_row_offsets: c.bad_words_row_offsets,
        dry_breaker_ids: c.dry_breaker_ids,
        dry_breaker_offsets: c.dry_breaker_offsets,
        dry_breakers_row_offsets: c.dry_breakers_row_offsets,
        // SAFETY: the batch's fields are integers, floats and raw pointers: all-zero is NULL/0.
        ..unsafe { std::mem::zeroed() }
    };
    let (n, o) = (c.rows, Owner::Batch);
    // SAFETY: the caller's contract for the rows' pointers.
    unsafe {
        Ok(ShardStep {
            prompt_tokens: lists(n, ("prompt_ids", b.prompt_ids), ("prompt_offsets", b.prompt_offsets))?,
            output_tokens: lists(n, ("output_ids", b.output_ids), ("output_offsets", b.output_offsets))?,
            repetition_penalty: opt_slice(o, "repetition_penalty", c.repetition_penalty, n)?,
            frequency_penalty: opt_slice(o, "frequency_penalty", c.frequency_penalty, n)?,
            presence_penalty: opt_slice(o, "presence_penalty", c.presence_penalty, n)?,
            penalty_last_n: opt_slice(o, "penalty_last_n", c.penalty_last_n, n)?,
            logit_bias: bias(&b, n)?,
            allowed_tokens: lists(n, ("allowed_ids", b.allowed_ids), ("allowed_offsets", b.allowed_offsets))?,
            allowed_rows: opt_slice(o, "allowed_rows", c.allowed_rows, n)?,
            banned_tokens: lists(n, ("banned_ids", b.banned_ids), ("banned_offsets", b.banned_offsets))?,
            token_bitmask: bitmask(&b, n, c.vocab_size)?,
            min_tokens: opt_slice(o, "min_tokens", c.min_tokens, n)?,
            stop_tokens: lists(n, ("stop_ids", b.stop_ids), ("stop_offsets", b.stop_offsets))?,
            bad_words: words(&b, n, BAD_WORD_FIELDS)?,
            dry_multiplier: opt_slice(o, "dry_multiplier", c.dry_multiplier, n)?,
            dry_base: opt_slice(o, "dry_base", c.dry_base, n)?,
            dry_allowed_length: opt_slice(o, "dry_allowed_length", c.dry_allowed_length, n)?,
            dry_penalty_last_n: opt_slice(o, "dry_penalty_last_n", c.dry_penalty_last_n, n)?,
            dry_breakers: words(&b, n, DRY_BREAKER_FIELDS)?,
        })
    }
}

/// An error about a field of the rows, named as the argument `rows` (not `batch`).
fn rows_named(e: Error) -> Error {
    let message = e.message.replacen("batch.", "rows.", 1);
    Error { message, ..e }
}

/// `ranks * rows` partials, rank-major, as one slice per rank.
///
/// # Safety
/// A non-NULL `partials` points to `ranks * rows` records.
unsafe fn per_rank(
    partials: *const tokenrace_shard_partial,
    ranks: usize,
    rows: usize,
) -> Result<Vec<Vec<ShardPartial>>> {
    let total = ranks.checked_mul(rows).ok_or_else(|| Error::invalid_argument("ranks: ranks x rows overflows"))?;
    // SAFETY: the caller's contract.
    let all = unsafe { slice(Owner::Batch, "partials", partials, total) }.map_err(|e| {
        let message = e.message.replacen("batch.", "", 1);
        Error { message, ..e }
    })?;
    Ok((0..ranks).map(|q| all[q * rows..(q + 1) * rows].iter().map(|&p| p.into()).collect()).collect())
}

/// Writes `values` to the caller's `out` (checked non-NULL and aligned), which may overlap what
/// was read (all reads are done).
///
/// # Safety
/// `out` points to `values.len()` writable records.
unsafe fn write_out<T: Copy>(name: &str, out: *mut T, values: &[T]) -> Result<()> {
    if values.is_empty() {
        return Ok(());
    }
    if out.is_null() || !(out as usize).is_multiple_of(align_of::<T>()) {
        return Err(Error::invalid_argument(format!("{name}: is NULL or not aligned to {} bytes", align_of::<T>())));
    }
    // SAFETY: the caller's contract; `copy` allows the ranges to overlap.
    unsafe { std::ptr::copy(values.as_ptr(), out, values.len()) };
    Ok(())
}

/// Round 1 on this rank: one `tokenrace_shard_partial` per row of `rows` into `out`
/// (`rows->rows` records). Unseeded sampling rows take one key each from the sampler's stream,
/// in row order, as `tokenrace_draw` of the same rows would, so ranks whose samplers were made
/// with the same seed and make the same calls agree. The sampler must not have a noise pool.
/// On failure nothing is written and no key is taken.
///
/// # Safety
/// `sampler` is a live sampler; `rows` a valid struct whose pointers cover their elements; `out`
/// points to `rows->rows` writable records.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_shard_top(
    sampler: *mut tokenrace_sampler,
    rows: *const tokenrace_shard_rows,
    out: *mut tokenrace_shard_partial,
) -> tokenrace_status {
    guard("tokenrace_shard_top", || {
        // SAFETY: the caller's contract.
        unsafe {
            let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
            let r = rows_from_c(&read_versioned(rows, "rows")?)?;
            if out.is_null() && r.rows > 0 {
                return Err(Error::invalid_argument("out: is NULL"));
            }
            let mut p = vec![ShardPartial::default(); r.rows];
            s.inner.shard_top(&r, &mut p)?;
            let c: Vec<tokenrace_shard_partial> = p.into_iter().map(Into::into).collect();
            write_out("out", out, &c)
        }
    })
}

/// Combines the round-1 partials of `ranks` ranks (`partials`: `ranks * rows` records,
/// rank-major, the ranks in any order) into one `tokenrace_shard_row` per row in `out`. Refuses
/// partials of other rounds, rows or calls, and slices that do not tile the row.
///
/// # Safety
/// `partials` points to `ranks * rows` records; `out` to `rows` writable ones.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_shard_combine_top(
    partials: *const tokenrace_shard_partial,
    ranks: u32,
    rows: u32,
    out: *mut tokenrace_shard_row,
) -> tokenrace_status {
    let (ranks, rows) = (ranks as usize, rows as usize);
    guard("tokenrace_shard_combine_top", || {
        // SAFETY: the caller's contract.
        let all = unsafe { per_rank(partials, ranks, rows)? };
        let views: Vec<&[ShardPartial]> = all.iter().map(|p| &p[..]).collect();
        let mut combined = vec![ShardRow::default(); rows];
        combine_top(&views, &mut combined)?;
        let c: Vec<tokenrace_shard_row> = combined.into_iter().map(Into::into).collect();
        // SAFETY: the caller's contract.
        unsafe { write_out("out", out, &c) }
    })
}

/// Round 2 on this rank: the race of its slice of each row with the combined first round
/// (`combined`, `rows->rows` records from `tokenrace_shard_combine_top`), into `out`. `rows`
/// describes the same rows as in round 1. Takes no key.
///
/// # Safety
/// As `tokenrace_shard_top`; `combined` points to `rows->rows` records.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_shard_race(
    sampler: *mut tokenrace_sampler,
    rows: *const tokenrace_shard_rows,
    combined: *const tokenrace_shard_row,
    out: *mut tokenrace_shard_partial,
) -> tokenrace_status {
    guard("tokenrace_shard_race", || {
        // SAFETY: the caller's contract.
        unsafe {
            let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
            let r = rows_from_c(&read_versioned(rows, "rows")?)?;
            let c = slice(Owner::Batch, "combined", combined, r.rows).map_err(rows_named)?;
            let c: Vec<ShardRow> = c.iter().map(|&x| x.into()).collect();
            let mut p = vec![ShardPartial::default(); r.rows];
            s.inner.shard_race(&r, &c, &mut p)?;
            let o: Vec<tokenrace_shard_partial> = p.into_iter().map(Into::into).collect();
            write_out("out", out, &o)
        }
    })
}

/// The tokens (and, with non-NULL `flags`, the TOKENRACE_FLAG_* sets) of `rows` rows from their
/// combined first round and the round-2 partials of `ranks` ranks (`ranks * rows` records,
/// rank-major, any order; `ranks` 0 and `partials` NULL when no row races): what
/// `tokenrace_draw` of the whole rows returns, bit for bit. On failure nothing is written.
///
/// # Safety
/// `combined` points to `rows` records, `partials` to `ranks * rows`, `tokens` (and a non-NULL
/// `flags`) to `rows` writable elements.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_shard_finish(
    combined: *const tokenrace_shard_row,
    rows: u32,
    partials: *const tokenrace_shard_partial,
    ranks: u32,
    tokens: *mut i32,
    flags: *mut u32,
) -> tokenrace_status {
    let (rows, ranks) = (rows as usize, ranks as usize);
    guard("tokenrace_shard_finish", || {
        // SAFETY: the caller's contract.
        unsafe {
            let c = slice(Owner::Batch, "combined", combined, rows).map_err(rows_named)?;
            let c: Vec<ShardRow> = c.iter().map(|&x| x.into()).collect();
            let all = per_rank(partials, ranks, rows)?;
            let views: Vec<&[ShardPartial]> = all.iter().map(|p| &p[..]).collect();
            let (mut t, mut f) = (vec![0i32; rows], vec![0u32; rows]);
            finish(&c, &views, &mut t, Some(&mut f))?;
            write_out("tokens", tokens, &t)?;
            if !flags.is_null() {
                write_out("flags", flags, &f)?;
            }
            Ok(())
        }
    })
}

/// The state of one row's filter floor (min-p, top-k, top-p) in a sharded call, the same on every
/// rank: 56 bytes, made by `tokenrace_shard_cut_start`, advanced by `tokenrace_shard_cut_advance`
/// while `phase` is not 0 (TOKENRACE_SHARD_CUT_DONE), then raced with by `tokenrace_shard_race_cut`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct tokenrace_shard_cut {
    /// The row's floor (min-p's, top-k's, then top-p's threshold once found).
    pub floor: f32,
    /// The least value of the interval that holds the top-p threshold.
    pub lo: f32,
    /// The largest value of that interval.
    pub hi: f32,
    /// The row's top-p (1: off).
    pub top_p: f32,
    /// The row's maximum.
    pub m: f32,
    /// The 1/T the filters weigh at.
    pub inv_t: f32,
    /// 0: done; 1: a round binning by weight next; 2: a round splitting [lo, hi] by value; 3: a
    /// round sending the values in [lo, hi].
    pub phase: u32,
    /// Rounds done.
    pub step: u32,
    /// A hash of the row and of each round's outcome.
    pub fingerprint: u32,
    /// The combined row's round-2 fingerprint.
    pub row: u32,
    /// The kept mass above `hi`.
    pub above: f64,
    /// The kept mass.
    pub z: f64,
}

/// Bins per row of a `tokenrace_shard_mass` (and the most values of a values round).
pub const TOKENRACE_SHARD_CUT_BINS: usize = 64;

/// What one rank sends for one row in a round of the cut: 1320 bytes, a plain record to move
/// between ranks as bytes. In a values round `count[0]` is the number of values, in `low`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct tokenrace_shard_mass {
    /// Round (3), fingerprint, slice and key, as a partial.
    pub head: tokenrace_shard_partial,
    /// Per bin, the f64 mass of the rank's kept tokens in it.
    pub mass: [f64; 64],
    /// Per bin, their count.
    pub count: [u32; 64],
    /// Per bin, their least value (+inf: none).
    pub low: [f32; 64],
    /// Per bin, their largest value (-inf: none).
    pub high: [f32; 64],
}

// Field for field the library's records (same fields, same order, repr(C)).
const _: () = assert!(size_of::<tokenrace_shard_cut>() == size_of::<ShardCut>() && size_of::<ShardCut>() == 56);
const _: () = assert!(size_of::<tokenrace_shard_mass>() == size_of::<ShardMass>() && size_of::<ShardMass>() == 1320);
const _: () = assert!(TOKENRACE_SHARD_CUT_BINS == CUT_BINS);

fn cut_to_c(c: ShardCut) -> tokenrace_shard_cut {
    let ShardCut { floor, lo, hi, top_p, m, inv_t, phase, step, fingerprint, row, above, z } = c;
    tokenrace_shard_cut { floor, lo, hi, top_p, m, inv_t, phase, step, fingerprint, row, above, z }
}

fn cut_from_c(c: tokenrace_shard_cut) -> ShardCut {
    let tokenrace_shard_cut { floor, lo, hi, top_p, m, inv_t, phase, step, fingerprint, row, above, z } = c;
    ShardCut { floor, lo, hi, top_p, m, inv_t, phase, step, fingerprint, row, above, z }
}

fn mass_to_c(x: ShardMass) -> tokenrace_shard_mass {
    let ShardMass { head, mass, count, low, high } = x;
    tokenrace_shard_mass { head: head.into(), mass, count, low, high }
}

fn mass_from_c(x: tokenrace_shard_mass) -> ShardMass {
    let tokenrace_shard_mass { head, mass, count, low, high } = x;
    ShardMass { head: head.into(), mass, count, low, high }
}

/// `n` records at `ptr` (non-NULL when `n > 0`) under `name`.
///
/// # Safety
/// A non-NULL `ptr` points to `n` records.
unsafe fn records<'a, T>(name: &'static str, ptr: *const T, n: usize) -> Result<&'a [T]> {
    // SAFETY: the caller's contract.
    unsafe { slice(Owner::Batch, name, ptr, n) }.map_err(|e| {
        let message = e.message.replacen("batch.", "", 1);
        Error { message, ..e }
    })
}

/// The top-k candidates of this rank (round 1 of a call with top-k, sent with the partials): per
/// row its slice's `width` largest finite values, descending, padded with -inf, into `out`
/// (`rows->rows * width` floats). `width` is at least every row's top-k, the same on every rank.
///
/// # Safety
/// `rows` is a valid struct whose pointers cover their elements; `out` points to
/// `rows->rows * width` writable floats.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_shard_top_k_candidates(
    rows: *const tokenrace_shard_rows,
    width: u32,
    out: *mut f32,
) -> tokenrace_status {
    guard("tokenrace_shard_top_k_candidates", || {
        // SAFETY: the caller's contract.
        unsafe {
            let r = rows_from_c(&read_versioned(rows, "rows")?)?;
            let mut c = crate::alloc::filled(r.rows * width as usize, 0f32, "top-k candidates")?;
            top_k_candidates(&r, width as usize, &mut c)?;
            write_out("out", out, &c)
        }
    })
}

/// The first state of each row's floor (`out`, `rows->rows` records), the same on every rank:
/// min-p's floor, top-k's k-th value from the ranks' candidates (`candidates`: `ranks` ranks'
/// `tokenrace_shard_top_k_candidates` of `width` per row, rank-major; NULL with `ranks` 0 when no
/// row has top-k) and, for rows with top-p, the interval to search. Takes no key.
///
/// # Safety
/// As `tokenrace_shard_race`; `candidates` points to `ranks * rows->rows * width` floats; `out` to
/// `rows->rows` writable records.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_shard_cut_start(
    sampler: *mut tokenrace_sampler,
    rows: *const tokenrace_shard_rows,
    combined: *const tokenrace_shard_row,
    candidates: *const f32,
    ranks: u32,
    width: u32,
    out: *mut tokenrace_shard_cut,
) -> tokenrace_status {
    guard("tokenrace_shard_cut_start", || {
        // SAFETY: the caller's contract.
        unsafe {
            let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
            let r = rows_from_c(&read_versioned(rows, "rows")?)?;
            let c = records("combined", combined, r.rows)?;
            let c: Vec<ShardRow> = c.iter().map(|&x| x.into()).collect();
            let per = r.rows.checked_mul(width as usize).ok_or_else(|| Error::invalid_argument("width: overflows"))?;
            let total = per.checked_mul(ranks as usize).ok_or_else(|| Error::invalid_argument("ranks: overflows"))?;
            let all = records("candidates", candidates, total)?;
            let views: Vec<&[f32]> = (0..ranks as usize).map(|q| &all[q * per..(q + 1) * per]).collect();
            let mut cuts = vec![ShardCut::default(); r.rows];
            s.inner.shard_cut_start(&r, &c, &views, &mut cuts)?;
            let o: Vec<tokenrace_shard_cut> = cuts.into_iter().map(cut_to_c).collect();
            write_out("out", out, &o)
        }
    })
}

/// Whether any of `rows` cuts needs another round: 1 if so, 0 if not (then race), into `pending`.
///
/// # Safety
/// `cuts` points to `rows` records; `pending` to one writable u32.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_shard_cut_pending(
    cuts: *const tokenrace_shard_cut,
    rows: u32,
    pending: *mut u32,
) -> tokenrace_status {
    guard("tokenrace_shard_cut_pending", || {
        // SAFETY: the caller's contract.
        unsafe {
            let c = records("cuts", cuts, rows as usize)?;
            let any = c.iter().any(|c| c.phase != 0) as u32;
            write_out("pending", pending, &[any])
        }
    })
}

/// One round of the cut on this rank: per row the histogram (or values) of its slice in the cut's
/// interval, into `out` (`rows->rows` records; rows whose cut is done get an empty one).
///
/// # Safety
/// As `tokenrace_shard_race`; `cuts` points to `rows->rows` records, `out` to as many writable.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_shard_cut_round(
    sampler: *mut tokenrace_sampler,
    rows: *const tokenrace_shard_rows,
    cuts: *const tokenrace_shard_cut,
    out: *mut tokenrace_shard_mass,
) -> tokenrace_status {
    guard("tokenrace_shard_cut_round", || {
        // SAFETY: the caller's contract.
        unsafe {
            let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
            let r = rows_from_c(&read_versioned(rows, "rows")?)?;
            let c: Vec<ShardCut> = records("cuts", cuts, r.rows)?.iter().map(|&x| cut_from_c(x)).collect();
            let mut m = vec![ShardMass::default(); r.rows];
            s.inner.shard_cut_round(&r, &c, &mut m)?;
            let o: Vec<tokenrace_shard_mass> = m.into_iter().map(mass_to_c).collect();
            write_out("out", out, &o)
        }
    })
}

/// Advances the `rows` cuts (in place, the same on every rank) by the round's records of `ranks`
/// ranks (`masses`: `ranks * rows`, rank-major, any order). On failure nothing changes.
///
/// # Safety
/// `cuts` points to `rows` records (read and written), `masses` to `ranks * rows`.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_shard_cut_advance(
    cuts: *mut tokenrace_shard_cut,
    rows: u32,
    masses: *const tokenrace_shard_mass,
    ranks: u32,
) -> tokenrace_status {
    let (rows, ranks) = (rows as usize, ranks as usize);
    guard("tokenrace_shard_cut_advance", || {
        // SAFETY: the caller's contract.
        unsafe {
            let mut c: Vec<ShardCut> = records("cuts", cuts, rows)?.iter().map(|&x| cut_from_c(x)).collect();
            let total = ranks.checked_mul(rows).ok_or_else(|| Error::invalid_argument("ranks: overflows"))?;
            let all: Vec<ShardMass> = records("masses", masses, total)?.iter().map(|&x| mass_from_c(x)).collect();
            let views: Vec<&[ShardMass]> = (0..ranks).map(|q| &all[q * rows..(q + 1) * rows]).collect();
            cut_advance(&mut c, &views)?;
            let o: Vec<tokenrace_shard_cut> = c.into_iter().map(cut_to_c).collect();
            write_out("cuts", cuts, &o)
        }
    })
}

/// Round 2 with the floors of the rows' finished cuts (`cuts`, every one done): as
/// `tokenrace_shard_race`, for rows with min-p, top-k and top-p.
///
/// # Safety
/// As `tokenrace_shard_race`; `cuts` points to `rows->rows` records.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_shard_race_cut(
    sampler: *mut tokenrace_sampler,
    rows: *const tokenrace_shard_rows,
    combined: *const tokenrace_shard_row,
    cuts: *const tokenrace_shard_cut,
    out: *mut tokenrace_shard_partial,
) -> tokenrace_status {
    guard("tokenrace_shard_race_cut", || {
        // SAFETY: the caller's contract.
        unsafe {
            let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
            let r = rows_from_c(&read_versioned(rows, "rows")?)?;
            let c: Vec<ShardRow> = records("combined", combined, r.rows)?.iter().map(|&x| x.into()).collect();
            let k: Vec<ShardCut> = records("cuts", cuts, r.rows)?.iter().map(|&x| cut_from_c(x)).collect();
            let mut p = vec![ShardPartial::default(); r.rows];
            s.inner.shard_race_cut(&r, &c, &k, &mut p)?;
            let o: Vec<tokenrace_shard_partial> = p.into_iter().map(Into::into).collect();
            write_out("out", out, &o)
        }
    })
}

/// One rank's part of a row's logprobs: 64 bytes, a plain record sent with the race partials.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct tokenrace_shard_logprob_partial {
    /// Round (4), fingerprint, slice and key as a partial; `value`, `token`: this rank's race
    /// winner (-1: none).
    pub head: tokenrace_shard_partial,
    /// The slice's mass over the logprobs' set.
    pub z: f64,
    /// The logprobs' scale.
    pub s: f32,
    /// The set's floor.
    pub floor: f32,
    /// The slice's count of +inf values.
    pub posinf: u32,
    /// 0.
    pub reserved: u32,
}

/// A top-n candidate: a value and its global id (-1: none). 8 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct tokenrace_shard_top_entry {
    /// The token's value.
    pub value: f32,
    /// Its global id.
    pub token: i32,
}

const _: () = assert!(size_of::<tokenrace_shard_logprob_partial>() == size_of::<ShardLogprobPartial>());
const _: () = assert!(size_of::<ShardLogprobPartial>() == 64 && size_of::<ShardTopEntry>() == 8);

fn lp_to_c(p: ShardLogprobPartial) -> tokenrace_shard_logprob_partial {
    let ShardLogprobPartial { head, z, s, floor, posinf, reserved } = p;
    tokenrace_shard_logprob_partial { head: head.into(), z, s, floor, posinf, reserved }
}

fn lp_from_c(p: tokenrace_shard_logprob_partial) -> ShardLogprobPartial {
    let tokenrace_shard_logprob_partial { head, z, s, floor, posinf, reserved } = p;
    ShardLogprobPartial { head: head.into(), z, s, floor, posinf, reserved }
}

fn mode_of(mode: u32) -> Result<LogprobMode> {
    let m: tokenrace_logprob_mode = arg_enum(Owner::Output, "mode", mode).map_err(|e| {
        let message = e.message.replacen("output.", "", 1);
        Error { message, ..e }
    })?;
    Ok(m.into())
}

/// This rank's logprob partials (`out`, `rows->rows` records) and its `top_n` best tokens per
/// row (`top`, `rows->rows * top_n` entries) for the logprobs of `mode` (a
/// `tokenrace_logprob_mode`), from the combined rows, the rows' finished cuts and this rank's
/// own race partials (`races`: what `tokenrace_shard_race_cut` wrote here; NULL when no row
/// races). Sent with the race partials.
///
/// # Safety
/// As `tokenrace_shard_race_cut`; `races` points to `rows->rows` records or is NULL; `out` and
/// `top` to as many writable records as said.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_shard_logprob_partials(
    sampler: *mut tokenrace_sampler,
    rows: *const tokenrace_shard_rows,
    combined: *const tokenrace_shard_row,
    cuts: *const tokenrace_shard_cut,
    races: *const tokenrace_shard_partial,
    mode: u32,
    top_n: u32,
    out: *mut tokenrace_shard_logprob_partial,
    top: *mut tokenrace_shard_top_entry,
) -> tokenrace_status {
    guard("tokenrace_shard_logprob_partials", || {
        // SAFETY: the caller's contract.
        unsafe {
            let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
            let mode = mode_of(mode)?;
            let r = rows_from_c(&read_versioned(rows, "rows")?)?;
            let c: Vec<ShardRow> = records("combined", combined, r.rows)?.iter().map(|&x| x.into()).collect();
            let k: Vec<ShardCut> = records("cuts", cuts, r.rows)?.iter().map(|&x| cut_from_c(x)).collect();
            let mine: Vec<ShardPartial> = if races.is_null() {
                vec![ShardPartial { token: -1, ..Default::default() }; r.rows]
            } else {
                records("races", races, r.rows)?.iter().map(|&x| x.into()).collect()
            };
            let n = top_n as usize;
            let total = r.rows.checked_mul(n).ok_or_else(|| Error::invalid_argument("top_n: overflows"))?;
            let mut p = vec![ShardLogprobPartial::default(); r.rows];
            let mut t = vec![ShardTopEntry::default(); total];
            s.inner.shard_logprob_partials(&r, &c, &k, &mine, mode, n, &mut p, &mut t)?;
            let p: Vec<tokenrace_shard_logprob_partial> = p.into_iter().map(lp_to_c).collect();
            let t: Vec<tokenrace_shard_top_entry> =
                t.into_iter().map(|e| tokenrace_shard_top_entry { value: e.value, token: e.token }).collect();
            write_out("out", out, &p)?;
            write_out("top", top, &t)
        }
    })
}

/// The logprob of each row's sampled token (`tokens`, from `tokenrace_shard_finish`) into
/// `logprobs` (`rows` floats), and, with `top_n > 0`, the top-n ids and logprobs into `top_ids`
/// and `top_logprobs` (`rows * top_n` each), from the logprob partials and top-n candidates of
/// `ranks` ranks (`ranks * rows` and `ranks * rows * top_n` records, rank-major, any order).
/// Within 1e-5 of `tokenrace_draw`'s logprobs (docs/semantics.md). On failure nothing is written.
///
/// # Safety
/// The pointers cover the records said; `top_ids` and `top_logprobs` may be NULL when `top_n`
/// is 0.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_shard_logprobs(
    combined: *const tokenrace_shard_row,
    rows: u32,
    tokens: *const i32,
    partials: *const tokenrace_shard_logprob_partial,
    tops: *const tokenrace_shard_top_entry,
    ranks: u32,
    mode: u32,
    top_n: u32,
    logprobs: *mut f32,
    top_ids: *mut i32,
    top_logprobs: *mut f32,
) -> tokenrace_status {
    let (rows, ranks, n) = (rows as usize, ranks as usize, top_n as usize);
    guard("tokenrace_shard_logprobs", || {
        // SAFETY: the caller's contract.
        unsafe {
            let mode = mode_of(mode)?;
            let c: Vec<ShardRow> = records("combined", combined, rows)?.iter().map(|&x| x.into()).collect();
            let t = records("tokens", tokens, rows)?;
            let per = rows.checked_mul(n).ok_or_else(|| Error::invalid_argument("top_n: overflows"))?;
            let all_p: Vec<ShardLogprobPartial> =
                records("partials", partials, ranks * rows)?.iter().map(|&x| lp_from_c(x)).collect();
            let all_t: Vec<ShardTopEntry> = records("tops", tops, ranks * per)?
                .iter()
                .map(|e| ShardTopEntry { value: e.value, token: e.token })
                .collect();
            let pv: Vec<&[ShardLogprobPartial]> = (0..ranks).map(|q| &all_p[q * rows..(q + 1) * rows]).collect();
            let tv: Vec<&[ShardTopEntry]> = (0..ranks).map(|q| &all_t[q * per..(q + 1) * per]).collect();
            let (mut lps, mut ids, mut tl) = (vec![0f32; rows], vec![0i32; per], vec![0f32; per]);
            shard_logprobs(&c, t, &pv, &tv, mode, n, &mut lps, &mut ids, &mut tl)?;
            write_out("logprobs", logprobs, &lps)?;
            write_out("top_ids", top_ids, &ids)?;
            write_out("top_logprobs", top_logprobs, &tl)
        }
    })
}
