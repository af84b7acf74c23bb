//! `tokenrace_draw_greedy`: greedy rows without the general batch. A greedy call of a few rows
//! is mostly its fixed cost, and most of `tokenrace_draw`'s is the general batch and output
//! (about 70 fields read, converted and checked for overlaps) whose fields such a call leaves
//! NULL; this call reads the logits and writes the tokens and flags, drawn by the same code.

use super::api::tokenrace_sampler;
use super::convert::{arg_enum, read_versioned};
use super::draw::logits_from_c;
use super::panic::guard;
use super::types::{tokenrace_dtype, tokenrace_status};
use crate::batch::{Batch, Logits, Output};
use crate::error::{Error, Owner, Result};
use std::ffi::c_void;
use std::ops::Range;

/// The rows of a `tokenrace_draw_greedy()` call: the logits alone, as `tokenrace_batch` gives
/// them. Zero-initialise, set `struct_size = sizeof(tokenrace_greedy_batch)`, then the fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tokenrace_greedy_batch {
    /// sizeof(tokenrace_greedy_batch) as the caller knows it.
    pub struct_size: u32,
    /// A `tokenrace_dtype` of the logits.
    pub dtype: u32,
    /// `rows` rows of `vocab` values, `row_stride` elements apart, as `tokenrace_batch.logits`.
    pub logits: *const c_void,
    /// Rows in this call (at most the sampler's max_rows).
    pub rows: u32,
    /// Tokens per row (the sampler's vocab_size, unless that is 0).
    pub vocab: u32,
    /// Elements between the starts of two rows (at least `vocab`; 0 means `vocab`).
    pub row_stride: u64,
}

/// Draws each row's greedy token: its first largest value, NaN ignored (token 0 for a row of
/// NaN and -inf only, flagged `TOKENRACE_FLAG_EMPTY`), the same token and flags as
/// `tokenrace_draw()` gives the same rows at a temperature below the sampler's `greedy_below`
/// with no other field set (docs/semantics.md, "Greedy rows"), on any SIMD level and thread
/// count. Rows go to the sampler's threads as a draw's do; no noise or key is taken, and the
/// call counts as a draw in the sampler's stats (every row greedy).
///
/// `tokens` receives `batch->rows` token ids; `flags` is NULL or receives `batch->rows`
/// TOKENRACE_FLAG_* sets. Neither may share memory with the logits or with each other. On
/// failure nothing is written and `tokenrace_last_error()` names the argument, e.g.
/// `tokenrace_draw_greedy: batch.vocab: 1000 differs from the sampler's vocab_size 32000`.
///
/// # Safety
/// `sampler` is a live sampler; `batch` points to a valid struct whose logits cover the rows
/// its sizes say; `tokens` (and `flags`, when not NULL) point to `batch->rows` writable elements.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_draw_greedy(
    sampler: *mut tokenrace_sampler,
    batch: *const tokenrace_greedy_batch,
    tokens: *mut i32,
    flags: *mut u32,
) -> tokenrace_status {
    guard("tokenrace_draw_greedy", || {
        // SAFETY: the caller's contract for `sampler`, `batch`, `tokens` and `flags`.
        unsafe {
            let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
            let rejected = |e: Error| {
                s.inner.count_rejected();
                e
            };
            let b = read_versioned(batch, "batch").map_err(rejected)?;
            let batch = greedy_batch_from_c(&b).map_err(rejected)?;
            let rows = batch.rows;
            let tokens_out = slice_mut_named("tokens", tokens, rows).map_err(rejected)?;
            let flags_out =
                if flags.is_null() { None } else { Some(slice_mut_named("flags", flags, rows).map_err(rejected)?) };
            refuse_overlaps(&batch, tokens_out, flags_out.as_deref()).map_err(rejected)?;
            let mut out = Output { flags: flags_out, ..Output::new(tokens_out) };
            s.inner.draw_greedy(&batch, &mut out)
        }
    })
}

/// The Rust batch of a C greedy batch: its logits, the rest off.
///
/// # Safety
/// A non-NULL `b.logits` covers the rows its sizes say, for `'a`.
unsafe fn greedy_batch_from_c<'a>(b: &tokenrace_greedy_batch) -> Result<Batch<'a>> {
    let (rows, vocab) = (b.rows as usize, b.vocab as usize);
    let stride = if b.row_stride == 0 { vocab } else { usize::try_from(b.row_stride).unwrap_or(usize::MAX) };
    let dtype: tokenrace_dtype = arg_enum(Owner::Batch, "dtype", b.dtype)?;
    // SAFETY: the caller's contract.
    let logits = unsafe { logits_from_c(dtype, b.logits, rows, vocab, stride)? };
    Ok(Batch { row_stride: stride, ..Batch::new(logits, rows, vocab) })
}

/// A caller's output array of `len` elements, refused (NULL, misaligned, past the end of the
/// address space) with `name`, the argument's own name: this call has no output struct.
///
/// # Safety
/// A non-NULL `ptr` points to `len` writable elements that outlive `'a`.
unsafe fn slice_mut_named<'a, T>(name: &'static str, ptr: *mut T, len: usize) -> Result<&'a mut [T]> {
    if len == 0 {
        return Ok(&mut []);
    }
    let why = if ptr.is_null() {
        "is NULL".to_string()
    } else if !(ptr as usize).is_multiple_of(align_of::<T>()) {
        format!("is not aligned to {} bytes", align_of::<T>())
    } else if (ptr as usize).checked_add(len * size_of::<T>()).is_none() {
        format!("{len} elements from {ptr:p} overflow the address space")
    } else {
        // SAFETY: non-NULL, aligned, `len` elements (len < 2^32, so the byte count fits) within
        // the address space, writable by the caller's contract.
        return Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) });
    };
    Err(Error::invalid_argument(format!("{name}: {why}")))
}

/// The bytes of a slice.
fn bytes<T>(s: &[T]) -> Range<usize> {
    let start = s.as_ptr() as usize;
    start..start + std::mem::size_of_val(s)
}

/// Refuses outputs that share memory with the logits or with each other: a draw would read
/// values it had overwritten.
fn refuse_overlaps(batch: &Batch, tokens: &[i32], flags: Option<&[u32]>) -> Result<()> {
    let logits = match batch.logits {
        Logits::F32(s) => bytes(s),
        Logits::Bf16(s) => bytes(s),
        Logits::F16(s) => bytes(s),
    };
    let meet =
        |a: &Range<usize>, b: &Range<usize>| !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end;
    let tokens = bytes(tokens);
    let clash = |name: &str, what: &str, a: &Range<usize>, b: &Range<usize>| {
        Error::invalid_argument(format!(
            "{name}: overlaps {what} (bytes {:#x}..{:#x} and {:#x}..{:#x}): an output may share memory with no \
             input and no other output",
            a.start, a.end, b.start, b.end
        ))
    };
    if meet(&tokens, &logits) {
        return Err(clash("tokens", "batch.logits", &tokens, &logits));
    }
    if let Some(flags) = flags.map(bytes) {
        if meet(&flags, &logits) {
            return Err(clash("flags", "batch.logits", &flags, &logits));
        }
        if meet(&flags, &tokens) {
            return Err(clash("flags", "tokens", &flags, &tokens));
        }
    }
    Ok(())
}
