//! The order-preserving integer image of f32, and the bisection over it that the filters and
//! the mass bounds use to find the smallest value passing a monotone test without a pass over
//! the row.

/// The sign bit of an f32's bits (and the top bit of its key).
const SIGN_BIT: u32 = 1 << 31;

/// The order-preserving map of f32 (no NaN) to u32: negatives have every bit flipped (so the
/// larger magnitude sorts lower), non-negatives only their sign bit set (so they sort above).
pub(crate) fn ord_key(x: f32) -> u32 {
    let b = x.to_bits();
    if b & SIGN_BIT != 0 {
        !b
    } else {
        b | SIGN_BIT
    }
}

/// The inverse of [`ord_key`].
pub(crate) fn from_ord_key(k: u32) -> f32 {
    f32::from_bits(if k & SIGN_BIT != 0 { k & !SIGN_BIT } else { !k })
}

/// The smallest f32 in `(lo, hi]` passing a monotone test, given that `lo` fails and `hi`
/// passes (32 evaluations at most).
pub(crate) fn bisect(lo: f32, hi: f32, pass: impl Fn(f32) -> bool) -> f32 {
    let (mut lo, mut hi) = (ord_key(lo), ord_key(hi));
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if pass(from_ord_key(mid)) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    from_ord_key(hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ord_key_preserves_order_and_inverts() {
        let xs =
            [f32::NEG_INFINITY, -f32::MAX, -1.0, -f32::MIN_POSITIVE, -0.0, 0.0, 1e-45, 1.0, f32::MAX, f32::INFINITY];
        for w in xs.windows(2) {
            assert!(ord_key(w[0]) <= ord_key(w[1]), "{} {}", w[0], w[1]);
        }
        for &x in &xs {
            assert_eq!(from_ord_key(ord_key(x)).to_bits(), x.to_bits());
        }
    }

    #[test]
    fn bisect_finds_the_smallest_passing_value() {
        assert_eq!(bisect(-f32::MAX, 10.0, |v| v >= 2.5), 2.5);
        let just_above = f32::from_bits(1.0f32.to_bits() + 1);
        assert_eq!(bisect(0.0, 2.0, |v| v > 1.0), just_above);
    }
}
