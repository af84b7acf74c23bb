//! Pass 1 of every row: the maximum of each block and whether the row holds a NaN ([`scan`]);
//! the first index of a value, for greedy rows ([`find_first`]); and, for the benchmark only,
//! the read floors ([`max_only`], [`max_two`]: feature `internals`).

use super::BLOCK;
use crate::kernels::simd::{Elem, Scalar, Simd};

/// Writes the maximum (NaN ignored, -inf for an empty or all-NaN block) of each BLOCK of `row`
/// into `bmax`, and returns whether any element is NaN.
///
/// # Safety
/// `row` valid for `n` reads; `bmax` has `n.div_ceil(BLOCK)` elements; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn scan<S: Simd, E: Elem>(row: *const E, n: usize, bmax: &mut [f32]) -> bool {
    let l = S::LANES;
    let mut nan = S::none();
    let mut nan_tail = false;
    for (b, out) in bmax.iter_mut().enumerate() {
        let start = b * BLOCK;
        let end = (start + BLOCK).min(n);
        let mut i = start;
        let ninf = S::splat(f32::NEG_INFINITY);
        let (mut a0, mut a1, mut a2, mut a3) = (ninf, ninf, ninf, ninf);
        // Four accumulators, four vectors a step.
        while i + 4 * l <= end {
            // SAFETY: i + 4 LANES <= end <= n elements of `row`; `S` usable (the caller's contract).
            let (x0, x1, x2, x3) = unsafe {
                (
                    E::load::<S>(row.add(i)),
                    E::load::<S>(row.add(i + l)),
                    E::load::<S>(row.add(i + 2 * l)),
                    E::load::<S>(row.add(i + 3 * l)),
                )
            };
            // One unordered compare catches a NaN in either operand.
            nan = S::or_m(nan, S::or_m(S::unord(x0, x1), S::unord(x2, x3)));
            a0 = S::max(x0, a0);
            a1 = S::max(x1, a1);
            a2 = S::max(x2, a2);
            a3 = S::max(x3, a3);
            i += 4 * l;
        }
        while i + l <= end {
            // SAFETY: i + LANES <= end <= n; as above.
            let x = unsafe { E::load::<S>(row.add(i)) };
            nan = S::or_m(nan, S::is_nan(x));
            a0 = S::max(x, a0);
            i += l;
        }
        let mut m = S::reduce_max(S::max(S::max(a0, a1), S::max(a2, a3)));
        while i < end {
            // SAFETY: i < end <= n; Scalar runs anywhere.
            let x = unsafe { E::load::<Scalar>(row.add(i)) };
            nan_tail |= x.is_nan();
            m = Scalar::max(x, m);
            i += 1;
        }
        *out = m;
    }
    S::any(nan) || nan_tail
}

/// The largest of `n` elements (NaN ignored): the read floor the benchmark compares against,
/// one pass with four accumulators and nothing else.
///
/// # Safety
/// `row` valid for `n` reads; `S` usable here.
#[cfg(feature = "internals")]
#[inline(always)]
pub(crate) unsafe fn max_only<S: Simd, E: Elem>(row: *const E, n: usize) -> f32 {
    let l = S::LANES;
    let ninf = S::splat(f32::NEG_INFINITY);
    let (mut a0, mut a1, mut a2, mut a3) = (ninf, ninf, ninf, ninf);
    let mut i = 0;
    while i + 4 * l <= n {
        // SAFETY: i + 4 LANES <= n elements of `row`; `S` usable (the caller's contract).
        unsafe {
            a0 = S::max(E::load::<S>(row.add(i)), a0);
            a1 = S::max(E::load::<S>(row.add(i + l)), a1);
            a2 = S::max(E::load::<S>(row.add(i + 2 * l)), a2);
            a3 = S::max(E::load::<S>(row.add(i + 3 * l)), a3);
        }
        i += 4 * l;
    }
    let mut m = S::reduce_max(S::max(S::max(a0, a1), S::max(a2, a3)));
    while i < n {
        // SAFETY: i < n; Scalar runs anywhere.
        m = Scalar::max(unsafe { E::load::<Scalar>(row.add(i)) }, m);
        i += 1;
    }
    m
}

/// The read floor of two streams: the largest of `n` elements of `row` and of `other`, in one
/// pass (what a race on external noise must read at least).
///
/// # Safety
/// `row` and `other` valid for `n` reads; `S` usable here.
#[cfg(feature = "internals")]
#[inline(always)]
pub(crate) unsafe fn max_two<S: Simd, E: Elem>(row: *const E, other: *const f32, n: usize) -> f32 {
    let l = S::LANES;
    let ninf = S::splat(f32::NEG_INFINITY);
    let (mut a0, mut a1, mut a2, mut a3) = (ninf, ninf, ninf, ninf);
    let mut i = 0;
    while i + 2 * l <= n {
        // SAFETY: i + 2 LANES <= n elements of both streams; `S` usable (the caller's contract).
        unsafe {
            a0 = S::max(E::load::<S>(row.add(i)), a0);
            a1 = S::max(S::load_f32(other.add(i)), a1);
            a2 = S::max(E::load::<S>(row.add(i + l)), a2);
            a3 = S::max(S::load_f32(other.add(i + l)), a3);
        }
        i += 2 * l;
    }
    let mut m = S::reduce_max(S::max(S::max(a0, a1), S::max(a2, a3)));
    while i < n {
        // SAFETY: i < n; Scalar runs anywhere.
        m = unsafe { Scalar::max(E::load::<Scalar>(row.add(i)), Scalar::max(*other.add(i), m)) };
        i += 1;
    }
    m
}

/// The first index in `[start, end)` whose element equals `target` (compared as f32), if any.
///
/// # Safety
/// `row` valid for `end` reads; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn find_first<S: Simd, E: Elem>(
    row: *const E,
    start: usize,
    end: usize,
    target: f32,
) -> Option<usize> {
    let l = S::LANES;
    let t = S::splat(target);
    let mut i = start;
    while i + l <= end {
        // SAFETY: i + LANES <= end elements of `row`; `S` usable (the caller's contract).
        let m = S::eq(unsafe { E::load::<S>(row.add(i)) }, t);
        if S::any(m) {
            return Some(i + S::first(m));
        }
        i += l;
    }
    // SAFETY: j < end; Scalar runs anywhere.
    (i..end).find(|&j| unsafe { E::load::<Scalar>(row.add(j)) } == target)
}
