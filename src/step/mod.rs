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

mod deferred;

pub(crate) use deferred::DeferredRow;

use crate::alloc;
use crate::batch::Batch;
use crate::error::Result;
use crate::kernels::{BlockValues, Kernels, BLOCK};
use crate::row::RowValues;

/// What the lists say of one token, as [`edited`] reads it.
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

    /// Whether the repetition penalty changes anything.
    fn repeats(&self) -> bool {
        self.repetition != 1.0
    }

    /// Whether the output's counts change anything.
    fn counts(&self) -> bool {
        self.frequency != 0.0 || self.presence != 0.0
    }

    /// Whether no penalty can raise a value: `r >= 1`, `f >= 0` and `p >= 0`. Then every
    /// penalised value is at most the logit it came from, in f32 too: `fl(y / r) <= y` for
    /// `y > 0` and `fl(y * r) <= y` for `y <= 0` (rounding never crosses a representable bound),
    /// and `fl(y - c) <= y` for `c >= 0`.
    fn lower_only(&self) -> bool {
        self.repetition >= 1.0 && self.frequency >= 0.0 && self.presence >= 0.0
    }
}

/// The value of a token of logit `x` that the lists touched, in f32 as vLLM computes it: the
/// bias (a -inf bias bans, even a +inf logit), then the repetition penalty (`y > 0 ? y / r :
/// y * r`) for a token of the prompt or the output, then `y - f * count` and `y - p` for a token
/// of the output (two subtractions, as vLLM's two in-place ones).
#[inline(always)]
fn edited(x: f32, t: &Touched, p: Penalties) -> f32 {
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
    y
}

/// `y > 0 ? y / r : y * r` (vLLM's repetition penalty), without a branch on the sign: the sign
/// of a logit is a coin flip, which a branch would mispredict for half the tokens of a history.
#[inline(always)]
fn repeated(y: f32, r: f32) -> f32 {
    let (down, up) = (y / r, y * r);
    let positive = 0u32.wrapping_sub((y > 0.0) as u32);
    f32::from_bits((down.to_bits() & positive) | (up.to_bits() & !positive))
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

/// The kept tokens that the bias names, with their biases: an open-addressing table (linear
/// probing) of at least twice as many slots as names, so that a lookup costs a probe or two.
struct Listed {
    slots: Vec<Slot>,
    /// `32 - log2(slots.len())`: a slot index is the top bits of a multiplicative hash.
    shift: u32,
}

#[derive(Clone, Copy)]
struct Slot {
    /// The token, or [`Slot::FREE`].
    id: u32,
    bias: f32,
    has_bias: bool,
    banned: bool,
}

impl Slot {
    const FREE: u32 = u32::MAX;
}

impl Listed {
    const NONE: Listed = Listed { slots: Vec::new(), shift: 32 };

    /// A table with room for `names` tokens, in `slots` (reused storage).
    fn with_room(names: usize, mut slots: Vec<Slot>) -> Result<Listed> {
        let len = (2 * names).next_power_of_two().max(16);
        let free = Slot { id: Slot::FREE, bias: 0.0, has_bias: false, banned: false };
        slots.clear();
        alloc::resize(&mut slots, len, free, "the row's listed tokens")?;
        Ok(Listed { slots, shift: 32 - len.trailing_zeros() })
    }

    /// The slot of `id`: its own, or the free one where it goes. The table is never full (twice
    /// as many slots as names), so the probe ends.
    #[inline(always)]
    fn find(&self, id: u32) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = (id.wrapping_mul(0x9e37_79b1) >> self.shift) as usize;
        while self.slots[i].id != id && self.slots[i].id != Slot::FREE {
            i = (i + 1) & mask;
        }
        i
    }

    #[inline(always)]
    fn entry(&mut self, id: u32) -> &mut Slot {
        let i = self.find(id);
        let s = &mut self.slots[i];
        s.id = id;
        s
    }
}

/// The storage of a row's edits, kept per thread between rows: a row's bitsets and table are
/// tens of KiB, which a fresh allocation would zero (and fault in) for every row. `seen`,
/// `output_bits`, `listed_bits` and `counts` are all zero here.
#[derive(Default)]
struct Spare {
    keep: Vec<u32>,
    mask: Vec<u32>,
    raised: Vec<u32>,
    seen: Vec<u32>,
    output_bits: Vec<u32>,
    listed_bits: Vec<u32>,
    slots: Vec<Slot>,
    counts: Vec<u32>,
    counted: Vec<u32>,
    overrides: Vec<(u32, f32)>,
    ids: Vec<u32>,
    vals: Vec<f32>,
    words: Vec<u32>,
}

