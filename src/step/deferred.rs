//! A row whose histories are searched block by block: the draw of a row with penalties that
//! only lower values needs the touched tokens of the few blocks it visits (one or two of a
//! peaked row's hundreds), and [`RowStep::bounds`] shows why the rest never matter: a lowered
//! token's logit bounds its processed value. Marking every token of a 5,000-token history in the
//! row's bitsets, then a pass over every word, costs about as much as the race itself; the vector
//! search of the lists for the ids of one block ([`block_history`](crate::kernels::generic::block_history))
//! costs a few hundred nanoseconds. So a deferred row ([`RowStep::deferred`]) keeps the mask
//! as `keep` (the histories' bits still set) and works out each block it needs once, here:
//! its history bits, the output's counts, and its own keep words, which the race reads instead
//! of the row's ([`BlockValues::block_keep`]).
//!
//! Every value is the one [`RowStep`] gives once the histories are marked: the same touched
//! tokens (the histories' and the bias's, among the kept ones), the same counts, and the same
//! [`processed_value`](super::penalties::processed_value) arithmetic; the bounds and the race see the same numbers and draw
//! the same token.

use std::cell::RefCell;

use super::RowStep;
use crate::alloc;
use crate::error::Result;
use crate::kernels::generic::BlockHistory;
use crate::kernels::{BlockValues, Kernels, BLOCK};
use crate::row::RowValues;

/// Words of a block's bits.
const WORDS: usize = BLOCK / 32;

/// The most blocks a deferred row is expected to visit ([`DeferredRow::worth_it`]).
const FEW: usize = 5;

/// Blocks whose touched tokens are kept once worked out; past it, the last slot is worked out
/// again for each new block (a row that needs that many should have been completed:
/// [`DeferredRow::worth_it`]).
const CACHED: usize = 32;

/// What the histories say of one block, among the tokens the mask keeps.
#[derive(Clone, Copy)]
struct Entry {
    block: usize,
    /// The tokens that keep their logit as given (the mask's, less the touched ones).
    keep: [u32; WORDS],
    /// The tokens of the histories (the repetition penalty applies).
    seen: [u32; WORDS],
    /// Of them, the tokens of the output when the frequency or presence penalty is on, with
    /// their counts.
    history: BlockHistory,
}

impl Entry {
    const EMPTY: Entry = Entry { block: usize::MAX, keep: [0; WORDS], seen: [0; WORDS], history: BlockHistory::EMPTY };
}

/// The deferred step of a row with its values and histories, which work out the blocks the
/// draw visits (see the module doc).
pub(crate) struct DeferredRow<'a, V: ?Sized> {
    step: &'a RowStep<'a>,
    values: &'a V,
    k: &'a Kernels,
    prompt: &'a [i32],
    output: &'a [i32],
    /// The request whose distinct tokens `prompt` is (its whole prompt): a block then reads its
    /// words of the prompt's bits, not the prompt (a 27K-token prompt, once per visited block).
    prompt_of: Option<&'a crate::requests::Request>,
    /// The request whose counts stand for `output` (its whole output): a block then reads its
    /// words of the output's bits and its range of the repeats, not the whole output.
    output_of: Option<&'a crate::requests::Request>,
    /// The blocks worked out so far (room for [`CACHED`], reserved up front).
    cache: RefCell<Vec<Entry>>,
}

/// Block `b`'s part of the output of `request` (its whole output), as [`block_history`]
/// of the list sets it in `h`: the block's words of the output's bits and, when `counts`, each
/// token's occurrences (1, plus its repeats).
///
/// [`block_history`]: crate::kernels::Kernels
fn held_output_in_block(request: &crate::requests::Request, b: usize, counts: bool, h: &mut BlockHistory) {
    let bits = request.output_bits();
    let words = (b * WORDS).min(bits.len())..((b + 1) * WORDS).min(bits.len());
    for (i, w) in words.enumerate() {
        h.output[i] = bits[w];
        if counts {
            let mut word = bits[w];
            while word != 0 {
                h.counts[i * 32 + word.trailing_zeros() as usize] = 1;
                word &= word - 1;
            }
        }
    }
    if counts {
        let repeats = request.repeats();
        let (start, end) = ((b * BLOCK) as i32, ((b + 1) * BLOCK) as i32);
        let lo = repeats.partition_point(|&(t, _)| t < start);
        for &(t, extra) in repeats[lo..].iter().take_while(|&&(t, _)| t < end) {
            h.counts[(t - start) as usize] += extra;
        }
    }
}

