//! The sampling step inside a verify call: a target row's processed values, built by the draw's
//! own step (`step::build`, `RowStep::materialize`) from a one-row batch whose output history
//! is the request's output followed by the drafts before the row's position (vLLM's rule for
//! the penalties and bad words with drafts: `docs/semantics.md`, "The sampling step in
//! verification"). The row is then judged on those values exactly as a row given that way.

use super::verify::Drafts;
use crate::alloc;
use crate::batch::{BadWords, Batch, LogitBias, Logits, LogprobMode, TokenBitmask, TokenLists, VerifyStep};
use crate::error::Result;
use crate::kernels::Kernels;
use crate::logprob::{block_maxima, row_logprobs, RowOut};
use crate::row::with_row;

/// The step inputs of one request of a verify call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestStep<'a> {
    pub inputs: VerifyStep<'a>,
    /// The request's index in the call (its entry in the per-request lists).
    pub request: usize,
}

/// The `[start, end]` offsets of entry `i` of a CSR list of `offsets`: a one-row list over the
/// same ids.
fn one_row(offsets: &[u64], i: usize) -> [u64; 2] {
    [offsets[i], offsets[i + 1]]
}

/// The output history of request-local target row `local` of `d`: the request's output, then
/// the drafts of the path to that row (a chain's row `j`: drafts `0..j`; a tree's row `1 + n`:
/// the drafts of node `n`'s ancestors and of `n` itself). Placeholder drafts are left out (a row
/// after one is never judged).
fn history(s: &RequestStep, d: &Drafts, local: usize, out: &mut Vec<i32>) -> Result<()> {
    let output = s.inputs.output_tokens.map_or(&[][..], |l| l.row(s.request));
    out.clear();
    alloc::reserve(out, output.len() + local, "the target row's output history")?;
    out.extend_from_slice(output);
    match d.parents {
        None => out.extend(d.ids[..local].iter().copied().filter(|&t| t >= 0)),
        Some(parents) => {
            let start = out.len();
            let mut node = local as i32 - 1;
            while node >= 0 {
                let t = d.ids[node as usize];
                if t >= 0 {
                    out.push(t);
                }
                node = parents[node as usize];
            }
            out[start..].reverse();
        }
    }
    Ok(())
}

/// Writes into `y` the processed values of target row `r` (request-local row `local` of `d`),
/// and gives whether the caller's row holds a NaN (masked or not: the draw's `HAS_NAN`);
/// `None` when the step leaves the row as given (then `y` is untouched).
pub(super) fn processed_row(
    k: &Kernels,
    batch: &Batch,
    (r, local): (usize, usize),
    s: &RequestStep,
    d: &Drafts,
    y: &mut Vec<f32>,
) -> Result<Option<bool>> {
    let mut hist = Vec::new();
    history(s, d, local, &mut hist).map_err(|e| e.in_row(r))?;
    let (i, inputs) = (s.request, &s.inputs);
    let output_offsets = [0, hist.len() as u64];
    let prompt_offsets = inputs.prompt_tokens.map(|l| one_row(l.offsets, i));
    let allowed_offsets = inputs.allowed_tokens.map(|l| one_row(l.offsets, i));
    let banned_offsets = inputs.banned_tokens.map(|l| one_row(l.offsets, i));
    let stop_offsets = inputs.stop_tokens.map(|l| one_row(l.offsets, i));
    let bias_offsets = inputs.logit_bias.map(|b| one_row(b.offsets, i));
    let word_rows = inputs.bad_words.map(|w| one_row(w.row_offsets, i));
    let mut one = Batch::new(Logits::F32(&[]), 1, batch.vocab);
    one.output_tokens = Some(TokenLists { ids: &hist, offsets: &output_offsets });
    one.prompt_tokens =
        inputs.prompt_tokens.zip(prompt_offsets.as_ref()).map(|(l, o)| TokenLists { ids: l.ids, offsets: o });
    one.allowed_tokens =
        inputs.allowed_tokens.zip(allowed_offsets.as_ref()).map(|(l, o)| TokenLists { ids: l.ids, offsets: o });
    one.banned_tokens =
        inputs.banned_tokens.zip(banned_offsets.as_ref()).map(|(l, o)| TokenLists { ids: l.ids, offsets: o });
    one.stop_tokens = inputs.stop_tokens.zip(stop_offsets.as_ref()).map(|(l, o)| TokenLists { ids: l.ids, offsets: o });
    one.logit_bias = inputs.logit_bias.zip(bias_offsets.as_ref()).map(|(b, o)| LogitBias {
        ids: b.ids,
        values: b.values,
        offsets: o,
    });
    one.bad_words = inputs.bad_words.zip(word_rows.as_ref()).map(|(w, o)| BadWords {
        ids: w.ids,
        word_offsets: w.word_offsets,
        row_offsets: o,
    });
    fn at(p: Option<&[f32]>, i: usize) -> Option<&[f32]> {
        p.map(|p| &p[i..i + 1])
    }
    one.repetition_penalty = at(inputs.repetition_penalty, i);
    one.frequency_penalty = at(inputs.frequency_penalty, i);
    one.presence_penalty = at(inputs.presence_penalty, i);
    one.allowed_rows = inputs.allowed_rows.map(|a| &a[i..i + 1]);
    one.min_tokens = inputs.min_tokens.map(|m| &m[i..i + 1]);
    one.token_bitmask =
        inputs.token_bitmask.map(|m| TokenBitmask { words: &m.words[r * m.row_stride..], row_stride: m.row_stride });
    let Some(mut step) = crate::step::build(k, &one, 0, false).map_err(|e| e.in_row(r))? else {
        return Ok(None);
    };
    let nan = with_row!(batch, r, |row| step.materialize(k, row, y, &mut []));
    nan.map(Some).map_err(|e| e.in_row(r))
}

/// The logprob of `token` in target row `r` as given (`LogprobMode::Raw`): what a draw of the
/// row with a step reports, from the caller's values, not the processed ones.
pub(super) fn raw_logprob(k: &Kernels, batch: &Batch, r: usize, token: i32) -> Result<f32> {
    with_row!(batch, r, |row| {
        let mut bmax = Vec::new();
        let top = block_maxima(k, row, &mut bmax)?;
        let (mut logprob, mut rank) = (f32::NAN, 0);
        let out = RowOut { logprob: &mut logprob, rank: &mut rank, ids: &mut [], lps: &mut [], want_rank: false };
        row_logprobs(k, row, &bmax, None, LogprobMode::Raw, top, f32::NEG_INFINITY, token, out)?;
        Ok(logprob)
    })
    .map_err(|e: crate::error::Error| e.in_row(r))
}
