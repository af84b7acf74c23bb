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
    /// The tokens the lists touched (their bits are clear in `keep`), in token order.
    touched: Vec<(u32, Touched)>,
    penalties: Penalties,
    /// (token, value) of the touched tokens that can still be drawn (their value is neither
    /// -inf nor NaN), in token order; made by [`RowEdits::resolve`].
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

    /// Computes the overrides from the row's values `v`. Called once the row has been read (the
    /// touched tokens are scattered over it: read from the cache, not from memory).
    pub fn resolve<V: RowValues + ?Sized>(&mut self, v: &V) {
        self.overrides.clear();
        let p = self.penalties;
        // `overrides` has room for every touched token (reserved by `build`).
        self.overrides.extend(
            self.touched
                .iter()
                .map(|&(id, t)| (id, edited(v.at(id as usize), &t, p)))
                .filter(|&(_, y)| y > f32::NEG_INFINITY),
        );
    }

    /// Writes the processed row (`y`, as f32) into `out` (the overrides resolved first); returns whether the caller's row holds
    /// a NaN anywhere (masked or not).
    pub fn materialize<V: RowValues + ?Sized>(&mut self, v: &V, out: &mut Vec<f32>) -> Result<bool> {
        let n = v.n();
        alloc::resize(out, n, f32::NEG_INFINITY, "the processed row")?;
        self.resolve(v);
        let mut nan = false;
        for (i, y) in out.iter_mut().enumerate() {
            let x = v.at(i);
            nan |= x.is_nan();
            *y = if self.kept(i) { x } else { f32::NEG_INFINITY };
        }
        for &(id, value) in &self.overrides {
            out[id as usize] = value;
        }
        Ok(nan)
    }
}

/// Per-thread scratch of the edits. `named` is a bitset of the tokens the lists name (all clear
/// between rows: the walk that reads it clears it), so that the touched tokens are found in
/// token order without sorting the histories; `output` (sorted) gives the counts and `bias`
/// (sorted by token, list order kept) the biases.
#[derive(Default)]
struct Scratch {
    named: Vec<u32>,
    /// Tokens of the prompt or the output (the repetition penalty applies).
    seen: Vec<u32>,
    output: Vec<u32>,
    bias: Vec<(u32, f32)>,
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
pub(crate) fn build(batch: &Batch, r: usize) -> Result<Option<RowEdits>> {
    let n = batch.vocab;
    let words = n.div_ceil(32);
    let last_bits = if n.is_multiple_of(32) { u32::MAX } else { (1u32 << (n % 32)) - 1 };
    let mut e = RowEdits {
        keep: alloc::filled(words, u32::MAX, "the row's token mask")?,
        touched: Vec::new(),
        penalties: Penalties::of(batch, r),
        overrides: Vec::new(),
    };
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
    let touched = touch_lists(batch, r, &mut e)?;
    if !masked && touched == 0 {
        return Ok(None);
    }
    Ok(Some(e))
}

/// Collects what the bias and the histories say of each kept token, turns every token they
/// touched into an override (clearing its bit), and returns how many tokens were touched.
fn touch_lists(batch: &Batch, r: usize, e: &mut RowEdits) -> Result<usize> {
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
        let words = batch.vocab.div_ceil(32);
        for bits in [&mut s.named, &mut s.seen] {
            let n = bits.len().max(words);
            alloc::resize(bits, n, 0, "the row's named tokens")?;
        }
        let set = |bits: &mut [u32], id: i32| bits[id as usize / 32] |= 1 << (id as usize % 32);
        s.output.clear();
        s.bias.clear();
        // Every allocation before the first bit is set, so that a failure leaves them clear.
        let n_bias = bias.map_or(0, |b| b.0.len());
        alloc::reserve(&mut s.bias, n_bias, "the row's bias")?;
        alloc::reserve(&mut s.output, output.len(), "the row's output tokens")?;
        let most = n_bias + prompt.len() + output.len();
        alloc::reserve(&mut e.touched, most, "the row's touched tokens")?;
        alloc::reserve(&mut e.overrides, most, "the row's edited tokens")?;
        if let Some((ids, values)) = bias {
            for (&id, &b) in ids.iter().zip(values) {
                set(&mut s.named, id);
                s.bias.push((id as u32, b));
            }
            s.bias.sort_by_key(|&(id, _)| id); // stable: the biases of a token add up in list order
        }
        if repetition {
            for &id in prompt {
                set(&mut s.named, id);
                set(&mut s.seen, id);
            }
        }
        if counts {
            for &id in output {
                set(&mut s.named, id);
                set(&mut s.seen, id);
                s.output.push(id as u32);
            }
            s.output.sort_unstable();
        }
        Ok(walk_named(s, repetition, e))
    })
}