thread_local! {
    static SPARE: std::cell::RefCell<Option<Spare>> = const { std::cell::RefCell::new(None) };
}

impl Spare {
    /// The bytes its vectors hold.
    fn bytes(&self) -> usize {
        let words = [
            &self.keep,
            &self.mask,
            &self.raised,
            &self.seen,
            &self.output_bits,
            &self.listed_bits,
            &self.counts,
            &self.counted,
            &self.ids,
            &self.words,
        ];
        4 * (words.iter().map(|v| v.capacity()).sum::<usize>() + self.vals.capacity())
            + self.slots.capacity() * size_of::<Slot>()
            + self.overrides.capacity() * size_of::<(u32, f32)>()
    }
}

/// What this thread keeps of a row's edits (the bitsets, the output's counts, the touched
/// tokens' scratch) and of a deferred row's visited blocks, for `draw::KEPT_PER_THREAD`.
pub(crate) fn kept() -> [alloc::Kept; 2] {
    let bytes = SPARE.try_with(|s| s.try_borrow().map_or(0, |s| s.as_ref().map_or(0, Spare::bytes))).unwrap_or(0);
    let release = || {
        let _ = SPARE.try_with(|s| s.try_borrow_mut().map(|mut s| *s = None));
    };
    [alloc::Kept { bytes, release }, deferred::kept()]
}

/// The edits of one row: see the module doc. Three bitsets of one bit per token
/// (`vocab.div_ceil(32)` words; bits past the vocabulary are clear): `keep`, and the two that
/// say which kept tokens the lists touched, `seen` (a token of the histories: the penalties
/// apply) and `listed` (an entry in the table: a bias); and the output's count of each token.
/// A touched token's bit is clear in `keep`.
pub(crate) struct RowStep<'a> {
    /// The row's mask and edits (see above); read it through [`RowStep::keep`], which is the
    /// caller's bitmask words while `given` holds them.
    keep: Vec<u32>,
    /// The caller's bitmask words of a deferred row that no other list masks, read in place
    /// instead of a copy into `keep` (19 KiB a row of 151,936 tokens, a tenth of the time that
    /// issue 9's rows add): `keep` of a deferred row is its mask, which they are, but for the
    /// bits past the vocabulary in the last word, which nothing reads
    /// ([`DeferredRow`](deferred::DeferredRow) clears them in the blocks it works out).
    /// [`RowStep::complete`] copies them into `keep` (its storage reserved) before it changes
    /// them.
    given: Option<&'a [u32]>,
    /// Whether a mask (the allowed list, the bitmask, the banned list) bans any token.
    masked: bool,
    /// The tokens no mask bans (`keep` and the touched ones), when the lists touched any of a
    /// masked row (else `keep` is the mask, or nothing is masked).
    mask: Vec<u32>,
    /// The tokens whose edits may raise their value (a positive bias), in no particular order
    /// (a token may repeat).
    raised: Vec<u32>,
    /// Empty when the lists touch nothing (then every touched word is 0).
    seen: Vec<u32>,
    listed_bits: Vec<u32>,
    listed: Listed,
    /// The kept tokens of the output, when the frequency or presence penalty is on (else empty).
    output_bits: Vec<u32>,
    /// Per token, its occurrences in the output after the first (kept tokens only; a
    /// vocabulary of them, zero outside this row's repeats, reused by the thread's next row):
    /// a token of the output has `1 + counts[t]`. Most outputs repeat few tokens, so most rows
    /// never touch it (a dense count of every occurrence missed the cache once a token).
    counts: Vec<u32>,
    /// The repeats of the output: the nonzero entries of `counts`.
    counted: Vec<u32>,
    /// At least how many tokens the lists touched, and 0 when they touched none.
    touched: usize,
    /// The histories are not marked yet: `seen`, `output_bits` and `counts` are all zero, `keep`
    /// is the mask with the histories' bits set, and a block's touched tokens are found when it
    /// is visited ([`DeferredRow`]), until [`RowStep::complete`] marks them.
    deferred: bool,
    /// Whether the histories touch tokens densely enough (two words of `seen` in eight hold
    /// one, or more) that the race tests a visited block's touched tokens on its own vectors
    /// ([`RowStep::bounded_by_row`]) rather than one by one: the vector test costs the same
    /// for any count, the token-by-token one a bit walk and a load a token. A bitmask thins
    /// the touched tokens (those it bans are not touched), often below that.
    dense: bool,
    /// Scratch of [`RowStep::resolve_words`]: the touched tokens of a range, room for
    /// `touched + 4`.
    ids: Vec<u32>,
    /// Scratch beside `ids`: their values.
    vals: Vec<f32>,
    /// The words of the touched tokens (with repeats), when the lists name few tokens against
    /// the vocabulary: then only those words are worked out and cleared again, instead of a
    /// pass over every word (which cost a row of 16 biased ids a fifth of its draw). Empty when
    /// the pass went over every word.
    words: Vec<u32>,
    penalties: Penalties,
    /// (token, value) of the touched tokens that can still be drawn (their value is neither
    /// -inf nor NaN), in no particular order (whoever reads them takes the lowest token of a tie); made by [`RowStep::resolve`] or [`RowStep::scan`].
    pub overrides: Vec<(u32, f32)>,
}

