//! Locally typical sampling over many candidates without sorting them: the range
//! [`super::llama::typical`] keeps, decided from one weighing of the candidates, a histogram of
//! their scores and a sort of the few candidates near the crossing.
//!
//! `typical` sums `Z`, the entropy `H` and the kept mass in its own orders (sorted by value, then
//! outwards from the entropy), so its f64 results are not those of any other order. They differ
//! from the exact sums by at most `n` roundings of their terms, and the kept set moves only when
//! a candidate's score or the kept mass lies within those errors of the crossing: each is
//! checked here with room for the errors of both orders, and the row is left to `typical`
//! (`None`) when one is not clear of them.
//!
//! With `c = ln Z - H` (the mean of `ln w` under `p`), a token's score is `|c - ln w_i|`: the
//! kept set is every token whose score is at most the crossing's, a range of values around `c`.

use super::llama::KeptRange;
use crate::alloc;
use crate::error::Result;
use crate::kernels::Kernels;
use crate::mass::weight64;

/// Buckets of the histogram of values: one per [`CANDIDATES_PER_BUCKET`] candidates, at most
/// this many (the crossing's few buckets are gathered and sorted: a few hundred of 150k
/// candidates on a spread row).
const MAX_BUCKETS: usize = 2048;

/// Candidates per bucket of the histogram: the walk over the buckets costs a few percent of
/// the read of the candidates.
const CANDIDATES_PER_BUCKET: usize = 32;

/// Values whose weight is under e^-800 (0 in f64) share the lowest bucket, so that an extreme
/// value does not squeeze the others into a few buckets.
const SPAN_CAP: f64 = 800.0;

/// Candidates weighed at a time (a buffer on the stack).
const CHUNK: usize = 256;

/// A candidate near the crossing: its score, weight and value.
#[derive(Clone, Copy)]
struct Near {
    score: f64,
    w: f64,
    x: f32,
    /// `ln w > c`: the side of the centre above it.
    above: bool,
}

/// The histogram of a row's candidates by value and the sums of one read.
struct Weighed {
    z: f64,
    /// `sum w ln w`.
    s: f64,
    mass: Vec<f64>,
    count: Vec<u32>,
}

/// The grid of the histogram: bucket `floor((x - lo) * inv_h)`, clamped to the buckets.
#[derive(Clone, Copy)]
struct Grid {
    lo: f32,
    inv_h: f32,
    buckets: usize,
}

impl Grid {
    fn bucket(self, x: f32) -> usize {
        (((x - self.lo) * self.inv_h) as usize).min(self.buckets - 1)
    }
}

/// Reads the candidates once: their weights (the `weights64` kernel, a chunk at a time), `Z`,
/// `sum w ln w` and the histogram of their values on `grid`.
fn weigh(k: &Kernels, values: &[f32], (m, inv_t): (f32, f32), grid: Grid) -> Result<Weighed> {
    let mut mass = alloc::filled(grid.buckets, 0.0f64, "typical histogram")?;
    let mut count = alloc::filled(grid.buckets, 0u32, "typical histogram")?;
    let (mut z, mut s) = ([0.0f64; 8], [0.0f64; 8]);
    let mut w = [0.0f64; CHUNK];
    for xs in values.chunks(CHUNK) {
        let w = &mut w[..xs.len()];
        // SAFETY: `k` is the table of a supported level; `w` has a slot per value.
        unsafe { (k.weights64)(xs, m as f64, inv_t as f64, w) };
        // Eight interleaved sums (any order does: only bounds of them are used). A weight of 0
        // adds nothing to `s`, as in `typical` (ln w is finite).
        for (xs, ws) in xs.chunks(8).zip(w.chunks(8)) {
            for lane in 0..xs.len() {
                let ln_w = (xs[lane] as f64 - m as f64) * inv_t as f64;
                z[lane] += ws[lane];
                s[lane] += ws[lane] * ln_w;
            }
        }
        for (&x, &wi) in xs.iter().zip(w.iter()) {
            let b = grid.bucket(x);
            mass[b] += wi;
            count[b] += 1;
        }
    }
    Ok(Weighed { z: z.iter().sum(), s: s.iter().sum(), mass, count })
}

/// The least of `values` (finite), eight lanes at a time.
fn least(values: &[f32]) -> f32 {
    let mut lanes = [f32::INFINITY; 8];
    for xs in values.chunks(8) {
        for (l, &x) in lanes.iter_mut().zip(xs) {
            *l = if x < *l { x } else { *l };
        }
    }
    lanes.iter().fold(f32::INFINITY, |a, &b| a.min(b))
}

