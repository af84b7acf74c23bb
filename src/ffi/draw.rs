//! `tokenrace_draw`: the C batch and output turned into [`Batch`] and [`Output`]. Only what is
//! needed to build slices is looked at here (the sizes that give each pointer its length, the
//! dtype, the enum fields); every rule of a draw is checked once, by `batch::validate`, inside
//! [`Sampler::draw`](crate::Sampler::draw).

use super::api::tokenrace_sampler;
use super::convert::{arg_enum, opt_slice, read_versioned, slice, Versioned};
use super::disjoint::{Disjoint, Region};
use super::panic::guard;
use super::types::*;
use crate::batch::{
    noise_span, span, span_of, BadWords, Batch, ExternalNoise, LogitBias, Logits, Output, TokenBitmask, TokenLists,
};
use crate::error::{bail_batch, Error, Owner, Result};
use crate::filter::chain::{Stage, RESERVED_STAGE_IDS};
use crate::kernels::{Bf16, F16};
use crate::requests::{RequestRows, Requests};
use std::ffi::c_void;

/// The Rust view of a C batch.
///
/// `state` is the request state that `b.requests` points to, locked for reading by the caller
/// for as long as the batch lives.
///
/// # Safety
/// Every non-NULL pointer of `b` covers the elements its sizes say, for `'a`.
pub(super) unsafe fn batch_from_c<'a>(b: &tokenrace_batch, state: Option<&'a Requests>) -> Result<Batch<'a>> {
    let (rows, vocab) = (b.rows as usize, b.vocab as usize);
    let stride = if b.row_stride == 0 { vocab } else { usize::try_from(b.row_stride).unwrap_or(usize::MAX) };
    let dtype: tokenrace_dtype = arg_enum(Owner::Batch, "dtype", b.dtype)?;
    // SAFETY: the caller's contract: a non-NULL row_index covers `rows` entries.
    let row_index = unsafe { opt_slice(Owner::Batch, "row_index", b.row_index, rows)? };
    let logits_rows = crate::batch::logits_rows(&Batch { row_index, ..Batch::new(Logits::F32(&[]), rows, vocab) })?;
    // SAFETY (every slice below): the caller's contract for the batch's pointers.
    let logits = unsafe { logits_from_c(dtype, b.logits, logits_rows, vocab, stride)? };
    let noise = unsafe { noise_from_c(b.noise, b.noise_kind, b.noise_row_stride, rows, vocab)? };
    Ok(Batch {
        logits,
        rows,
        vocab,
        row_stride: stride,
        temperature: unsafe { opt_slice(Owner::Batch, "temperature", b.temperature, rows)? },
        seeds: unsafe { opt_slice(Owner::Batch, "seeds", b.seeds, rows)? },
        offsets: unsafe { opt_slice(Owner::Batch, "offsets", b.offsets, rows)? },
        seeded: unsafe { opt_slice(Owner::Batch, "seeded", b.seeded, rows)? },
        noise,
        top_k: unsafe { opt_slice(Owner::Batch, "top_k", b.top_k, rows)? },
        top_p: unsafe { opt_slice(Owner::Batch, "top_p", b.top_p, rows)? },
        min_p: unsafe { opt_slice(Owner::Batch, "min_p", b.min_p, rows)? },
        top_n_sigma: unsafe { opt_slice(Owner::Batch, "top_n_sigma", b.top_n_sigma, rows)? },
        prompt_tokens: unsafe { lists(rows, ("prompt_ids", b.prompt_ids), ("prompt_offsets", b.prompt_offsets))? },
        output_tokens: unsafe { lists(rows, ("output_ids", b.output_ids), ("output_offsets", b.output_offsets))? },
        repetition_penalty: unsafe { opt_slice(Owner::Batch, "repetition_penalty", b.repetition_penalty, rows)? },
        frequency_penalty: unsafe { opt_slice(Owner::Batch, "frequency_penalty", b.frequency_penalty, rows)? },
        presence_penalty: unsafe { opt_slice(Owner::Batch, "presence_penalty", b.presence_penalty, rows)? },
        penalty_last_n: unsafe { opt_slice(Owner::Batch, "penalty_last_n", b.penalty_last_n, rows)? },
        logit_bias: unsafe { bias(b, rows)? },
        allowed_tokens: unsafe { lists(rows, ("allowed_ids", b.allowed_ids), ("allowed_offsets", b.allowed_offsets))? },
        allowed_rows: unsafe { opt_slice(Owner::Batch, "allowed_rows", b.allowed_rows, rows)? },
        banned_tokens: unsafe { lists(rows, ("banned_ids", b.banned_ids), ("banned_offsets", b.banned_offsets))? },
        token_bitmask: unsafe { bitmask(b, rows, vocab)? },
        min_tokens: unsafe { opt_slice(Owner::Batch, "min_tokens", b.min_tokens, rows)? },
        stop_tokens: unsafe { lists(rows, ("stop_ids", b.stop_ids), ("stop_offsets", b.stop_offsets))? },
        requests: unsafe { request_rows(b, rows, state)? },
        min_keep: unsafe { opt_slice(Owner::Batch, "min_keep", b.min_keep, rows)? },
        typical_p: unsafe { opt_slice(Owner::Batch, "typical_p", b.typical_p, rows)? },
        xtc_probability: unsafe { opt_slice(Owner::Batch, "xtc_probability", b.xtc_probability, rows)? },
        xtc_threshold: unsafe { opt_slice(Owner::Batch, "xtc_threshold", b.xtc_threshold, rows)? },
        dynatemp_range: unsafe { opt_slice(Owner::Batch, "dynatemp_range", b.dynatemp_range, rows)? },
        dynatemp_exponent: unsafe { opt_slice(Owner::Batch, "dynatemp_exponent", b.dynatemp_exponent, rows)? },
        bad_words: unsafe { bad_words(b, rows)? },
        forced_tokens: unsafe { opt_slice(Owner::Batch, "forced_tokens", b.forced_tokens, rows)? },
        logprob_token_ids: unsafe {
            lists(rows, ("logprob_token_ids", b.logprob_token_ids), ("logprob_token_offsets", b.logprob_token_offsets))?
        },
        order: unsafe { stage_order(b)? },
        dry_multiplier: unsafe { opt_slice(Owner::Batch, "dry_multiplier", b.dry_multiplier, rows)? },
        dry_base: unsafe { opt_slice(Owner::Batch, "dry_base", b.dry_base, rows)? },
        dry_allowed_length: unsafe { opt_slice(Owner::Batch, "dry_allowed_length", b.dry_allowed_length, rows)? },
        dry_penalty_last_n: unsafe { opt_slice(Owner::Batch, "dry_penalty_last_n", b.dry_penalty_last_n, rows)? },
        dry_breakers: unsafe { words(b, rows, DRY_BREAKER_FIELDS)? },
        row_index,
        mirostat: unsafe { opt_slice(Owner::Batch, "mirostat", b.mirostat, rows)? },
        mirostat_tau: unsafe { opt_slice(Owner::Batch, "mirostat_tau", b.mirostat_tau, rows)? },
        mirostat_eta: unsafe { opt_slice(Owner::Batch, "mirostat_eta", b.mirostat_eta, rows)? },
        mirostat_m: unsafe { opt_slice(Owner::Batch, "mirostat_m", b.mirostat_m, rows)? },
        mirostat_mu: unsafe { opt_slice(Owner::Batch, "mirostat_mu", b.mirostat_mu, rows)? },
    })
}