/// Tokens per call of the masked scan in [`RowStep::scan`]: the touched tokens of each chunk
/// are resolved right after it is scanned, from L1 (16 KiB of f32), rather than gathered from
/// the whole row afterwards. A multiple of BLOCK and of 32.
const CHUNK: usize = 16 * BLOCK;

impl RowStep<'_> {
    /// The row's mask and edits: bit `i % 32` of word `i / 32` set for a token that keeps the
    /// caller's logit (see the module doc). Of a deferred row, its mask: maybe the caller's
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

    fn clear(&mut self, i: usize) {
        self.keep[i / 32] &= !(1 << (i % 32));
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

    /// Whether the edited row can be raced block by block ([`RowStep::bounds`],
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
    fn touched_value(&self, x: f32, t: usize) -> f32 {
        debug_assert!(!self.deferred);
        self.value_with(x, t, self.seen[t / 32] >> (t % 32) & 1 != 0, self.count(t))
    }

    /// The processed value of touched token `t` of logit `x`, which the histories hold (`seen`)
    /// and the output `count` times; its bias from the table.
    #[inline]
    fn value_with(&self, x: f32, t: usize, seen: bool, count: u32) -> f32 {
        let mut info = Touched { seen, count, ..Touched::default() };
        if self.listed_bits[t / 32] >> (t % 32) & 1 != 0 {
            let s = &self.listed.slots[self.listed.find(t as u32)];
            (info.bias, info.has_bias, info.banned) = (s.bias, s.has_bias, s.banned);
        }
        edited(x, &info, self.penalties)
    }

    /// Whether the histories wait to be found block by block ([`DeferredRow`]).
    pub fn deferred(&self) -> bool {
        self.deferred
    }

    /// Marks the histories of a deferred row (row `r` of `batch`, which built these edits), as
    /// [`build`] does for a row it does not defer: after it, the row is drawn as any other. The
    /// storage was reserved by [`build`], so nothing here can fail.
    pub fn complete(&mut self, k: &Kernels, batch: &Batch, r: usize) {
        if self.deferred {
            self.deferred = false;
            if let Some(given) = self.given.take() {
                // (Room was reserved by `build`: this allocates nothing.)
                self.keep.clear();
                self.keep.extend_from_slice(given);
                self.keep[given.len() - 1] &= last_word_bits(batch.vocab);
            }
            mark_histories(k, batch, r, self, false);
        }
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
fn exact_bounds(
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

/// The touched tokens of a row with edits, block by block, for the race ([`RowStep::listed_of`]).
pub(crate) struct StepBlocks<'a, V: ?Sized> {
    pub edits: &'a RowStep<'a>,
    pub values: &'a V,
}

impl<V: RowValues + ?Sized> BlockValues for StepBlocks<'_, V> {
    fn listed(&self, b: usize, out: &mut [(u32, f32); BLOCK]) -> usize {
        self.edits.listed_of(self.values, b, out)
    }

    fn bounded_by_row(&self, b: usize) -> Option<*const u32> {
        self.edits.bounded_by_row(b)
    }

    fn value(&self, t: u32) -> f32 {
        self.edits.touched_value(self.values.at(t as usize), t as usize)
    }
}

impl Drop for RowStep<'_> {
    /// Hands the storage back to this thread for its next row (bitsets cleared).
    fn drop(&mut self) {
        let mut spare = Spare {
            keep: std::mem::take(&mut self.keep),
            mask: std::mem::take(&mut self.mask),
            raised: std::mem::take(&mut self.raised),
            seen: std::mem::take(&mut self.seen),
            output_bits: std::mem::take(&mut self.output_bits),
            listed_bits: std::mem::take(&mut self.listed_bits),
            slots: std::mem::take(&mut self.listed.slots),
            counts: std::mem::take(&mut self.counts),
            counted: std::mem::take(&mut self.counted),
            overrides: std::mem::take(&mut self.overrides),
            ids: std::mem::take(&mut self.ids),
            vals: std::mem::take(&mut self.vals),
            words: std::mem::take(&mut self.words),
        };
        if !spare.words.is_empty() {
            for &w in &spare.words {
                let w = w as usize;
                (spare.seen[w], spare.output_bits[w], spare.listed_bits[w]) = (0, 0, 0);
            }
            spare.words.clear();
        } else if self.touched > 0 {
            // (No bit is set in a row that touched nothing, nor in the histories' bitsets of a
            // deferred row.) The output's bits are set only with the frequency or presence
            // penalty, and the listed ones are those of the table's few tokens.
            if !self.deferred {
                spare.seen.fill(0);
                if self.penalties.counts() {
                    spare.output_bits.fill(0);
                }
            }
            for slot in spare.slots.iter().filter(|s| s.id != Slot::FREE) {
                spare.listed_bits[slot.id as usize / 32] = 0;
            }
        }
        for &id in &spare.counted {
            spare.counts[id as usize] = 0;
        }
        // (`try_with`: a thread that is exiting drops its edits without keeping them.)
        let _ = SPARE.try_with(|s| {
            let mut s = s.borrow_mut();
            if s.is_none() {
                *s = Some(spare);
            }
        });
    }
}

