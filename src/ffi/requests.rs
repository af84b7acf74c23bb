//! The C functions of the request state (`tokenrace_requests`): the histories of the live
//! requests, kept between draws (`src/requests/`), which `tokenrace_draw` reads through the
//! batch's `requests` and `request_ids`.

use super::convert::read_versioned;
use super::panic::{guard, guard_void};
use super::types::tokenrace_status;
use crate::alloc;
use crate::error::{Error, Result};
use crate::requests::{RequestParams, Requests};
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

/// Appends a verify call's emitted tokens to `n` requests at once, from its output as it lies:
/// request `ids[i]` gets `counts[i]` tokens from `tokens[i * tokens_stride]` on
/// (`tokenrace_verify_output`'s `tokens`, `tokens_stride` and `counts`: each count in
/// `[0, tokens_stride]`). A request named twice gets both, in order. Every id must be live and
/// every appended token >= 0: a refused call appends nothing. Costs O(n + new tokens).
///
/// # Safety
/// `requests` is NULL or live; `ids` and `counts` cover `n` entries, `tokens` `n * tokens_stride`.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_requests_append_strided(
    requests: *mut tokenrace_requests,
    n: u64,
    ids: *const u64,
    tokens: *const i32,
    tokens_stride: u64,
    counts: *const i32,
) -> tokenrace_status {
    guard("tokenrace_requests_append_strided", || {
        // SAFETY: the caller's contract for every pointer.
        unsafe {
            let s = state(requests)?;
            let ids = given("ids", ids, n)?;
            let counts = given("counts", counts, n)?;
            let stride = usize::try_from(tokens_stride)
                .map_err(|_| Error::invalid_argument(format!("tokens_stride: {tokens_stride} overflows")))?;
            let span = n
                .checked_mul(tokens_stride)
                .ok_or_else(|| Error::invalid_argument(format!("tokens: {n} x {tokens_stride} entries overflow")))?;
            let tokens = given("tokens", tokens, span)?;
            s.inner.write().append_strided(ids, tokens, stride, counts)
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

/// A request's sampling parameters, kept by a request state (`tokenrace_requests_set_params`).
/// A draw whose rows name requests (`batch.requests`, `batch.request_ids`) takes each per-row
/// parameter its batch leaves NULL from the row's request: the batch's array, when given, is
/// every row's. Get one from `tokenrace_request_params_default()` (every parameter off, the
/// draw of a batch that leaves them all NULL), then set what the request asks for. Each value
/// follows the batch field of the same name (docs/semantics.md).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tokenrace_request_params {
    /// `sizeof(tokenrace_request_params)`.
    pub struct_size: u32,
    /// Finite and >= 0 (0: greedy); default 1.
    pub temperature: f32,
    /// The request's seed, with `has_seed`: its rows are seeded rows at the batch's offsets, or,
    /// where the batch gives none, at the request's output length.
    pub seed: u64,
    /// Nonzero: the request is seeded with `seed`. Default 0 (unseeded).
    pub has_seed: u32,
    /// k <= 0 (default) or >= vocab: off.
    pub top_k: i32,
    /// In (0, 1]; default 1 (off).
    pub top_p: f32,
    /// In [0, 1]; default 0 (off).
    pub min_p: f32,
    /// Finite; n <= 0 (default 0) is off.
    pub top_n_sigma: f32,
    /// >= 0; default 0.
    pub min_keep: i32,
    /// In (0, 1]; default 1 (off).
    pub typical_p: f32,
    /// Finite and > 0; default 1 (off).
    pub repetition_penalty: f32,
    /// Finite; default 0 (off).
    pub frequency_penalty: f32,
    /// Finite; default 0 (off).
    pub presence_penalty: f32,
    /// >= 0: the last n tokens of (prompt ++ output) count; default 0 (every token).
    pub penalty_last_n: i32,
    /// >= 0: the stop tokens are banned while the output is shorter; default 0.
    pub min_tokens: i32,
    /// `stop_len` stop token ids (>= 0; NULL for none).
    pub stop_ids: *const i32,
    /// Entries of `stop_ids`.
    pub stop_len: u64,
    /// `bias_len` biased ids (>= 0) and their biases (finite, or -inf to ban).
    pub bias_ids: *const i32,
    /// `bias_len` biases, one per entry of `bias_ids`.
    pub bias_values: *const f32,
    /// Entries of `bias_ids` and `bias_values`.
    pub bias_len: u64,
    /// NULL (default): every token allowed; else the only `allowed_len` tokens the request may
    /// draw (allowed_len 0: none).
    pub allowed_ids: *const i32,
    /// Entries of `allowed_ids`.
    pub allowed_len: u64,
    /// `banned_len` ids the request may not draw (NULL for none).
    pub banned_ids: *const i32,
    /// Entries of `banned_ids`.
    pub banned_len: u64,
}

/// The default request parameters: every parameter off, `struct_size` set.
#[no_mangle]
pub extern "C" fn tokenrace_request_params_default() -> tokenrace_request_params {
    params_to_c(&RequestParams::default())
}

/// The C struct of `p`'s scalars (its lists NULL).
pub(super) fn params_to_c(p: &RequestParams) -> tokenrace_request_params {
    tokenrace_request_params {
        struct_size: size_of::<tokenrace_request_params>() as u32,
        temperature: p.temperature,
        seed: p.seed.unwrap_or(0),
        has_seed: p.seed.is_some() as u32,
        top_k: p.top_k,
        top_p: p.top_p,
        min_p: p.min_p,
        top_n_sigma: p.top_n_sigma,
        min_keep: p.min_keep,
        typical_p: p.typical_p,
        repetition_penalty: p.repetition_penalty,
        frequency_penalty: p.frequency_penalty,
        presence_penalty: p.presence_penalty,
        penalty_last_n: p.penalty_last_n,
        min_tokens: p.min_tokens,
        stop_ids: std::ptr::null(),
        stop_len: 0,
        bias_ids: std::ptr::null(),
        bias_values: std::ptr::null(),
        bias_len: 0,
        allowed_ids: std::ptr::null(),
        allowed_len: 0,
        banned_ids: std::ptr::null(),
        banned_len: 0,
    }
}

/// The parameters a C struct gives, its lists copied.
///
/// # Safety
/// Its non-NULL pointers cover their lengths.
unsafe fn params_from_c(c: &tokenrace_request_params) -> Result<RequestParams> {
    let copy = |field: &str, ptr: *const i32, len: u64| -> Result<Vec<i32>> {
        // SAFETY: the caller's contract.
        let ids = unsafe { given(field, ptr, len)? };
        alloc::collect(ids.iter().copied(), "the request's parameters")
    };
    // SAFETY (every list): the caller's contract.
    let allowed =
        if c.allowed_ids.is_null() { None } else { Some(copy("params.allowed_ids", c.allowed_ids, c.allowed_len)?) };
    let bias_values = unsafe { given("params.bias_values", c.bias_values, c.bias_len)? };
    Ok(RequestParams {
        temperature: c.temperature,
        seed: (c.has_seed != 0).then_some(c.seed),
        top_k: c.top_k,
        top_p: c.top_p,
        min_p: c.min_p,
        top_n_sigma: c.top_n_sigma,
        min_keep: c.min_keep,
        typical_p: c.typical_p,
        repetition_penalty: c.repetition_penalty,
        frequency_penalty: c.frequency_penalty,
        presence_penalty: c.presence_penalty,
        penalty_last_n: c.penalty_last_n,
        min_tokens: c.min_tokens,
        stop_tokens: copy("params.stop_ids", c.stop_ids, c.stop_len)?,
        bias_ids: copy("params.bias_ids", c.bias_ids, c.bias_len)?,
        bias_values: alloc::collect(bias_values.iter().copied(), "the request's parameters")?,
        allowed_tokens: allowed,
        banned_tokens: copy("params.banned_ids", c.banned_ids, c.banned_len)?,
    })
}

/// Sets the sampling parameters of request `id` (copied, replacing any it had; NULL `params`
/// turns every one off). Refused (INVALID_ARGUMENT, nothing changed) when `id` is not live or
/// a value breaks its rule, naming the field (`params.top_p: 1.5 is not in (0, 1]`); token ids
/// are checked against the vocabulary of each draw that names the request. Costs O(the
/// parameters' lists).
///
/// # Safety
/// `requests` is NULL or live; `params` is NULL or points to a valid struct whose non-NULL
/// pointers cover their lengths.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_requests_set_params(
    requests: *mut tokenrace_requests,
    id: u64,
    params: *const tokenrace_request_params,
) -> tokenrace_status {
    guard("tokenrace_requests_set_params", || {
        // SAFETY: the caller's contract for every pointer.
        unsafe {
            let s = state(requests)?;
            let p = if params.is_null() {
                RequestParams::default()
            } else {
                params_from_c(&read_versioned(params, "params")?)?
            };
            s.inner.write().set_params(id, p)
        }
    })
}
