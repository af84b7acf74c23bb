//! The last pass of a row's edits (`edits.rs`) over its mask words: plain integer loops, which
//! each level's entry point vectorises at its own width (the same loop compiled outside a
//! target-feature function ran on SSE2 and cost a quarter of a 5,000-token row's edits).

/// What [`edit_words`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WordPass {
    /// Whether the lists touch any kept token.
    pub touched: bool,
    /// The words of `seen` that still hold a bit.
    pub seen_words: usize,
}

/// For every word `w` of the row: `mask[w] = keep[w]` (when `mask` is not empty), the bits of
/// `seen` and `output` kept only where `keep` keeps (a masked token is never touched), and
/// `keep[w]` cleared where `seen` or `listed` holds a bit (a touched token does not keep its
/// logit as given). Every slice but an empty `mask` has the length of `keep`.
#[inline(always)]
pub(crate) fn edit_words(
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
            let k = keep[w];
            let (s, l) = (seen[w] & k, listed[w]);
            (seen[w], output[w], keep[w]) = (s, output[w] & k, k & !(s | l));
            any |= s | l;
            seen_words += (s != 0) as u32;
        }
    } else {
        let mask = &mut mask[..n];
        for w in 0..n {
            let k = keep[w];
            let (s, l) = (seen[w] & k, listed[w]);
            (mask[w], seen[w], output[w], keep[w]) = (k, s, output[w] & k, k & !(s | l));
            any |= s | l;
            seen_words += (s != 0) as u32;
        }
    }
    WordPass { touched: any != 0, seen_words: seen_words as usize }
}

#[cfg(test)]
mod tests {
    use super::WordPass;
    use crate::kernels::{kernels, supported_levels};

    /// Every level's `edit_words` gives, word for word, what the module doc says, with and
    /// without a mask, on random words at lengths that end inside a vector.
    #[test]
    fn every_level_edits_the_words_as_defined() {
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
                want_seen[w] = seen[w] & k;
                want_output[w] = output[w] & k;
                want_keep[w] = k & !(want_seen[w] | listed[w]);
                any |= want_seen[w] | listed[w];
                seen_words += (want_seen[w] != 0) as usize;
            }
            let want_pass = WordPass { touched: any != 0, seen_words };
            for level in supported_levels() {
                for masked in [false, true] {
                    let (mut k, mut s, mut o) = (keep.clone(), seen.clone(), output.clone());
                    let mut mask = if masked { vec![7u32; n] } else { Vec::new() };
                    // SAFETY: the level is supported.
                    let pass = unsafe { (kernels(level).edit_words)(&mut k, &mut mask, &mut s, &mut o, &listed) };
                    assert_eq!(pass, want_pass, "{level:?} n {n}");
                    assert_eq!((&k, &s, &o), (&want_keep, &want_seen, &want_output), "{level:?} n {n}");
                    if masked {
                        assert_eq!(mask, keep, "{level:?} n {n}");
                    }
                }
            }
        }
    }
}
