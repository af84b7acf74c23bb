//! What a draw call takes and gives back, and the checks that run before anything is written.
//!
//! [`validate`] is the one place a draw's arguments are checked; the C layer only turns raw
//! pointers into slices (with [`span`], the one overflow check of a strided layout) and leaves
//! every other rule to it. Errors carry their location (`batch.top_p[3]`) as data.

use crate::config::NoiseKind;
use crate::error::{bail_batch, bail_out, Error, Owner, Result};
use crate::kernels::{Bf16, F16};

/// Which logprobs a draw reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogprobMode {
    /// log_softmax of the logits as given (vLLM's default).
    #[default]
    Raw,
    /// log_softmax of `(x - m) / T` over the tokens the filters keep (-inf elsewhere); greedy
    /// rows report RAW.
    Processed,
}

/// 1/T of a sampling row as the race and the filters use it, capped at the largest f32 so that
/// a tiny T never turns `0 * inv_t` into NaN.
pub(crate) fn inv_temperature(t: f32) -> f32 {
    let inv = 1.0 / t;
    if inv.is_finite() {
        inv
    } else {
        f32::MAX
    }
}

/// The logits of a batch: `rows` rows of `vocab` values, `row_stride` elements apart.
#[derive(Clone, Copy, Debug)]
pub enum Logits<'a> {
    F32(&'a [f32]),
    Bf16(&'a [Bf16]),
    F16(&'a [F16]),
}

impl Logits<'_> {
    /// Bytes per element.
    pub fn elem_size(&self) -> usize {
        match self {
            Logits::F32(_) => 4,
            Logits::Bf16(_) | Logits::F16(_) => 2,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Logits::F32(s) => s.len(),
            Logits::Bf16(s) => s.len(),
            Logits::F16(s) => s.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The value at `index`, as f32.
    pub fn get(&self, index: usize) -> f32 {
        match self {
            Logits::F32(s) => s[index],
            Logits::Bf16(s) => s[index].to_f32(),
            Logits::F16(s) => s[index].to_f32(),
        }
    }
}

/// Noise supplied by the caller: one value per token, E or ln E.
#[derive(Clone, Copy, Debug)]
pub struct ExternalNoise<'a> {
    pub values: &'a [f32],
    pub kind: NoiseKind,
    /// Elements between rows; 0 broadcasts one row to every row.
    pub row_stride: usize,
}

/// One draw call's inputs. Every per-row slice is optional and, when given, has at least `rows`
/// elements.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    pub logits: Logits<'a>,
    pub rows: usize,
    pub vocab: usize,
    /// Elements between the starts of consecutive rows (>= vocab).
    pub row_stride: usize,
    /// Per-row temperature; `None` means 1.0 for every row.
    pub temperature: Option<&'a [f32]>,
    /// Per-row seeds; a seeded row's noise is a pure function of (seed, offset, token).
    pub seeds: Option<&'a [u64]>,
    /// Per-row offsets (e.g. the position of the token in its sequence); `None` means 0.
    pub offsets: Option<&'a [u64]>,
    /// Which rows use their seed (nonzero = seeded); `None` with `seeds` means every row.
    pub seeded: Option<&'a [u8]>,
    /// Noise for the unseeded sampling rows.
    pub noise: Option<ExternalNoise<'a>>,
    /// Per-row top-k; k <= 0 or k >= vocab is off. Sampling rows only.
    pub top_k: Option<&'a [i32]>,
    /// Per-row top-p in (0, 1]; 1 is off. Sampling rows only.
    pub top_p: Option<&'a [f32]>,
    /// Per-row min-p in [0, 1]; 0 is off. Sampling rows only.
    pub min_p: Option<&'a [f32]>,
}

impl<'a> Batch<'a> {
    /// A batch of contiguous rows with no per-row options.
    pub fn new(logits: Logits<'a>, rows: usize, vocab: usize) -> Self {
        Batch {
            logits,
            rows,
            vocab,
            row_stride: vocab,
            temperature: None,
            seeds: None,
            offsets: None,
            seeded: None,
            noise: None,
            top_k: None,
            top_p: None,
            min_p: None,
        }
    }

    pub fn temperature(&self, row: usize) -> f32 {
        self.temperature.map_or(1.0, |t| t[row])
    }

    /// The seed of `row` if it is seeded.
    pub fn seed_of(&self, row: usize) -> Option<(u64, u64)> {
        let seeds = self.seeds?;
        if let Some(mask) = self.seeded {
            if mask[row] == 0 {
                return None;
            }
        }
        Some((seeds[row], self.offsets.map_or(0, |o| o[row])))
    }
}

/// Row flags reported in `Output::flags`.
pub mod flags {
    /// The row held at least one NaN logit (NaN never wins).
    pub const HAS_NAN: u32 = 1;
    /// The row held a +inf logit; the first +inf won.
    pub const HAS_POSINF: u32 = 2;
    /// The row had no finite and no +inf logit; token 0 was returned.
    pub const EMPTY: u32 = 4;
    /// The row was drawn greedily (temperature below the greedy threshold).
    pub const GREEDY: u32 = 8;
}

/// Where a draw writes. Nothing is written unless the call succeeds. Every output but `tokens`
/// is optional; make one with [`Output::new`] and set the fields you want.
#[derive(Debug)]
pub struct Output<'a> {
    pub tokens: &'a mut [i32],
    pub flags: Option<&'a mut [u32]>,
    /// `rows` logprobs of the sampled tokens, in `logprob_mode`.
    pub logprobs: Option<&'a mut [f32]>,
    /// `rows` ranks of the sampled tokens: the count of tokens whose logprob is >= its own.
    pub ranks: Option<&'a mut [i32]>,
    /// Entries per row of `topn_ids` / `topn_logprobs` (at most vocab); 0: none.
    pub top_n: usize,
    /// `rows x top_n` ids of the most probable tokens, descending, lowest id first on ties.
    pub topn_ids: Option<&'a mut [i32]>,
    /// `rows x top_n` logprobs of those tokens, in `logprob_mode`.
    pub topn_logprobs: Option<&'a mut [f32]>,
    pub logprob_mode: LogprobMode,
}

