//! The C functions of vocabulary-sharded sampling (`crate::shard`, `docs/semantics.md`,
//! "Sharded rows"): a rank's two rounds on its slice, and the combinations of the ranks'
//! partials. The library moves no bytes between ranks: the caller gathers the partials (an
//! all_gather of `ranks * rows` records, rank-major) and passes them back.

use super::api::tokenrace_sampler;
use super::convert::{opt_slice, read_versioned, slice};
use super::panic::guard;
use super::types::tokenrace_status;
use crate::error::{Error, Owner, Result};
use crate::shard::{combine_top, finish, ShardPartial, ShardRow, ShardRows};

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
            top_k: None,
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