/// The logits of a C batch: `rows` rows of `vocab` values of `dtype`, `stride` elements apart.
///
/// # Safety
/// A non-NULL `logits` covers those rows.
pub(super) unsafe fn logits_from_c<'a>(
    dtype: tokenrace_dtype,
    logits: *const c_void,
    rows: usize,
    vocab: usize,
    stride: usize,
) -> Result<Logits<'a>> {
    let at = |size| span(rows, vocab, stride, size, "row_stride");
    // SAFETY: the caller's contract.
    unsafe {
        Ok(match dtype {
            tokenrace_dtype::F32 => Logits::F32(slice(Owner::Batch, "logits", logits as *const f32, at(4)?)?),
            tokenrace_dtype::Bf16 => Logits::Bf16(slice(Owner::Batch, "logits", logits as *const Bf16, at(2)?)?),
            tokenrace_dtype::F16 => Logits::F16(slice(Owner::Batch, "logits", logits as *const F16, at(2)?)?),
        })
    }
}

/// The caller's noise of a C batch (NULL: none), its kind decoded and its stride checked
/// against `rows` rows of `vocab`.
///
/// # Safety
/// A non-NULL `noise` covers the values its stride says.
pub(super) unsafe fn noise_from_c<'a>(
    noise: *const f32,
    kind: u32,
    row_stride: u64,
    rows: usize,
    vocab: usize,
) -> Result<Option<ExternalNoise<'a>>> {
    if noise.is_null() {
        return Ok(None);
    }
    let kind: tokenrace_noise_kind = arg_enum(Owner::Batch, "noise_kind", kind)?;
    let row_stride = usize::try_from(row_stride).unwrap_or(usize::MAX);
    let len = noise_span(rows, vocab, row_stride)?;
    // SAFETY: the caller's contract.
    let values = unsafe { slice(Owner::Batch, "noise", noise, len)? };
    Ok(Some(ExternalNoise { values, kind: kind.into(), row_stride }))
}