/// The range `typical` keeps of the finite values `values` (any order; their maximum is `m`)
/// weighed at `inv_t`, or `None` when a rounding of its sums could move the crossing (the
/// caller then sorts and runs `typical`). Fails only if its buffers cannot be allocated.
pub(super) fn kept_without_sort(
    k: &Kernels,
    values: &[f32],
    (m, inv_t): (f32, f32),
    typical_p: f64,
    min_keep: usize,
) -> Result<Option<KeptRange>> {
    let n = values.len();
    let ln_w = |x: f32| (x as f64 - m as f64) * inv_t as f64;
    // Either order's sum of n terms is within n * 2^-53 of the exact one, relative to the sum
    // of their magnitudes: Z relative to Z, the entropy relative to H + |c| (each p |ln w - ln Z|
    // is bounded by p (|ln w| + ln Z)); 1e-15 is about 9 roundings a term.
    let terms = n as f64 + 16.0;
    let eps_mass = terms * 2e-15;
    if typical_p.is_nan() || typical_p >= 1.0 - eps_mass {
        return Ok(None);
    }
    let x_min = least(values);
    let lo = x_min.max((m as f64 - SPAN_CAP / inv_t as f64) as f32);
    let buckets = (n / CANDIDATES_PER_BUCKET).clamp(16, MAX_BUCKETS);
    let inv_h = buckets as f32 / (m - lo);
    if !(inv_h.is_finite() && inv_h > 0.0) {
        return Ok(None);
    }
    let grid = Grid { lo, inv_h, buckets };
    let Weighed { z, s, mass, count } = weigh(k, values, (m, inv_t), grid)?;
    let ln_z = z.ln();
    let centre = s / z;
    let entropy = ln_z - centre;
    let score = |x: f32| (centre - ln_w(x)).abs();
    // Each bucket's scores, from its values widened by a hundredth of a bucket (the f32 rounding
    // of its index) and its share of the margin below.
    let h = (m - lo) as f64 / buckets as f64;
    let magnitude = 1.0 + ln_z.abs() + entropy.abs() + centre.abs() + (ln_w(x_min)).abs().min(SPAN_CAP);
    // c moves by the errors of Z and H (a score on the other side of c moves the other way:
    // twice), each score by its own rounding.
    let margin = 2.0 * terms * 1e-15 * magnitude + 1e-14 * magnitude;
    let widen = h * 0.01 + (m.abs().max(lo.abs()) as f64) * 1e-6 + margin / inv_t as f64;
    let scores_of = |b: usize| -> (f64, f64) {
        let x0 = if b == 0 { x_min as f64 } else { lo as f64 + b as f64 * h };
        let x1 = if b == buckets - 1 { m as f64 } else { lo as f64 + (b + 1) as f64 * h };
        let (a0, a1) = ((x0 - widen - m as f64) * inv_t as f64, (x1 + widen - m as f64) * inv_t as f64);
        if centre < a0 {
            (a0 - centre, a1 - centre)
        } else if centre > a1 {
            (centre - a1, centre - a0)
        } else {
            (0.0, (centre - a0).max(a1 - centre))
        }
    };
    let bounds: Vec<(f64, f64)> = alloc::collect((0..buckets).map(scores_of), "typical bucket scores")?;
    // The crossing's score lies between the first score at which the buckets that reach it
    // (an upper bound of the mass within it) exceed typical_p, and the first at which the
    // buckets wholly within it do. Either end of the buckets' scores falls and then rises with
    // the bucket: the buckets in its order are a merge walking outwards from its least.
    let crossing = |end: fn(&(f64, f64)) -> f64, over: f64| -> Option<f64> {
        let key = |b: usize| end(&bounds[b]);
        let first = (0..buckets).min_by(|&a, &b| key(a).total_cmp(&key(b))).unwrap_or(0);
        let (mut left, mut right) = (first, first);
        let (mut taken, mut taken_count) = (0.0, 0usize);
        while left > 0 || right < buckets {
            let take_left = right == buckets || (left > 0 && key(left - 1) <= key(right));
            let b = if take_left { left - 1 } else { right };
            if take_left {
                left -= 1;
            } else {
                right += 1;
            }
            taken += mass[b];
            taken_count += count[b] as usize;
            if taken_count >= min_keep && taken / z > over {
                return Some(key(b));
            }
        }
        None
    };
    let Some(earliest) = crossing(|b| b.0, typical_p - eps_mass) else {
        // No token stops the walk: every candidate is kept.
        return Ok(Some(KeptRange { lo: x_min, hi: m }));
    };
    let latest = crossing(|b| b.1, typical_p + eps_mass).unwrap_or(f64::INFINITY);
    // The candidates of every bucket whose scores meet [earliest, latest] (wholly below it:
    // taken before them), walked in score order a group of equal scores at a time.
    let gathered = |b: usize| bounds[b].1 >= earliest && bounds[b].0 <= latest;
    let (mut taken_mass, mut taken_count) = (0.0f64, 0usize);
    let mut near_count = 0usize;
    for b in 0..buckets {
        if gathered(b) {
            near_count += count[b] as usize;
        } else if bounds[b].1 < earliest {
            taken_mass += mass[b];
            taken_count += count[b] as usize;
        }
    }
    let near_buckets: Vec<bool> = alloc::collect((0..buckets).map(gathered), "typical buckets near the crossing")?;
    let mut near = alloc::with_capacity::<Near>(near_count, "typical candidates near the crossing")?;
    for &x in values {
        if near_buckets[grid.bucket(x)] {
            near.push(Near { score: score(x), w: weight64(x, m, inv_t), x, above: ln_w(x) > centre });
        }
    }
    near.sort_unstable_by(|a, b| a.score.total_cmp(&b.score));
    let mut at = 0;
    let (stop, before_mass, before_count) = loop {
        if at == near.len() {
            return Ok(None);
        }
        let (before_mass, before_count) = (taken_mass, taken_count);
        let group = near[at..].iter().take_while(|t| t.score == near[at].score).count();
        taken_mass += near[at..at + group].iter().map(|t| t.w).sum::<f64>();
        taken_count += group;
        if taken_count >= min_keep && taken_mass / z > typical_p {
            break (near[at], before_mass, before_count);
        }
        at += group;
    };
    // The crossing is clear: the mass through the group exceeds typical_p beyond the errors, and
    // before it stays below (or min_keep is not yet reached).
    let before_clear = before_count < min_keep || before_mass / z <= typical_p - eps_mass;
    if !(taken_mass / z > typical_p + eps_mass && before_clear) {
        return Ok(None);
    }
    // Every other score is clear of the crossing's (those within the margin were gathered: the
    // buckets were widened by it).
    if !(stop.score >= earliest && stop.score <= latest) {
        return Ok(None);
    }
    let stop_ln_w = ln_w(stop.x);
    if near.iter().any(|t| (t.score - stop.score).abs() <= margin && ln_w(t.x) != stop_ln_w) {
        return Ok(None);
    }
    Ok(Some(kept_ends(values, &near, (x_min, m), (earliest, stop.score), score)))
}

