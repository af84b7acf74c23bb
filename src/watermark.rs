//! Keyed-noise watermarking (`docs/semantics.md`, "Watermarking"): the noise of a watermarked
//! position is keyed by a secret and a hash of the `k` tokens before it, so that whoever holds
//! the secret can recompute, for each token of a text, the uniform of the race that emitted it.
//!
//! A watermarked row is a seeded row: its seed is [`watermark_seed`] of (secret, context) and
//! its offset 0, so the draw is the plain keyed race of every seeded row and each token's
//! distribution is exactly the row's. The race picks the token of the largest `a_x - ln E_x`,
//! so the emitted token's `E` is smaller than a uniform token's; [`detect`] sums
//! `-ln(1 - U_t)` with `U_t = exp(-E_t)` over the text, `Gamma(n, 1)` without a watermark.

use crate::kernels::generic::noise::splitmix64;
use crate::kernels::BLOCK;
use crate::noise::seeded_row_key;

/// The domain of the context hash: "wmark".
const CONTEXT_DOMAIN: u64 = 0x77_6d61_726b;
/// The domains of the inline noise's block streams (`kernels/generic/race.rs`).
use crate::kernels::generic::race::{MIN_KEY_DOMAIN, POS_KEY_DOMAIN};

/// The seed of a watermarked position whose context (the tokens before it, at most `k` of them,
/// oldest first) is `context`: the secret and every token mixed in by SplitMix64, then the
/// context's length (so that a shorter context at the start of a text is a context of its own).
pub fn watermark_seed(secret: u64, context: &[i32]) -> u64 {
    let h = context.iter().fold(splitmix64(secret ^ CONTEXT_DOMAIN), |h, &t| splitmix64(h ^ t as u32 as u64));
    splitmix64(h ^ context.len() as u64)
}

/// The context of the position after `history` (the prompt then the output so far): its last
/// `k` tokens, fewer when the history is shorter.
pub fn context_of(history: &[i32], k: usize) -> &[i32] {
    &history[history.len().saturating_sub(k)..]
}

/// One round of the 32-bit avalanche mix of the noise hash (`kernels/generic/noise.rs`).
fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The 32 bits of counter `i` under the row key `key`, as the kernels' hash gives them.
fn hash_bits(key: u64, i: u32) -> u32 {
    let (lo, hi) = (key as u32, (key >> 32) as u32);
    fmix32(fmix32(i.wrapping_mul(0x9e37_79b9) ^ lo).wrapping_add(hi))
}

/// `E = -ln U`, `U = (b + 0.5) 2^-32`, in f64.
fn exp_of_bits(b: u32) -> f64 {
    -((b as f64 + 0.5) / 4_294_967_296.0).ln()
}

/// The inline noise `E` of token `i` of the row keyed by `key`, in f64: in block `i / BLOCK`, the
/// block's minimum `E(h1) / BLOCK` sits at position `h2 >> 24`, every other token holds the
/// minimum plus the `E` of its own hash (the race's noise, exactly `Exp(1)` and independent).
pub fn token_noise(key: u64, i: usize) -> f64 {
    let block = (i / BLOCK) as u32;
    let h1 = hash_bits(splitmix64(key ^ MIN_KEY_DOMAIN), block);
    let h2 = hash_bits(splitmix64(key ^ POS_KEY_DOMAIN), block);
    let e_min = exp_of_bits(h1) / BLOCK as f64;
    if (i % BLOCK) as u32 == h2 >> 24 {
        e_min
    } else {
        e_min + exp_of_bits(hash_bits(key, i as u32))
    }
}

/// What [`detect`] found in a text.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Detection {
    /// `sum -ln(1 - U_t)` over the scored tokens.
    pub score: f64,
    /// Tokens scored: those whose (context, token) pair had not been seen before in the text.
    pub scored: u64,
    /// `P(Gamma(scored, 1) >= score)`: the chance of a score this high without the watermark
    /// (1 when nothing was scored).
    pub p_value: f64,
}

/// Scores `tokens`, generated after `prefix` (the prompt, whose tail is the first contexts),
/// for the watermark of `secret` with context window `k`: `U_t = exp(-E_t)` of token `t`
/// under its position's key, a pair (context, token) seen before in the text skipped (its `U`
/// repeats, so it is no new evidence).
pub fn detect(secret: u64, k: usize, prefix: &[i32], tokens: &[i32]) -> Detection {
    let mut history: Vec<i32> = Vec::with_capacity(prefix.len() + tokens.len());
    history.extend_from_slice(prefix);
    let mut seen = std::collections::HashSet::with_capacity(tokens.len());
    let (mut score, mut scored) = (0.0f64, 0u64);
    for &t in tokens {
        let seed = watermark_seed(secret, context_of(&history, k));
        history.push(t);
        if t < 0 || !seen.insert((seed, t)) {
            continue;
        }
        let e = token_noise(seeded_row_key(seed, 0), t as usize);
        // -ln(1 - U) with U = exp(-E), without cancellation: -ln(-expm1(-E)).
        score += -(-(-e).exp_m1()).ln();
        scored += 1;
    }
    Detection { score, scored, p_value: gamma_upper_tail(scored, score) }
}

