//! The sampling step before temperature and the filters: the allowed list, the grammar bitmask
//! and the banned list (masks), the logit bias, and the penalties (`docs/semantics.md`, The
//! sampling step). The caller's logits are never written.
//!
//! A row's edits are built in `O(vocab / 32 + history + list lengths)`, never a pass over the
//! logits:
//! - `keep`, one bit per token: set for the tokens whose value is the caller's logit as given
//!   (neither masked nor edited);
//! - `overrides`, the (token, value) pairs of the tokens that bias or penalties changed (masked
//!   tokens are never among them: a mask wins over everything).
//!
//! The row the rest of the draw sees is then `y_i = override_i`, else `x_i` where the bit is set,
//! else -inf. Each override is computed in f32 by [`edited`], in vLLM's order.

use crate::alloc;
use crate::batch::Batch;
use crate::error::Result;
use crate::row::RowValues;
use std::cell::RefCell;

/// What the lists of one token say.
#[derive(Clone, Copy, Debug, Default)]
struct Touched {
    id: u32,
    /// Occurrences in the output.
    count: u32,
    /// Occurs in the prompt or the output (the repetition penalty applies).
    seen: bool,
    has_bias: bool,
    /// A -inf bias bans the token.
    banned: bool,
    bias: f32,
}

/// The penalties of one row (defaults: off).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Penalties {
    pub repetition: f32,
    pub frequency: f32,
    pub presence: f32,
}

impl Penalties {
    fn of(batch: &Batch, r: usize) -> Penalties {
        Penalties {
            repetition: batch.repetition_penalty.map_or(1.0, |p| p[r]),
            frequency: batch.frequency_penalty.map_or(0.0, |p| p[r]),
            presence: batch.presence_penalty.map_or(0.0, |p| p[r]),
        }
    }
}

/// The value of a token of logit `x` that the lists touched, in f32 as vLLM computes it: the
/// bias (a -inf bias bans, even a +inf logit), then the repetition penalty (`y > 0 ? y / r :
/// y * r`) for a token of the prompt or the output, then `y - f * count` and `y - p` for a token
/// of the output (two subtractions, as vLLM's two in-place ones).
fn edited(x: f32, t: &Touched, p: Penalties) -> f32 {
    if t.banned {
        return f32::NEG_INFINITY;
    }
    let mut y = x;
    if t.has_bias {
        y += t.bias;
    }
    if t.seen && p.repetition != 1.0 {
        y = if y > 0.0 { y / p.repetition } else { y * p.repetition };
    }
    if t.count > 0 {
        y -= p.frequency * t.count as f32;
        y -= p.presence;
    }
    y
}

/// The edits of one row: see the module doc.
pub(crate) struct RowEdits {
    /// One bit per token (`vocab.div_ceil(32)` words; bits past the vocabulary are clear).
    pub keep: Vec<u32>,
    /// (token, value) of the edited tokens that can still be drawn (their value is neither
    /// -inf nor NaN), in the order the lists named them.
    pub overrides: Vec<(u32, f32)>,
}

impl RowEdits {
    /// Whether token `i` keeps the caller's logit.
    #[inline(always)]
    pub fn kept(&self, i: usize) -> bool {
        self.keep[i / 32] >> (i % 32) & 1 != 0
    }

    fn clear(&mut self, i: usize) {
        self.keep[i / 32] &= !(1 << (i % 32));
    }

    /// Writes the row the draw sees (`y`, as f32) into `out`; returns whether the caller's row
    /// holds a NaN anywhere (masked or not) and its largest value (NaN ignored).
    pub fn materialize<V: RowValues + ?Sized>(&self, v: &V, out: &mut Vec<f32>) -> Result<(bool, f32)> {
        let n = v.n();
        alloc::resize(out, n, f32::NEG_INFINITY, "the processed row")?;
        let (mut nan, mut top) = (false, f32::NEG_INFINITY);
        for (i, y) in out.iter_mut().enumerate() {
            let x = v.at(i);
            nan |= x.is_nan();
            if x > top {
                top = x;
            }
            *y = if self.kept(i) { x } else { f32::NEG_INFINITY };
        }
        for &(id, value) in &self.overrides {
            out[id as usize] = value;
        }
        Ok((nan, top))
    }
}

