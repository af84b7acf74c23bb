//! Integer loops of the sampling step before the filters, which each level's entry point
//! vectorises at its own width (the same loops compiled outside a target-feature function ran
//! on SSE2): the last pass of a row's step (`src/step/build.rs`) over its mask words, which cost
//! a quarter of the step of a row with 5,000-token histories on SSE2, the range check of the token lists
//! (`batch.rs`), which runs on one thread for every row of a call, and the search of the
//! histories for one block's tokens (`block_history`), which a row drawn block by block runs
//! for each block it visits instead of marking every token of its histories.

/// What [`step_words`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WordPass {
    /// Whether the lists touch any kept token.
    pub touched: bool,
    /// How many words of `seen` still hold a bit.
    pub seen_words: usize,
}

/// For every word `w` of the row: `mask[w] = keep[w]` (when `mask` is not empty), the bits of
/// `seen` and `output` kept only where `keep` keeps (a masked token is never touched), the
/// output's bits added to `seen` (the loop over the output sets only its own bits), and
/// `keep[w]` cleared where `seen` or `listed` holds a bit (a touched token does not keep its
/// logit as given). Every slice but an empty `mask` has the length of `keep`.
#[inline(always)]
pub(crate) fn step_words(
    keep: &mut [u32],
    mask: &mut [u32],
    seen: &mut [u32],
    output: &mut [u32],
    listed: &[u32],
) -> WordPass {
    let n = keep.len();
    let (seen, output, listed) = (&mut seen[..n], &mut output[..n], &listed[..n]);
    let (mut any, mut seen_words) = (0u32, 0u32);
    if mask.is_empty() {
        for w in 0..n {
            let (k, l) = (keep[w], listed[w]);
            let o = output[w] & k;
            let s = (seen[w] & k) | o;
            (seen[w], output[w], keep[w]) = (s, o, k & !(s | l));
            any |= s | l;
            seen_words += (s != 0) as u32;
        }
    } else {
        let mask = &mut mask[..n];
        for w in 0..n {
            let (k, l) = (keep[w], listed[w]);
            let o = output[w] & k;
            let s = (seen[w] & k) | o;
            (mask[w], seen[w], output[w], keep[w]) = (k, s, o, k & !(s | l));
            any |= s | l;
            seen_words += (s != 0) as u32;
        }
    }
    WordPass { touched: any != 0, seen_words: seen_words as usize }
}

/// Whether every id lies in `[0, vocab)` (`vocab < 2^31`): a negative id is a large u32, so
/// one unsigned compare a lane, ORed (a reduction of bools, or a search that stops early, does
/// not vectorise).
#[inline(always)]
pub(crate) fn ids_in_range(ids: &[i32], vocab: u32) -> bool {
    ids.iter().fold(0u32, |bad, &id| bad | (id as u32 >= vocab) as u32) == 0
}

/// The tokens of one block (of [`BLOCK`](super::BLOCK)) that a row's histories hold: bit `i % 32`
/// of word `i / 32` for the block's token `i`.
#[derive(Clone, Copy)]
pub(crate) struct BlockHistory {
    /// The tokens of the prompt.
    pub prompt: [u32; super::BLOCK / 32],
    /// The tokens of the output.
    pub output: [u32; super::BLOCK / 32],
    /// Per token, its occurrences in the output (counted only with `count`).
    pub counts: [u32; super::BLOCK],
}

impl BlockHistory {
    pub const EMPTY: BlockHistory =
        BlockHistory { prompt: [0; super::BLOCK / 32], output: [0; super::BLOCK / 32], counts: [0; super::BLOCK] };
}

/// Ids per step of [`block_history`]'s search: one test of a chunk's ids (an OR of unsigned
/// compares, which vectorises) skips the chunk when none lies in the block; a block of 256 in a
/// vocabulary of 150k holds an id of a random chunk of 32 about once in 20 chunks.
const CHUNK: usize = 32;

/// Sets `h` (all zero on entry) to the tokens of `prompt` and `output` that lie in the block of
/// tokens `[base, base + BLOCK)`, with, when `count`, the occurrences of each in the output.
#[inline(always)]
pub(crate) fn block_history(prompt: &[i32], output: &[i32], base: u32, count: bool, h: &mut BlockHistory) {
    for_block_ids(prompt, base, |d| h.prompt[d as usize / 32] |= 1 << (d % 32));
    for_block_ids(output, base, |d| {
        h.output[d as usize / 32] |= 1 << (d % 32);
        if count {
            h.counts[d as usize] += 1;
        }
    });
}