/// The least and greatest values whose score is at most `limit` (`earliest <= limit`): on each
/// side of the centre, the row's end there (`m` above, `x_min` below) when its score is within
/// the limit; else the gathered candidate of that side with the largest score within it, which
/// is the side's end when its score is at least `earliest` (every score in `[earliest, limit]`
/// was gathered); else a pass over `values`.
fn kept_ends(
    values: &[f32],
    near: &[Near],
    (x_min, m): (f32, f32),
    (earliest, limit): (f64, f64),
    score: impl Fn(f32) -> f64,
) -> KeptRange {
    let side_end = |above: bool| -> Option<f32> {
        let end = if above { m } else { x_min };
        if score(end) <= limit {
            return Some(end);
        }
        let on_side = |t: &&Near| t.above == above && t.score >= earliest && t.score <= limit;
        near.iter().filter(on_side).max_by(|a, b| a.score.total_cmp(&b.score)).map(|t| t.x)
    };
    if let (Some(lo), Some(hi)) = (side_end(false), side_end(true)) {
        return KeptRange { lo, hi };
    }
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &x in values {
        let kept = score(x) <= limit;
        lo = if kept && x < lo { x } else { lo };
        hi = if kept && x > hi { x } else { hi };
    }
    KeptRange { lo, hi }
}

#[cfg(test)]
mod tests {
    use super::super::llama::{typical, Candidate};
    use super::*;
    use crate::mass::weight64;
    use crate::noise::splitmix64;

