//! llama.cpp's filters that keep a range of values rather than a top set: locally typical
//! sampling and XTC (exclude top choices), with `min_keep`.
//!
//! Both keep the tokens whose logit lies in `[lo, hi]`: typical sampling keeps the tokens whose
//! surprise `-ln p` is nearest the entropy, and `-ln p` falls as the logit rises, so they form a
//! range of logits around the entropy's; XTC removes the most probable tokens. A row with either
//! ([`Filters::keeps_range`]) computes its whole chain here, exactly, over its candidates sorted
//! by value (the tokens at or above the floor of min-p, top-nσ and top-k), in the order
//! `min-p, top-nσ -> top-k -> typical -> top-p -> XTC`.
//!
//! Probabilities are `w_i / Z` with `w_i = exp((x_i - m) * inv_t)` in f64 ([`weight64`]), `Z`
//! the sum over what the previous filter left, as in llama.cpp, where each filter renormalises
//! what it is given. Tokens tied in value are kept or removed together (the race cannot tell
//! them apart), which llama.cpp's unstable sorts leave to chance.

use super::Filters;
use crate::alloc;
use crate::error::Result;
use crate::kernels::Kernels;
use crate::mass::{weight64, RowMass};
use crate::noise::splitmix64;
use crate::row::RowValues;

/// Mixed into a row's key for XTC's coin, so that the coin is independent of every token's noise
/// (which the row's key gives through block keys of small indices).
const XTC_COIN_DOMAIN: u64 = 0x7874_635f_636f_696e; // "xtc_coin"

