//! What a draw call takes and gives back, and the checks that run before anything is written.

pub use super::logprob::LogprobMode;
use crate::config::NoiseKind;
use crate::error::{bail_arg, Result};
use crate::kernels::{Bf16, F16};

/// The logits of a batch: `rows` rows of `vocab` values, `row_stride` elements apart.
#[derive(Clone, Copy, Debug)]
pub enum Logits<'a> {
    F32(&'a [f32]),
    Bf16(&'a [Bf16]),
    F16(&'a [F16]),
}

impl Logits<'_> {
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

fn check_len(name: &str, len: usize, rows: usize) -> Result<()> {
    if len < rows {
        bail_arg!("{name}: has {len} elements, the batch has {rows} rows");
    }
    Ok(())
}

/// Checks every argument of a draw call; `max_rows` and `vocab_size` come from the sampler.
pub(crate) fn validate(batch: &Batch, out: &Output, max_rows: usize, vocab_size: usize) -> Result<()> {
    let rows = batch.rows;
    if rows > max_rows {
        bail_arg!("rows: {rows} exceeds the sampler's max_rows {max_rows}");
    }
    if batch.vocab == 0 {
        bail_arg!("vocab: must be at least 1");
    }
    if batch.vocab > i32::MAX as usize {
        bail_arg!("vocab: {} exceeds 2147483647 (token ids are int32)", batch.vocab);
    }
    if vocab_size != 0 && batch.vocab != vocab_size {
        bail_arg!("vocab: {} differs from the sampler's vocab_size {vocab_size}", batch.vocab);
    }
    if batch.row_stride < batch.vocab {
        bail_arg!("row_stride: {} is smaller than vocab {}", batch.row_stride, batch.vocab);
    }
    if rows > 0 {
        let needed = (rows - 1).checked_mul(batch.row_stride).and_then(|n| n.checked_add(batch.vocab));
        match needed {
            None => bail_arg!("rows x row_stride: overflows"),
            Some(n) if n > batch.logits.len() => {
                bail_arg!("logits: holds {} elements, rows/vocab/row_stride need {n}", batch.logits.len())
            }
            _ => {}
        }
    }
    check_len("tokens", out.tokens.len(), rows)?;
    if let Some(f) = &out.flags {
        check_len("flags", f.len(), rows)?;
    }
    if let Some(l) = &out.logprobs {
        check_len("logprobs", l.len(), rows)?;
    }
    if let Some(l) = &out.ranks {
        check_len("ranks", l.len(), rows)?;
    }
    if out.top_n > 0 {
        if out.top_n > batch.vocab {
            bail_arg!("top_n: {} exceeds vocab {}", out.top_n, batch.vocab);
        }
        let need = rows.saturating_mul(out.top_n);
        for (name, len) in [
            ("topn_ids", out.topn_ids.as_ref().map(|l| l.len())),
            ("topn_logprobs", out.topn_logprobs.as_ref().map(|l| l.len())),
        ] {
            if let Some(len) = len {
                if len < need {
                    bail_arg!("{name}: has {len} elements, rows x top_n is {need}");
                }
            }
        }
    }
    if let Some(k) = batch.top_k {
        check_len("top_k", k.len(), rows)?;
    }
    if let Some(p) = batch.top_p {
        check_len("top_p", p.len(), rows)?;
        for (r, &p) in p[..rows].iter().enumerate() {
            if !(p > 0.0 && p <= 1.0) {
                bail_arg!("top_p[{r}]: {p} is not in (0, 1]");
            }
        }
    }
    if let Some(p) = batch.min_p {
        check_len("min_p", p.len(), rows)?;
        for (r, &p) in p[..rows].iter().enumerate() {
            if !(0.0..=1.0).contains(&p) {
                bail_arg!("min_p[{r}]: {p} is not in [0, 1]");
            }
        }
    }
    if let Some(t) = batch.temperature {
        check_len("temperature", t.len(), rows)?;
        for (r, &t) in t[..rows].iter().enumerate() {
            if !(t.is_finite() && t >= 0.0) {
                bail_arg!("temperature[{r}]: {t} is not a finite number >= 0");
            }
        }
    }
    if let Some(s) = batch.seeds {
        check_len("seeds", s.len(), rows)?;
    }
    if let Some(o) = batch.offsets {
        check_len("offsets", o.len(), rows)?;
    }
    if let Some(m) = batch.seeded {
        if batch.seeds.is_none() {
            bail_arg!("seeded: given without seeds");
        }
        check_len("seeded", m.len(), rows)?;
    }
    if let Some(n) = &batch.noise {
        if n.row_stride != 0 && n.row_stride < batch.vocab {
            bail_arg!("noise_row_stride: {} is neither 0 (broadcast) nor >= vocab {}", n.row_stride, batch.vocab);
        }
        if rows > 0 {
            let needed = if n.row_stride == 0 {
                Some(batch.vocab)
            } else {
                (rows - 1).checked_mul(n.row_stride).and_then(|x| x.checked_add(batch.vocab))
            };
            match needed {
                None => bail_arg!("rows x noise_row_stride: overflows"),
                Some(k) if k > n.values.len() => {
                    bail_arg!("noise: holds {} values, rows/vocab/noise_row_stride need {k}", n.values.len())
                }
                _ => {}
            }
        }
    }
    Ok(())
}
