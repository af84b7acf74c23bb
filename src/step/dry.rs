//! DRY ("don't repeat yourself", llama.cpp's `dry_*` parameters): a penalty on each token that
//! would extend a sequence the history already repeats, growing exponentially with the length of
//! the repeat. Computed from the row's history alone (no state between calls), in
//! `O(history)`.
//!
//! The rule, over the window `h` (the last `dry_penalty_last_n` tokens of prompt ++ output, all
//! of them at -1), `L = len(h)`:
//! - off when `dry_multiplier == 0`, `dry_base < 1`, `dry_penalty_last_n == 0` or
//!   `L <= dry_allowed_length`;
//! - the repeat limit: the number of tokens after the last complete sequence breaker of the
//!   window (a breaker is a head token then its tail; at a head, its longest matching tail
//!   counts), `L` when there is none; off when it is below `dry_allowed_length`;
//! - for each end `i < L - 1`, `n_i = min(s_i, limit)` with `s_i` the longest common suffix of
//!   `h[..=i]` and `h`: if `n_i >= dry_allowed_length`, token `h[i + 1]` would extend a repeat of
//!   `n_i` tokens; a token's repeat is the longest of its ends;
//! - a token with a repeat `n` (unless it is the head of a one-token breaker) has its value
//!   lowered by `fl32(multiplier * base^e)` (the power in f64), `e = n - dry_allowed_length`,
//!   capped at `trunc(88.7228391 / ln(base))` when `base > 1.000001`, after every other penalty.

use crate::alloc;
use crate::batch::{BadWords, Batch};
use crate::error::Result;

/// llama.cpp's defaults of the parameters a batch may leave out.
const DEFAULT_BASE: f32 = 1.75;
const DEFAULT_ALLOWED_LENGTH: i32 = 2;
/// `ln(f32::MAX)`, rounded as llama.cpp writes it: the exponent is capped so that the power
/// stays below it.
const FLOAT_MAX_LOG: f32 = 88.722_84;

/// Row `r`'s DRY parameters, when DRY is on for it.
#[derive(Clone, Copy, Debug)]
struct Dry {
    multiplier: f32,
    base: f32,
    allowed_length: usize,
    /// -1: the whole history.
    last_n: i32,
}

impl Dry {
    fn of(batch: &Batch, r: usize) -> Option<Dry> {
        let multiplier = batch.dry_multiplier.map_or(0.0, |m| m[r]);
        let base = batch.dry_base.map_or(DEFAULT_BASE, |b| b[r]);
        let last_n = batch.dry_penalty_last_n.map_or(-1, |n| n[r]);
        let allowed_length = batch.dry_allowed_length.map_or(DEFAULT_ALLOWED_LENGTH, |n| n[r]).max(0) as usize;
        (multiplier != 0.0 && base >= 1.0 && last_n != 0).then_some(Dry { multiplier, base, allowed_length, last_n })
    }

    /// The penalty of a repeat of `n >= allowed_length` tokens.
    fn penalty(&self, n: usize) -> f32 {
        let mut exponent = (n - self.allowed_length).min(i32::MAX as usize) as i32;
        if self.base > 1.000_001 {
            let most = (FLOAT_MAX_LOG / self.base.ln()) as i32;
            if most > 0 {
                exponent = exponent.min(most);
            }
        }
        (self.multiplier as f64 * (self.base as f64).powf(exponent as f64)) as f32
    }
}

/// Whether row `r` of a validated batch has DRY on with a window that may penalise a token.
pub(super) fn dry_on(batch: &Batch, r: usize) -> bool {
    Dry::of(batch, r).is_some_and(|d| window(batch, r, d).len() > d.allowed_length)
}

/// The DRY window of row `r`: the last `last_n` tokens of prompt ++ output (-1: all).
struct Window<'a> {
    prompt: &'a [i32],
    output: &'a [i32],
}

impl Window<'_> {
    fn len(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    #[inline(always)]
    fn at(&self, j: usize) -> i32 {
        if j < self.prompt.len() {
            self.prompt[j]
        } else {
            self.output[j - self.prompt.len()]
        }
    }
}

fn window<'a>(batch: &Batch<'a>, r: usize, d: Dry) -> Window<'a> {
    let (prompt, output) = (batch.prompt_row(r), batch.output_row(r));
    let (prompt, output) =
        if d.last_n < 0 { (prompt, output) } else { super::penalties::windowed(prompt, output, d.last_n) };
    Window { prompt, output }
}

