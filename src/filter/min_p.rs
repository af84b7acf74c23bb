//! min-p: keep the tokens with `p_i >= min_p * p_max`, i.e. `w_i >= min_p` for the weight `w`
//! that is 1 at the maximum.

use crate::mass::weight64;
use crate::order::bisect;

/// The smallest f32 `v <= m` with `weight64(v) >= min_p` (`min_p` in (0, 1]); -inf when every
/// finite value passes. `w` is monotone in `v`, so a bisection over the order-preserving image
/// of f32 finds it in 32 evaluations, without a pass over the row.
pub(super) fn floor(m: f32, inv_t: f32, min_p: f64) -> f32 {
    let pass = |v: f32| weight64(v, m, inv_t) >= min_p;
    if pass(-f32::MAX) {
        return f32::NEG_INFINITY;
    }
    bisect(-f32::MAX, m, pass)
}
