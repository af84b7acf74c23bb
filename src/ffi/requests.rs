//! The C functions of the request state (`tokenrace_requests`): the histories of the live
//! requests, kept between draws (`src/requests/`), which `tokenrace_draw` reads through the
//! batch's `requests` and `request_ids`.

use super::panic::{guard, guard_void};
use super::types::tokenrace_status;
use crate::error::{Error, Result};
use crate::requests::Requests;
use parking_lot::RwLock;

/// An opaque request state: the prompt and output histories of the live requests, keyed by a
/// caller-chosen `uint64_t` id. Safe to use from several threads at once: it holds a
/// reader-writer lock, which draws that name it take shared (any number at once) and
/// `tokenrace_requests_add`, `_remove`, `_append` and `_reset` take exclusive (each waits for the
/// draws in progress). A host that appends after each draw on one thread never waits.
pub struct tokenrace_requests {
    pub(crate) inner: RwLock<Requests>,
}

/// A slice from a caller's pointer to `len` elements (NULL only for zero), named `field` in
/// errors.
///
/// # Safety
/// A non-NULL `ptr` points to `len` readable elements that outlive `'a`.
unsafe fn given<'a, T>(field: &str, ptr: *const T, len: u64) -> Result<&'a [T]> {
    let len = usize::try_from(len).map_err(|_| Error::invalid_argument(format!("{field}: {len} elements overflow")))?;
    if ptr.is_null() {
        return if len == 0 { Ok(&[]) } else { Err(Error::invalid_argument(format!("{field}: is NULL"))) };
    }
    if !(ptr as usize).is_multiple_of(align_of::<T>()) {
        return Err(Error::invalid_argument(format!("{field}: is not aligned to {} bytes", align_of::<T>())));
    }
    let fits = len
        .checked_mul(size_of::<T>())
        .is_some_and(|bytes| bytes <= isize::MAX as usize && (ptr as usize).checked_add(bytes).is_some());
    if !fits {
        return Err(Error::invalid_argument(format!("{field}: {len} elements overflow the address space")));
    }
    // SAFETY: non-NULL, aligned, and `len` elements long by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// The state behind a handle, or an error naming `requests`.
///
/// # Safety
/// `requests` is NULL or a live handle.
unsafe fn state<'a>(requests: *const tokenrace_requests) -> Result<&'a tokenrace_requests> {
    // SAFETY: NULL or live (the caller's contract).
    unsafe { requests.as_ref() }.ok_or_else(|| Error::invalid_argument("requests: is NULL"))
}

/// Makes an empty request state into `*out`.
///
/// # Safety
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_requests_new(out: *mut *mut tokenrace_requests) -> tokenrace_status {
    guard("tokenrace_requests_new", || {
        if out.is_null() {
            return Err(Error::invalid_argument("out: is NULL"));
        }
        let state = Box::new(tokenrace_requests { inner: RwLock::new(Requests::new()) });
        // SAFETY: `out` is writable (the caller's contract) and not NULL (checked).
        unsafe { out.write(Box::into_raw(state)) };
        Ok(())
    })
}

/// Releases a request state and every request it holds (NULL is ignored). No call may be using
/// it.
///
/// # Safety
/// `requests` is NULL or came from `tokenrace_requests_new()` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_requests_free(requests: *mut tokenrace_requests) {
    if !requests.is_null() {
        // SAFETY: it came from `tokenrace_requests_new` and is not used again (the caller's
        // contract).
        guard_void(|| drop(unsafe { Box::from_raw(requests) }));
    }
}

