//! Pass 1 of every row: the maximum of each block and whether the row holds a NaN ([`scan`]);
//! the first index of a value, for greedy rows ([`find_first`]); and, for the benchmark only,
//! the read floors ([`max_only`], [`max_two`]: feature `internals`).

use super::BLOCK;
use crate::kernels::simd::{Elem, Scalar, Simd};

/// Writes the maximum (NaN ignored, -inf for an empty or all-NaN block) of each BLOCK of `row`
/// into `bmax`, and returns whether any element is NaN. With a non-null `keep`, only the elements whose bit is
/// set in `keep` count for the maxima (every element for the NaN).
///
/// # Safety
/// `row` valid for `n` reads; `bmax` has `n.div_ceil(BLOCK)` elements; `keep`, when not null,
/// valid for `n.div_ceil(32)` reads; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn scan<S: Simd, E: Elem>(row: *const E, keep: *const u32, n: usize, bmax: &mut [f32]) -> bool {
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
            // SAFETY: i + 4 LANES <= n tokens of `keep` (the caller's contract).
            let (x0, x1, x2, x3) = unsafe {
                (
                    kept::<S>(x0, keep, i),
                    kept::<S>(x1, keep, i + l),
                    kept::<S>(x2, keep, i + 2 * l),
                    kept::<S>(x3, keep, i + 3 * l),
                )
            };
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
            // SAFETY: as above.
            a0 = S::max(unsafe { kept::<S>(x, keep, i) }, a0);
            i += l;
        }
        let mut m = S::reduce_max(S::max(S::max(a0, a1), S::max(a2, a3)));
        while i < end {
            // SAFETY: i < end <= n; Scalar runs anywhere.
            let x = unsafe { E::load::<Scalar>(row.add(i)) };
            nan_tail |= x.is_nan();
            // SAFETY: as above.
            m = Scalar::max(unsafe { kept::<Scalar>(x, keep, i) }, m);
            i += 1;
        }
        *out = m;
    }
    S::any(nan) || nan_tail
}

/// The bits of the `LANES` tokens from `i` (a multiple of `LANES`, which divides 32) in the
/// token mask `keep`: bit `i % 32` of word `i / 32` is token `i`'s.
///
/// # Safety
/// `keep` valid for `i / 32 + 1` reads.
#[inline(always)]
pub(crate) unsafe fn keep_bits<S: Simd>(keep: *const u32, i: usize) -> S::M {
    // SAFETY: the caller's contract.
    S::mask_of_word(unsafe { *keep.add(i / 32) }, (i % 32) as u32)
}

/// `x` where `keep` is null or the tokens' bits are set in `keep`, -inf elsewhere.
///
/// # Safety
/// When `keep` is not null, as [`keep_bits`].
#[inline(always)]
pub(crate) unsafe fn kept<S: Simd>(x: S::F, keep: *const u32, i: usize) -> S::F {
    if !keep.is_null() {
        // SAFETY: the caller's contract.
        S::select(unsafe { keep_bits::<S>(keep, i) }, x, S::splat(f32::NEG_INFINITY))
    } else {
        x
    }
}

/// Writes the `n` values of `row` as f32 into `out` where their bit is set in `keep`, -inf
/// elsewhere, and returns whether any value of `row` (kept or not) is NaN: the processed values
/// of a row with edits before its edited tokens are written over them (`src/edits.rs`).
///
/// # Safety
/// `row` valid for `n` reads, `out` for `n` writes, `keep` for `n.div_ceil(32)` reads; `S`
/// usable here.
#[inline(always)]
pub(crate) unsafe fn masked_copy<S: Simd, E: Elem>(row: *const E, keep: *const u32, n: usize, out: *mut f32) -> bool {
    let l = S::LANES;
    let mut nan = S::none();
    let mut i = 0;
    while i + l <= n {
        // SAFETY: i + LANES <= n reads of `row` and writes of `out`, bits of `keep` (the
        // caller's contract); `S` usable.
        unsafe {
            let x = E::load::<S>(row.add(i));
            nan = S::or_m(nan, S::is_nan(x));
            S::store(out.add(i), kept::<S>(x, keep, i));
        }
        i += l;
    }
    let mut nan_tail = false;
    while i < n {
        // SAFETY: i < n; Scalar runs anywhere.
        unsafe {
            let x = E::load::<Scalar>(row.add(i));
            nan_tail |= x.is_nan();
            Scalar::store(out.add(i), kept::<Scalar>(x, keep, i));
        }
        i += 1;
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