/// The (token, penalty) pairs of row `r` of a validated batch, appended to `out` (a token may
/// come more than once: its penalty is the largest). Fails only when the scratch cannot be
/// allocated.
pub(super) fn penalties(batch: &Batch, r: usize, out: &mut Vec<(u32, f32)>) -> Result<()> {
    let Some(d) = Dry::of(batch, r) else { return Ok(()) };
    let h = window(batch, r, d);
    let len = h.len();
    if len <= d.allowed_length {
        return Ok(());
    }
    let breakers = Breakers::of(batch.dry_breakers, r)?;
    let limit = breakers.repeat_limit(&h);
    if limit < d.allowed_length {
        return Ok(());
    }
    let suffixes = common_suffixes(&h)?;
    // The longest repeat each token would extend, then one pair a token.
    let mut ends = alloc::collect(
        (0..len - 1)
            .map(|i| (h.at(i + 1) as u32, (suffixes[i] as usize).min(limit)))
            .filter(|&(_, n)| n >= d.allowed_length),
        "the row's DRY repeats",
    )?;
    drop(suffixes);
    ends.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    ends.dedup_by_key(|e| e.0);
    alloc::reserve(out, ends.len(), "the row's DRY penalties")?;
    for (token, n) in ends {
        if !breakers.single_token(token as i32) {
            out.push((token, d.penalty(n)));
        }
    }
    Ok(())
}

/// For each end `i < len - 1` of the window, the longest common suffix of `h[..=i]` and `h`: the
/// Z-function of the reversed window (`z[k]`, the longest common prefix of the reversed window
/// and its suffix from `k`, is the entry of end `len - 1 - k`), linear in the window.
fn common_suffixes(h: &Window) -> Result<Vec<u32>> {
    let len = h.len();
    let rev = |k: usize| h.at(len - 1 - k);
    let mut z = alloc::filled(len, 0u32, "the row's DRY suffixes")?;
    // [lt, rt): the rightmost match window found so far.
    let (mut lt, mut rt) = (0usize, 0usize);
    for k in 1..len {
        let mut n = if k < rt { (z[k - lt] as usize).min(rt - k) } else { 0 };
        while k + n < len && rev(n) == rev(k + n) {
            n += 1;
        }
        if k + n > rt {
            (lt, rt) = (k, k + n);
        }
        z[k] = n as u32;
    }
    // z[k] for k >= 1 is end len - 1 - k: reversed in place, end i is at i.
    let mut suffixes = z;
    suffixes.reverse();
    Ok(suffixes)
}

/// A row's sequence breakers, found by their head.
struct Breakers<'a> {
    /// (head, tail) of every breaker, sorted by head.
    by_head: Vec<(i32, &'a [i32])>,
}

impl<'a> Breakers<'a> {
    fn of(all: Option<BadWords<'a>>, r: usize) -> Result<Breakers<'a>> {
        let words = all.into_iter().flat_map(|w| w.row(r));
        let mut by_head = alloc::collect(words.map(|w| (w[0], &w[1..])), "the row's DRY breakers")?;
        by_head.sort_unstable_by_key(|b| b.0);
        Ok(Breakers { by_head })
    }

    fn with_head(&self, token: i32) -> &[(i32, &'a [i32])] {
        let from = self.by_head.partition_point(|b| b.0 < token);
        let to = from + self.by_head[from..].partition_point(|b| b.0 == token);
        &self.by_head[from..to]
    }

    /// Whether `token` is a whole breaker (a breaker of one token): DRY never penalises it.
    fn single_token(&self, token: i32) -> bool {
        self.with_head(token).iter().any(|b| b.1.is_empty())
    }

    /// How many tokens of the window follow its last complete breaker (the whole window without
    /// one): no counted repeat is longer. Scanning from the end, the first head whose tail
    /// follows it whole; of its tails, the longest that does.
    fn repeat_limit(&self, h: &Window) -> usize {
        let len = h.len();
        if self.by_head.is_empty() {
            return len;
        }
        for after in 0..len {
            let head = len - 1 - after;
            let longest = self
                .with_head(h.at(head))
                .iter()
                .filter(|(_, tail)| tail.len() <= after)
                .filter(|(_, tail)| tail.iter().enumerate().all(|(j, &t)| h.at(head + 1 + j) == t))
                .map(|(_, tail)| tail.len())
                .max();
            if let Some(tail) = longest {
                return after - tail;
            }
        }
        len
    }
}