/// Most stages an order may list (each stage at most once, so more is a mistake anyway).
const MAX_ORDER_LEN: u64 = 16;

/// The batch's order of stages, every id checked (an unknown one is refused with its position).
///
/// # Safety
/// A non-NULL `b.order` covers `b.order_len` ids.
unsafe fn stage_order<'a>(b: &tokenrace_batch) -> Result<Option<&'a [Stage]>> {
    if b.order.is_null() {
        return Ok(None);
    }
    if b.order_len == 0 || b.order_len > MAX_ORDER_LEN {
        bail_batch!("order_len", None, "{} is not in [1, {MAX_ORDER_LEN}]", b.order_len);
    }
    // SAFETY: the caller's contract.
    let ids: &[u32] = unsafe { slice(Owner::Batch, "order", b.order, b.order_len as usize)? };
    for (i, &id) in ids.iter().enumerate() {
        if Stage::from_id(id).is_none() {
            match RESERVED_STAGE_IDS.iter().find(|(r, _)| *r == id) {
                Some((_, name)) => bail_batch!("order", Some(i), "stage {id} ({name}) is not in this build"),
                None => bail_batch!("order", Some(i), "{id} is not a tokenrace_stage"),
            }
        }
    }
    // SAFETY: `Stage` is `repr(u32)` and every id is one of its values (checked above).
    Ok(Some(unsafe { std::slice::from_raw_parts(ids.as_ptr().cast::<Stage>(), ids.len()) }))
}

/// The rows named by request id: both fields or neither.
///
/// # Safety
/// A non-NULL `b.request_ids` covers `rows` ids.
unsafe fn request_rows<'a>(
    b: &tokenrace_batch,
    rows: usize,
    state: Option<&'a Requests>,
) -> Result<Option<RequestRows<'a>>> {
    // SAFETY: the caller's contract.
    let ids = unsafe { opt_slice(Owner::Batch, "request_ids", b.request_ids, rows)? };
    match (state, ids) {
        (Some(state), Some(ids)) => Ok(Some(RequestRows { state, ids })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(Error::arg(Owner::Batch, "request_ids", None, "is NULL while requests is given")),
        (None, Some(_)) => Err(Error::arg(Owner::Batch, "requests", None, "is NULL while request_ids is given")),
    }
}

/// The bad words of a C batch: the rows' offsets, as many word offsets as their last says (plus
/// one), then as many ids as the last word offset says.
///
/// # Safety
/// Non-NULL pointers cover those counts.
unsafe fn bad_words<'a>(b: &tokenrace_batch, rows: usize) -> Result<Option<BadWords<'a>>> {
    // SAFETY: the caller's contract.
    unsafe { words(b, rows, BAD_WORD_FIELDS) }
}

