//! llama.cpp's mirostat, v1 and v2: the final sampler of a row's chain, which narrows what the
//! chain keeps to a set whose draw aims at a target surprise `tau` (bits), and the feedback on
//! the row's `mu` after the draw.
//!
//! Probabilities are those of the tokens the chain keeps (its range `[lo, hi]`, renormalised),
//! at the draw's temperature: `p_i = w_i / Z` with `w_i = exp((x_i - hi) * inv_t)` in f64
//! ([`weight64`]) and `Z` their sum, in index order. llama.cpp computes the same quantities in
//! f32; here every step is f64 and only the new mu is rounded to f32.
//!
//! - v2 keeps the tokens whose surprise `-log2 p_i` is at most `mu` (at least the most probable).
//! - v1 estimates the Zipf exponent `s_hat` from the `m` most probable tokens (the least-squares
//!   slope of `ln(p_i / p_{i+1})` against `ln((i + 2) / (i + 1))`), derives
//!   `k = (e * 2^mu / (1 - N^-e))^(1 / s_hat)` with `e = s_hat - 1` and `N` the row's
//!   vocabulary, and keeps the `max(trunc(k), 1)` most probable tokens (ties with the last kept).
//!
//! After the draw, `mu <- mu - eta * (-log2 p - tau)` with `p` the drawn token's probability in
//! the narrowed set, renormalised.

use super::llama::KeptRange;
use crate::alloc;
use crate::batch::Batch;
use crate::error::Result;
use crate::mass::weight64;
use crate::row::RowValues;

/// llama.cpp's default target surprise (`mirostat_tau`), taken when a batch gives none.
pub const DEFAULT_TAU: f32 = 5.0;
/// llama.cpp's default learning rate (`mirostat_eta`).
pub const DEFAULT_ETA: f32 = 0.1;
/// The `m` llama.cpp's common code gives mirostat v1.
pub const DEFAULT_M: usize = 100;

/// One row's mirostat settings, as validated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Mirostat {
    /// 1 or 2.
    pub version: u8,
    pub tau: f32,
    pub eta: f32,
    /// v1's count of the most probable tokens that estimate `s_hat` (>= 1).
    pub m: usize,
    /// The row's mu going in.
    pub mu: f32,
}

impl Mirostat {
    /// Row `r`'s mirostat, if it is on (a validated batch: mode 1 or 2, finite parameters).
    pub(crate) fn of(batch: &Batch, r: usize) -> Option<Mirostat> {
        let version = match batch.mirostat.map_or(0, |m| m[r]) {
            1 => 1,
            2 => 2,
            _ => return None,
        };
        let tau = batch.mirostat_tau.map_or(DEFAULT_TAU, |t| t[r]);
        Some(Mirostat {
            version,
            tau,
            eta: batch.mirostat_eta.map_or(DEFAULT_ETA, |e| e[r]),
            m: batch.mirostat_m.map_or(DEFAULT_M, |m| m[r].max(1) as usize),
            mu: batch.mirostat_mu.map_or(2.0 * tau, |m| m[r]),
        })
    }

    /// The mu after a draw whose token had `surprise` bits: `mu - eta * (surprise - tau)` in f64,
    /// rounded once to f32.
    pub(crate) fn updated_mu(&self, surprise: f64) -> f32 {
        (self.mu as f64 - self.eta as f64 * (surprise - self.tau as f64)) as f32
    }
}

/// What mirostat keeps of a row: the finite values in `range`, and how to weigh the drawn one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MirostatKept {
    pub range: KeptRange,
    /// The sum of the kept weights (relative to `range.hi`); `None`: the row's temperature is 0,
    /// and the kept set is its maximum alone, of probability 1.
    z: Option<f64>,
    inv_t: f32,
}

impl MirostatKept {
    /// The kept set of a row drawn at temperature 0: its maximum `hi`, of probability 1.
    pub(crate) fn greedy(hi: f32) -> MirostatKept {
        MirostatKept { range: KeptRange { lo: hi, hi }, z: None, inv_t: 1.0 }
    }

    /// The surprise `-log2 p` in bits of a kept token of value `x`.
    pub(crate) fn surprise(&self, x: f32) -> f64 {
        match self.z {
            Some(z) => -(weight64(x, self.range.hi, self.inv_t) / z).log2(),
            None => 0.0,
        }
    }
}