/// Whether row `r` of a validated `batch` has anything before the filters to apply (the
/// bitmask of a row counts even when all its bits are set; [`build`] then finds nothing).
pub(crate) fn row_has_step(batch: &Batch, r: usize) -> bool {
    let nonempty = |l: Option<crate::batch::TokenLists>| l.is_some_and(|l| !l.row(r).is_empty());
    let p = Penalties::of(batch, r);
    batch.token_bitmask.is_some()
        || restricted(batch, r)
        || nonempty(batch.banned_tokens)
        || batch.logit_bias.is_some_and(|b| !b.row(r).0.is_empty())
        || (p.repeats() && (nonempty(batch.prompt_tokens) || nonempty(batch.output_tokens)))
        || (p.counts() && nonempty(batch.output_tokens))
}

/// Whether row `r` may only draw from its allowed list.
fn restricted(batch: &Batch, r: usize) -> bool {
    batch.allowed_tokens.is_some() && batch.allowed_rows.is_none_or(|a| a[r] != 0)
}

/// The edits of row `r` of a validated `batch`, or `None` when they leave the row as given
/// (every bit of its bitmask set, no list touching a kept token). With `defer`, a row whose
/// histories are long (more ids than a quarter of its words) and whose penalties only lower
/// values leaves them unmarked ([`RowStep::deferred`]): the caller draws it block by block
/// ([`DeferredRow`]) or completes it ([`RowStep::complete`]).
pub(crate) fn build<'a>(k: &Kernels, batch: &Batch<'a>, r: usize, defer: bool) -> Result<Option<RowStep<'a>>> {
    let n = batch.vocab;
    let words = n.div_ceil(32);
    let last_bits = last_word_bits(n);
    let penalties = Penalties::of(batch, r);
    let defer = defer && penalties.lower_only() && long_histories(batch, r, penalties, words);
    let spare = SPARE.with(|s| s.borrow_mut().take()).unwrap_or_default();
    let mut e = RowStep {
        keep: spare.keep,
        given: None,
        masked: false,
        mask: spare.mask,
        raised: spare.raised,
        seen: spare.seen,
        output_bits: spare.output_bits,
        listed_bits: spare.listed_bits,
        listed: Listed { slots: spare.slots, ..Listed::NONE },
        counts: spare.counts,
        counted: spare.counted,
        touched: 0,
        deferred: false,
        dense: false,
        ids: spare.ids,
        vals: spare.vals,
        words: spare.words,
        penalties,
        overrides: spare.overrides,
    };
    e.keep.clear();
    e.raised.clear();
    e.counted.clear();
    alloc::reserve(&mut e.keep, words, "the row's token mask")?;
    let mut masked = false;
    let banned = batch.banned_tokens.map_or(&[][..], |l| l.row(r));
    if let Some(m) = batch.token_bitmask.filter(|_| defer && !restricted(batch, r) && banned.is_empty()) {
        // A deferred row masked by the bitmask alone: its words as they are.
        let given = as_u32(&m.words[r * m.row_stride..r * m.row_stride + words]);
        masked = !all_set(given, last_bits);
        e.given = Some(given);
    } else if let Some(m) = batch.token_bitmask {
        e.keep.extend(m.words[r * m.row_stride..r * m.row_stride + words].iter().map(|&w| w as u32));
        e.keep[words - 1] &= last_bits;
        masked = !all_set(&e.keep, last_bits);
    } else {
        e.keep.resize(words, u32::MAX);
        e.keep[words - 1] &= last_bits;
    }
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
    for &id in banned {
        e.clear(id as usize);
        masked = true;
    }
    e.masked = masked;
    touch_lists(k, batch, r, &mut e, defer)?;
    if !masked && e.touched == 0 {
        return Ok(None);
    }
    Ok(Some(e))
}