/// A two-level list of words in a batch: its three pointers and their names.
pub(super) type WordPointers =
    (fn(&tokenrace_batch) -> (*const i32, *const u64, *const u64), (&'static str, &'static str, &'static str));
pub(super) const BAD_WORD_FIELDS: WordPointers = (
    |b| (b.bad_words_ids, b.bad_word_offsets, b.bad_words_row_offsets),
    ("bad_words_ids", "bad_word_offsets", "bad_words_row_offsets"),
);
pub(super) const DRY_BREAKER_FIELDS: WordPointers = (
    |b| (b.dry_breaker_ids, b.dry_breaker_offsets, b.dry_breakers_row_offsets),
    ("dry_breaker_ids", "dry_breaker_offsets", "dry_breakers_row_offsets"),
);

/// The two-level list of words that `fields` names (NULL row offsets: none).
///
/// # Safety
/// Non-NULL pointers cover what their offsets say.
pub(super) unsafe fn words<'a>(b: &tokenrace_batch, rows: usize, fields: WordPointers) -> Result<Option<BadWords<'a>>> {
    let ((ids, word_offsets, row_offsets), (ids_name, word_name, row_name)) = ((fields.0)(b), fields.1);
    // SAFETY: the caller's contract.
    unsafe { word_lists(rows, (ids_name, ids), (word_name, word_offsets), (row_name, row_offsets)) }
}

/// A two-level list of words: `rows + 1` row offsets into the word offsets, as many word
/// offsets as their last says (plus one), then as many ids as the last word offset says (NULL
/// row offsets: none).
///
/// # Safety
/// Non-NULL pointers cover what their offsets say.
pub(super) unsafe fn word_lists<'a>(
    rows: usize,
    (ids_name, ids_ptr): (&'static str, *const i32),
    (word_name, word_ptr): (&'static str, *const u64),
    (row_name, row_ptr): (&'static str, *const u64),
) -> Result<Option<BadWords<'a>>> {
    // SAFETY: the caller's contract (a word offset is 8 bytes).
    let Some((row_offsets, words)) = (unsafe { offsets(rows, row_name, row_ptr, size_of::<u64>())? }) else {
        needs_offsets(&[(ids_name, !ids_ptr.is_null()), (word_name, !word_ptr.is_null())], row_name)?;
        return Ok(None);
    };
    // SAFETY: as above.
    let Some((word_offsets, len)) = (unsafe { offsets(words, word_name, word_ptr, size_of::<i32>())? }) else {
        return Err(Error::arg(Owner::Batch, word_name, None, format!("is NULL while {row_name} is given")));
    };
    // SAFETY: as above.
    let ids = unsafe { slice(Owner::Batch, ids_name, ids_ptr, len)? };
    Ok(Some(BadWords { ids, word_offsets, row_offsets }))
}

/// The `rows + 1` offsets of a CSR list whose arrays have `elem_size`-byte entries, and how many
/// entries they say the list has (its last offset; `validate` checks the order). A last offset
/// whose entries would span more than the address space is refused here, before any slice of
/// that length exists.
///
/// # Safety
/// `ptr` is NULL or covers `rows + 1` elements.
pub(super) unsafe fn offsets<'a>(
    rows: usize,
    field: &'static str,
    ptr: *const u64,
    elem_size: usize,
) -> Result<Option<(&'a [u64], usize)>> {
    // SAFETY: the caller's contract.
    let Some(o) = (unsafe { opt_slice(Owner::Batch, field, ptr, rows + 1)? }) else {
        return Ok(None);
    };
    let last = o[rows];
    let len = usize::try_from(last)
        .ok()
        .filter(|&n| n.checked_mul(elem_size).is_some_and(|b| b <= isize::MAX as usize))
        .ok_or_else(|| {
            Error::arg(
                Owner::Batch,
                field,
                Some(rows),
                format!("{last} entries of {elem_size} bytes overflow the address space"),
            )
        })?;
    Ok(Some((o, len)))
}

/// Refuses list entries given without the offsets that say whose they are: silently ignoring them
/// would lift an allowed list or draw a banned token.
pub(super) fn needs_offsets(given: &[(&'static str, bool)], offsets_field: &'static str) -> Result<()> {
    match given.iter().find(|(_, g)| *g) {
        Some((field, _)) => Err(Error::arg(
            Owner::Batch,
            offsets_field,
            None,
            format!(
                "is NULL while {field} is given (row r's entries are at {offsets_field}[r]..{offsets_field}[r + 1])"
            ),
        )),
        None => Ok(()),
    }
}

/// A CSR list of token ids: its offsets, then as many ids as the last offset says.
///
/// # Safety
/// Non-NULL pointers cover `rows + 1` offsets and that many ids.
pub(super) unsafe fn lists<'a>(
    rows: usize,
    (ids_field, ids): (&'static str, *const i32),
    (offsets_field, offs): (&'static str, *const u64),
) -> Result<Option<TokenLists<'a>>> {
    // SAFETY: the caller's contract.
    let Some((offsets, len)) = (unsafe { offsets(rows, offsets_field, offs, size_of::<i32>())? }) else {
        needs_offsets(&[(ids_field, !ids.is_null())], offsets_field)?;
        return Ok(None);
    };
    // SAFETY: as above.
    let ids = unsafe { slice(Owner::Batch, ids_field, ids, len)? };
    Ok(Some(TokenLists { ids, offsets }))
}

/// The logit bias pairs of a C batch.
///
/// # Safety
/// As `lists`, for both the ids and the values.
pub(super) unsafe fn bias<'a>(b: &tokenrace_batch, rows: usize) -> Result<Option<LogitBias<'a>>> {
    // SAFETY: the caller's contract.
    unsafe { bias_lists(rows, b.bias_ids, b.bias_values, b.bias_offsets) }
}

/// Logit bias pairs in CSR form: `rows + 1` offsets, then as many ids and values as the last
/// offset says (NULL offsets: none, and neither ids nor values may be given).
///
/// # Safety
/// As `lists`, for both the ids and the values.
pub(super) unsafe fn bias_lists<'a>(
    rows: usize,
    ids: *const i32,
    values: *const f32,
    bias_offsets: *const u64,
) -> Result<Option<LogitBias<'a>>> {
    // SAFETY: the caller's contract.
    let Some((offsets, len)) = (unsafe { offsets(rows, "bias_offsets", bias_offsets, size_of::<f32>())? }) else {
        let given = [("bias_ids", !ids.is_null()), ("bias_values", !values.is_null())];
        needs_offsets(&given, "bias_offsets")?;
        return Ok(None);
    };
    // SAFETY: as above.
    let (ids, values) =
        unsafe { (slice(Owner::Batch, "bias_ids", ids, len)?, slice(Owner::Batch, "bias_values", values, len)?) };
    Ok(Some(LogitBias { ids, values, offsets }))
}

/// The grammar bitmask of a C batch.
///
/// # Safety
/// A non-NULL `token_bitmask` covers the words its stride says.
pub(super) unsafe fn bitmask<'a>(b: &tokenrace_batch, rows: usize, vocab: usize) -> Result<Option<TokenBitmask<'a>>> {
    if b.token_bitmask.is_null() {
        return Ok(None);
    }
    let words = vocab.div_ceil(32);
    let stride = match usize::try_from(b.bitmask_row_stride).unwrap_or(usize::MAX) {
        0 => words,
        s => s,
    };
    if stride < words {
        return Err(Error::arg(
            Owner::Batch,
            "bitmask_row_stride",
            None,
            format!("{stride} is smaller than ceil(vocab / 32) = {words}"),
        ));
    }
    let len = span(rows, words, stride, 4, "bitmask_row_stride")?;
    // SAFETY: the caller's contract.
    let words = unsafe { slice(Owner::Batch, "token_bitmask", b.token_bitmask, len)? };
    Ok(Some(TokenBitmask { words, row_stride: stride }))
}

/// The Rust view of a C output for the rows of `b`, and what its arrays share with `b`'s.
///
/// # Safety
/// Every non-NULL pointer of `o` covers the elements its sizes say, for `'a`, and nothing else
/// uses them meanwhile.
pub(super) unsafe fn output_from_c<'a>(o: &tokenrace_output, b: &Batch) -> Result<(Output<'a>, Disjoint)> {
    let (rows, vocab) = (b.rows, b.vocab);
    let logprob_mode: tokenrace_logprob_mode = arg_enum(Owner::Output, "logprob_mode", o.logprob_mode)?;
    let top_n = o.top_n as usize;
    let topn_len =
        rows.checked_mul(top_n).ok_or_else(|| Error::arg(Owner::Output, "top_n", None, "rows x top_n overflows"))?;
    let full_mode: tokenrace_full_mode = arg_enum(Owner::Output, "full_mode", o.full_mode)?;
    let full_stride = match usize::try_from(o.full_row_stride).unwrap_or(usize::MAX) {
        0 => vocab,
        s => s,
    };
    let full_len = match o.full_logprobs.is_null() {
        true => 0,
        false => span_of(Owner::Output, rows, vocab, full_stride, 4, "full_row_stride")?,
    };
    // One logprob and rank per given id (validate checks the offsets' order; the last says how
    // many ids there are, at most the ids' span, which `lists` made a slice of).
    let given = b.logprob_token_ids.map_or(0, |l| l.ids.len());
    let kept_words = rows
        .checked_mul(vocab.div_ceil(32))
        .ok_or_else(|| Error::arg(Owner::Output, "kept_bitmask", None, "rows x ceil(vocab / 32) overflows"))?;
    let mut d = Disjoint::new(input_regions(b));
    let out = Owner::Output;
    // SAFETY (every slice below): the caller's contract for the output's pointers.
    let output = Output {
        tokens: unsafe { d.slice_mut(out, "tokens", o.tokens, rows)? },
        flags: unsafe { d.opt_slice_mut(out, "flags", o.flags, rows)? },
        logprobs: unsafe { d.opt_slice_mut(out, "logprobs", o.logprobs, rows)? },
        ranks: unsafe { d.opt_slice_mut(out, "ranks", o.ranks, rows)? },
        top_n,
        topn_ids: unsafe { d.opt_slice_mut(out, "topn_ids", o.topn_ids, if top_n > 0 { topn_len } else { 0 })? }
            .filter(|_| top_n > 0),
        topn_logprobs: unsafe {
            d.opt_slice_mut(out, "topn_logprobs", o.topn_logprobs, if top_n > 0 { topn_len } else { 0 })?
        }
        .filter(|_| top_n > 0),
        logprob_mode: logprob_mode.into(),
        full_logprobs: unsafe { d.opt_slice_mut(out, "full_logprobs", o.full_logprobs, full_len)? },
        full_row_stride: full_stride,
        full_mode: full_mode.into(),
        token_logprobs: unsafe { d.opt_slice_mut(out, "token_logprobs", o.token_logprobs, given)? },
        token_ranks: unsafe { d.opt_slice_mut(out, "token_ranks", o.token_ranks, given)? },
        kept_threshold: unsafe { d.opt_slice_mut(out, "kept_threshold", o.kept_threshold, rows)? },
        kept_count: unsafe { d.opt_slice_mut(out, "kept_count", o.kept_count, rows)? },
        kept_mass: unsafe { d.opt_slice_mut(out, "kept_mass", o.kept_mass, rows)? },
        kept_bitmask: unsafe { d.opt_slice_mut(out, "kept_bitmask", o.kept_bitmask, kept_words)? },
        mirostat_mu: unsafe { d.opt_slice_mut(out, "mirostat_mu", o.mirostat_mu, rows)? },
    };
    Ok((output, d))
}

/// The arrays a draw reads, for the check that no output shares memory with them.
fn input_regions(b: &Batch) -> [Option<Region>; 52] {
    let (prompt, output, allowed, banned) = (b.prompt_tokens, b.output_tokens, b.allowed_tokens, b.banned_tokens);
    [
        Some(Region::logits(b.logits)),
        Region::input("temperature", b.temperature),
        Region::input("seeds", b.seeds),
        Region::input("offsets", b.offsets),
        Region::input("seeded", b.seeded),
        Region::input("noise", b.noise.map(|n| n.values)),
        Region::input("top_k", b.top_k),
        Region::input("top_p", b.top_p),
        Region::input("min_p", b.min_p),
        Region::input("top_n_sigma", b.top_n_sigma),
        Region::input("order", b.order),
        Region::input("repetition_penalty", b.repetition_penalty),
        Region::input("frequency_penalty", b.frequency_penalty),
        Region::input("presence_penalty", b.presence_penalty),
        Region::input("penalty_last_n", b.penalty_last_n),
        Region::input("bias_ids", b.logit_bias.map(|l| l.ids)),
        Region::input("bias_values", b.logit_bias.map(|l| l.values)),
        Region::input("bias_offsets", b.logit_bias.map(|l| l.offsets)),
        Region::input("allowed_rows", b.allowed_rows),
        Region::input("token_bitmask", b.token_bitmask.map(|m| m.words)),
        Region::input("prompt_ids", prompt.map(|l| l.ids)),
        Region::input("prompt_offsets", prompt.map(|l| l.offsets)),
        Region::input("output_ids", output.map(|l| l.ids)),
        Region::input("output_offsets", output.map(|l| l.offsets)),
        Region::input("allowed_ids", allowed.map(|l| l.ids)),
        Region::input("allowed_offsets", allowed.map(|l| l.offsets)),
        Region::input("banned_ids", banned.map(|l| l.ids)),
        Region::input("banned_offsets", banned.map(|l| l.offsets)),
        Region::input("min_tokens", b.min_tokens),
        Region::input("stop_ids", b.stop_tokens.map(|l| l.ids)),
        Region::input("stop_offsets", b.stop_tokens.map(|l| l.offsets)),
        Region::input("request_ids", b.requests.map(|q| q.ids)),
        Region::input("min_keep", b.min_keep),
        Region::input("typical_p", b.typical_p),
        Region::input("xtc_probability", b.xtc_probability),
        Region::input("xtc_threshold", b.xtc_threshold),
        Region::input("dynatemp_range", b.dynatemp_range),
        Region::input("dynatemp_exponent", b.dynatemp_exponent),
        Region::input("bad_words_ids", b.bad_words.map(|w| w.ids)),
        Region::input("bad_word_offsets", b.bad_words.map(|w| w.word_offsets)),
        Region::input("bad_words_row_offsets", b.bad_words.map(|w| w.row_offsets)),
        Region::input("forced_tokens", b.forced_tokens),
        Region::input("logprob_token_ids", b.logprob_token_ids.map(|l| l.ids)),
        Region::input("logprob_token_offsets", b.logprob_token_ids.map(|l| l.offsets)),
        Region::input("dry_multiplier", b.dry_multiplier),
        Region::input("dry_base", b.dry_base),
        Region::input("dry_allowed_length", b.dry_allowed_length),
        Region::input("dry_penalty_last_n", b.dry_penalty_last_n),
        Region::input("dry_breaker_ids", b.dry_breakers.map(|w| w.ids)),
        Region::input("dry_breaker_offsets", b.dry_breakers.map(|w| w.word_offsets)),
        Region::input("dry_breakers_row_offsets", b.dry_breakers.map(|w| w.row_offsets)),
        Region::input("mirostat_mu", b.mirostat_mu),
    ]
}

/// The first steps of a call on a batch and an output (a draw, a verify): the sampler, which
/// must not be NULL, then the batch's and the output's structs read at their sizes; a struct
/// refused counts as a rejected call of the sampler.
///
/// # Safety
/// `sampler` is NULL or a live sampler for `'s`; `batch` and `out` are NULL or point to valid
/// structs.
pub(super) unsafe fn read_call<'s, B: Versioned, O: Versioned>(
    sampler: *mut tokenrace_sampler,
    batch: *const B,
    out: *const O,
) -> Result<(&'s tokenrace_sampler, B, O)> {
    // SAFETY: the caller's contract.
    unsafe {
        let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
        let read = || -> Result<_> {
            let b = read_versioned(batch, "batch")?;
            let o = read_versioned(out, "out")?;
            Ok((b, o))
        };
        let (b, o) = read().inspect_err(|_| s.inner.count_rejected())?;
        Ok((s, b, o))
    }
}