/// XTC's coin of a row keyed `key`: a uniform value in [0, 1) from the top 53 bits of
/// `splitmix64(splitmix64(key ^ XTC_COIN_DOMAIN))`. XTC applies when it is below the row's
/// `xtc_probability` (so always at 1, never at 0).
pub(crate) fn xtc_coin(key: u64) -> f64 {
    (splitmix64(splitmix64(key ^ XTC_COIN_DOMAIN)) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// What a row keeps: the finite values in `[lo, hi]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct KeptRange {
    pub lo: f32,
    pub hi: f32,
}

/// One candidate: its value, weight and the log of its weight.
#[derive(Clone, Copy)]
pub(super) struct Candidate {
    pub(super) x: f32,
    pub(super) w: f64,
    pub(super) ln_w: f64,
}

/// The candidates `values` (sorted by value, descending; not empty) weighed at `inv_t`
/// relative to the first.
pub(super) fn weigh(values: &[f32], inv_t: f32) -> Result<Vec<Candidate>> {
    let top = values[0];
    let weigh = |&x: &f32| Candidate { x, w: weight64(x, top, inv_t), ln_w: (x as f64 - top as f64) * inv_t as f64 };
    alloc::collect(values.iter().map(weigh), "typical/XTC candidates")
}

/// Candidates from which typical sampling is first tried without sorting them
/// ([`super::typical::kept_without_sort`]); fewer (behind a top-k) are sorted at once.
const TYPICAL_UNSORTED_FROM: usize = 1024;

/// The range of a row `v` (block maxima `bmax`, finite maximum `m`, at `inv_t`) kept by its
/// filters `f` once the floor of min-p, top-nσ and top-k is `floor`; `xtc_applies`: XTC's coin
/// fell below its probability. Fails only if the candidates cannot be allocated.
pub(crate) fn kept_range<V: RowValues + ?Sized>(
    k: &Kernels,
    (v, bmax, cand): (&V, &[f32], Option<Vec<f32>>),
    (m, inv_t, floor): (f32, f32, f32),
    f: Filters,
    xtc_applies: bool,
) -> Result<KeptRange> {
    // Gathered as bare f32 values (a quarter of the bytes of the candidates) from the blocks
    // that reach the floor, sorted, then weighed.
    let mut values = values_ge(k, (v, bmax, cand), floor)?;
    // Typical sampling over many candidates, decided without sorting them when the rounding of
    // its sums cannot move its crossing; what it keeps is then `c[a..b]` below (the kept values
    // sorted), all the rest needs.
    let mut typical_done = false;
    if f.typical_p < 1.0 && values.len() >= TYPICAL_UNSORTED_FROM {
        if let Some(kept) = super::typical::kept_without_sort(k, &values, (m, inv_t), f.typical_p, f.min_keep)? {
            if f.top_p >= 1.0 && !(xtc_applies && f.xtc_on()) {
                return Ok(kept);
            }
            values.retain(|&x| x >= kept.lo && x <= kept.hi);
            typical_done = true;
        }
    }
    sort_descending(&mut values)?;
    // Each weight is `weight64`'s (the kernel computes the same f64 value per element).
    let mut w = alloc::filled(values.len(), 0.0, "typical/XTC weights")?;
    // SAFETY: `k` is the table of a supported level; `w` has a slot per value.
    unsafe { (k.weights64)(&values, m as f64, inv_t as f64, &mut w) };
    let weigh = |(&x, &w): (&f32, &f64)| Candidate { x, w, ln_w: (x as f64 - m as f64) * inv_t as f64 };
    let c = alloc::collect(values.iter().zip(&w).map(weigh), "typical/XTC candidates")?;
    drop((values, w));
    // The kept candidates are always `c[a..b]` (sorted by value, descending).
    let (mut a, mut b) = (0, c.len());
    if f.typical_p < 1.0 && !typical_done {
        (a, b) = typical(&c, f.typical_p, f.min_keep);
    }
    if f.top_p < 1.0 {
        b = a + top_p_len(&c[a..b], f.top_p, f.min_keep);
    }
    if xtc_applies && f.xtc_on() {
        a += xtc_removed(&c[a..b], f.xtc_threshold, f.min_keep);
    }
    Ok(KeptRange { lo: c[b - 1].x, hi: c[a].x })
}

/// Sorts finite values in descending order: the order of `sort_unstable_by(|a, b|
/// b.total_cmp(a))` (values equal under `total_cmp` have the same bits, so the sorted sequence is
/// one), by a radix sort of their order keys (three passes of 11 bits) when there are many.
pub(crate) fn sort_descending(values: &mut [f32]) -> Result<()> {
    if values.len() < 1024 {
        values.sort_unstable_by(|a, b| b.total_cmp(a));
        return Ok(());
    }
    // The key that orders f32 bits as `total_cmp` does, complemented: ascending keys are
    // descending values.
    let key = |x: f32| {
        let b = x.to_bits();
        !(if b >> 31 == 1 { !b } else { b | 0x8000_0000 })
    };
    let mut keys = alloc::collect(values.iter().map(|&x| key(x)), "typical/XTC sort keys")?;
    let mut spare = alloc::filled(keys.len(), 0u32, "typical/XTC sort keys")?;
    // Three passes of 11 bits, their counts taken in one read.
    const DIGIT: u32 = 11;
    const RADIX: usize = 1 << DIGIT;
    let digit = |k: u32, pass: usize| ((k >> (pass as u32 * DIGIT)) as usize) & (RADIX - 1);
    let mut starts = alloc::filled(3 * RADIX, 0usize, "typical/XTC sort counts")?;
    for &k in &keys {
        for pass in 0..3 {
            starts[pass * RADIX + digit(k, pass)] += 1;
        }
    }
    for pass in 0..3 {
        let start = &mut starts[pass * RADIX..(pass + 1) * RADIX];
        let mut at = 0;
        for s in start.iter_mut() {
            (*s, at) = (at, at + *s);
        }
        for &k in &keys {
            let d = digit(k, pass);
            spare[start[d]] = k;
            start[d] += 1;
        }
        std::mem::swap(&mut keys, &mut spare);
    }
    // Back from the keys: a key's top bit (complemented) tells the sign.
    for (x, &k) in values.iter_mut().zip(&keys) {
        let b = !k;
        *x = f32::from_bits(if b >> 31 == 1 { b & 0x7fff_ffff } else { !b });
    }
    Ok(())
}

/// Blocks of candidates up to which XTC's sum is taken exactly over the gathered values.
const FEW_XTC_BLOCKS: usize = 64;

/// XTC over the finite values `>= floor` of a row `v` (block maxima `bmax`, finite maximum `m`,
/// at `inv_t`) when no typical sampling comes before it: what [`xtc_removed`] removes of them,
/// without sorting. With `p_i = w_i / Z` (`Z` the f64 sum of the weights in index order), the
/// tokens with `p >= threshold` go but the least probable of them (ties with it stay).
///
/// Behind a floor that few blocks reach, `Z` is summed over the gathered values; otherwise each
/// token's test is decided from bounds of `Z` ([`xtc_by_bounds`]), and `Z` summed over the row
/// only when the bounds leave one undecided.
pub(crate) fn xtc_above<V: RowValues + ?Sized>(
    k: &Kernels,
    (v, bmax, cand): (&V, &[f32], Option<Vec<f32>>),
    (m, inv_t, floor): (f32, f32, f32),
    f: Filters,
    xtc_applies: bool,
) -> Result<KeptRange> {
    let all = KeptRange { lo: floor, hi: m };
    if !(xtc_applies && f.xtc_on()) {
        return Ok(all);
    }
    let few = floor > f32::NEG_INFINITY && bmax.iter().filter(|&&b| b >= floor).count() <= FEW_XTC_BLOCKS;
    let (above, least, count) = if few || cand.is_some() {
        // The gathered values are the row's finite values >= floor, in index order: Z as below.
        let kept = values_ge(k, (v, bmax, cand), floor)?;
        let z: f64 = kept.iter().fold(0.0, |z, &x| z + weight64(x, m, inv_t));
        let (above, least) = passing(&kept, (m, inv_t), |w| w / z >= f.xtc_threshold);
        (above, least, kept.len())
    } else if let Some(decided) = xtc_by_bounds(k, (v, bmax), (m, inv_t, floor), f)? {
        decided
    } else {
        let kept = || (0..v.n()).map(|i| v.at(i)).filter(|x| x.is_finite() && *x >= floor);
        let (mut z, mut count) = (0.0f64, 0usize);
        for x in kept() {
            z += weight64(x, m, inv_t);
            count += 1;
        }
        let (mut above, mut least) = (0usize, f32::INFINITY);
        for x in kept().filter(|&x| weight64(x, m, inv_t) / z >= f.xtc_threshold) {
            above += 1;
            least = least.min(x);
        }
        (above, least, count)
    };
    if above < 2 || count - (above - 1) < f.min_keep {
        return Ok(all);
    }
    Ok(KeptRange { lo: floor, hi: least })
}

/// The finite values `>= floor` of a row `v` (block maxima `bmax`) in index order: from `cand`
/// (top-k's candidates, a superset of them in index order) when given, else gathered from the
/// blocks that reach the floor.
fn values_ge<V: RowValues + ?Sized>(
    k: &Kernels,
    (v, bmax, cand): (&V, &[f32], Option<Vec<f32>>),
    floor: f32,
) -> Result<Vec<f32>> {
    match cand {
        Some(mut c) => {
            c.retain(|&x| x >= floor);
            Ok(c)
        }
        None => super::row_values_ge(k, v, bmax, floor),
    }
}

/// How many of `xs` pass `test` on their weight at `(m, inv_t)`, and the least of them.
fn passing(xs: &[f32], (m, inv_t): (f32, f32), test: impl Fn(f64) -> bool) -> (usize, f32) {
    let (mut above, mut least) = (0usize, f32::INFINITY);
    for &x in xs.iter().filter(|&&x| test(weight64(x, m, inv_t))) {
        above += 1;
        least = least.min(x);
    }
    (above, least)
}

/// XTC's tests `w / Z >= threshold` of [`xtc_above`] decided from bounds of `Z`, without its
/// exact sum: `(above, least, count)`, or `None` if a test is left undecided (or the
/// threshold is not above 0, where every token passes).
///
/// `Z >= 1` (it holds the maximum's weight, 1), so only tokens with `w >= threshold` can pass:
/// those with `a = (x - m) / T >= ln threshold` (less 1e-3 for the rounding of the f64 exp),
/// gathered from the blocks that reach them. Bounds of the true mass come from the cheap kernel
/// (refined on the heaviest blocks), then the f32-exp kernel ([`crate::mass`]); widened by the
/// error of the f64 sum in index order (`n` roundings of 2^-53, and each weight's 1e-15), they
/// hold the `Z` of the exact pass, and `w / Z_hi >= threshold` implies `w / Z >= threshold` (a
/// division rounds monotonically), `w / Z_lo < threshold` its negation.
fn xtc_by_bounds<V: RowValues + ?Sized>(
    k: &Kernels,
    (v, bmax): (&V, &[f32]),
    (m, inv_t, floor): (f32, f32, f32),
    f: Filters,
) -> Result<Option<(usize, f32, usize)>> {
    let threshold = f.xtc_threshold;
    let Some(mass) = (threshold > 0.0).then(|| RowMass::new(k, v, m, inv_t, floor)).flatten() else {
        return Ok(None);
    };
    let ln_threshold = threshold.ln() - 1e-3;
    let cut = crate::mass::first_passing(floor, m, |x| (x as f64 - m as f64) * inv_t as f64 >= ln_threshold);
    let candidates = super::row_values_ge(k, v, bmax, cut)?;
    let n = mass.count() as f64;
    let slack = 1e-12 + n * 2.3e-16;
    let decide = |(lo, hi): (f64, f64)| -> Option<(usize, f32)> {
        let (z_lo, z_hi) = ((lo * (1.0 - slack)).max(1.0), hi * (1.0 + slack));
        let undecided = |w: f64| w / z_hi < threshold && w / z_lo >= threshold;
        if candidates.iter().any(|&x| undecided(weight64(x, m, inv_t))) {
            return None;
        }
        Some(passing(&candidates, (m, inv_t), |w| w / z_hi >= threshold))
    };
    let (_, cheap, blocks) = mass.z_cheap(bmax)?;
    let refined = mass.z_refined(&blocks);
    let mut decided = decide((cheap.0.max(refined.0), cheap.1.min(refined.1)));
    if decided.is_none() {
        let (_, by_exp) = mass.z_exp(bmax, &mut Vec::new())?;
        decided = decide(by_exp);
    }
    let Some((above, least)) = decided else { return Ok(None) };
    // min_keep needs the number of kept tokens only when XTC would remove some.
    let count = if above >= 2 && f.min_keep > 1 {
        (0..v.n()).map(|i| v.at(i)).filter(|x| x.is_finite() && *x >= floor).count()
    } else {
        usize::MAX
    };
    Ok(Some((above, least, count)))
}

/// llama.cpp's dynamic temperature of a row of base temperature `t` whose filters `f` keep the
/// finite values of `v` in `range`: `min_t + (max_t - min_t) * (H / ln N)^exponent`, with
/// `min_t = max(0, t - dynatemp_range)`, `max_t = t + dynatemp_range`, `H` the entropy of
/// softmax(x) (at temperature 1) over the N kept tokens. `None` when off, or when N <= 1 (the
/// temperature does not matter then).
pub(crate) fn dynamic_temperature<V: RowValues + ?Sized>(v: &V, range: KeptRange, t: f32, f: Filters) -> Option<f64> {
    if f.dynatemp_range <= 0.0 {
        return None;
    }
    let kept = || (0..v.n()).map(|i| v.at(i)).filter(|x| x.is_finite() && *x >= range.lo && *x <= range.hi);
    let (mut z, mut count) = (0.0f64, 0usize);
    for x in kept() {
        z += weight64(x, range.hi, 1.0);
        count += 1;
    }
    if count <= 1 {
        return None;
    }
    let ln_z = z.ln();
    // p ln p = (w / Z) (ln w - ln Z); a weight of 0 adds nothing.
    let mut entropy = 0.0f64;
    for x in kept() {
        let w = weight64(x, range.hi, 1.0);
        if w > 0.0 {
            entropy -= w / z * ((x as f64 - range.hi as f64) - ln_z);
        }
    }
    let normalized = (entropy / (count as f64).ln()).max(0.0);
    let (low, high) = ((t as f64 - f.dynatemp_range).max(0.0), t as f64 + f.dynatemp_range);
    Some(low + (high - low) * normalized.powf(f.dynatemp_exponent))
}

/// Locally typical sampling over the candidates `c` (sorted by value, descending; not empty):
/// with `p_i = w_i / Z`, `H = -sum p_i ln p_i`, the tokens in increasing order of
/// `|-ln p_i - H|` (lower index first on ties), up to the first at which their mass exceeds
/// `typical_p` and at least `min_keep` are kept; every token whose score equals the last one's
/// is kept too. Returns the kept range `c[a..b]`.
///
/// `-ln p_i = ln Z - ln w_i` rises with `i`, so the scores fall up to the first token whose
/// surprise reaches `H` and rise after it: the increasing order is a merge walking outwards from
/// there, and the kept tokens are one range.
pub(super) fn typical(c: &[Candidate], typical_p: f64, min_keep: usize) -> (usize, usize) {
    let z: f64 = c.iter().map(|t| t.w).sum();
    let ln_z = z.ln();
    // p ln p = (w / Z) (ln w - ln Z); a weight of 0 (under e^-700) adds nothing.
    let entropy: f64 = -c.iter().filter(|t| t.w > 0.0).map(|t| t.w / z * (t.ln_w - ln_z)).sum::<f64>();
    let shifted = |i: usize| ln_z - c[i].ln_w - entropy;
    let score = |i: usize| shifted(i).abs();
    let split = c.partition_point(|t| ln_z - t.ln_w - entropy < 0.0);
    // Taken: c[left..right], growing outwards from `split`.
    let (mut left, mut right) = (split, split);
    let mut mass = 0.0;
    let mut bound = f64::INFINITY;
    while left > 0 || right < c.len() {
        let take_left = right == c.len() || (left > 0 && score(left - 1) <= score(right));
        let i = if take_left { left - 1 } else { right };
        if take_left {
            left -= 1;
        } else {
            right += 1;
        }
        mass += c[i].w / z;
        if mass > typical_p && right - left >= min_keep {
            bound = score(i);
            break;
        }
    }
    while left > 0 && score(left - 1) <= bound {
        left -= 1;
    }
    while right < c.len() && score(right) <= bound {
        right += 1;
    }
    (left, right)
}

/// How many of the candidates `c` (sorted by value, descending; not empty) top-p keeps: the
/// fewest most probable whose mass reaches `top_p` of their sum and at least `min_keep`, then
/// every token tied with the last.
fn top_p_len(c: &[Candidate], top_p: f64, min_keep: usize) -> usize {
    let z: f64 = c.iter().map(|t| t.w).sum();
    let mut mass = 0.0;
    let mut len = c.len();
    for (n, t) in c.iter().enumerate() {
        mass += t.w / z;
        if mass >= top_p && n + 1 >= min_keep {
            len = n + 1;
            break;
        }
    }
    while len < c.len() && c[len].x == c[len - 1].x {
        len += 1;
    }
    len
}

/// How many of the most probable candidates `c` (sorted by value, descending; not empty) XTC
/// removes: with `p_i = w_i / Z`, when at least two tokens have `p >= threshold`, all of them but
/// the least probable, provided at least `min_keep` tokens remain; and never a token tied with the
/// least probable of them.
pub(super) fn xtc_removed(c: &[Candidate], threshold: f64, min_keep: usize) -> usize {
    let z: f64 = c.iter().map(|t| t.w).sum();
    let above = c.iter().take_while(|t| t.w / z >= threshold).count();
    if above < 2 || c.len() - (above - 1) < min_keep {
        return 0;
    }
    let least = c[above - 1].x;
    c.iter().take_while(|t| t.x > least).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range_of(probs: &[f32], f: Filters) -> Vec<f32> {
        let x: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let bmax: Vec<f32> =
            x.chunks(crate::kernels::BLOCK).map(|c| c.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))).collect();
        let k = crate::kernels::kernels(crate::kernels::best_level());
        let r = kept_range(k, (&x[..], &bmax, None), (m, 1.0, f32::NEG_INFINITY), f, true).unwrap();
        let mut kept: Vec<f32> =
            probs.iter().zip(&x).filter(|(_, &x)| x >= r.lo && x <= r.hi).map(|(&p, _)| p).collect();
        kept.sort_by(|a, b| b.total_cmp(a));
        kept
    }

    fn typical_p(p: f64) -> Filters {
        Filters { typical_p: p, ..Filters::default() }
    }

    fn xtc(probability: f64, threshold: f64) -> Filters {
        Filters { xtc_probability: probability, xtc_threshold: threshold, ..Filters::default() }
    }

    #[test]
    fn typical_keeps_llama_cpp_expected_sets() {
        assert_eq!(range_of(&[0.97, 0.01, 0.01, 0.01], typical_p(0.5)), [0.97]);
        assert_eq!(range_of(&[0.4, 0.2, 0.2, 0.2], typical_p(0.5)), [0.2, 0.2, 0.2]);
    }

    #[test]
    fn xtc_keeps_llama_cpp_expected_sets() {
        let p = [0.4, 0.3, 0.2, 0.1];
        assert_eq!(range_of(&p, xtc(0.99, 0.09)), [0.1]);
        assert_eq!(range_of(&p, xtc(0.99, 0.19)), [0.2, 0.1]);
        assert_eq!(range_of(&p, xtc(0.99, 0.29)), [0.3, 0.2, 0.1]);
        assert_eq!(range_of(&p, xtc(0.99, 0.39)), [0.4, 0.3, 0.2, 0.1]);
    }

    #[test]
    fn min_keep_holds_typical_and_xtc_back() {
        let p = [0.97, 0.01, 0.01, 0.01];
        assert_eq!(range_of(&p, Filters { min_keep: 2, ..typical_p(0.5) }).len(), 4); // ties with the 2nd
        let p = [0.4, 0.3, 0.2, 0.1];
        assert_eq!(range_of(&p, Filters { min_keep: 2, ..xtc(1.0, 0.09) }), [0.4, 0.3, 0.2, 0.1]);
        assert_eq!(range_of(&p, Filters { min_keep: 2, ..xtc(1.0, 0.19) }), [0.2, 0.1]);
    }

    /// XTC's removal by its definition: Z the f64 sum in index order of the kept weights, the
    /// tokens with `w / Z >= threshold`, the least of them kept.
    fn xtc_reference(x: &[f32], (m, inv_t, floor): (f32, f32, f32), f: Filters) -> KeptRange {
        let kept: Vec<f32> = x.iter().copied().filter(|v| v.is_finite() && *v >= floor).collect();
        let z = kept.iter().fold(0.0, |z, &v| z + weight64(v, m, inv_t));
        let (above, least) = passing(&kept, (m, inv_t), |w| w / z >= f.xtc_threshold);
        if above < 2 || kept.len() - (above - 1) < f.min_keep {
            return KeptRange { lo: floor, hi: m };
        }
        KeptRange { lo: floor, hi: least }
    }

    /// Thresholds at a token's probability (every bound leaves it undecided: the exact sum
    /// decides), just off it (the f32-exp bounds decide) and far from it (the cheap bounds):
    /// the range of the definition, at every level, with and without a floor.
    #[test]
    fn xtc_by_bounds_removes_what_the_exact_sum_removes() {
        let mut state = 0x5eed_u64;
        let mut uniform = || {
            state = splitmix64(state);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for level in crate::kernels::supported_levels() {
            let k = crate::kernels::kernels(level);
            for row in 0..12 {
                let n = 3000 + row * 500;
                let mut x: Vec<f32> = (0..n).map(|_| (uniform() * 6.0) as f32).collect();
                for j in 0..4 {
                    x[(row * 97 + j * 611) % n] = 9.0 + j as f32 * 0.3;
                }
                let bmax: Vec<f32> = x
                    .chunks(crate::kernels::BLOCK)
                    .map(|c| c.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)))
                    .collect();
                let m = bmax.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) + 0.0;
                let inv_t = [1.0f32, 1.25, 0.8][row % 3];
                let floor = if row % 2 == 0 { f32::NEG_INFINITY } else { 1.0 };
                let kept: Vec<f32> = x.iter().copied().filter(|v| *v >= floor).collect();
                let z = kept.iter().fold(0.0, |z, &v| z + weight64(v, m, inv_t));
                let p_at = |v: f32| weight64(v, m, inv_t) / z;
                let second = p_at(9.6);
                for threshold in [second, second * (1.0 + 1e-5), second * (1.0 - 1e-5), second * 1.3, 0.01, 1e-4] {
                    for min_keep in [0, 3, n] {
                        let f =
                            Filters { xtc_probability: 1.0, xtc_threshold: threshold, min_keep, ..Filters::default() };
                        let got = xtc_above(k, (&x[..], &bmax[..], None), (m, inv_t, floor), f, true).unwrap();
                        let want = xtc_reference(&x, (m, inv_t, floor), f);
                        assert_eq!(got, want, "{level:?} row {row} threshold {threshold} min_keep {min_keep}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_radix_sort_gives_the_comparison_sort_bit_for_bit() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut values: Vec<f32> = (0..10_000)
            .map(|i| {
                state = splitmix64(state);
                match i % 7 {
                    0 => 0.0,
                    1 => -0.0,
                    2 => ((state >> 40) % 13) as f32 - 6.0,
                    _ => f32::from_bits((state >> 32) as u32 & 0xbf7f_ffff),
                }
            })
            .filter(|x| x.is_finite())
            .collect();
        let mut want = values.clone();
        want.sort_unstable_by(|a, b| b.total_cmp(a));
        sort_descending(&mut values).unwrap();
        assert_eq!(
            values.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_coin_is_uniform_in_the_unit_interval() {
        let coins: Vec<f64> = (0..10_000u64).map(xtc_coin).collect();
        assert!(coins.iter().all(|&u| (0.0..1.0).contains(&u)));
        let below_half = coins.iter().filter(|&&u| u < 0.5).count();
        assert!((4_800..5_200).contains(&below_half), "{below_half}");
    }
}
