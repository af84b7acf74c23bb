//! `tokenrace_verify`: the C verify batch and output turned into [`VerifyBatch`] and
//! [`VerifyOutput`]. As in `draw.rs`, only what gives each pointer its length is looked at here;
//! every rule is checked once, by `verify::prepare`, inside
//! [`Sampler::verify`](crate::Sampler::verify).

use super::api::tokenrace_sampler;
use super::convert::{arg_enum, opt_slice, slice};
use super::disjoint::{Disjoint, Region};
use super::draw::{bias_lists, lists, logits_from_c, noise_from_c, read_call, refuse_overlap, word_lists};
use super::panic::guard;
use super::types::*;
use crate::batch::{span, DraftProbs, TokenBitmask, TokenLists, VerifyBatch, VerifyOutput, VerifyStep};
use crate::error::{Error, Owner, Result};

/// A `u64` size or stride as `usize` (saturating: a huge value then fails its span check).
fn size(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// The Rust view of a C verify batch.
///
/// # Safety
/// Every non-NULL pointer of `b` covers the elements its sizes say, for `'a`.
unsafe fn batch_from_c<'a>(b: &tokenrace_verify_batch) -> Result<VerifyBatch<'a>> {
    let (rows, vocab, requests) = (b.rows as usize, b.vocab as usize, b.requests as usize);
    let stride = if b.row_stride == 0 { vocab } else { size(b.row_stride) };
    let dtype: tokenrace_dtype = arg_enum(Owner::Batch, "dtype", b.dtype)?;
    // SAFETY (every slice below): the caller's contract for the batch's pointers.
    let logits = unsafe { logits_from_c(dtype, b.logits, rows, vocab, stride)? };
    let draft_counts = unsafe { slice(Owner::Batch, "draft_counts", b.draft_counts, requests)? };
    let drafts = draft_counts.iter().map(|&c| c.max(0) as usize).sum::<usize>();
    let draft_probs = if b.draft_probs.is_null() {
        None
    } else {
        let row_stride = if b.draft_probs_row_stride == 0 { vocab } else { size(b.draft_probs_row_stride) };
        let len = span(drafts, vocab, row_stride.max(vocab), 4, "draft_probs_row_stride")?;
        Some(DraftProbs { values: unsafe { slice(Owner::Batch, "draft_probs", b.draft_probs, len)? }, row_stride })
    };
    let noise = unsafe { noise_from_c(b.noise, b.noise_kind, b.noise_row_stride, rows, vocab)? };
    Ok(VerifyBatch {
        logits,
        rows,
        vocab,
        row_stride: stride,
        requests,
        draft_counts,
        draft_tokens: unsafe { slice(Owner::Batch, "draft_tokens", b.draft_tokens, drafts)? },
        draft_probs,
        temperature: unsafe { opt_slice(Owner::Batch, "temperature", b.temperature, requests)? },
        top_k: unsafe { opt_slice(Owner::Batch, "top_k", b.top_k, requests)? },
        top_p: unsafe { opt_slice(Owner::Batch, "top_p", b.top_p, requests)? },
        min_p: unsafe { opt_slice(Owner::Batch, "min_p", b.min_p, requests)? },
        seeds: unsafe { opt_slice(Owner::Batch, "seeds", b.seeds, requests)? },
        offsets: unsafe { opt_slice(Owner::Batch, "offsets", b.offsets, requests)? },
        seeded: unsafe { opt_slice(Owner::Batch, "seeded", b.seeded, requests)? },
        uniforms: unsafe { opt_slice(Owner::Batch, "uniforms", b.uniforms, drafts)? },
        noise,
        draft_parents: unsafe { opt_slice(Owner::Batch, "draft_parents", b.draft_parents, drafts)? },
        step: unsafe { step_from_c(b, requests, vocab)? },
    })
}

/// The sampling step's inputs of a C verify batch: per-request lists and parameters, a bitmask
/// row per target row.
///
/// # Safety
/// Every non-NULL pointer of `b` covers the elements its sizes say, for `'a`.
unsafe fn step_from_c<'a>(b: &tokenrace_verify_batch, requests: usize, vocab: usize) -> Result<VerifyStep<'a>> {
    let n = requests;
    // SAFETY (every slice below): the caller's contract for the batch's pointers.
    unsafe {
        let bias = bias_lists(n, b.bias_ids, b.bias_values, b.bias_offsets)?;
        let bitmask = if b.token_bitmask.is_null() {
            None
        } else {
            let words = vocab.div_ceil(32);
            let row_stride = if b.bitmask_row_stride == 0 { words } else { size(b.bitmask_row_stride) };
            let len = span(b.rows as usize, words, row_stride.max(words), 4, "bitmask_row_stride")?;
            Some(TokenBitmask { words: slice(Owner::Batch, "token_bitmask", b.token_bitmask, len)?, row_stride })
        };
        let bad_words = word_lists(
            n,
            ("bad_words_ids", b.bad_words_ids),
            ("bad_word_offsets", b.bad_word_offsets),
            ("bad_words_row_offsets", b.bad_words_row_offsets),
        )?;
        Ok(VerifyStep {
            prompt_tokens: lists(n, ("prompt_ids", b.prompt_ids), ("prompt_offsets", b.prompt_offsets))?,
            output_tokens: lists(n, ("output_ids", b.output_ids), ("output_offsets", b.output_offsets))?,
            repetition_penalty: opt_slice(Owner::Batch, "repetition_penalty", b.repetition_penalty, n)?,
            frequency_penalty: opt_slice(Owner::Batch, "frequency_penalty", b.frequency_penalty, n)?,
            presence_penalty: opt_slice(Owner::Batch, "presence_penalty", b.presence_penalty, n)?,
            logit_bias: bias,
            allowed_tokens: lists(n, ("allowed_ids", b.allowed_ids), ("allowed_offsets", b.allowed_offsets))?,
            allowed_rows: opt_slice(Owner::Batch, "allowed_rows", b.allowed_rows, n)?,
            banned_tokens: lists(n, ("banned_ids", b.banned_ids), ("banned_offsets", b.banned_offsets))?,
            bad_words,
            min_tokens: opt_slice(Owner::Batch, "min_tokens", b.min_tokens, n)?,
            stop_tokens: lists(n, ("stop_ids", b.stop_ids), ("stop_offsets", b.stop_offsets))?,
            token_bitmask: bitmask,
        })
    }
}

/// The Rust view of a C verify output for `b`'s requests.
///
/// # Safety
/// Every non-NULL pointer of `o` covers the elements its sizes say, for `'a`, and nothing else
/// uses them meanwhile.
unsafe fn output_from_c<'a>(o: &tokenrace_verify_output, b: &VerifyBatch) -> Result<(VerifyOutput<'a>, Disjoint)> {
    let logprob_mode: tokenrace_logprob_mode = arg_enum(Owner::Output, "logprob_mode", o.logprob_mode)?;
    let max_n = b.draft_counts.iter().map(|&c| c.max(0) as usize).max().unwrap_or(0);
    let tokens_stride = size(o.tokens_stride);
    let width = if tokens_stride == 0 { max_n + 1 } else { tokens_stride };
    // Both arrays it sizes hold 4-byte elements: the span must fit in the address space.
    let len = b
        .requests
        .checked_mul(width)
        .filter(|n| n.checked_mul(4).is_some_and(|bytes| bytes <= isize::MAX as usize))
        .ok_or_else(|| {
            Error::arg(Owner::Output, "tokens_stride", None, "requests x tokens_stride overflows the address space")
        })?;
    let mut d = Disjoint::new(input_regions(b));
    let out = Owner::Output;
    // SAFETY (every slice below): the caller's contract for the output's pointers.
    let output = VerifyOutput {
        tokens: unsafe { d.slice_mut(out, "tokens", o.tokens, len)? },
        tokens_stride,
        counts: unsafe { d.slice_mut(out, "counts", o.counts, b.requests)? },
        flags: unsafe { d.opt_slice_mut(out, "flags", o.flags, b.requests)? },
        logprobs: unsafe { d.opt_slice_mut(out, "logprobs", o.logprobs, len)? },
        logprob_mode: logprob_mode.into(),
        accepted_nodes: unsafe { d.opt_slice_mut(out, "accepted_nodes", o.accepted_nodes, len)? },
    };
    Ok((output, d))
}

