//! Reading the processed row of a row's step: its overrides (resolved from the row's values,
//! whole or chunk by chunk with the masked scan), the bounds and the touched tokens that the race
//! reads block by block, and the processed values that the filters and the logprobs read.

use super::penalties::{processed_value, repeated, Touched};
use super::{RowStep, StepBlocks};
use crate::alloc;
use crate::error::Result;
use crate::kernels::{BlockValues, Kernels, BLOCK};
use crate::row::RowValues;

/// Tokens per call of the masked scan in [`RowStep::scan`]: the touched tokens of each chunk
/// are resolved right after it is scanned, from L1 (16 KiB of f32), rather than gathered from
/// the whole row afterwards. A multiple of BLOCK and of 32.
const CHUNK: usize = 16 * BLOCK;

impl RowStep<'_> {
    /// The row's mask less its touched tokens: bit `i % 32` of word `i / 32` set for a token that
    /// keeps the caller's logit (see the module doc). Of a deferred row, its mask: maybe the caller's
    /// bitmask words, whose bits past the vocabulary are not cleared (see `given`).
    #[inline(always)]
    pub fn keep(&self) -> &[u32] {
        self.given.unwrap_or(&self.keep)
    }

    /// Whether token `i` keeps the caller's logit.
    #[inline(always)]
    pub fn kept(&self, i: usize) -> bool {
        self.keep[i / 32] >> (i % 32) & 1 != 0
    }

    /// Appends the overrides of the touched tokens of words `words` (those of the histories
    /// alone, then the biased ones, each in token order), from the row's values `v`.
    fn resolve_words<V: RowValues + ?Sized>(&mut self, v: &V, words: std::ops::Range<usize>) {
        if self.touched == 0 {
            return;
        }
        let p = self.penalties;
        let (mut ids, mut vals, mut out) =
            (std::mem::take(&mut self.ids), std::mem::take(&mut self.vals), std::mem::take(&mut self.overrides));
        // The tokens of the histories that no bias names (most of a long prompt): the penalties
        // alone, without a lookup, in loops that branch on no value: gather, penalise
        // (vectorised), append those left finite.
        ids.clear();
        flatten(words.clone(), |w| self.seen[w] & !self.listed_bits[w], &mut ids);
        vals.clear();
        vals.extend(ids.iter().map(|&id| v.at(id as usize)));
        if p.repeats() {
            for y in vals.iter_mut() {
                *y = repeated(*y, p.repetition);
            }
        }
        if p.counts() {
            for (y, &id) in vals.iter_mut().zip(&ids) {
                let c = self.count(id as usize);
                let counted = (*y - p.frequency * c as f32) - p.presence;
                *y = if c > 0 { counted } else { *y };
            }
        }
        append_drawable(&ids, &vals, &mut out);
        ids.clear();
        flatten(words, |w| self.listed_bits[w], &mut ids);
        for &id in ids.iter() {
            let y = self.touched_value(v.at(id as usize), id as usize);
            if y > f32::NEG_INFINITY {
                out.push((id, y));
            }
        }
        (self.ids, self.vals, self.overrides) = (ids, vals, out);
    }

    /// Computes the overrides from the row's values `v`.
    pub fn resolve<V: RowValues + ?Sized>(&mut self, v: &V) {
        self.overrides.clear();
        self.resolve_words(v, 0..self.keep.len());
    }

    /// The masked scan of the row (block maxima of the kept tokens into `bmax`; whether any
    /// value is NaN), with the overrides resolved as it goes: chunk by chunk, so that each touched
    /// token is read while its chunk is in L1.
    pub fn scan<V: RowValues + ?Sized>(&mut self, k: &Kernels, v: &V, bmax: &mut [f32]) -> bool {
        self.overrides.clear();
        let n = v.n();
        if self.touched == 0 {
            return v.scan_masked(k, &self.keep, 0, n, bmax);
        }
        let mut nan = false;
        for start in (0..n).step_by(CHUNK) {
            let len = CHUNK.min(n - start);
            let blocks = start / BLOCK..(start + len).div_ceil(BLOCK);
            nan |= v.scan_masked(k, &self.keep, start, len, &mut bmax[blocks]);
            self.resolve_words(v, start / 32..(start + len).div_ceil(32));
        }
        nan
    }

    /// Whether the processed row can be raced block by block ([`RowStep::bounds`],
    /// [`StepBlocks`]): no penalty raises a value, so the row's own block maxima bound the
    /// processed ones everywhere but in the `raised` blocks.
    pub fn by_blocks(&self) -> bool {
        self.penalties.lower_only()
    }

    /// Whether block `b` holds a token the lists touched.
    #[inline]
    fn block_touched(&self, b: usize) -> bool {
        debug_assert!(!self.deferred);
        if self.touched == 0 {
            return false;
        }
        let words = b * (BLOCK / 32)..((b + 1) * (BLOCK / 32)).min(self.keep.len());
        self.seen[words.clone()].iter().zip(&self.listed_bits[words]).any(|(&s, &l)| s | l != 0)
    }

    /// The occurrences of token `t` in the output (0 unless the frequency or presence penalty is
    /// on).
    #[inline]
    fn count(&self, t: usize) -> u32 {
        let first = self.penalties.counts() && self.output_bits[t / 32] >> (t % 32) & 1 != 0;
        if first {
            1 + self.counts[t]
        } else {
            0
        }
    }

    /// The processed value of touched token `t`, whose logit is `x`.
    #[inline]
    pub(super) fn touched_value(&self, x: f32, t: usize) -> f32 {
        debug_assert!(!self.deferred);
        self.value_with(x, t, self.seen[t / 32] >> (t % 32) & 1 != 0, self.count(t))
    }

    /// The processed value of touched token `t` of logit `x`, which the histories hold (`seen`)
    /// and the output `count` times; its bias from the table.
    #[inline]
    pub(super) fn value_with(&self, x: f32, t: usize, seen: bool, count: u32) -> f32 {
        let mut info = Touched { seen, count, ..Touched::default() };
        if self.listed_bits[t / 32] >> (t % 32) & 1 != 0 {
            let s = &self.listed.slots[self.listed.find(t as u32)];
            (info.bias, info.has_bias, info.banned, info.dry) = (s.bias, s.has_bias, s.banned, s.dry);
        }
        processed_value(x, &info, self.penalties)
    }

    /// Whether the histories wait to be found block by block ([`DeferredRow`](super::DeferredRow)).
    pub fn deferred(&self) -> bool {
        self.deferred
    }

    /// The bits of the touched tokens (`seen`), when they are dense (`dense`) and block `b`
    /// holds no biased one: then [`RowStep::listed_of`] would bound each by its logit
    /// ([`BlockValues::bounded_by_row`]).
    fn bounded_by_row(&self, b: usize) -> Option<*const u32> {
        if self.touched == 0 || !self.dense {
            return None;
        }
        let words = b * (BLOCK / 32)..((b + 1) * (BLOCK / 32)).min(self.keep.len());
        let biased = self.listed_bits[words].iter().any(|&l| l != 0);
        (!biased).then_some(self.seen.as_ptr())
    }

    /// Writes into `out` the touched tokens of block `b` of the row `v`, each with an upper
    /// bound of its processed value when no penalty raises one ([`RowStep::by_blocks`]): its
    /// logit, or, for a biased token (a bias may raise it), its value. Returns how many.
    pub fn listed_of<V: RowValues + ?Sized>(&self, v: &V, b: usize, out: &mut [(u32, f32); BLOCK]) -> usize {
        if !self.block_touched(b) {
            return 0;
        }
        let mut count = 0;
        let words = b * (BLOCK / 32)..((b + 1) * (BLOCK / 32)).min(self.keep.len());
        for w in words {
            let (listed, mut bits) = (self.listed_bits[w], self.seen[w] | self.listed_bits[w]);
            while bits != 0 {
                let j = bits.trailing_zeros();
                let t = w * 32 + j as usize;
                let x = v.at(t);
                out[count] = (t as u32, if listed >> j & 1 != 0 { self.touched_value(x, t) } else { x });
                count += 1;
                bits &= bits - 1;
            }
        }
        count
    }

    /// The largest processed value of block `b` (NaN ignored; -inf if none), as the scan
    /// computes a block maximum.
    fn block_max<V: RowValues + ?Sized>(&self, k: &Kernels, v: &V, b: usize) -> f32 {
        let start = b * BLOCK;
        let mut m = [f32::NEG_INFINITY];
        v.scan_masked(k, &self.keep, start, BLOCK.min(v.n() - start), &mut m);
        let mut listed = [(0, 0.0); BLOCK];
        let count = self.listed_of(v, b, &mut listed);
        listed[..count].iter().fold(m[0], |m, &(t, _)| {
            let y = self.touched_value(v.at(t as usize), t as usize);
            if y > m {
                y
            } else {
                m
            }
        })
    }

    /// The first pass of a row raced block by block ([`RowStep::by_blocks`]): writes into
    /// `bmax` an upper bound of each block's largest processed value whose largest is the row's
    /// largest processed value, and returns whether the row holds a NaN (masked or not).
    ///
    /// One pass over the logits as given (its mask applied) bounds every block: the lists only
    /// lower values there, but for the tokens of a raising bias, whose processed values raise
    /// their blocks' bounds (one lookup each, not a pass over their blocks). Then the block of
    /// the largest bound is worked out exactly, and every block whose bound is above that
    /// block's exact maximum: the largest of the bounds is then exact. On a typical row that is
    /// one or two blocks of the row's whole vocabulary.
    pub fn bounds<V: RowValues + ?Sized>(&self, k: &Kernels, v: &V, bmax: &mut [f32]) -> bool {
        let n = v.n();
        let nan = match (self.masked, self.touched) {
            (false, _) => v.scan(k, 0, n, bmax),
            (true, 0) => v.scan_masked(k, &self.keep, 0, n, bmax),
            (true, _) => v.scan_masked(k, &self.mask, 0, n, bmax),
        };
        self.refine_bounds(k, v, bmax);
        nan
    }

    /// The end of [`RowStep::bounds`], once `bmax` holds upper bounds of the blocks' processed
    /// values (the scan of the row as given, or a deferred row's rough bounds): the raised blocks
    /// at their values, the largest bound made exact.
    pub fn refine_bounds<V: RowValues + ?Sized>(&self, k: &Kernels, v: &V, bmax: &mut [f32]) {
        let value = |t: usize| self.touched_value(v.at(t), t);
        exact_bounds(&self.raised, bmax, value, |b| self.block_touched(b), |b| self.block_max(k, v, b));
    }

    /// The lowest token whose processed value is `top`, the row's largest (0 if none), given
    /// block bounds from [`RowStep::bounds`].
    pub fn first_of<V: RowValues + ?Sized>(&self, v: &V, bmax: &[f32], top: f32) -> usize {
        let mut listed = [(0, 0.0); BLOCK];
        for (b, _) in bmax.iter().enumerate().filter(|&(_, &m)| m >= top) {
            let start = b * BLOCK;
            let kept = (start..(start + BLOCK).min(v.n())).find(|&i| self.kept(i) && v.at(i) == top);
            let count = self.listed_of(v, b, &mut listed);
            let touched = listed[..count]
                .iter()
                .map(|&(t, _)| t as usize)
                .filter(|&t| self.touched_value(v.at(t), t) == top)
                .min();
            if let Some(i) = kept.into_iter().chain(touched).min() {
                return i;
            }
        }
        0
    }

    /// The processed value of token `t` of the row `v`, which the masks keep.
    pub fn value_of<V: RowValues + ?Sized>(&self, v: &V, t: usize) -> f32 {
        if self.kept(t) {
            v.at(t)
        } else {
            self.touched_value(v.at(t), t)
        }
    }

    /// The processed values `>= lo` (`lo` finite) of the row `v`, from the blocks whose bound in
    /// `bmax` ([`RowStep::bounds`]) reaches `lo`: per block its kept tokens, then its touched
    /// ones.
    pub fn values_ge<V: RowValues + ?Sized>(&self, v: &V, bmax: &[f32], lo: f32) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        let mut listed = [(0, 0.0); BLOCK];
        for (b, _) in bmax.iter().enumerate().filter(|&(_, &bound)| bound >= lo) {
            let (start, end) = (b * BLOCK, ((b + 1) * BLOCK).min(v.n()));
            alloc::reserve(&mut out, 2 * BLOCK, "the row's values above the winner")?;
            out.extend((start..end).filter(|&i| self.kept(i)).map(|i| v.at(i)).filter(|&x| x >= lo));
            let count = self.listed_of(v, b, &mut listed);
            out.extend(listed[..count].iter().map(|&(t, _)| self.value_of(v, t as usize)).filter(|&y| y >= lo));
        }
        Ok(out)
    }

    /// Writes the processed row (`y`, as f32) into `out` (the overrides resolved first), and,
    /// with a non-empty `bmax`, its block maxima (NaN ignored: what a scan of `out` gives);
    /// returns whether the caller's row holds a NaN anywhere (masked or not).
    pub fn materialize<V: RowValues + ?Sized>(
        &mut self,
        k: &Kernels,
        v: &V,
        out: &mut Vec<f32>,
        bmax: &mut [f32],
    ) -> Result<bool> {
        alloc::resize(out, v.n(), f32::NEG_INFINITY, "the processed row")?;
        self.resolve(v);
        let nan = v.masked_copy(k, &self.keep, out, bmax);
        for &(id, value) in &self.overrides {
            out[id as usize] = value;
        }
        if !bmax.is_empty() {
            // (An override is neither -inf nor NaN.)
            for &(id, value) in &self.overrides {
                let m = &mut bmax[id as usize / BLOCK];
                *m = if value > *m { value } else { *m };
            }
        }
        Ok(nan)
    }
}