impl<'a, V: RowValues + ?Sized> DeferredRow<'a, V> {
    /// The deferred `step` of row `r` of `batch`, whose values are `values`.
    pub fn new(
        k: &'a Kernels,
        batch: &crate::batch::Batch<'a>,
        r: usize,
        step: &'a RowStep<'a>,
        values: &'a V,
    ) -> Result<Self> {
        debug_assert!(step.deferred);
        let h = super::penalties::histories_of(batch, r, step.penalties);
        let (prompt, output, prompt_of, output_of) = (h.prompt, h.output, h.prompt_of, h.output_of);
        // The thread's storage of the previous row, if any (36 KiB, which a fresh allocation
        // would fault in for every row).
        let mut cache = SPARE.with(|s| s.take());
        cache.clear();
        alloc::reserve(&mut cache, CACHED, "the row's visited blocks")?;
        Ok(DeferredRow { step, values, k, prompt, output, prompt_of, output_of, cache: RefCell::new(cache) })
    }

    /// Calls `f` with block `b`'s entry, worked out on first use.
    fn with_entry<R>(&self, b: usize, f: impl FnOnce(&Entry) -> R) -> R {
        let mut cache = self.cache.borrow_mut();
        let i = match cache.iter().position(|e| e.block == b) {
            Some(i) => return f(&cache[i]),
            None if cache.len() < CACHED => {
                // (Room was reserved: this allocates nothing.)
                cache.push(Entry::EMPTY);
                cache.len() - 1
            }
            None => CACHED - 1,
        };
        self.work_out(b, &mut cache[i]);
        f(&cache[i])
    }

    /// Works out block `b`'s entry into `entry`, from the lists: as [`super::build::mark_histories`]
    /// and the pass over the words give it.
    fn work_out(&self, b: usize, entry: &mut Entry) {
        let e = self.step;
        let counts = e.penalties.counts();
        *entry = Entry { block: b, ..Entry::EMPTY };
        let h = &mut entry.history;
        let prompt = if self.prompt_of.is_some() { &[][..] } else { self.prompt };
        let output = if self.output_of.is_some() { &[][..] } else { self.output };
        // SAFETY: the level is supported (`kernels`).
        unsafe { (self.k.block_history)(prompt, output, (b * BLOCK) as u32, counts, h) };
        if let Some(request) = self.prompt_of {
            let (bits, words) = (request.prompt_bits(), b * WORDS..(b + 1) * WORDS);
            let held = &bits[words.start.min(bits.len())..words.end.min(bits.len())];
            h.prompt[..held.len()].copy_from_slice(held);
        }
        if let Some(request) = self.output_of {
            held_output_in_block(request, b, counts, h);
        }
        let keep = e.keep();
        let words = b * WORDS..((b + 1) * WORDS).min(keep.len());
        // (The caller's bitmask words may set bits past the vocabulary: `RowStep::given`.)
        let last = super::build::last_word_bits(self.values.n());
        for (i, w) in words.enumerate() {
            let k = if w == keep.len() - 1 { keep[w] & last } else { keep[w] };
            // The output's tokens are seen; their counts are read only with `counts`.
            let o = entry.history.output[i] & k;
            let s = (entry.history.prompt[i] & k) | o;
            entry.history.output[i] = if counts { o } else { 0 };
            entry.seen[i] = s;
            entry.keep[i] = k & !(s | e.listed_bits[w]);
        }
    }

    /// The processed value of touched token `t` (logit `x`) of block entry `e`.
    fn value_in(&self, e: &Entry, x: f32, t: usize) -> f32 {
        let i = t - e.block * BLOCK;
        let seen = e.seen[i / 32] >> (i % 32) & 1 != 0;
        let output = e.history.output[i / 32] >> (i % 32) & 1 != 0;
        self.step.value_with(x, t, seen, if output { e.history.counts[i] } else { 0 })
    }