impl<'a> Output<'a> {
    /// Tokens only.
    pub fn new(tokens: &'a mut [i32]) -> Self {
        Output {
            tokens,
            flags: None,
            logprobs: None,
            ranks: None,
            top_n: 0,
            topn_ids: None,
            topn_logprobs: None,
            logprob_mode: LogprobMode::Raw,
        }
    }

    /// Whether any logprob output is asked for.
    pub(crate) fn wants_logprobs(&self) -> bool {
        self.logprobs.is_some()
            || self.ranks.is_some()
            || (self.top_n > 0 && (self.topn_ids.is_some() || self.topn_logprobs.is_some()))
    }
}

/// Elements spanned by `rows` rows of `vocab` elements of `elem_size` bytes, `stride` elements
/// apart: `(rows - 1) * stride + vocab`, or an error naming `stride_field` when that many
/// elements do not fit in the address space (`isize::MAX` bytes). `rows` 0 spans nothing.
pub fn span(rows: usize, vocab: usize, stride: usize, elem_size: usize, stride_field: &'static str) -> Result<usize> {
    if rows == 0 {
        return Ok(0);
    }
    (rows - 1)
        .checked_mul(stride)
        .and_then(|n| n.checked_add(vocab))
        .filter(|&n| n.checked_mul(elem_size).is_some_and(|b| b <= isize::MAX as usize))
        .ok_or_else(|| {
            Error::arg(
                Owner::Batch,
                stride_field,
                None,
                format!("{stride} x {} rows of {elem_size}-byte elements overflows the address space", rows - 1),
            )
        })
}

fn check_len(owner: Owner, field: &'static str, len: usize, need: usize, what: &str) -> Result<()> {
    if len < need {
        return Err(Error::arg(owner, field, None, format!("has {len} elements, {what} is {need}")));
    }
    Ok(())
}

fn check_rows<T>(owner: Owner, field: &'static str, s: Option<&[T]>, rows: usize) -> Result<()> {
    s.map_or(Ok(()), |s| check_len(owner, field, s.len(), rows, "the batch's row count"))
}

/// Checks a per-row value of every row; the first bad one is reported with its row.
fn check_each<T: Copy>(
    field: &'static str,
    s: Option<&[T]>,
    rows: usize,
    bad: impl Fn(T) -> Option<String>,
) -> Result<()> {
    check_rows(Owner::Batch, field, s, rows)?;
    for (r, &v) in s.map_or(&[][..], |s| &s[..rows]).iter().enumerate() {
        if let Some(why) = bad(v) {
            bail_batch!(field, Some(r), "{why}");
        }
    }
    Ok(())
}