/// The end of [`RowStep::bounds`] (and of the deferred row's) once `bmax` holds the block maxima
/// of the row as given, its mask applied: the blocks of the `raised` tokens raised to their
/// values (`value`), then the block of the largest bound worked out exactly (`block_max`, where
/// it holds a `touched` token), and every touched block whose bound is above that maximum.
pub(super) fn exact_bounds(
    raised: &[u32],
    bmax: &mut [f32],
    value: impl Fn(usize) -> f32,
    touched: impl Fn(usize) -> bool,
    block_max: impl Fn(usize) -> f32,
) {
    for &t in raised {
        let (t, m) = (t as usize, &mut bmax[t as usize / BLOCK]);
        let y = value(t);
        *m = if y > *m { y } else { *m };
    }
    let top = crate::kernels::largest(bmax, f32::NEG_INFINITY);
    if top == f32::NEG_INFINITY {
        return;
    }
    // (The first block of the largest bound: `==` finds it whichever zero `largest` returned.)
    let first = bmax.iter().position(|&m| m == top).unwrap_or(0);
    if !touched(first) {
        return;
    }
    bmax[first] = block_max(first);
    let exact = bmax[first];
    for (b, m) in bmax.iter_mut().enumerate() {
        if *m > exact && touched(b) {
            *m = block_max(b);
        }
    }
}