/// Calls `hit(id - base)` for each id of `ids` in `[base, base + BLOCK)`, in order. (A generic
/// function inlined into the level's entry point, not a closure: a closure's body is compiled
/// apart, without the level's features, and its loop ran on SSE2.)
#[inline(always)]
fn for_block_ids(ids: &[i32], base: u32, mut hit: impl FnMut(u32)) {
    const B: u32 = super::BLOCK as u32;
    // (A negative id never lies in a block: it is a large u32. The batch's ids are in range.)
    let mut chunks = ids.chunks_exact(CHUNK);
    for c in &mut chunks {
        let mut any = 0u32;
        for &id in c {
            any |= ((id as u32).wrapping_sub(base) < B) as u32;
        }
        if any != 0 {
            for &id in c {
                let d = (id as u32).wrapping_sub(base);
                if d < B {
                    hit(d);
                }
            }
        }
    }
    for &id in chunks.remainder() {
        let d = (id as u32).wrapping_sub(base);
        if d < B {
            hit(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WordPass;

    /// Every level finds an id out of range wherever it is, and none in a list in range.
    #[test]
    fn every_level_finds_ids_out_of_range() {
        let vocab = 151_936u32;
        each_level(|level| {
            let ids_in_range = kernels(level).ids_in_range;
            for n in [0usize, 1, 15, 16, 17, 100, 5120] {
                let mut ids: Vec<i32> = (0..n as i32).map(|i| (i * 7919) % vocab as i32).collect();
                // SAFETY: the level is supported.
                assert!(unsafe { ids_in_range(&ids, vocab) }, "{level:?} n {n}");
                for at in [0, n / 2, n.saturating_sub(1)].into_iter().filter(|_| n > 0) {
                    for bad in [vocab as i32, -1, i32::MIN, i32::MAX] {
                        let keep = ids[at];
                        ids[at] = bad;
                        // SAFETY: as above.
                        assert!(!unsafe { ids_in_range(&ids, vocab) }, "{level:?} n {n} at {at} id {bad}");
                        ids[at] = keep;
                    }
                }
            }
        });
    }
    use super::BlockHistory;
    use crate::kernels::kernels;
    use crate::kernels::test_support::each_level;

    /// Every level's `block_history` finds, for blocks at the row's start, middle and end, the
    /// tokens and counts a loop over the ids finds, with ids in chunks and remainders of every
    /// length, and ids just outside the block.
    #[test]
    fn every_level_finds_a_blocks_history() {
        let vocab = 151_936u32;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |m: u32| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % m as u64) as u32
        };
        for (np, no) in [(0usize, 0usize), (1, 0), (31, 33), (4096, 1024), (100, 5000)] {
            for base in [0u32, 256 * 297, vocab - vocab % 256] {
                // Half the ids near the block (inside or just outside it), half anywhere.
                let mut id = || {
                    if next(2) == 0 {
                        (base as i64 + next(300) as i64 - 20).clamp(0, vocab as i64 - 1) as i32
                    } else {
                        next(vocab) as i32
                    }
                };
                let prompt: Vec<i32> = (0..np).map(|_| id()).collect();
                let output: Vec<i32> = (0..no).map(|_| id()).collect();
                let mut want = BlockHistory::EMPTY;
                for &t in &prompt {
                    if (base..base + 256).contains(&(t as u32)) {
                        want.prompt[(t as u32 - base) as usize / 32] |= 1 << ((t as u32 - base) % 32);
                    }
                }
                for &t in &output {
                    if (base..base + 256).contains(&(t as u32)) {
                        want.output[(t as u32 - base) as usize / 32] |= 1 << ((t as u32 - base) % 32);
                        want.counts[(t as u32 - base) as usize] += 1;
                    }
                }
                each_level(|level| {
                    for count in [false, true] {
                        let mut h = BlockHistory::EMPTY;
                        // SAFETY: the level is supported.
                        unsafe { (kernels(level).block_history)(&prompt, &output, base, count, &mut h) };
                        let counts = if count { want.counts } else { [0; 256] };
                        let what = format!("{level:?} prompt {np} output {no} base {base} count {count}");
                        assert_eq!((h.prompt, h.output), (want.prompt, want.output), "{what}");
                        assert_eq!(h.counts, counts, "{what}");
                    }
                });
            }
        }
    }

    /// Every level's `step_words` gives, word for word, what the module doc says, with and
    /// without a mask, on random words at lengths that end inside a vector.
    #[test]
    fn every_level_applies_the_step_to_words_as_defined() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Sparse words too: most history words hold few bits.
            let w = x as u32;
            if x >> 40 & 3 == 0 {
                0
            } else {
                w
            }
        };
        for n in [1usize, 7, 16, 33, 100, 4748] {
            let gen = |f: &mut dyn FnMut() -> u32| (0..n).map(|_| f()).collect::<Vec<u32>>();
            let (keep, seen, output, listed) = (gen(&mut next), gen(&mut next), gen(&mut next), gen(&mut next));
            let mut want_keep = keep.clone();
            let (mut want_seen, mut want_output) = (seen.clone(), output.clone());
            let (mut any, mut seen_words) = (0, 0);
            for w in 0..n {
                let k = keep[w];
                want_output[w] = output[w] & k;
                want_seen[w] = (seen[w] | output[w]) & k;
                want_keep[w] = k & !(want_seen[w] | listed[w]);
                any |= want_seen[w] | listed[w];
                seen_words += (want_seen[w] != 0) as usize;
            }
            let want_pass = WordPass { touched: any != 0, seen_words };
            each_level(|level| {
                for masked in [false, true] {
                    let (mut k, mut s, mut o) = (keep.clone(), seen.clone(), output.clone());
                    let mut mask = if masked { vec![7u32; n] } else { Vec::new() };
                    // SAFETY: the level is supported.
                    let pass = unsafe { (kernels(level).step_words)(&mut k, &mut mask, &mut s, &mut o, &listed) };
                    assert_eq!(pass, want_pass, "{level:?} n {n}");
                    assert_eq!((&k, &s, &o), (&want_keep, &want_seen, &want_output), "{level:?} n {n}");
                    if masked {
                        assert_eq!(mask, keep, "{level:?} n {n}");
                    }
                }
            });
        }
    }
}
