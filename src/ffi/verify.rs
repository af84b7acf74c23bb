//! `tokenrace_verify`: the C verify batch and output turned into [`VerifyBatch`] and
//! [`VerifyOutput`]. As in `draw.rs`, only what gives each pointer its length is looked at here;
//! every rule is checked once, by `verify::prepare`, inside
//! [`Sampler::verify`](crate::Sampler::verify).

use super::api::tokenrace_sampler;
use super::convert::{arg_enum, opt_slice, read_versioned, slice};
use super::disjoint::{Disjoint, Region};
use super::panic::guard;
use super::types::*;
use crate::batch::{noise_span, span, DraftProbs, ExternalNoise, Logits, VerifyBatch, VerifyOutput};
use crate::error::{Error, Owner, Result};
use crate::kernels::{Bf16, F16};

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
    let at = |bytes| span(rows, vocab, stride, bytes, "row_stride");
    // SAFETY (every slice below): the caller's contract for the batch's pointers.
    let logits = unsafe {
        match dtype {
            tokenrace_dtype::F32 => Logits::F32(slice(Owner::Batch, "logits", b.logits as *const f32, at(4)?)?),
            tokenrace_dtype::Bf16 => Logits::Bf16(slice(Owner::Batch, "logits", b.logits as *const Bf16, at(2)?)?),
            tokenrace_dtype::F16 => Logits::F16(slice(Owner::Batch, "logits", b.logits as *const F16, at(2)?)?),
        }
    };
    let draft_counts = unsafe { slice(Owner::Batch, "draft_counts", b.draft_counts, requests)? };
    let drafts = draft_counts.iter().map(|&c| c.max(0) as usize).sum::<usize>();
    let draft_probs = if b.draft_probs.is_null() {
        None
    } else {
        let row_stride = if b.draft_probs_row_stride == 0 { vocab } else { size(b.draft_probs_row_stride) };
        let len = span(drafts, vocab, row_stride.max(vocab), 4, "draft_probs_row_stride")?;
        Some(DraftProbs { values: unsafe { slice(Owner::Batch, "draft_probs", b.draft_probs, len)? }, row_stride })
    };
    let noise = if b.noise.is_null() {
        None
    } else {
        let kind: tokenrace_noise_kind = arg_enum(Owner::Batch, "noise_kind", b.noise_kind)?;
        let row_stride = size(b.noise_row_stride);
        let len = noise_span(rows, vocab, row_stride)?;
        Some(ExternalNoise {
            values: unsafe { slice(Owner::Batch, "noise", b.noise, len)? },
            kind: kind.into(),
            row_stride,
        })
    };
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
    })
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
fn input_regions(b: &VerifyBatch) -> [Option<Region>; 14] {
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
            let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
            let read = || -> Result<_> {
                let b = read_versioned(batch, "batch")?;
                let o = read_versioned(out as *const tokenrace_verify_output, "out")?;
                Ok((b, o))
            };
            let (b, o) = read().inspect_err(|_| s.inner.count_rejected())?;
            let batch = batch_from_c(&b).inspect_err(|_| s.inner.count_rejected())?;
            let (mut output, arrays) = output_from_c(&o, &batch).inspect_err(|_| s.inner.count_rejected())?;
            if let Some(overlap) = arrays.overlap() {
                // A wrong size makes arrays overlap too: its own message says more.
                s.inner.count_rejected();
                return Err(s.inner.check_verify(&batch, &output).err().unwrap_or(overlap));
            }
            s.inner.verify(&batch, &mut output)
        }
    })
}
