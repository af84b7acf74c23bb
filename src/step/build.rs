//! Building a row's step from the batch: the masks into `keep`, then the tokens the bias and the
//! histories touch, marked in the row's bitsets (or left to the blocks the draw visits, for a
//! deferred row), their bits cleared in `keep`.

use super::listed::Listed;
use super::penalties::{histories, histories_of, Penalties};
use super::RowStep;
use crate::alloc;
use crate::batch::Batch;
use crate::error::Result;
use crate::kernels::Kernels;

/// Whether row `r` of a validated `batch` has anything before the filters to apply (the
/// bitmask of a row counts even when all its bits are set; [`build`] then finds nothing).
pub(crate) fn row_has_step(batch: &Batch, r: usize) -> bool {
    let nonempty = |l: Option<crate::batch::TokenLists>| l.is_some_and(|l| !l.row(r).is_empty());
    // (The histories the penalties read: none where they are off, the window's part else.)
    let (prompt, output) = histories(batch, r, Penalties::of(batch, r));
    batch.token_bitmask.is_some()
        || restricted(batch, r)
        || nonempty(batch.banned_tokens)
        || !batch.banned_stops(r).is_empty()
        || batch.banned_by_words(r).next().is_some()
        || batch.logit_bias.is_some_and(|b| !b.row(r).0.is_empty())
        || !prompt.is_empty()
        || !output.is_empty()
        || super::dry::dry_on(batch, r)
}

/// Whether row `r` may only draw from its allowed list.
fn restricted(batch: &Batch, r: usize) -> bool {
    batch.allowed_tokens.is_some() && batch.allowed_rows.is_none_or(|a| a[r] != 0)
}