/// The bits of the last word of a row's bitsets that are tokens of the vocabulary (`n` tokens).
fn last_word_bits(n: usize) -> u32 {
    if n.is_multiple_of(32) {
        u32::MAX
    } else {
        (1u32 << (n % 32)) - 1
    }
}

/// Whether every bit of a row's `words` is set, but those past the vocabulary (the last word's
/// bits outside `last_bits`): an unconstrained row of a grammar bitmask. A chunk of words at a
/// time, each an AND that the compiler vectorises (a search that stops at the first word does
/// not), stopping at the first chunk with a clear bit: a grammar's row most often, whose words
/// the scan reads next.
fn all_set(words: &[u32], last_bits: u32) -> bool {
    let (body, last) = words.split_at(words.len() - 1);
    last[0] & last_bits == last_bits && body.chunks(64).all(|c| c.iter().fold(u32::MAX, |a, &w| a & w) == u32::MAX)
}

/// The caller's bitmask words as the bitsets' `u32`s.
fn as_u32(words: &[i32]) -> &[u32] {
    // SAFETY: i32 and u32 have the same size and alignment, and every bit pattern is a valid
    // value of both; the slice borrows `words` for as long.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u32>(), words.len()) }
}

/// Whether row `r`'s histories are long enough to leave to the blocks the draw visits (more
/// named tokens than a quarter of the row's `words`): below that, the pass of the marking goes
/// over their words alone (`sparse` in [`touch_lists`]), a few hundred nanoseconds.
fn long_histories(batch: &Batch, r: usize, p: Penalties, words: usize) -> bool {
    let (prompt, output) = histories(batch, r, p);
    let bias = batch.logit_bias.map_or(0, |b| b.row(r).0.len());
    let most = prompt.len() + output.len() + bias;
    most > 0 && most >= words / 4
}

/// The bit of token `id` in its word: a load from a table of 32, where `1 << (id % 32)` is a
/// shift by `cl`, three uops on Intel cores, in the loops that set a bit for each token of a
/// history.
#[inline(always)]
fn bit(id: i32) -> u32 {
    const BITS: [u32; 32] = {
        let mut b = [0u32; 32];
        let mut j = 0;
        while j < 32 {
            b[j] = 1 << j;
            j += 1;
        }
        b
    };
    BITS[(id & 31) as usize]
}