/// Adds request `id` with its prompt (`prompt_len` token ids) and the output it has so far
/// (`output_len` ids; 0 for a new request), copied. Ids are >= 0; each draw that names the
/// request checks them against its vocab. Refused (INVALID_ARGUMENT) when `id` is already live.
/// Costs O(prompt_len + output_len).
///
/// # Safety
/// `requests` is NULL or live; non-NULL `prompt` and `output` cover their lengths.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_requests_add(
    requests: *mut tokenrace_requests,
    id: u64,
    prompt: *const i32,
    prompt_len: u64,
    output: *const i32,
    output_len: u64,
) -> tokenrace_status {
    guard("tokenrace_requests_add", || {
        // SAFETY: the caller's contract for every pointer.
        unsafe {
            let s = state(requests)?;
            let (prompt, output) = (given("prompt", prompt, prompt_len)?, given("output", output, output_len)?);
            s.inner.write().add(id, prompt, output)
        }
    })
}

/// Removes request `id` and frees its histories. Refused (INVALID_ARGUMENT) when `id` is not
/// live.
///
/// # Safety
/// `requests` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_requests_remove(requests: *mut tokenrace_requests, id: u64) -> tokenrace_status {
    guard("tokenrace_requests_remove", || {
        // SAFETY: the caller's contract.
        unsafe { state(requests) }?.inner.write().remove(id)
    })
}

/// Removes every request.
///
/// # Safety
/// `requests` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_requests_reset(requests: *mut tokenrace_requests) -> tokenrace_status {
    guard("tokenrace_requests_reset", || {
        // SAFETY: the caller's contract.
        unsafe { state(requests) }?.inner.write().reset();
        Ok(())
    })
}

/// Appends new output tokens to `n` requests at once: request `ids[i]` gets
/// `tokens[offsets[i] .. offsets[i + 1]]` (`offsets`: n + 1 non-decreasing entries; a verify
/// call's accepted tokens), or `tokens[i]` alone when `offsets` is NULL (a draw's `out.tokens`).
/// A request named twice gets both, in order. Every id must be live and every token >= 0: a
/// refused call appends nothing. Costs O(n + new tokens). A draw never appends by itself: call
/// this with its tokens once the host keeps them (a host may also drop a drawn token).
///
/// # Safety
/// `requests` is NULL or live; `ids` covers `n` entries, `offsets` (if not NULL) `n + 1`, and
/// `tokens` `n` (NULL offsets) or `offsets[n]`.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_requests_append(
    requests: *mut tokenrace_requests,
    n: u64,
    ids: *const u64,
    tokens: *const i32,
    offsets: *const u64,
) -> tokenrace_status {
    guard("tokenrace_requests_append", || {
        // SAFETY: the caller's contract for every pointer.
        unsafe {
            let s = state(requests)?;
            let ids = given("ids", ids, n)?;
            let (offsets, count) = if offsets.is_null() {
                (None, n)
            } else {
                let o = given("offsets", offsets, n.saturating_add(1))?;
                (Some(o), o[o.len() - 1])
            };
            let tokens = given("tokens", tokens, count)?;
            s.inner.write().append(ids, tokens, offsets)
        }
    })
}

/// Writes how many requests the state holds into `*out`.
///
/// # Safety
/// `requests` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_requests_len(
    requests: *const tokenrace_requests,
    out: *mut u64,
) -> tokenrace_status {
    guard("tokenrace_requests_len", || {
        // SAFETY: the caller's contract.
        let s = unsafe { state(requests) }?;
        if out.is_null() {
            return Err(Error::invalid_argument("out: is NULL"));
        }
        // SAFETY: writable and not NULL.
        unsafe { out.write(s.inner.read().len() as u64) };
        Ok(())
    })
}

/// Writes the output length of request `id` into `*out`, or `UINT64_MAX` when `id` is not live.
///
/// # Safety
/// `requests` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_requests_output_len(
    requests: *const tokenrace_requests,
    id: u64,
    out: *mut u64,
) -> tokenrace_status {
    guard("tokenrace_requests_output_len", || {
        // SAFETY: the caller's contract.
        let s = unsafe { state(requests) }?;
        if out.is_null() {
            return Err(Error::invalid_argument("out: is NULL"));
        }
        let len = s.inner.read().output(id).map_or(u64::MAX, |o| o.len() as u64);
        // SAFETY: writable and not NULL.
        unsafe { out.write(len) };
        Ok(())
    })
}