/// The arrays a verify call reads, for the check that no output shares memory with them.
fn input_regions(b: &VerifyBatch) -> [Option<Region>; 33] {
    let s = &b.step;
    fn ids<'a>(l: Option<TokenLists<'a>>) -> Option<&'a [i32]> {
        l.map(|l| l.ids)
    }
    fn offs<'a>(l: Option<TokenLists<'a>>) -> Option<&'a [u64]> {
        l.map(|l| l.offsets)
    }
    [
        Some(Region::logits(b.logits)),
        Region::input("draft_counts", Some(b.draft_counts)),
        Region::input("draft_tokens", Some(b.draft_tokens)),
        Region::input("draft_probs", b.draft_probs.map(|q| q.values)),
        Region::input("temperature", b.temperature),
        Region::input("top_k", b.top_k),
        Region::input("top_p", b.top_p),
        Region::input("min_p", b.min_p),
        Region::input("seeds", b.seeds),
        Region::input("offsets", b.offsets),
        Region::input("seeded", b.seeded),
        Region::input("uniforms", b.uniforms),
        Region::input("noise", b.noise.map(|n| n.values)),
        Region::input("draft_parents", b.draft_parents),
        Region::input("prompt_ids", ids(s.prompt_tokens)),
        Region::input("prompt_offsets", offs(s.prompt_tokens)),
        Region::input("output_ids", ids(s.output_tokens)),
        Region::input("output_offsets", offs(s.output_tokens)),
        Region::input("repetition_penalty", s.repetition_penalty),
        Region::input("frequency_penalty", s.frequency_penalty),
        Region::input("presence_penalty", s.presence_penalty),
        Region::input("bias_ids", s.logit_bias.map(|l| l.ids)),
        Region::input("bias_values", s.logit_bias.map(|l| l.values)),
        Region::input("bias_offsets", s.logit_bias.map(|l| l.offsets)),
        Region::input("allowed_ids", ids(s.allowed_tokens)),
        Region::input("allowed_offsets", offs(s.allowed_tokens)),
        Region::input("allowed_rows", s.allowed_rows),
        Region::input("banned_ids", ids(s.banned_tokens)),
        Region::input("banned_offsets", offs(s.banned_tokens)),
        Region::input("token_bitmask", s.token_bitmask.map(|m| m.words)),
        Region::input("bad_words_ids", s.bad_words.map(|w| w.ids)),
        Region::input("min_tokens", s.min_tokens),
        Region::input("stop_ids", ids(s.stop_tokens)),
    ]
}

