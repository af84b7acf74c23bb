//! `tokenrace_draw`: the C batch and output turned into [`Batch`] and [`Output`]. Only what is
//! needed to build slices is looked at here (the sizes that give each pointer its length, the
//! dtype, the enum fields); every rule of a draw is checked once, by `batch::validate`, inside
//! [`Sampler::draw`](crate::Sampler::draw).

use super::api::tokenrace_sampler;
use super::convert::{arg_enum, opt_slice, opt_slice_mut, read_versioned, slice, slice_mut};
use super::panic::guard;
use super::types::*;
use crate::batch::{noise_span, span, Batch, ExternalNoise, Logits, Output};
use crate::error::{Error, Owner, Result};
use crate::kernels::{Bf16, F16};

/// The Rust view of a C batch.
///
/// # Safety
/// Every non-NULL pointer of `b` covers the elements its sizes say, for `'a`.
unsafe fn batch_from_c<'a>(b: &tokenrace_batch) -> Result<Batch<'a>> {
    let (rows, vocab) = (b.rows as usize, b.vocab as usize);
    let stride = if b.row_stride == 0 { vocab } else { usize::try_from(b.row_stride).unwrap_or(usize::MAX) };
    let dtype: tokenrace_dtype = arg_enum(Owner::Batch, "dtype", b.dtype)?;
    let at = |size| span(rows, vocab, stride, size, "row_stride");
    // SAFETY (every slice below): the caller's contract for the batch's pointers.
    let logits = unsafe {
        match dtype {
            tokenrace_dtype::F32 => Logits::F32(slice(Owner::Batch, "logits", b.logits as *const f32, at(4)?)?),
            tokenrace_dtype::Bf16 => Logits::Bf16(slice(Owner::Batch, "logits", b.logits as *const Bf16, at(2)?)?),
            tokenrace_dtype::F16 => Logits::F16(slice(Owner::Batch, "logits", b.logits as *const F16, at(2)?)?),
        }
    };
    let noise = if b.noise.is_null() {
        None
    } else {
        let kind: tokenrace_noise_kind = arg_enum(Owner::Batch, "noise_kind", b.noise_kind)?;
        let row_stride = usize::try_from(b.noise_row_stride).unwrap_or(usize::MAX);
        let len = noise_span(rows, vocab, row_stride)?;
        let values = unsafe { slice(Owner::Batch, "noise", b.noise, len)? };
        Some(ExternalNoise { values, kind: kind.into(), row_stride })
    };
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
    })
}

/// The Rust view of a C output for `rows` rows.
///
/// # Safety
/// Every non-NULL pointer of `o` covers the elements its sizes say, for `'a`, and nothing else
/// uses them meanwhile.
unsafe fn output_from_c<'a>(o: &tokenrace_output, rows: usize) -> Result<Output<'a>> {
    let logprob_mode: tokenrace_logprob_mode = arg_enum(Owner::Output, "logprob_mode", o.logprob_mode)?;
    let top_n = o.top_n as usize;
    let topn_len =
        rows.checked_mul(top_n).ok_or_else(|| Error::arg(Owner::Output, "top_n", None, "rows x top_n overflows"))?;
    // SAFETY (every slice below): the caller's contract for the output's pointers.
    Ok(Output {
        tokens: unsafe { slice_mut(Owner::Output, "tokens", o.tokens, rows)? },
        flags: unsafe { opt_slice_mut(Owner::Output, "flags", o.flags, rows)? },
        logprobs: unsafe { opt_slice_mut(Owner::Output, "logprobs", o.logprobs, rows)? },
        ranks: unsafe { opt_slice_mut(Owner::Output, "ranks", o.ranks, rows)? },
        top_n,
        topn_ids: unsafe { opt_slice_mut(Owner::Output, "topn_ids", o.topn_ids, topn_len)? }.filter(|_| top_n > 0),
        topn_logprobs: unsafe { opt_slice_mut(Owner::Output, "topn_logprobs", o.topn_logprobs, topn_len)? }
            .filter(|_| top_n > 0),
        logprob_mode: logprob_mode.into(),
    })
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
            let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
            let read = || -> Result<_> {
                let b = read_versioned(batch, "batch")?;
                let o = read_versioned(out as *const tokenrace_output, "out")?;
                Ok((b, o))
            };
            let (b, o) = read().inspect_err(|_| s.inner.count_rejected())?;
            let batch = batch_from_c(&b).inspect_err(|_| s.inner.count_rejected())?;
            let mut output = output_from_c(&o, batch.rows).inspect_err(|_| s.inner.count_rejected())?;
            s.inner.draw(&batch, &mut output)
        }
    })
}
