//! top-nσ: keep the tokens with `x >= max - n * sigma`, `max` and `sigma` the maximum and the
//! population standard deviation of the row's finite logits (NaN and -inf, masked tokens among
//! them, are left out of both, as they never win).
//!
//! The rule is in logit units: `sigma` of `x / T` is `sigma / T`, so the kept set is the same
//! before and after the temperature, and the floor is one number in either filter order.

use crate::kernels::BLOCK;
use crate::row::RowValues;

/// Mean and population variance of the finite values of `v`, in f64, with one summation order
/// whatever the SIMD level or thread count: each block of [`BLOCK`] values summed in index
/// order, then the blocks' sums in block order; the same for the squared deviations from the
/// mean (a second pass, which stays accurate where `E[x²] - E[x]²` would cancel). `None` when
/// the row has no finite value.
fn mean_and_variance<V: RowValues + ?Sized>(v: &V) -> Option<(f64, f64)> {
    let n = v.n();
    let finite = |i: usize| Some(v.at(i) as f64).filter(|x| x.is_finite());
    let (mut sum, mut count) = (0.0f64, 0usize);
    for start in (0..n).step_by(BLOCK) {
        let mut block_sum = 0.0f64;
        for x in (start..(start + BLOCK).min(n)).filter_map(finite) {
            block_sum += x;
            count += 1;
        }
        sum += block_sum;
    }
    if count == 0 {
        return None;
    }
    let mean = sum / count as f64;
    let mut squares = 0.0f64;
    for start in (0..n).step_by(BLOCK) {
        let mut block_squares = 0.0f64;
        for x in (start..(start + BLOCK).min(n)).filter_map(finite) {
            block_squares += (x - mean) * (x - mean);
        }
        squares += block_squares;
    }
    Some((mean, squares / count as f64))
}

/// The threshold `m - n * sigma` of a row `v` with finite maximum `m` (f64; `n > 0` finite).
pub(crate) fn threshold<V: RowValues + ?Sized>(v: &V, m: f32, n: f64) -> f64 {
    let sigma = mean_and_variance(v).map_or(0.0, |(_, variance)| variance.sqrt());
    m as f64 - n * sigma
}

/// The smallest f32 `x` with `x >= threshold` (compared in f64): the race keeps `x >= floor`
/// exactly where the rule keeps `x`. -inf when every finite value passes.
pub(super) fn floor<V: RowValues + ?Sized>(v: &V, m: f32, n: f64) -> f32 {
    f32_at_or_above(threshold(v, m, n))
}

fn f32_at_or_above(t: f64) -> f32 {
    if t <= -(f32::MAX as f64) {
        return f32::NEG_INFINITY;
    }
    let rounded = t as f32;
    if (rounded as f64) < t {
        rounded.next_up()
    } else {
        rounded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_first_f32_at_or_above_the_threshold() {
        assert_eq!(f32_at_or_above(1.0), 1.0);
        let t = 1.0 + 1e-12;
        assert_eq!(f32_at_or_above(t), 1.0f32.next_up());
        assert_eq!(f32_at_or_above(1.0 - 1e-12), 1.0);
        assert_eq!(f32_at_or_above(-1e300), f32::NEG_INFINITY);
    }

    #[test]
    fn sigma_leaves_out_nan_and_negative_infinity() {
        let row = [1.0f32, f32::NEG_INFINITY, 3.0, f32::NAN];
        let (mean, variance) = mean_and_variance(&row[..]).unwrap();
        assert_eq!((mean, variance), (2.0, 1.0));
        assert_eq!(threshold(&row[..], 3.0, 1.5), 1.5);
    }
}