    /// The touched tokens of entry `e`: its words of `seen | listed`.
    fn touched_words(&self, e: &Entry) -> [u32; WORDS] {
        let (listed, words) = (&self.step.listed_bits, self.step.keep().len());
        std::array::from_fn(|i| {
            let w = e.block * WORDS + i;
            e.seen[i] | if w < words { listed[w] } else { 0 }
        })
    }

    /// The tokens of the bits `words` of block `b`, in token order.
    fn tokens(b: usize, words: [u32; WORDS]) -> impl Iterator<Item = usize> {
        words.into_iter().enumerate().flat_map(move |(i, mut bits)| {
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let j = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    b * BLOCK + i * 32 + j
                })
            })
        })
    }

    fn block_touched(&self, b: usize) -> bool {
        self.with_entry(b, |e| self.touched_words(e).iter().any(|&w| w != 0))
    }

    /// The largest processed value of block `b` (NaN ignored; -inf if none).
    fn block_max(&self, b: usize) -> f32 {
        let v = self.values;
        self.with_entry(b, |e| {
            let kept = Self::tokens(b, e.keep).map(|i| v.at(i));
            let touched = Self::tokens(b, self.touched_words(e)).map(|t| self.value_in(e, v.at(t), t));
            kept.chain(touched).fold(f32::NEG_INFINITY, |m, y| if y > m { y } else { m })
        })
    }

    /// The first half of [`RowStep::bounds`] for the deferred row: upper bounds of every
    /// block's processed values, from the scan of the row as given (its mask applied) and, for
    /// the blocks of a raising bias, the biased values without the penalties (which only lower
    /// them). Returns whether the row holds a NaN (masked or not). [`DeferredRow::refine`] or,
    /// once the row is completed, [`RowStep::refine_bounds`] makes the largest exact.
    pub fn rough_bounds(&self, bmax: &mut [f32]) -> bool {
        let (e, v, n) = (self.step, self.values, self.values.n());
        // `keep` is the mask here (no touched bit cleared).
        let nan = if e.masked { v.scan_masked(self.k, e.keep(), 0, n, bmax) } else { v.scan(self.k, 0, n, bmax) };
        for &t in &e.raised {
            let (t, m) = (t as usize, &mut bmax[t as usize / BLOCK]);
            let y = e.value_with(v.at(t), t, false, 0);
            *m = if y > *m { y } else { *m };
        }
        nan
    }

    /// The second half of [`RowStep::bounds`]: the block of the largest bound worked out
    /// exactly, and every block whose bound is above that maximum.
    pub fn refine(&self, bmax: &mut [f32]) {
        super::processed::exact_bounds(
            &[],
            bmax,
            |_| f32::NEG_INFINITY,
            |b| self.block_touched(b),
            |b| self.block_max(b),
        );
    }

    /// Whether the draw of this row, from its [`DeferredRow::rough_bounds`] (`inv_t` for a
    /// sampling row, `None` for a greedy one), should stay deferred: the race (or the search for
    /// the first maximum) is expected to visit few blocks. Each block searched reads the whole
    /// lists (about 0.5 us for 5,120 ids), while marking them costs 3-8 us once (the bits, the
    /// pass over the words, their clearing): measured on the benchmark's step rows (32 rows of
    /// 151,936 tokens), the two tie at about six blocks, so a row expected to visit more than
    /// [`FEW`] is marked.
    pub fn worth_it(&self, bmax: &[f32], inv_t: Option<f32>) -> bool {
        let top = crate::kernels::largest(bmax, f32::NEG_INFINITY);
        let Some(inv_t) = inv_t else {
            return bmax.iter().filter(|&&m| m >= top).count() <= FEW;
        };
        // A block at a distance `d = (m - bmax) / T` is visited when its largest noise, -ln of
        // the least of 256 Exp(1) (ln 256 plus a Gumbel), reaches `d` plus the best key (about
        // the key of the largest token, a Gumbel of median 0.37): with a probability of about
        // `min(1, 256 exp(-d - 0.5))`. `VISITS[i]` is that at `d = i`, the most of a block whose
        // distance is in `[i, i + 1)`; past 12 it is below 1e-3 a block.
        const VISITS: [f32; 12] = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.384, 0.141, 0.052, 0.0191, 0.0071, 0.0026];
        // Most blocks of a peaked row lie past 12: a vector test of 16 blocks at a time against
        // the bound below which a block is that far (about) skips them (the distance of each,
        // in a scalar loop, cost a fifth of what the deferral saves). An infinite `top` makes
        // `near` +inf or NaN: no block is near, as no distance was below 12.
        let near = top - VISITS.len() as f32 / inv_t;
        let mut visits = 0.0;
        for chunk in bmax.chunks(16) {
            if !chunk.iter().fold(false, |any, &b| any | (b > near)) {
                continue;
            }
            for &b in chunk {
                // (NaN, from an infinite `top`, is never below 12.)
                let d = (top - b) * inv_t;
                if d < VISITS.len() as f32 {
                    visits += VISITS[d as usize];
                    if visits > FEW as f32 {
                        // (A flat row, most often: it stops here after a few dozen blocks.)
                        return false;
                    }
                }
            }
        }
        true
    }

    /// [`RowStep::first_of`] of the deferred row.
    pub fn first_of(&self, bmax: &[f32], top: f32) -> usize {
        let v = self.values;
        for (b, _) in bmax.iter().enumerate().filter(|&(_, &m)| m >= top) {
            let found = self.with_entry(b, |e| {
                let kept = Self::tokens(b, e.keep).find(|&i| v.at(i) == top);
                let touched = Self::tokens(b, self.touched_words(e)).find(|&t| self.value_in(e, v.at(t), t) == top);
                kept.into_iter().chain(touched).min()
            });
            if let Some(i) = found {
                return i;
            }
        }
        0
    }
}

