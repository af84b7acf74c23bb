//! The combination of the ranks' partials of a row, in any order of the ranks, and the checks
//! that they belong together: the same row of the same call (fingerprint, key, round), and
//! slices that tile the row exactly.

use super::{race_fingerprint, ShardPartial, ShardRow, ROUND_RACE, ROUND_TOP};
use crate::alloc;
use crate::batch::flags;
use crate::error::{Error, Result};
use crate::kernels::Best;

/// Combines the first-round partials of all ranks (`partials[rank]`, one per row, each as long
/// as `out`) into one [`ShardRow`] per row: the row's maximum and the lowest global id holding
/// it, its flags, its fingerprint and key. The ranks may come in any order. Fails (writing
/// nothing) when the partials are not of round 1, differ in fingerprint or key, or their slices
/// do not tile `[0, vocab_size)` exactly.
pub fn combine_top(partials: &[&[ShardPartial]], out: &mut [ShardRow]) -> Result<()> {
    let rows = out.len();
    check_ranks(partials, rows)?;
    let combined = alloc::collect((0..rows).map(|r| combine_row(partials, r)), "the combined rows")?;
    for (o, c) in out.iter_mut().zip(combined) {
        *o = c?;
    }
    Ok(())
}

fn combine_row(partials: &[&[ShardPartial]], r: usize) -> Result<ShardRow> {
    let first = check_row(partials, r, ROUND_TOP, partials[0][r].fingerprint)?;
    let mut top = f32::NEG_INFINITY;
    let mut has_nan = false;
    for p in partials {
        let p = &p[r];
        // NaN never is a maximum: each slice's value is already NaN-free.
        if p.value > top {
            top = p.value;
        }
        has_nan |= p.flags & flags::HAS_NAN != 0;
    }
    // As the unsharded draw: a largest zero is +0 whichever zero the slices held.
    let top = top + 0.0;
    // The lowest id holding the maximum: each slice sent its first; equal values compare equal
    // across ranks (+0 == -0), as the unsharded search's comparison does.
    let token =
        partials.iter().map(|p| p[r]).filter(|p| p.token >= 0 && p.value == top).map(|p| p.token).min().unwrap_or(0);
    let mut fl = (first.flags & flags::GREEDY) | if has_nan { flags::HAS_NAN } else { 0 };
    if top == f32::INFINITY {
        fl |= flags::HAS_POSINF;
    } else if top == f32::NEG_INFINITY {
        fl |= flags::EMPTY;
    }
    let token = if fl & flags::EMPTY != 0 { 0 } else { token };
    Ok(ShardRow { top, token, flags: fl, fingerprint: first.fingerprint, key: first.key })
}

/// The token and flags of every row from its combined first round (`rows`) and the second-round
/// partials of all ranks (`partials[rank]`, one per row; none at all when no row races), into
/// `tokens` and `flags` (each at least as long as `rows`): bit for bit what the unsharded draw
/// of the whole rows returns. Fails (writing nothing) when a partial is not of round 2 of these
/// rows or the slices do not tile the row.
pub fn finish(
    rows: &[ShardRow],
    partials: &[&[ShardPartial]],
    tokens: &mut [i32],
    row_flags: Option<&mut [u32]>,
) -> Result<()> {
    let n = rows.len();
    if tokens.len() < n {
        return Err(Error::invalid_argument(format!("tokens: {} elements for {n} rows", tokens.len())));
    }
    if let Some(f) = &row_flags {
        if f.len() < n {
            return Err(Error::invalid_argument(format!("flags: {} elements for {n} rows", f.len())));
        }
    }
    if partials.is_empty() {
        if let Some(r) = rows.iter().position(ShardRow::races) {
            return Err(Error::invalid_argument(format!(
                "partials: none given, but row {r} races (a sampling row with a finite maximum)"
            )));
        }
    } else {
        check_ranks(partials, n)?;
    }
    let drawn = alloc::collect(
        rows.iter().enumerate().map(|(r, row)| {
            if partials.is_empty() {
                return Ok(row.token);
            }
            check_row(partials, r, ROUND_RACE, race_fingerprint(row))?;
            if row.key != partials[0][r].key {
                return Err(Error::invalid_argument(format!(
                    "partials[0][{r}].key: {:#x} is not the combined row's key {:#x}",
                    partials[0][r].key, row.key
                )));
            }
            if !row.races() {
                return Ok(row.token);
            }
            let best = partials.iter().fold(Best::NONE, |b, p| {
                let p = p[r];
                let theirs = if p.token < 0 { Best::NONE } else { Best { key: p.value, token: p.token as usize } };
                b.merge(theirs)
            });
            // No key above -inf: the first maximum, as the unsharded draw falls back to.
            Ok(if best.token == usize::MAX { row.token } else { best.token as i32 })
        }),
        "the sharded tokens",
    )?;
    let drawn: Vec<i32> = drawn.into_iter().collect::<Result<_>>()?;
    tokens[..n].copy_from_slice(&drawn);
    if let Some(f) = row_flags {
        for (f, row) in f[..n].iter_mut().zip(rows) {
            *f = row.flags;
        }
    }
    Ok(())
}

/// Every rank has a partial per row.
fn check_ranks(partials: &[&[ShardPartial]], rows: usize) -> Result<()> {
    if partials.is_empty() {
        return Err(Error::invalid_argument("partials: no rank given"));
    }
    if let Some(q) = partials.iter().position(|p| p.len() != rows) {
        return Err(Error::invalid_argument(format!("partials[{q}]: {} partials for {rows} rows", partials[q].len())));
    }
    Ok(())
}

/// Checks that the partials of row `r` are of `round`, carry `fingerprint`, one key and one
/// vocabulary size, and that their slices tile `[0, vocab_size)`; returns rank 0's.
pub(super) fn check_row(partials: &[&[ShardPartial]], r: usize, round: u32, fingerprint: u32) -> Result<ShardPartial> {
    let first = partials[0][r];
    for (q, p) in partials.iter().enumerate() {
        let p = p[r];
        let wrong =
            |what: String| Err(Error::invalid_argument(format!("partials[{q}][{r}] (rank {q}, row {r}): {what}")));
        if p.round != round {
            return wrong(format!("is of round {}, not {round}", p.round));
        }
        if p.fingerprint != fingerprint {
            return wrong(format!(
                "its fingerprint {:#010x} is not {fingerprint:#010x}: a partial of another row, call or settings",
                p.fingerprint
            ));
        }
        if p.key != first.key || p.vocab_size != first.vocab_size {
            return wrong(format!(
                "its key {:#x} and vocab_size {} differ from rank 0's {:#x} and {} (ranks whose key streams differ?)",
                p.key, p.vocab_size, first.key, first.vocab_size
            ));
        }
    }
    let mut slices: Vec<(u64, u64, usize)> =
        partials.iter().enumerate().map(|(q, p)| (u64::from(p[r].vocab_start), u64::from(p[r].slice_len), q)).collect();
    slices.sort_unstable();
    let mut next = 0u64;
    for &(start, len, q) in &slices {
        if start != next {
            return Err(Error::invalid_argument(format!(
                "partials[{q}][{r}] (rank {q}, row {r}): its slice starts at {start}, where {} the slices of the \
                 other ranks {}",
                next,
                if start < next { "overlaps" } else { "leaves a gap after" }
            )));
        }
        next = start + len;
    }
    if next != u64::from(first.vocab_size) {
        return Err(Error::invalid_argument(format!(
            "partials[..][{r}] (row {r}): the slices cover [0, {next}), not the row [0, {})",
            first.vocab_size
        )));
    }
    Ok(first)
}