/// `Q(n, x) = P(Gamma(n, 1) >= x)` for a whole `n`: the Poisson sum `e^-x sum_{j<n} x^j / j!`,
/// in f64, its terms added in log space from the largest (no overflow nor early underflow).
pub fn gamma_upper_tail(n: u64, x: f64) -> f64 {
    if n == 0 || x.is_nan() || x <= 0.0 {
        return 1.0;
    }
    if x == f64::INFINITY {
        return 0.0;
    }
    let ln_x = x.ln();
    // ln of term j: -x + j ln x - ln j!.
    let mut ln_terms = Vec::with_capacity(n as usize);
    let mut ln_fact = 0.0f64;
    for j in 0..n {
        if j > 0 {
            ln_fact += (j as f64).ln();
        }
        ln_terms.push(-x + j as f64 * ln_x - ln_fact);
    }
    let top = ln_terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = ln_terms.iter().map(|l| (l - top).exp()).sum();
    (top + sum.ln()).exp().min(1.0)
}

/// The seeds of the target rows of one request's watermarked verification: row `j` (draft
/// position `j`, then the bonus row `drafts.len()`) has the seed of the position after
/// `history ++ drafts[..j]`, so that each row is keyed exactly as the position-by-position
/// watermarked draw of that text would key it. Draw the rows with these seeds (offset 0) and
/// keep the drafts while they equal the drawn tokens ([`watermark_accept`]).
pub fn watermark_verify_seeds(secret: u64, k: usize, history: &[i32], drafts: &[i32]) -> Vec<u64> {
    // Only the last k tokens of history ++ drafts[..j] matter.
    let tail = &history[history.len().saturating_sub(k)..];
    let text: Vec<i32> = tail.iter().chain(drafts).copied().collect();
    (0..=drafts.len()).map(|j| watermark_seed(secret, context_of(&text[..tail.len() + j], k))).collect()
}

/// The tokens one request emits from its drafts and the tokens drawn at its target rows with
/// [`watermark_verify_seeds`]: the drafts while each equals its row's drawn token, then the
/// drawn token of the first row that differs (the bonus row's when every draft matched). Each
/// emitted token is the token of the position-by-position watermarked draw: an accepted draft
/// is that draw's token, and the first other drawn token is drawn with the seed of the text
/// accepted so far. So the text, its distribution and its watermark are the sequential ones.
pub fn watermark_accept(drafts: &[i32], drawn: &[i32]) -> Vec<i32> {
    let matched = drafts.iter().zip(drawn).take_while(|(d, t)| d == t).count();
    let mut out = drafts[..matched].to_vec();
    if let Some(&t) = drawn.get(matched) {
        out.push(t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gamma_tail_matches_closed_forms() {
        // n = 1: e^-x; n = 2: e^-x (1 + x).
        for x in [0.1f64, 1.0, 5.0, 30.0] {
            let tail = (-x).exp();
            assert!((gamma_upper_tail(1, x) - tail).abs() <= 1e-15 * tail);
            let want = tail * (1.0 + x);
            assert!((gamma_upper_tail(2, x) - want).abs() <= 1e-14 * want);
        }
        // The median of Gamma(n, 1) is near n - 1/3: the tail there is near 1/2.
        let q = gamma_upper_tail(200, 200.0 - 1.0 / 3.0);
        assert!((q - 0.5).abs() < 0.01, "{q}");
        // Far tails stay finite and ordered.
        let (a, b) = (gamma_upper_tail(200, 400.0), gamma_upper_tail(200, 500.0));
        assert!(a > b && b > 0.0 && a < 1e-20, "{a} {b}");
        assert_eq!(gamma_upper_tail(0, 3.0), 1.0);
    }

    #[test]
    fn contexts_are_the_last_k_tokens() {
        assert_eq!(context_of(&[1, 2, 3, 4], 2), &[3, 4]);
        assert_eq!(context_of(&[1], 3), &[1]);
        assert_ne!(watermark_seed(5, &[1, 2]), watermark_seed(5, &[2, 1]));
        assert_ne!(watermark_seed(5, &[]), watermark_seed(5, &[0]));
        assert_ne!(watermark_seed(5, &[1]), watermark_seed(6, &[1]));
    }
}