impl<V: RowValues + ?Sized> BlockValues for StepBlocks<'_, V> {
    fn listed(&self, b: usize, out: &mut [(u32, f32); BLOCK]) -> usize {
        self.step.listed_of(self.values, b, out)
    }

    fn bounded_by_row(&self, b: usize) -> Option<*const u32> {
        self.step.bounded_by_row(b)
    }

    fn value(&self, t: u32) -> f32 {
        self.step.touched_value(self.values.at(t as usize), t as usize)
    }
}

/// Appends to `ids` the tokens whose bits are set in `bits(w)` for the words `words` (word `w`
/// is tokens `32 w ..`), in token order, two words at a time. The first four tokens of a pair
/// are written without a branch (a pair of a long history holds about two of them, at random,
/// which a loop per bit would mispredict about once a pair); an empty pair (most of them, in a
/// row the bitmask thins) costs one test. `ids` has room for 4 more than it receives.
#[inline(always)]
fn flatten(words: std::ops::Range<usize>, bits: impl Fn(usize) -> u32, ids: &mut Vec<u32>) {
    let mut n = ids.len();
    let p = ids.as_mut_ptr();
    let mut w = words.start;
    while w < words.end {
        let high = if w + 1 < words.end { bits(w + 1) } else { 0 };
        let mut b = bits(w) as u64 | (high as u64) << 32;
        let base = (w * 32) as u32;
        w += 2;
        if b == 0 {
            continue;
        }
        let count = b.count_ones() as usize;
        // SAFETY: `ids` has room for every token of these words plus 4 (the caller's
        // contract), and n counts the tokens written so far: the four writes land below
        // n + 4. A write past the pair's tokens is overwritten or left past the length.
        unsafe {
            for k in 0..4 {
                p.add(n + k).write(base + b.trailing_zeros());
                b &= b.wrapping_sub(1);
            }
        }
        let mut k = 4;
        while b != 0 {
            // SAFETY: as above: n + k < n + count.
            unsafe { p.add(n + k).write(base + b.trailing_zeros()) };
            b &= b - 1;
            k += 1;
        }
        n += count;
    }
    // SAFETY: the first n slots were written above.
    unsafe { ids.set_len(n) };
}

/// Appends `(ids[i], values[i])` to `out` for the values that can still be drawn (neither -inf
/// nor NaN), without a branch per value; `out` has room for all of them.
#[inline(always)]
fn append_drawable(ids: &[u32], values: &[f32], out: &mut Vec<(u32, f32)>) {
    assert!(out.capacity() - out.len() >= ids.len() && values.len() == ids.len());
    let mut n = out.len();
    let p = out.as_mut_ptr();
    for (&id, &y) in ids.iter().zip(values) {
        // SAFETY: n <= len + i < capacity (checked above).
        unsafe { p.add(n).write((id, y)) };
        n += (y > f32::NEG_INFINITY) as usize;
    }
    // SAFETY: the first n slots hold written pairs.
    unsafe { out.set_len(n) };
}