/// The finite values of row `v` in `range`, in index order.
fn candidates<V: RowValues + ?Sized>(v: &V, range: KeptRange) -> Result<Vec<f32>> {
    alloc::collect(
        (0..v.n()).map(|i| v.at(i)).filter(|x| x.is_finite() && *x >= range.lo && *x <= range.hi),
        "mirostat candidates",
    )
}

/// The sum, in index order, of the weights of `values` at or above `lo` (relative to `hi`).
fn mass_from(values: &[f32], lo: f32, hi: f32, inv_t: f32) -> f64 {
    values.iter().filter(|&&x| x >= lo).map(|&x| weight64(x, hi, inv_t)).sum()
}

/// Narrows `range` (what the row's chain keeps of row `v`; `range.hi` its largest kept value)
/// by mirostat `ms`, at the draw's `inv_t`, for a row of `n_vocab` tokens.
pub(crate) fn narrow<V: RowValues + ?Sized>(
    v: &V,
    range: KeptRange,
    inv_t: f32,
    ms: Mirostat,
    n_vocab: usize,
) -> Result<MirostatKept> {
    let mut values = candidates(v, range)?;
    let hi = range.hi;
    let lo = if ms.version == 2 {
        let z = mass_from(&values, range.lo, hi, inv_t);
        least_passing(&values, hi, |x| -(weight64(x, hi, inv_t) / z).log2() <= ms.mu as f64)
    } else {
        kth_of_v1(&mut values, ms, inv_t, n_vocab)
    };
    let kept = KeptRange { lo, hi };
    let z = mass_from(&candidates(v, kept)?, lo, hi, inv_t);
    Ok(MirostatKept { range: kept, z: Some(z), inv_t })
}

/// The least of `values` that `passes` (a test that holds for every value above one that
/// passes: the surprise falls as the value rises), or `hi` (the maximum always stays). The test
/// is evaluated only for values between the least that passed and the greatest that failed so
/// far, so a row of random order costs few evaluations rather than one per token.
fn least_passing(values: &[f32], hi: f32, passes: impl Fn(f32) -> bool) -> f32 {
    let (mut least, mut failed) = (hi, f32::NEG_INFINITY);
    for &x in values {
        if x >= least || x <= failed {
            continue;
        }
        if passes(x) {
            least = x;
        } else {
            failed = x;
        }
    }
    least
}

/// v1's least kept value among the candidates `values` (not empty; reordered): the k-th largest.
fn kth_of_v1(values: &mut [f32], ms: Mirostat, inv_t: f32, n_vocab: usize) -> f32 {
    let desc = |a: &f32, b: &f32| b.total_cmp(a);
    let len = values.len();
    let top = ms.m.min(len);
    if top < len {
        values.select_nth_unstable_by(top - 1, desc);
    }
    values[..top].sort_unstable_by(desc);
    let k = v1_k(&values[..top], ms, inv_t, n_vocab).min(len);
    if k > top {
        values[top..].select_nth_unstable_by(k - 1 - top, desc);
    }
    values[k - 1]
}

/// v1's count of kept tokens (at least 1), from the `m` most probable candidates `top` (sorted,
/// descending): llama.cpp's `max(int(k), 1)`, with a NaN k taken as 1 and a k past the range of
/// integers as every candidate (llama.cpp's conversion is undefined there).
fn v1_k(top: &[f32], ms: Mirostat, inv_t: f32, n_vocab: usize) -> usize {
    let hi = top[0];
    let (mut sum_tb, mut sum_tt) = (0.0f64, 0.0f64);
    for i in 0..top.len() - 1 {
        let t = ((i + 2) as f64 / (i + 1) as f64).ln();
        let b = (weight64(top[i], hi, inv_t) / weight64(top[i + 1], hi, inv_t)).ln();
        sum_tb += t * b;
        sum_tt += t * t;
    }
    let s_hat = sum_tb / sum_tt;
    let epsilon = s_hat - 1.0;
    let k = ((epsilon * 2f64.powf(ms.mu as f64)) / (1.0 - (n_vocab as f64).powf(-epsilon))).powf(1.0 / s_hat);
    // `as` saturates and takes NaN to 0.
    (k as usize).max(1)
}