/// The histories of row `r` that its penalties read: the prompt (with the repetition penalty)
/// and the output (with any penalty).
fn histories<'a>(batch: &Batch<'a>, r: usize, p: Penalties) -> (&'a [i32], &'a [i32]) {
    let prompt = if p.repeats() { batch.prompt_tokens.map_or(&[][..], |l| l.row(r)) } else { &[] };
    let output = batch.output_tokens.map_or(&[][..], |l| l.row(r));
    (prompt, if p.repeats() || p.counts() { output } else { &[] })
}

/// Marks the kept tokens that the histories and the bias touch (`seen`, `listed`, with their
/// counts and biases in the table) and clears their bits in `keep`. A masked token is never
/// touched: the mask wins over everything. With `defer` (penalties that only lower values, long
/// histories: [`build`]), the histories are left for [`DeferredRow`] or [`RowStep::complete`] (the bias is marked, but its
/// bits stay set in `keep`, as the histories' do).
fn touch_lists(k: &Kernels, batch: &Batch, r: usize, e: &mut RowStep, defer: bool) -> Result<()> {
    let p = e.penalties;
    let (bias_ids, bias_values) = batch.logit_bias.map_or((&[][..], &[][..]), |b| b.row(r));
    let (prompt, output) = histories(batch, r, p);
    if bias_ids.is_empty() && prompt.is_empty() && output.is_empty() {
        return Ok(());
    }
    let words = e.keep().len();
    // The bitsets stay all zero between rows (see `Spare`); past this row's words they are
    // never read.
    for (bits, what) in [
        (&mut e.seen, "the row's repeated tokens"),
        (&mut e.output_bits, "the row's output tokens"),
        (&mut e.listed_bits, "the row's biased tokens"),
    ] {
        let len = words.max(bits.len());
        alloc::resize(bits, len, 0, what)?;
    }
    // Every allocation first: a failure after a bit is set would hand the thread's next row
    // bitsets that are not all zero (`Drop` clears them only for a row that touched tokens).
    e.listed = Listed::with_room(bias_ids.len(), std::mem::take(&mut e.listed.slots))?;
    if p.counts() {
        let len = (words * 32).max(e.counts.len());
        alloc::resize(&mut e.counts, len, 0, "the row's output counts")?;
        alloc::reserve(&mut e.counted, output.len(), "the row's output counts")?;
    }
    alloc::reserve(&mut e.raised, bias_ids.len(), "the row's raised blocks")?;
    if e.masked {
        e.mask.clear();
        alloc::reserve(&mut e.mask, words, "the row's token mask")?;
    }
    let most = prompt.len() + output.len() + bias_ids.len();
    e.overrides.clear();
    e.ids.clear();
    alloc::reserve(&mut e.ids, most + 4, "the row's touched tokens")?;
    alloc::reserve(&mut e.vals, most, "the row's touched values")?;
    alloc::reserve(&mut e.overrides, most, "the row's edited tokens")?;
    // Few named tokens against the words of the row: work out only their words.
    let sparse = most < words / 4;
    e.words.clear();
    if sparse {
        alloc::reserve(&mut e.words, most, "the row's touched words")?;
    }
    let keep = e.given.unwrap_or(&e.keep[..]);
    let kept = |id: usize| keep[id / 32] >> (id % 32) & 1 != 0;
    let set = |bits: &mut [u32], id: usize| bits[id / 32] |= 1 << (id % 32);
    for (&id, &b) in bias_ids.iter().zip(bias_values) {
        if kept(id as usize) {
            set(&mut e.listed_bits, id as usize);
            // The biases of a token add up in list order.
            let s = e.listed.entry(id as u32);
            s.bias = if s.has_bias { s.bias + b } else { b };
            s.has_bias = true;
            s.banned |= b == f32::NEG_INFINITY;
        }
    }
    for &id in bias_ids {
        if kept(id as usize) && e.listed.slots[e.listed.find(id as u32)].bias > 0.0 {
            e.raised.push(id as u32);
        }
    }
    if defer {
        // (`build` defers long histories alone: not `sparse`.)
        (e.deferred, e.touched, e.dense) = (true, most, false);
        return Ok(());
    }
    mark_histories(k, batch, r, e, sparse);
    Ok(())
}