/// Per-thread scratch of the edits: a slot per token (`u32::MAX`: untouched; kept so between
/// rows, so that only the touched slots are ever reset) and the touched tokens.
#[derive(Default)]
struct Scratch {
    slot: Vec<u32>,
    touched: Vec<Touched>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Whether row `r` of a validated `batch` has anything before the filters to apply (the
/// bitmask of a row counts even when all its bits are set; [`build`] then finds nothing).
pub(crate) fn row_has_edits(batch: &Batch, r: usize) -> bool {
    let nonempty = |l: Option<crate::batch::TokenLists>| l.is_some_and(|l| !l.row(r).is_empty());
    let p = Penalties::of(batch, r);
    batch.token_bitmask.is_some()
        || restricted(batch, r)
        || nonempty(batch.banned_tokens)
        || batch.logit_bias.is_some_and(|b| !b.row(r).0.is_empty())
        || (p.repetition != 1.0 && (nonempty(batch.prompt_tokens) || nonempty(batch.output_tokens)))
        || ((p.frequency != 0.0 || p.presence != 0.0) && nonempty(batch.output_tokens))
}

/// Whether row `r` may only draw from its allowed list.
fn restricted(batch: &Batch, r: usize) -> bool {
    batch.allowed_tokens.is_some() && batch.allowed_rows.is_none_or(|a| a[r] != 0)
}

/// The edits of row `r` of a validated `batch` whose values are `v`, or `None` when they leave
/// the row as given (every bit of its bitmask set, no list touching a kept token).
pub(crate) fn build<V: RowValues + ?Sized>(batch: &Batch, r: usize, v: &V) -> Result<Option<RowEdits>> {
    let n = batch.vocab;
    let words = n.div_ceil(32);
    let last_bits = if n.is_multiple_of(32) { u32::MAX } else { (1u32 << (n % 32)) - 1 };
    let mut e = RowEdits { keep: alloc::filled(words, u32::MAX, "the row's token mask")?, overrides: Vec::new() };
    let mut masked = false;
    if let Some(m) = batch.token_bitmask {
        let row = &m.words[r * m.row_stride..r * m.row_stride + words];
        for (k, &w) in e.keep.iter_mut().zip(row) {
            *k = w as u32;
        }
        e.keep[words - 1] &= last_bits;
        masked = e.keep[..words - 1].iter().any(|&w| w != u32::MAX) || e.keep[words - 1] != last_bits;
    }
    e.keep[words - 1] &= last_bits;
    if restricted(batch, r) {
        let allowed = batch.allowed_tokens.map_or(&[][..], |l| l.row(r));
        let mut only = alloc::filled(words, 0u32, "the row's allowed tokens")?;
        for &id in allowed {
            let i = id as usize;
            only[i / 32] |= e.keep[i / 32] & (1 << (i % 32));
        }
        e.keep = only;
        masked = true;
    }
    for &id in batch.banned_tokens.map_or(&[][..], |l| l.row(r)) {
        e.clear(id as usize);
        masked = true;
    }
    let overrides = touch_lists(batch, r, v, &mut e)?;
    if !masked && overrides == 0 {
        return Ok(None);
    }
    Ok(Some(e))
}

/// Collects what the bias and the histories say of each kept token, turns every token they
/// touched into an override (clearing its bit), and returns how many tokens were touched.
fn touch_lists<V: RowValues + ?Sized>(batch: &Batch, r: usize, v: &V, e: &mut RowEdits) -> Result<usize> {
    let p = Penalties::of(batch, r);
    let bias = batch.logit_bias.map(|b| b.row(r));
    let prompt = batch.prompt_tokens.map_or(&[][..], |l| l.row(r));
    let output = batch.output_tokens.map_or(&[][..], |l| l.row(r));
    let repetition = p.repetition != 1.0;
    let counts = repetition || p.frequency != 0.0 || p.presence != 0.0;
    let touches =
        bias.is_some_and(|b| !b.0.is_empty()) || (repetition && !prompt.is_empty()) || (counts && !output.is_empty());
    if !touches {
        return Ok(0);
    }
    SCRATCH.with(|s| {
        let s = &mut *s.borrow_mut();
        let n = s.slot.len().max(batch.vocab);
        alloc::resize(&mut s.slot, n, u32::MAX, "the row's token slots")?;
        s.touched.clear();
        let most = bias.map_or(0, |b| b.0.len()) + prompt.len() + output.len();
        alloc::reserve(&mut s.touched, most, "the row's touched tokens")?;
        if let Some((ids, values)) = bias {
            for (&id, &b) in ids.iter().zip(values) {
                if let Some(t) = s.touch(e, id) {
                    t.bias = if t.has_bias { t.bias + b } else { b };
                    t.has_bias = true;
                    t.banned |= b == f32::NEG_INFINITY;
                }
            }
        }
        if repetition {
            for &id in prompt {
                if let Some(t) = s.touch(e, id) {
                    t.seen = true;
                }
            }
        }
        if counts {
            for &id in output {
                if let Some(t) = s.touch(e, id) {
                    t.seen = true;
                    t.count += 1;
                }
            }
        }
        let result = alloc::reserve(&mut e.overrides, s.touched.len(), "the row's edited tokens");
        for t in &s.touched {
            let i = t.id as usize;
            s.slot[i] = u32::MAX;
            e.clear(i);
            let y = edited(v.at(i), t, p);
            if result.is_ok() && y > f32::NEG_INFINITY {
                e.overrides.push((t.id, y));
            }
        }
        result.map(|_| s.touched.len())
    })
}

impl Scratch {
    /// The entry of token `id`, made on first use; `None` for a masked token (it stays -inf
    /// whatever the lists say). `touched` has room for every token of the lists.
    fn touch(&mut self, e: &RowEdits, id: i32) -> Option<&mut Touched> {
        let i = id as usize;
        if !e.kept(i) {
            return None;
        }
        if self.slot[i] == u32::MAX {
            self.slot[i] = self.touched.len() as u32;
            self.touched.push(Touched { id: id as u32, ..Touched::default() });
        }
        Some(&mut self.touched[self.slot[i] as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{LogitBias, Logits, Output, TokenBitmask, TokenLists};
    use crate::{Config, Sampler};

    /// The processed row in the simplest form: every step over the whole vocabulary.
    fn dense(x: &[f32], prompt: &[i32], output: &[i32], bias: &[(i32, f32)], p: Penalties, mask: &[bool]) -> Vec<f32> {
        let mut y: Vec<f32> = x.iter().zip(mask).map(|(&x, &m)| if m { x } else { f32::NEG_INFINITY }).collect();
        for (i, y) in y.iter_mut().enumerate() {
            if !mask[i] {
                continue;
            }
            let b: Vec<f32> = bias.iter().filter(|b| b.0 as usize == i).map(|b| b.1).collect();
            if b.contains(&f32::NEG_INFINITY) {
                *y = f32::NEG_INFINITY;
                continue;
            }
            if let Some(first) = b.first() {
                *y += b[1..].iter().fold(*first, |a, &v| a + v);
            }
            let count = output.iter().filter(|&&t| t as usize == i).count();
            if p.repetition != 1.0 && (count > 0 || prompt.contains(&(i as i32))) {
                *y = if *y > 0.0 { *y / p.repetition } else { *y * p.repetition };
            }
            if count > 0 {
                *y -= p.frequency * count as f32;
                *y -= p.presence;
            }
        }
        y
    }

    #[test]
    fn a_row_with_edits_draws_as_its_processed_row() {
        let vocab: usize = 1000;
        let x: Vec<f32> = (0..vocab).map(|i| ((i * 7919 % 1000) as f32 / 100.0) - 5.0).collect();
        let prompt = [3, 5, 5, 900, 17];
        let output = [5, 17, 17, 42, 0];
        let bias = [(42, 2.5), (7, -1.0), (7, 0.5), (8, f32::NEG_INFINITY), (999, 30.0)];
        let p = Penalties { repetition: 1.3, frequency: 0.2, presence: 0.1 };
        let mut words = vec![-1i32; vocab.div_ceil(32)];
        words[3] = 0x0f0f_0f0f;
        let mask: Vec<bool> = (0..vocab).map(|i| words[i / 32] as u32 >> (i % 32) & 1 != 0).collect();
        let y = dense(&x, &prompt, &output, &bias, p, &mask);
        let s = Sampler::new(Config { vocab_size: vocab, max_rows: 4, ..Config::default() }).unwrap();
        let seeds = [11u64];
        let (bias_ids, bias_values): (Vec<i32>, Vec<f32>) = bias.iter().copied().unzip();
        let po = [0u64, prompt.len() as u64];
        let oo = [0u64, output.len() as u64];
        let bo = [0u64, bias.len() as u64];
        for t in [0.0f32, 0.7, 1.0, 2.0] {
            let temps = [t];
            let fused = Batch {
                temperature: Some(&temps),
                seeds: Some(&seeds),
                prompt_tokens: Some(TokenLists { ids: &prompt, offsets: &po }),
                output_tokens: Some(TokenLists { ids: &output, offsets: &oo }),
                repetition_penalty: Some(&[1.3]),
                frequency_penalty: Some(&[0.2]),
                presence_penalty: Some(&[0.1]),
                logit_bias: Some(LogitBias { ids: &bias_ids, values: &bias_values, offsets: &bo }),
                token_bitmask: Some(TokenBitmask { words: &words, row_stride: words.len() }),
                ..Batch::new(Logits::F32(&x), 1, vocab)
            };
            let plain =
                Batch { temperature: Some(&temps), seeds: Some(&seeds), ..Batch::new(Logits::F32(&y), 1, vocab) };
            let (mut a, mut b) = ([0i32], [0i32]);
            s.draw(&fused, &mut Output::new(&mut a)).unwrap();
            s.draw(&plain, &mut Output::new(&mut b)).unwrap();
            assert_eq!(a, b, "T = {t}");
            assert_ne!(a[0], 999 % 1000 + 1000); // in range
        }
    }
}