/// Checks every argument of a draw call; `max_rows` and `vocab_size` come from the sampler.
pub(crate) fn validate(batch: &Batch, out: &Output, max_rows: usize, vocab_size: usize) -> Result<()> {
    let (rows, vocab) = (batch.rows, batch.vocab);
    if rows > max_rows {
        bail_batch!("rows", None, "{rows} exceeds the sampler's max_rows {max_rows}");
    }
    if vocab == 0 {
        bail_batch!("vocab", None, "must be at least 1");
    }
    if vocab > i32::MAX as usize {
        bail_batch!("vocab", None, "{vocab} exceeds 2147483647 (token ids are int32)");
    }
    if vocab_size != 0 && vocab != vocab_size {
        bail_batch!("vocab", None, "{vocab} differs from the sampler's vocab_size {vocab_size}");
    }
    if batch.row_stride < vocab {
        bail_batch!("row_stride", None, "{} is smaller than vocab {vocab}", batch.row_stride);
    }
    let need = span(rows, vocab, batch.row_stride, batch.logits.elem_size(), "row_stride")?;
    check_len(Owner::Batch, "logits", batch.logits.len(), need, "rows/vocab/row_stride's span")?;
    check_len(Owner::Output, "tokens", out.tokens.len(), rows, "the batch's row count")?;
    check_rows(Owner::Output, "flags", out.flags.as_deref(), rows)?;
    check_rows(Owner::Output, "logprobs", out.logprobs.as_deref(), rows)?;
    check_rows(Owner::Output, "ranks", out.ranks.as_deref(), rows)?;
    if out.top_n > 0 {
        if out.top_n > vocab {
            bail_out!("top_n", None, "{} exceeds vocab {vocab}", out.top_n);
        }
        let need = rows
            .checked_mul(out.top_n)
            .ok_or_else(|| Error::arg(Owner::Output, "top_n", None, "rows x top_n overflows"))?;
        for (field, s) in [
            ("topn_ids", out.topn_ids.as_ref().map(|l| l.len())),
            ("topn_logprobs", out.topn_logprobs.as_ref().map(|l| l.len())),
        ] {
            if let Some(len) = s {
                check_len(Owner::Output, field, len, need, "rows x top_n")?;
            }
        }
    }
    check_rows(Owner::Batch, "top_k", batch.top_k, rows)?;
    check_each("top_p", batch.top_p, rows, |p: f32| (!(p > 0.0 && p <= 1.0)).then(|| format!("{p} is not in (0, 1]")))?;
    check_each("min_p", batch.min_p, rows, |p: f32| {
        (!(0.0..=1.0).contains(&p)).then(|| format!("{p} is not in [0, 1]"))
    })?;
    check_each("temperature", batch.temperature, rows, |t: f32| {
        (!(t.is_finite() && t >= 0.0)).then(|| format!("{t} is not a finite number >= 0"))
    })?;
    check_rows(Owner::Batch, "seeds", batch.seeds, rows)?;
    check_rows(Owner::Batch, "offsets", batch.offsets, rows)?;
    if batch.seeded.is_some() && batch.seeds.is_none() {
        bail_batch!("seeded", None, "given without seeds");
    }
    check_rows(Owner::Batch, "seeded", batch.seeded, rows)?;
    if let Some(n) = &batch.noise {
        if n.row_stride != 0 && n.row_stride < vocab {
            bail_batch!("noise_row_stride", None, "{} is neither 0 (broadcast) nor >= vocab {vocab}", n.row_stride);
        }
        let need = noise_span(rows, vocab, n.row_stride)?;
        check_len(Owner::Batch, "noise", n.values.len(), need, "rows/vocab/noise_row_stride's span")?;
    }
    Ok(())
}

/// Values spanned by the noise rows of a batch (a stride of 0 broadcasts one row).
pub fn noise_span(rows: usize, vocab: usize, stride: usize) -> Result<usize> {
    match (rows, stride) {
        (0, _) => Ok(0),
        (_, 0) => Ok(vocab),
        _ => span(rows, vocab, stride, 4, "noise_row_stride"),
    }
}