/// The histories' part of [`touch_lists`] (its storage reserved): their bits, the output's
/// counts, then the pass over the words that clears every touched token's bit in `keep`.
fn mark_histories(k: &Kernels, batch: &Batch, r: usize, e: &mut RowStep, sparse: bool) {
    let p = e.penalties;
    let (prompt, output) = histories(batch, r, p);
    let bias_ids = batch.logit_bias.map_or(&[][..], |b| b.row(r).0);
    let words = e.keep.len();
    let most = prompt.len() + output.len() + bias_ids.len();
    // The histories' bits are set whatever the mask says, and cleared where it bans in the pass
    // over the words below (a masked token is not touched): one load and one store a token,
    // no branch, and no bounds check (two compares a token of a 4096-token prompt).
    // (Local slices: through `e`, the loops reloaded each vector's pointer after every store.)
    let seen = &mut e.seen[..words];
    for &id in prompt {
        // SAFETY: the batch's ids were checked to lie in [0, vocab) (`batch::check_row_ids`), so
        // id / 32 < words, the length of `seen`.
        unsafe { *seen.get_unchecked_mut(id as usize / 32) |= bit(id) };
    }
    if p.counts() {
        let (output_bits, counts) = (&mut e.output_bits[..words], &mut e.counts[..words * 32]);
        // The output's tokens are added to `seen` by the pass over the words below (one
        // read-modify-write a token fewer).
        for &id in output {
            let (w, bit) = (id as usize / 32, bit(id));
            // SAFETY: as above (`counts` holds `words * 32` entries).
            unsafe {
                let first = *output_bits.get_unchecked(w);
                *output_bits.get_unchecked_mut(w) = first | bit;
                if first & bit != 0 {
                    // A repeat: rare in most outputs, so the branch costs nothing. (A masked
                    // token's count is never read.)
                    *counts.get_unchecked_mut(id as usize) += 1;
                    e.counted.push(id as u32);
                }
            }
        }
    } else {
        for &id in output {
            // SAFETY: as above.
            unsafe { *seen.get_unchecked_mut(id as usize / 32) |= bit(id) };
        }
    }
    // `seen_words` counts the words of `seen` holding a bit, not the bits (a population count
    // per word is a dozen instructions on baseline x86-64, whose POPCNT is not assumed), and
    // the sparse pass counts a word that comes back as often: it only guesses (`dense`).
    let (touched, seen_words) = if sparse {
        if e.masked {
            e.mask.extend_from_slice(&e.keep);
        }
        // The pass of `step_words` over the touched words only. It must give the same word
        // however often a word comes back, so it starts from the mask (`mask`, or every bit of
        // an unmasked row), not from `keep`, which it changes.
        let n = batch.vocab;
        let last = if n.is_multiple_of(32) { u32::MAX } else { (1u32 << (n % 32)) - 1 };
        let all = |w: usize| if w == words - 1 { last } else { u32::MAX };
        let named = prompt.iter().chain(output).chain(bias_ids).map(|&id| id as usize / 32);
        let (mut any, mut seen_words) = (0, 0);
        for w in named {
            let k = if e.masked { e.mask[w] } else { all(w) };
            let o = e.output_bits[w] & k;
            let (s, l) = ((e.seen[w] & k) | o, e.listed_bits[w]);
            (e.seen[w], e.output_bits[w], e.keep[w]) = (s, o, k & !(s | l));
            any |= s | l;
            e.words.push(w as u32);
            seen_words += (s != 0) as usize;
        }
        (any != 0, seen_words)
    } else {
        if e.masked {
            // (Room was reserved above: this allocates nothing.)
            e.mask.resize(words, 0);
        }
        let mask = if e.masked { &mut e.mask[..] } else { &mut [][..] };
        // SAFETY: the slices are the row's words (`seen`, `output_bits` and `listed_bits` hold
        // at least `words`, resized above); the level is supported (`kernels`).
        let pass = unsafe {
            (k.step_words)(
                &mut e.keep,
                mask,
                &mut e.seen[..words],
                &mut e.output_bits[..words],
                &e.listed_bits[..words],
            )
        };
        (pass.touched, pass.seen_words)
    };
    e.touched = if touched { most } else { 0 };
    e.dense = seen_words * 4 >= words;
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
        let levels = [
            SimdChoice::Scalar,
            SimdChoice::Portable,
            SimdChoice::Avx2,
            SimdChoice::Avx512,
            SimdChoice::Neon,
            SimdChoice::Vxe2,
        ];
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