thread_local! {
    static SPARE: std::cell::Cell<Vec<Entry>> = const { std::cell::Cell::new(Vec::new()) };
}

/// What this thread keeps of a deferred row's visited blocks.
pub(super) fn kept() -> alloc::Kept {
    let bytes = SPARE
        .try_with(|s| {
            let cache = s.take();
            let bytes = cache.capacity() * size_of::<Entry>();
            s.set(cache);
            bytes
        })
        .unwrap_or(0);
    alloc::Kept { bytes, release: || drop(SPARE.try_with(|s| s.take())) }
}

impl<V: ?Sized> Drop for DeferredRow<'_, V> {
    /// Hands the cache's storage back to this thread for its next row.
    fn drop(&mut self) {
        let cache = std::mem::take(self.cache.get_mut());
        // (`try_with`: a thread that is exiting drops it.)
        let _ = SPARE.try_with(|s| s.set(cache));
    }
}

impl<V: RowValues + ?Sized> BlockValues for DeferredRow<'_, V> {
    fn listed(&self, b: usize, out: &mut [(u32, f32); BLOCK]) -> usize {
        let (v, listed) = (self.values, &self.step.listed_bits);
        self.with_entry(b, |e| {
            let mut count = 0;
            for t in Self::tokens(b, self.touched_words(e)) {
                let x = v.at(t);
                // A lowered token is bounded by its logit; a biased one (a bias may raise it)
                // by its value.
                let biased = listed[t / 32] >> (t % 32) & 1 != 0;
                out[count] = (t as u32, if biased { self.value_in(e, x, t) } else { x });
                count += 1;
            }
            count
        })
    }

    fn bounded_by_row(&self, _b: usize) -> Option<*const u32> {
        None
    }

    fn value(&self, t: u32) -> f32 {
        let t = t as usize;
        self.with_entry(t / BLOCK, |e| self.value_in(e, self.values.at(t), t))
    }

    fn own_keep(&self) -> bool {
        true
    }

    fn block_keep(&self, b: usize, words: &mut [u32; BLOCK / 32]) {
        self.with_entry(b, |e| *words = e.keep);
    }
}