/// Walks the named tokens in token order (clearing the bitsets as it goes): each kept one is
/// touched (its bit cleared in `e.keep`), with its count and bias. Returns how many there were.
fn walk_named(s: &mut Scratch, repetition: bool, e: &mut RowEdits) -> usize {
    let (mut o, mut b, mut touched) = (0, 0, 0);
    for w in 0..e.keep.len() {
        let named = std::mem::take(&mut s.named[w]);
        let seen = std::mem::take(&mut s.seen[w]);
        let mut bits = named & e.keep[w];
        while bits != 0 {
            let j = bits.trailing_zeros();
            bits &= bits - 1;
            let id = (w * 32) as u32 + j;
            let mut t = Touched { seen: repetition && seen >> j & 1 != 0, ..Touched::default() };
            while s.output.get(o).is_some_and(|&x| x < id) {
                o += 1; // a masked token's
            }
            while s.output.get(o) == Some(&id) {
                t.count += 1;
                o += 1;
            }
            while s.bias.get(b).is_some_and(|&(x, _)| x < id) {
                b += 1;
            }
            while let Some(&(_, bias)) = s.bias.get(b).filter(|&&(x, _)| x == id) {
                t.bias = if t.has_bias { t.bias + bias } else { bias };
                t.has_bias = true;
                t.banned |= bias == f32::NEG_INFINITY;
                b += 1;
            }
            e.keep[w] &= !(1 << j);
            touched += 1;
            e.touched.push((id, t)); // within the room reserved for every listed token
        }
    }
    touched
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::ExternalNoise;
    use crate::batch::{LogitBias, Logits, Output, TokenBitmask, TokenLists};
    use crate::config::{NoiseKind, SimdChoice};
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
        let (bias_ids, bias_values): (Vec<i32>, Vec<f32>) = bias.iter().copied().unzip();
        let po = [0u64, prompt.len() as u64];
        let oo = [0u64, output.len() as u64];
        let bo = [0u64, bias.len() as u64];
        let ln_e: Vec<f32> =
            (0..vocab).map(|i| (-((i * 2654435761usize % 1000) as f32 / 1000.0 + 1e-4).ln()).ln()).collect();
        let e_noise: Vec<f32> = ln_e.iter().map(|l| l.exp()).collect();
        let levels = [SimdChoice::Scalar, SimdChoice::Portable, SimdChoice::Avx2, SimdChoice::Avx512];
        for (simd, level) in levels.into_iter().zip(crate::kernels::SimdLevel::ALL) {
            if !level.is_supported() {
                continue;
            }
            let s = Sampler::new(Config { vocab_size: vocab, max_rows: 4, simd, ..Config::default() }).unwrap();
            for (t, noise) in [0.0f32, 0.7, 1.0, 2.0].into_iter().flat_map(|t| {
                [
                    (t, None),
                    (t, Some(ExternalNoise { values: &ln_e[..], kind: NoiseKind::LogExp, row_stride: vocab })),
                    (t, Some(ExternalNoise { values: &e_noise[..], kind: NoiseKind::Exp, row_stride: vocab })),
                ]
            }) {
                let temps = [t];
                let seeds = if noise.is_none() { Some(&[11u64][..]) } else { None };
                let fused = Batch {
                    temperature: Some(&temps),
                    seeds,
                    noise,
                    prompt_tokens: Some(TokenLists { ids: &prompt, offsets: &po }),
                    output_tokens: Some(TokenLists { ids: &output, offsets: &oo }),
                    repetition_penalty: Some(&[1.3]),
                    frequency_penalty: Some(&[0.2]),
                    presence_penalty: Some(&[0.1]),
                    logit_bias: Some(LogitBias { ids: &bias_ids, values: &bias_values, offsets: &bo }),
                    token_bitmask: Some(TokenBitmask { words: &words, row_stride: words.len() }),
                    ..Batch::new(Logits::F32(&x), 1, vocab)
                };
                let plain = Batch { temperature: Some(&temps), seeds, noise, ..Batch::new(Logits::F32(&y), 1, vocab) };
                let (mut a, mut b) = ([0i32], [0i32]);
                s.draw(&fused, &mut Output::new(&mut a)).unwrap();
                s.draw(&plain, &mut Output::new(&mut b)).unwrap();
                assert_eq!(a, b, "{level:?} T = {t} noise {:?}", noise.map(|n| n.kind));
            }
        }
    }
}