/// Refuses a call whose outputs share memory with an input or with each other (a rejected
/// call). A wrong size makes arrays overlap too, so the call's own check (`call_error`) runs
/// first: its message says more.
pub(super) fn refuse_overlap(
    s: &tokenrace_sampler,
    arrays: Disjoint,
    call_error: impl FnOnce() -> Option<Error>,
) -> Result<()> {
    match arrays.overlap() {
        None => Ok(()),
        Some(overlap) => {
            s.inner.count_rejected();
            Err(call_error().unwrap_or(overlap))
        }
    }
}

/// Draws one token per row. See docs/semantics.md for the exact rules. On failure nothing is
/// written to `out`'s arrays, and `tokenrace_last_error()` names the argument (and row) that was
/// wrong, e.g. `tokenrace_draw: batch.top_p[3]: 1.5 is not in (0, 1]`.
///
/// # Safety
/// `sampler` is a live sampler; `batch` and `out` point to valid structs whose non-NULL
/// pointers cover the elements the batch's sizes say.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_draw(
    sampler: *mut tokenrace_sampler,
    batch: *const tokenrace_batch,
    out: *mut tokenrace_output,
) -> tokenrace_status {
    guard("tokenrace_draw", || {
        // SAFETY: the caller's contract for `sampler`, `batch` and `out`.
        unsafe {
            let (s, b, o) = read_call(sampler, batch, out as *const tokenrace_output)?;
            // `check_only`: every rule checked, nothing drawn (an appending draw checks its call
            // before it makes room for the tokens).
            let draw = |state: Option<&Requests>, check_only: bool| -> Result<()> {
                let batch = batch_from_c(&b, state).inspect_err(|_| s.inner.count_rejected())?;
                let (mut output, arrays) = output_from_c(&o, &batch).inspect_err(|_| s.inner.count_rejected())?;
                refuse_overlap(s, arrays, || s.inner.check_draw(&batch, &output).err())?;
                if check_only {
                    return s.inner.check_draw(&batch, &output).inspect_err(|_| s.inner.count_rejected());
                }
                s.inner.draw(&batch, &mut output)
            };
            match (b.requests.as_ref(), b.append_to_requests != 0) {
                // A draw that names a request state reads it under its shared lock, held until
                // the draw returns: the state's operations wait for it, never change it under
                // the draw.
                (state, false) => draw(state.map(|q| q.inner.read()).as_deref(), false),
                (Some(state), true) => draw_and_append(&state.inner, &b, &o, draw),
                (None, true) => {
                    s.inner.count_rejected();
                    Err(Error::arg(Owner::Batch, "append_to_requests", None, "is set without requests"))
                }
            }
        }
    })
}

