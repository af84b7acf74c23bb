//! `tokenrace_score`: the logprobs of given target tokens with the draw's batch and output,
//! nothing drawn ([`Sampler::score`](crate::Sampler::score)).

use super::api::tokenrace_sampler;
use super::convert::{read_versioned, slice};
use super::draw::{batch_from_c, output_from_c};
use super::panic::guard;
use super::types::*;
use crate::error::{Error, Owner};

/// Scores one target token per row: writes into `out` what `tokenrace_draw` writes for a row
/// whose token is its target (`logprobs`, `ranks`, the top-n, `token_logprobs`/`token_ranks` of
/// the batch's `logprob_token_ids`, `full_logprobs`, `flags`, in `out->logprob_mode`), bit for
/// bit the values a draw that returned that token reports; `out->tokens` receives the targets.
/// Nothing is drawn: no noise is consumed (the sampler's stream, its pool) and the sampler's
/// counters do not move. The rows are spread over the sampler's threads as a draw's are.
///
/// `batch`: a draw's batch with `forced_tokens` and `noise` NULL (refused otherwise); its
/// seeds are read only by rows with XTC on, whose coin comes from the row's key (an unseeded
/// row's: that of seed 0 at offset 0). `target_ids`: `batch->rows` token ids, each in
/// `[0, vocab)`. Prompt logprobs: one row per position, its target the next prompt token.
///
/// Returns TOKENRACE_OK, or an error naming the argument (and row) that was refused; a failed
/// call writes nothing.
///
/// # Safety
/// As `tokenrace_draw`; `target_ids` covers `batch->rows` ids.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_score(
    sampler: *mut tokenrace_sampler,
    batch: *const tokenrace_batch,
    target_ids: *const i32,
    out: *mut tokenrace_output,
) -> tokenrace_status {
    guard("tokenrace_score", || {
        // SAFETY: the caller's contract for `sampler`, `batch`, `target_ids` and `out`.
        unsafe {
            let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
            let b = read_versioned(batch, "batch")?;
            let o = read_versioned(out as *const tokenrace_output, "out")?;
            if b.append_to_requests != 0 {
                return Err(Error::arg(
                    Owner::Batch,
                    "append_to_requests",
                    None,
                    "is set in a score call (nothing is drawn)",
                ));
            }
            if target_ids.is_null() {
                return Err(Error::invalid_argument("target_ids: is NULL (one target token per row is needed)"));
            }
            let targets = slice(Owner::Batch, "target_ids", target_ids, b.rows as usize)?;
            let state = b.requests.as_ref().map(|q| q.inner.read());
            let batch = batch_from_c(&b, state.as_deref())?;
            let (mut output, arrays) = output_from_c(&o, &batch)?;
            if let Some(overlap) = arrays.overlap() {
                return Err(s.inner.check_draw(&batch, &output).err().unwrap_or(overlap));
            }
            s.inner.score(&batch, targets, &mut output)
        }
    })
}