/// Verifies draft tokens (speculative decoding) by vLLM's rejection sampling: for each request,
/// its accepted drafts and one more token (recovered or bonus) into `out`. See
/// docs/semantics.md, "Verifying draft tokens". On failure nothing is written to `out`'s arrays,
/// and `tokenrace_last_error()` names the argument, request and position that was wrong.
///
/// # Safety
/// `sampler` is a live sampler; `batch` and `out` point to valid structs whose non-NULL
/// pointers cover the elements the batch's sizes say.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_verify(
    sampler: *mut tokenrace_sampler,
    batch: *const tokenrace_verify_batch,
    out: *mut tokenrace_verify_output,
) -> tokenrace_status {
    guard("tokenrace_verify", || {
        // SAFETY: the caller's contract for `sampler`, `batch` and `out`.
        unsafe {
            let (s, b, o) = read_call(sampler, batch, out as *const tokenrace_verify_output)?;
            let batch = batch_from_c(&b).inspect_err(|_| s.inner.count_rejected())?;
            let (mut output, arrays) = output_from_c(&o, &batch).inspect_err(|_| s.inner.count_rejected())?;
            refuse_overlap(s, arrays, || s.inner.check_verify(&batch, &output).err())?;
            s.inner.verify(&batch, &mut output)
        }
    })
}