    /// `typical`'s range over the values sorted (its own path).
    fn by_sort(values: &[f32], (m, inv_t): (f32, f32), p: f64, min_keep: usize) -> KeptRange {
        let mut sorted = values.to_vec();
        sorted.sort_unstable_by(|a, b| b.total_cmp(a));
        let c: Vec<Candidate> = sorted
            .iter()
            .map(|&x| Candidate { x, w: weight64(x, m, inv_t), ln_w: (x as f64 - m as f64) * inv_t as f64 })
            .collect();
        let (a, b) = typical(&c, p, min_keep);
        KeptRange { lo: c[b - 1].x, hi: c[a].x }
    }

    fn rows() -> Vec<Vec<f32>> {
        let mut state = 0x7e57_u64;
        let mut uniform = || {
            state = splitmix64(state);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut rows = Vec::new();
        for r in 0..24 {
            let n = 1500 + r * 700;
            // Roughly normal (the sum of three uniforms), a few peaks, every fourth row in
            // steps of 1/4 (many ties).
            let mut x: Vec<f32> = (0..n).map(|_| ((uniform() + uniform() + uniform() - 1.5) * 4.0) as f32).collect();
            if r % 4 == 3 {
                x.iter_mut().for_each(|v| *v = (*v * 4.0).round() / 4.0);
            }
            for j in 0..(r % 5) {
                x[(r * 131 + j * 977) % n] = 8.0 + j as f32;
            }
            rows.push(x);
        }
        rows
    }

    /// The range of the sorted path, at every level, for spread and tied rows, several p,
    /// temperatures and min_keep; and the bounds decide most of them (the path is used).
    #[test]
    fn keeps_what_the_sorted_walk_keeps() {
        let mut decided = 0;
        let mut total = 0;
        for level in crate::kernels::supported_levels() {
            let k = crate::kernels::kernels(level);
            for (r, x) in rows().iter().enumerate().step_by(2) {
                let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                for inv_t in [1.0f32, 0.5] {
                    for p in [0.2, 0.9, 0.95, 0.999] {
                        for min_keep in [0, 1, 40, x.len() / 2, x.len() + 1] {
                            let want = by_sort(x, (m, inv_t), p, min_keep);
                            total += 1;
                            if let Some(got) = kept_without_sort(k, x, (m, inv_t), p, min_keep).unwrap() {
                                decided += 1;
                                assert_eq!(got, want, "{level:?} row {r} 1/T {inv_t} p {p} min_keep {min_keep}");
                            }
                        }
                    }
                }
            }
        }
        assert!(decided * 10 >= total * 9, "decided {decided} of {total}");
    }

    /// typical_p at the exact mass of a crossing (the sorted walk's own sum decides it): the
    /// bounds leave it to the sorted path, or agree with it.
    #[test]
    fn a_crossing_within_the_rounding_is_left_to_the_sorted_walk() {
        let k = crate::kernels::kernels(crate::kernels::best_level());
        for x in rows().iter().take(8) {
            let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            // The sorted walk's mass after each token, by the definition: take a few of them as p.
            let mut sorted = x.clone();
            sorted.sort_unstable_by(|a, b| b.total_cmp(a));
            let z: f64 = sorted.iter().map(|&v| weight64(v, m, 1.0)).sum();
            for target in [0.3, 0.6, 0.9] {
                let got = kept_without_sort(k, x, (m, 1.0), target, 0).unwrap();
                let want = by_sort(x, (m, 1.0), target, 0);
                assert!(got.is_none() || got == Some(want));
                // The same p nudged by less than the errors cannot be told apart from the
                // crossing: left to the walk, or the same range.
                let range = by_sort(x, (m, 1.0), target, 0);
                let kept_mass: f64 =
                    sorted.iter().filter(|&&v| v >= range.lo && v <= range.hi).map(|&v| weight64(v, m, 1.0) / z).sum();
                // At the kept mass itself the crossing is within the errors: never decided here
                // (the check that leaves rows to the walk can fail).
                assert_eq!(kept_without_sort(k, x, (m, 1.0), kept_mass, 0).unwrap(), None, "p {kept_mass}");
                for p in [kept_mass, kept_mass * (1.0 - 1e-15), kept_mass * (1.0 + 1e-15)] {
                    if p < 1.0 {
                        let got = kept_without_sort(k, x, (m, 1.0), p, 0).unwrap();
                        assert!(got.is_none() || got == Some(by_sort(x, (m, 1.0), p, 0)), "p {p}");
                    }
                }
            }
        }
    }
}
