//! The penalties of a row (repetition, frequency, presence) and the value of a token the lists
//! touched: its bias, then the penalties, in f32 as vLLM computes them.

use crate::batch::Batch;

/// What the lists say of one token, as [`processed_value`] reads it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Touched {
    /// Occurrences in the output.
    pub count: u32,
    /// Occurs in the prompt or the output (the repetition penalty applies).
    pub seen: bool,
    pub has_bias: bool,
    /// A -inf bias bans the token.
    pub banned: bool,
    pub bias: f32,
    /// DRY's penalty (0 when it has none).
    pub dry: f32,
}

/// The penalties of one row (defaults: off).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Penalties {
    pub repetition: f32,
    pub frequency: f32,
    pub presence: f32,
}

// (`#[inline]` throughout: these are read in the per-token loops of `processed.rs` and
// `build.rs`, which may land in another codegen unit.)
impl Penalties {
    /// Row `r`'s penalties in `batch` (off where the batch has none).
    #[inline]
    pub(super) fn of(batch: &Batch, r: usize) -> Penalties {
        Penalties {
            repetition: batch.repetition_penalty.map_or(1.0, |p| p[r]),
            frequency: batch.frequency_penalty.map_or(0.0, |p| p[r]),
            presence: batch.presence_penalty.map_or(0.0, |p| p[r]),
        }
    }

    /// Whether the repetition penalty changes anything.
    #[inline]
    pub(super) fn repeats(&self) -> bool {
        self.repetition != 1.0
    }

    /// Whether the output's counts change anything.
    #[inline]
    pub(super) fn counts(&self) -> bool {
        self.frequency != 0.0 || self.presence != 0.0
    }

    /// Whether no penalty can raise a value: `r >= 1`, `f >= 0` and `p >= 0`. Then every
    /// penalised value is at most the logit it came from, in f32 too: `fl(y / r) <= y` for
    /// `y > 0` and `fl(y * r) <= y` for `y <= 0` (rounding never crosses a representable bound),
    /// and `fl(y - c) <= y` for `c >= 0`.
    #[inline]
    pub(super) fn lower_only(&self) -> bool {
        self.repetition >= 1.0 && self.frequency >= 0.0 && self.presence >= 0.0
    }
}

/// The value of a token of logit `x` that the lists touched, in f32 as vLLM computes it: the
/// bias (a -inf bias bans, even a +inf logit), then the repetition penalty (`y > 0 ? y / r :
/// y * r`) for a token of the prompt or the output, then `y - f * count` and `y - p` for a token
/// of the output (two subtractions, as vLLM's two in-place ones), then `y - dry` (DRY's
/// penalty, 0 for a token it does not penalise).
#[inline(always)]
pub(super) fn processed_value(x: f32, t: &Touched, p: Penalties) -> f32 {
    if t.banned {
        return f32::NEG_INFINITY;
    }
    let mut y = x;
    if t.has_bias {
        y += t.bias;
    }
    if t.seen && p.repeats() {
        y = repeated(y, p.repetition);
    }
    if t.count > 0 {
        y -= p.frequency * t.count as f32;
        y -= p.presence;
    }
    // llama.cpp's DRY comes after its penalties: one more subtraction (of 0 for most tokens,
    // which changes no value).
    y - t.dry
}

/// `y > 0 ? y / r : y * r` (vLLM's repetition penalty), without a branch on the sign: the sign
/// of a logit is a coin flip, which a branch would mispredict for half the tokens of a history.
#[inline(always)]
pub(super) fn repeated(y: f32, r: f32) -> f32 {
    let (down, up) = (y / r, y * r);
    let positive = 0u32.wrapping_sub((y > 0.0) as u32);
    f32::from_bits((down.to_bits() & positive) | (up.to_bits() & !positive))
}

/// The histories of row `r` that its penalties read: the prompt (with the repetition penalty)
/// and the output (with any penalty), both within the row's penalty window.
///
/// A row named by request id whose window keeps its whole prompt reads the prompt's distinct
/// tokens instead ([`Requests`](crate::Requests) keeps them): the prompt only marks which
/// tokens it holds, so its set marks the same bits as its list, in a pass a fraction as long.
pub(super) fn histories<'a>(batch: &Batch<'a>, r: usize, p: Penalties) -> (&'a [i32], &'a [i32]) {
    let h = histories_of(batch, r, p);
    (h.prompt, h.output)
}

/// What a row's penalties read of its histories ([`histories_of`]).
pub(super) struct Histories<'a> {
    /// The prompt within the window (empty without the repetition penalty).
    pub prompt: &'a [i32],
    /// The output within the window (empty without any penalty).
    pub output: &'a [i32],
    /// The request whose distinct tokens `prompt` is, when it is (a nonempty prompt read by the
    /// repetition penalty): `prompt` is then increasing, so the ids of one block of tokens are a
    /// range of it, and the request holds its bits.
    pub prompt_of: Option<&'a crate::requests::Request>,
    /// The request whose whole output `output` is, when it is (the window keeps all of it): the
    /// request's counts of it (its distinct tokens' bits, its repeats) then stand for the list.
    pub output_of: Option<&'a crate::requests::Request>,
}

/// [`histories`], with the requests that hold what they read ([`Histories`]).
pub(super) fn histories_of<'a>(batch: &Batch<'a>, r: usize, p: Penalties) -> Histories<'a> {
    let whole = batch.prompt_row(r);
    let whole_output = batch.output_row(r);
    let (mut prompt, output) = windowed(whole, whole_output, batch.penalty_last_n.map_or(0, |n| n[r]));
    let (mut prompt_of, mut output_of) = (None, None);
    if let Some(request) = batch.requests.and_then(|q| q.row(r)) {
        if prompt.len() == whole.len() && p.repeats() {
            (prompt, prompt_of) = (request.prompt_set(), Some(request));
        }
        if output.len() == whole_output.len() && !output.is_empty() {
            output_of = Some(request);
        }
    }
    let output = if p.repeats() || p.counts() { output } else { &[] };
    Histories {
        prompt: if p.repeats() { prompt } else { &[] },
        output,
        prompt_of,
        output_of: output_of.filter(|_| !output.is_empty()),
    }
}

/// The last `last_n` tokens of `prompt ++ output`, as the part of each that they cover; 0 (or
/// a window at least as long as both) keeps them whole. Slicing, not copying: the step's cost
/// is the window's length, not the history's.
pub(super) fn windowed<'a>(prompt: &'a [i32], output: &'a [i32], last_n: i32) -> (&'a [i32], &'a [i32]) {
    let Ok(n) = usize::try_from(last_n) else { return (prompt, output) };
    if n == 0 {
        return (prompt, output);
    }
    let output = &output[output.len().saturating_sub(n)..];
    let from_prompt = n - output.len();
    (&prompt[prompt.len().saturating_sub(from_prompt)..], output)
}