/// The step of row `r` of a validated `batch`, or `None` when it leaves the row as given
/// (every bit of its bitmask set, no list touching a kept token). With `defer`, a row whose
/// histories are long (more ids than a quarter of its words) and whose penalties only lower
/// values leaves them unmarked ([`RowStep::deferred`]): the caller draws it block by block
/// ([`DeferredRow`](super::DeferredRow)) or completes it ([`RowStep::complete`]).
pub(crate) fn build<'a>(k: &Kernels, batch: &Batch<'a>, r: usize, defer: bool) -> Result<Option<RowStep<'a>>> {
    let n = batch.vocab;
    let words = n.div_ceil(32);
    let last_bits = last_word_bits(n);
    let penalties = Penalties::of(batch, r);
    let defer = defer && penalties.lower_only() && long_histories(batch, r, penalties, words);
    let mut e = RowStep::in_thread_storage(penalties);
    e.keep.clear();
    e.raised.clear();
    e.counted.clear();
    alloc::reserve(&mut e.keep, words, "the row's token mask")?;
    let mut masked = false;
    let banned = batch.banned_tokens.map_or(&[][..], |l| l.row(r));
    // Stop tokens before the minimum output length: banned as the banned list's are.
    let stops = batch.banned_stops(r);
    // A bad word bans its last token where the output ends with the rest of it: as the banned
    // list bans.
    let by_words = batch.banned_by_words(r);
    let bitmask_alone =
        !restricted(batch, r) && banned.is_empty() && stops.is_empty() && batch.banned_by_words(r).next().is_none();
    if let Some(m) = batch.token_bitmask.filter(|_| defer && bitmask_alone) {
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
    for id in banned.iter().chain(stops).copied().chain(by_words) {
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

impl RowStep<'_> {
    /// Marks the histories of a deferred row (row `r` of `batch`, which built this step), as
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

    /// Clears token `i`'s bit in `keep` (a banned token).
    fn clear(&mut self, i: usize) {
        self.keep[i / 32] &= !(1 << (i % 32));
    }
}

/// The bits of the last word of a row's bitsets that are tokens of the vocabulary (`n` tokens).
pub(super) fn last_word_bits(n: usize) -> u32 {
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
///
/// A history its request holds (`Histories::prompt_of`, `output_of`) is marked in a pass over
/// the words whatever its length, so it counts only where a mask (a bitmask, an allowed list)
/// thins the tokens it touches: there the visited blocks still cost less than the marking (at
/// 1024 + 27000 tokens, vocab 151936, a 10% bitmask: 1.36x the plain draw deferred, 1.96x
/// marked), while an unmasked row's blocks, most of them visited, cost more (2.05x against
/// 1.90x).
fn long_histories(batch: &Batch, r: usize, p: Penalties, words: usize) -> bool {
    let h = histories_of(batch, r, p);
    let masked = batch.token_bitmask.is_some() || restricted(batch, r);
    let listed = |len: usize, held: bool| if held && !masked { 0 } else { len };
    let bias = batch.logit_bias.map_or(0, |b| b.row(r).0.len());
    let most = listed(h.prompt.len(), h.prompt_of.is_some()) + listed(h.output.len(), h.output_of.is_some()) + bias;
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

/// Marks the kept tokens that the histories and the bias touch (`seen`, `listed`, with their
/// counts and biases in the table) and clears their bits in `keep`. A masked token is never
/// touched: the mask wins over everything. With `defer` (penalties that only lower values, long
/// histories: [`build`]), the histories are left for [`DeferredRow`](super::DeferredRow) or
/// [`RowStep::complete`] (the bias is marked, but its bits stay set in `keep`, as the
/// histories' do).
fn touch_lists(k: &Kernels, batch: &Batch, r: usize, e: &mut RowStep, defer: bool) -> Result<()> {
    let p = e.penalties;
    let (bias_ids, bias_values) = batch.logit_bias.map_or((&[][..], &[][..]), |b| b.row(r));
    let (prompt, output) = histories(batch, r, p);
    // DRY's tokens are listed as the bias's are: a value of their own, computed once.
    let mut dry = Vec::new();
    super::dry::penalties(batch, r, &mut dry)?;
    if bias_ids.is_empty() && prompt.is_empty() && output.is_empty() && dry.is_empty() {
        return Ok(());
    }
    let words = e.keep().len();
    // The bitsets stay all zero between rows (see `scratch.rs`); past this row's words they are
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
    e.listed = Listed::with_room(bias_ids.len() + dry.len(), std::mem::take(&mut e.listed.slots))?;
    e.dry_ids.clear();
    alloc::reserve(&mut e.dry_ids, dry.len(), "the row's DRY tokens")?;
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
    let most = prompt.len() + output.len() + bias_ids.len() + dry.len();
    e.overrides.clear();
    e.ids.clear();
    alloc::reserve(&mut e.ids, most + 4, "the row's touched tokens")?;
    alloc::reserve(&mut e.vals, most, "the row's touched values")?;
    alloc::reserve(&mut e.overrides, most, "the row's changed tokens")?;
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
    // (DRY only lowers a value: none of its tokens is raised.)
    for &(id, penalty) in &dry {
        if kept(id as usize) {
            set(&mut e.listed_bits, id as usize);
            e.listed.entry(id).dry = penalty;
            e.dry_ids.push(id);
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

/// The output of a row whose request holds its counts (`Histories::output_of`), marked as
/// its tokens would mark it: with the frequency or presence penalty, its bits in `output_bits`
/// (the pass over the words adds them to `seen`) and each repeated token's occurrences after
/// the first in `counts` (listed in `counted`); without, its bits in `seen`.
fn mark_held_output(e: &mut RowStep, request: &crate::requests::Request, words: usize) {
    let bits = request.output_bits();
    if e.penalties.counts() {
        e.output_bits[..words].iter_mut().zip(bits).for_each(|(o, &b)| *o |= b);
        for &(t, extra) in request.repeats() {
            e.counts[t as usize] = extra;
            e.counted.push(t as u32);
        }
    } else {
        e.seen[..words].iter_mut().zip(bits).for_each(|(s, &b)| *s |= b);
    }
}

/// The histories' part of [`touch_lists`] (its storage reserved): their bits, the output's
/// counts, then the pass over the words that clears every touched token's bit in `keep`.
pub(super) fn mark_histories(k: &Kernels, batch: &Batch, r: usize, e: &mut RowStep, sparse: bool) {
    let p = e.penalties;
    let h = histories_of(batch, r, p);
    let (prompt, output) = (h.prompt, h.output);
    let bias_ids = batch.logit_bias.map_or(&[][..], |b| b.row(r).0);
    let words = e.keep.len();
    let most = prompt.len() + output.len() + bias_ids.len() + e.dry_ids.len();
    // The histories' bits are set whatever the mask says, and cleared where it bans in the pass
    // over the words below (a masked token is not touched): one load and one store a token,
    // no branch, and no bounds check (two compares a token of a 4096-token prompt).
    // (Local slices: through `e`, the loops reloaded each vector's pointer after every store.)
    let seen = &mut e.seen[..words];
    match h.prompt_of.filter(|_| !sparse) {
        // A request's whole prompt: its bits, kept by the state, set the same bits as its
        // tokens, in a pass over the words (the sparse pass below needs the ids).
        Some(request) => seen.iter_mut().zip(request.prompt_bits()).for_each(|(s, &b)| *s |= b),
        None => {
            for &id in prompt {
                // SAFETY: the batch's ids were checked to lie in [0, vocab)
                // (`batch::check_row_ids`), so id / 32 < words, the length of `seen`.
                unsafe { *seen.get_unchecked_mut(id as usize / 32) |= bit(id) };
            }
        }
    }
    match h.output_of.filter(|_| !sparse) {
        // A request's whole output: its counts, kept by the state, give the same bits and
        // counts as its tokens, in a pass over the words and one store a repeated token.
        Some(request) => mark_held_output(e, request, words),
        None if p.counts() => {
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
        }
        None => {
            for &id in output {
                // SAFETY: as above.
                unsafe { *seen.get_unchecked_mut(id as usize / 32) |= bit(id) };
            }
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
        // (Local slices, one loop per list: through `e` and a chain of four lists, each word
        // reloaded the vectors' pointers after every store and tested which list it was in, 5 us
        // a row of 1,024 output tokens.)
        let masked = e.masked;
        let (mask, seen, output_bits) = (&e.mask[..], &mut e.seen[..words], &mut e.output_bits[..words]);
        let (listed_bits, keep, touched_words) = (&e.listed_bits[..words], &mut e.keep[..words], &mut e.words);
        let (mut any, mut seen_words) = (0, 0);
        let mut pass = |w: usize| {
            let k = if masked { mask[w] } else { all(w) };
            let o = output_bits[w] & k;
            let (s, l) = ((seen[w] & k) | o, listed_bits[w]);
            (seen[w], output_bits[w], keep[w]) = (s, o, k & !(s | l));
            any |= s | l;
            // (Room for every named token was reserved: this allocates nothing.)
            touched_words.push(w as u32);
            seen_words += (s != 0) as usize;
        };
        for list in [prompt, output, bias_ids] {
            for &id in list {
                pass(id as usize / 32);
            }
        }
        for &id in &e.dry_ids {
            pass(id as usize / 32);
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