/// A draw that appends its tokens to the rows' requests: the call is checked, room for the
/// tokens made, then the state is held (readable by other draws, its writers waiting) through
/// the draw and the append, which then cannot fail. A refused call reserves nothing (room sized
/// by an unchecked batch's vocab could be large); a draw that fails appends nothing (the room it
/// made changes no history).
///
/// # Safety
/// `b.request_ids` covers `b.rows` ids and `o.tokens` `b.rows` tokens (the caller's contract).
unsafe fn draw_and_append(
    state: &parking_lot::RwLock<Requests>,
    b: &tokenrace_batch,
    o: &tokenrace_output,
    draw: impl Fn(Option<&Requests>, bool) -> Result<()>,
) -> Result<()> {
    use parking_lot::{RwLockUpgradableReadGuard as Upgradable, RwLockWriteGuard as Write};
    let rows = b.rows as usize;
    // SAFETY: the caller's contract.
    let ids = unsafe { opt_slice(Owner::Batch, "request_ids", b.request_ids, rows)? }.unwrap_or(&[]);
    let reading = state.upgradable_read();
    draw(Some(&reading), true)?;
    let mut writing = Upgradable::upgrade(reading);
    writing.reserve_drawn(ids, b.vocab as usize)?;
    let held = Write::downgrade_to_upgradable(writing);
    draw(Some(&held), false)?;
    if rows > 0 {
        // SAFETY: the draw succeeded, so `out.tokens` is an aligned array of one token a row.
        let tokens = unsafe { std::slice::from_raw_parts(o.tokens, rows) };
        Upgradable::upgrade(held).append_drawn(ids, tokens);
    }
    Ok(())
}
