//! Pass 1 of every row: the maximum of each block and whether the row holds a NaN ([`scan`]),
//! or, for a greedy row that needs nothing else, the maximum and its first block ([`top_block`]);
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
    let mut nan = S::none();
    let mut nan_tail = false;
    for (b, out) in bmax.iter_mut().enumerate() {
        let start = b * BLOCK;
        let end = (start + BLOCK).min(n);
        // SAFETY: start <= end <= n; the rest is the caller's contract.
        if let Some(m) = unsafe { block_max_fast::<S, E>(row, keep, start, end) } {
            *out = m;
            continue;
        }
        // SAFETY: start <= end <= n; the rest is the caller's contract.
        let (lanes, mut i) = unsafe { lanes_max::<S, E>(row, keep, start, end, &mut nan) };
        let mut m = S::reduce_max(lanes);
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

/// The maximum of the block `row[start..end]` by the level's own loop ([`Simd::max_f32_any`]),
/// when the level has one, the block is whole, f32 and unmasked, and the result is exact: no
/// value is NaN and the maximum is not a zero (a unique bit pattern, which the exact loops
/// would give too). None otherwise: the exact loops then visit the block.
///
/// # Safety
/// `row` valid for `end` reads; `S` usable here.
#[inline(always)]
unsafe fn block_max_fast<S: Simd, E: Elem>(row: *const E, keep: *const u32, start: usize, end: usize) -> Option<f32> {
    const { assert!(BLOCK.is_multiple_of(32)) };
    if S::MAX_F32_ANY && E::IS_F32 && keep.is_null() && end - start == BLOCK {
        // SAFETY: `E` is f32 (IS_F32); the block's BLOCK values, a multiple of 32, are in `row`
        // (the caller's contract).
        let m = unsafe { S::max_f32_any(row.add(start) as *const f32, BLOCK) };
        if !m.is_nan() && m != 0.0 {
            return Some(m);
        }
    }
    None
}

/// The lane-wise maximum (NaN ignored) of the whole vectors of `row[start..end]` (with a
/// non-null `keep`, of the elements whose bit is set), and the index after the last of them;
/// marks in `nan` the lanes where any of them is NaN. The loop both [`scan`] and [`top_block`]
/// run over each block.
///
/// # Safety
/// `row` valid for `end` reads, `start` a multiple of `LANES`; `keep`, when not null, valid
/// for `end.div_ceil(32)` reads; `S` usable here.
#[inline(always)]
unsafe fn lanes_max<S: Simd, E: Elem>(
    row: *const E,
    keep: *const u32,
    start: usize,
    end: usize,
    nan: &mut S::M,
) -> (S::F, usize) {
    // One loop per case, so that the masked one does not test `keep` a vector.
    // SAFETY: the caller's contract.
    unsafe {
        if keep.is_null() {
            lanes_max_of::<S, E, false>(row, keep, start, end, nan)
        } else {
            lanes_max_of::<S, E, true>(row, keep, start, end, nan)
        }
    }
}

/// `max(kept(x), acc)` per lane for the tokens `i..`: `max(x, acc)`, or, when `MASKED`, that
/// where the token's bit is set in `keep` and `acc` elsewhere (one masked max on AVX-512).
///
/// # Safety
/// When `MASKED`, as [`keep_bits`].
#[inline(always)]
unsafe fn max_kept<S: Simd, const MASKED: bool>(x: S::F, acc: S::F, keep: *const u32, i: usize) -> S::F {
    if MASKED {
        // SAFETY: the caller's contract.
        S::max_where(unsafe { keep_bits::<S>(keep, i) }, x, acc)
    } else {
        S::max(x, acc)
    }
}

/// [`lanes_max`], with `keep` null exactly when not `MASKED`.
///
/// # Safety
/// As [`lanes_max`].
#[inline(always)]
unsafe fn lanes_max_of<S: Simd, E: Elem, const MASKED: bool>(
    row: *const E,
    keep: *const u32,
    start: usize,
    end: usize,
    nan: &mut S::M,
) -> (S::F, usize) {
    let l = S::LANES;
    let mut i = start;
    let ninf = S::splat(f32::NEG_INFINITY);
    let (mut a0, mut a1, mut a2, mut a3) = (ninf, ninf, ninf, ninf);
    // Four accumulators, four vectors a step.
    while i + 4 * l <= end {
        // SAFETY: i + 4 LANES <= end elements of `row`; `S` usable (the caller's contract).
        let (x0, x1, x2, x3) = unsafe {
            (
                E::load::<S>(row.add(i)),
                E::load::<S>(row.add(i + l)),
                E::load::<S>(row.add(i + 2 * l)),
                E::load::<S>(row.add(i + 3 * l)),
            )
        };
        // One unordered compare catches a NaN in either operand.
        *nan = S::or_m(*nan, S::or_m(S::unord(x0, x1), S::unord(x2, x3)));
        // SAFETY: i + 4 LANES <= end tokens of `keep` (the caller's contract).
        unsafe {
            a0 = max_kept::<S, MASKED>(x0, a0, keep, i);
            a1 = max_kept::<S, MASKED>(x1, a1, keep, i + l);
            a2 = max_kept::<S, MASKED>(x2, a2, keep, i + 2 * l);
            a3 = max_kept::<S, MASKED>(x3, a3, keep, i + 3 * l);
        }
        i += 4 * l;
    }
    while i + l <= end {
        // SAFETY: i + LANES <= end; as above.
        let x = unsafe { E::load::<S>(row.add(i)) };
        *nan = S::or_m(*nan, S::is_nan(x));
        // SAFETY: as above.
        a0 = unsafe { max_kept::<S, MASKED>(x, a0, keep, i) };
        i += l;
    }
    (S::max(S::max(a0, a1), S::max(a2, a3)), i)
}

/// The pass of a greedy row that needs nothing else (no filters, no logprobs): the row's largest
/// value (NaN ignored, -inf if none), the first block that holds it, and whether any element is
/// NaN. It is [`scan`] without the block maxima: each lane keeps the largest of its block
/// maxima and the first block where it reached it, three vector operations a block instead of a
/// reduction across lanes and a store. The first block holding the maximum is then the least
/// block among the lanes that hold it, and the token the first index of it in that block
/// ([`find_first`]): the same token `scan` leads to, on every level.
///
/// # Safety
/// `row` valid for `n` reads; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn top_block<S: Simd, E: Elem>(row: *const E, n: usize) -> (f32, usize, bool) {
    let mut t = TopScan::<S>::new();
    for b in 0..n / BLOCK {
        // SAFETY: (b + 1) * BLOCK <= n; `S` usable.
        unsafe { t.block::<E>(row, b) };
    }
    // SAFETY: as above.
    unsafe { t.finish::<E>(row, n) }
}

/// [`top_block`] of two rows of `n` elements, their blocks read in turn: two streams of reads
/// in flight instead of one (each row's result is [`top_block`]'s, bit for bit), on a level
/// with [`Simd::INTERLEAVE_ROWS`]; one row after the other elsewhere.
///
/// # Safety
/// `row` and `other` valid for `n` reads; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn top_block_pair<S: Simd, E: Elem>(
    row: *const E,
    other: *const E,
    n: usize,
) -> [(f32, usize, bool); 2] {
    if !S::INTERLEAVE_ROWS {
        // SAFETY: the caller's contract.
        return unsafe { [top_block::<S, E>(row, n), top_block::<S, E>(other, n)] };
    }
    let (mut t, mut u) = (TopScan::<S>::new(), TopScan::<S>::new());
    for b in 0..n / BLOCK {
        // SAFETY: (b + 1) * BLOCK <= n for both rows; `S` usable.
        unsafe {
            t.block::<E>(row, b);
            u.block::<E>(other, b);
        }
    }
    // SAFETY: as above.
    unsafe { [t.finish::<E>(row, n), u.finish::<E>(other, n)] }
}

/// The state of [`top_block`] over a row's whole blocks.
struct TopScan<S: Simd> {
    nan: S::M,
    /// Each lane's largest block maximum, and the first block where it reached it.
    best: S::F,
    at: S::F,
    /// The blocks that the level's own loop took (`block_max_fast`): their largest maximum and
    /// the first of them holding it.
    fast_best: f32,
    fast_at: usize,
}

impl<S: Simd> TopScan<S> {
    #[inline(always)]
    fn new() -> Self {
        TopScan {
            nan: S::none(),
            best: S::splat(f32::NEG_INFINITY),
            at: S::splat(0.0),
            fast_best: f32::NEG_INFINITY,
            fast_at: 0,
        }
    }

    /// Takes whole block `b` of `row`.
    ///
    /// # Safety
    /// `row` valid for `(b + 1) * BLOCK` reads; `S` usable here.
    #[inline(always)]
    unsafe fn block<E: Elem>(&mut self, row: *const E, b: usize) {
        // SAFETY: the caller's contract.
        if let Some(m) = unsafe { block_max_fast::<S, E>(row, std::ptr::null(), b * BLOCK, (b + 1) * BLOCK) } {
            if m > self.fast_best {
                (self.fast_best, self.fast_at) = (m, b);
            }
            return;
        }
        // SAFETY: the caller's contract; BLOCK is a multiple of LANES.
        let (m, _) = unsafe { lanes_max::<S, E>(row, std::ptr::null(), b * BLOCK, (b + 1) * BLOCK, &mut self.nan) };
        // Strictly greater: a lane keeps the first block where it reached its maximum.
        let up = S::gt(m, self.best);
        self.best = S::select(up, m, self.best);
        // Block numbers as f32 are exact below 2^24 blocks (2^32 tokens).
        self.at = S::select(up, S::splat(b as f32), self.at);
    }

    /// The row's result, once every whole block of its `n` elements was taken, with its last,
    /// partial block.
    ///
    /// # Safety
    /// `row` valid for `n` reads; `S` usable here.
    #[inline(always)]
    unsafe fn finish<E: Elem>(self, row: *const E, n: usize) -> (f32, usize, bool) {
        let whole = n / BLOCK;
        let top = S::reduce_max(self.best);
        let holds = S::eq(self.best, S::splat(top));
        let first = -S::reduce_max(S::select(holds, S::sub(S::splat(0.0), self.at), S::splat(f32::NEG_INFINITY)));
        let (top, first) = (top, first as usize);
        // Merged with the blocks of the level's own loop: their maximum is never NaN nor a zero,
        // so an equal maximum is the same value, held first by the earlier block.
        let (top, first) = if self.fast_best > top {
            (self.fast_best, self.fast_at)
        } else if self.fast_best == top {
            (top, first.min(self.fast_at))
        } else {
            (top, first)
        };
        if whole * BLOCK == n {
            return (top, first, S::any(self.nan));
        }
        // The last, partial block: its maximum wins only if it is larger, since every earlier
        // block comes first.
        let mut last = [f32::NEG_INFINITY];
        // SAFETY: the block's n - whole * BLOCK elements are in `row`; `S` usable.
        let nan_last = unsafe { scan::<S, E>(row.add(whole * BLOCK), std::ptr::null(), n - whole * BLOCK, &mut last) };
        let nan = S::any(self.nan) || nan_last;
        if whole == 0 || last[0] > top {
            (last[0], whole, nan)
        } else {
            (top, first, nan)
        }
    }
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
/// of a row with a sampling step before its changed tokens are written over them (`src/step/`). With a
/// non-empty `bmax` (one per block), also the largest value written in each block (NaN ignored),
/// as [`scan`] of `out` would give it: the copy is then not scanned again.
///
/// # Safety
/// `row` valid for `n` reads, `out` for `n` writes, `keep` for `n.div_ceil(32)` reads; `bmax`
/// empty or of `n.div_ceil(BLOCK)` entries; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn masked_copy<S: Simd, E: Elem>(
    row: *const E,
    keep: *const u32,
    n: usize,
    out: *mut f32,
    bmax: &mut [f32],
) -> bool {
    let mut nan = S::none();
    let mut nan_tail = false;
    if bmax.is_empty() {
        // SAFETY: the caller's contract.
        unsafe { copy_kept::<S, E, false>(row, keep, 0, n, out, &mut nan, &mut nan_tail) };
    }
    for (b, m) in bmax.iter_mut().enumerate() {
        let (start, end) = (b * BLOCK, ((b + 1) * BLOCK).min(n));
        // SAFETY: start <= end <= n; the rest is the caller's contract.
        *m = unsafe { copy_kept::<S, E, true>(row, keep, start, end, out, &mut nan, &mut nan_tail) };
    }
    S::any(nan) || nan_tail
}

/// [`masked_copy`] of `row[start..end]` (`start` a multiple of `LANES`): the largest value
/// written when `MAX` (else -inf), NaN marked in `nan` and `nan_tail`.
///
/// # Safety
/// As [`masked_copy`], for `end` values.
#[inline(always)]
unsafe fn copy_kept<S: Simd, E: Elem, const MAX: bool>(
    row: *const E,
    keep: *const u32,
    start: usize,
    end: usize,
    out: *mut f32,
    nan: &mut S::M,
    nan_tail: &mut bool,
) -> f32 {
    let l = S::LANES;
    let mut acc = S::splat(f32::NEG_INFINITY);
    let mut i = start;
    while i + l <= end {
        // SAFETY: i + LANES <= end reads of `row` and writes of `out`, bits of `keep` (the
        // caller's contract); `S` usable.
        unsafe {
            let x = E::load::<S>(row.add(i));
            *nan = S::or_m(*nan, S::is_nan(x));
            let y = kept::<S>(x, keep, i);
            S::store(out.add(i), y);
            if MAX {
                acc = S::max(y, acc);
            }
        }
        i += l;
    }
    let mut m = S::reduce_max(acc);
    while i < end {
        // SAFETY: i < end; Scalar runs anywhere.
        unsafe {
            let x = E::load::<Scalar>(row.add(i));
            *nan_tail |= x.is_nan();
            let y = kept::<Scalar>(x, keep, i);
            Scalar::store(out.add(i), y);
            m = Scalar::max(y, m);
        }
        i += 1;
    }
    m
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

#[cfg(test)]
mod tests {
    use super::BLOCK;
    use crate::kernels::kernels;
    use crate::kernels::test_support::each_level;

    /// The definition: the largest value (NaN ignored), the block of its first index, and
    /// whether any value is NaN.
    fn defined(row: &[f32]) -> (f32, usize, bool) {
        let top = row.iter().filter(|x| !x.is_nan()).fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a });
        let first = row.iter().position(|&x| x == top).unwrap_or(0);
        (top, first / BLOCK, row.iter().any(|x| x.is_nan()))
    }

    #[test]
    fn largest_is_the_largest_value() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for len in (0..70).chain([593, 594, 1024, 1025]) {
            for init in [f32::NEG_INFINITY, 0.5] {
                let v: Vec<f32> = (0..len)
                    .map(|_| match crate::kernels::xorshift64(&mut state) % 8 {
                        0 => f32::NEG_INFINITY,
                        1 => -0.0,
                        2 => 0.0,
                        r => r as f32 - (crate::kernels::xorshift64(&mut state) % 1000) as f32 / 100.0,
                    })
                    .collect();
                let want = v.iter().fold(init, |a, &x| if x > a { x } else { a });
                // Equal as numbers (which zero is the order's).
                assert_eq!(super::super::largest(&v, init), want, "len {len} init {init}");
            }
        }
        assert_eq!(super::super::largest(&[1.0, 3.0, f32::INFINITY, 2.0], 0.0), f32::INFINITY);
    }

    #[test]
    fn every_level_finds_the_first_block_of_the_maximum() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || crate::kernels::xorshift64(&mut state);
        for n in [0usize, 1, 15, 255, 256, 257, 4096, 4097, 32000, 151_936] {
            for case in 0..8 {
                // Few distinct values, so that the maximum repeats across blocks and lanes; zeros
                // of both signs; NaN and -inf in some rows; rows of -inf only.
                let mut row: Vec<f32> = (0..n).map(|_| (next() % 7) as f32 - 6.0).collect();
                for x in row.iter_mut() {
                    let r = next() % 64;
                    match case {
                        1 if r == 0 => *x = f32::NAN,
                        2 if r < 2 => *x = -0.0,
                        3 => *x = f32::NEG_INFINITY,
                        4 if r == 0 => *x = f32::INFINITY,
                        5 if r < 3 => *x = f32::NAN,
                        _ => {}
                    }
                }
                if case == 2 {
                    row.iter_mut().filter(|x| **x > 0.0).for_each(|x| *x = 0.0);
                }
                if case == 6 && n > 0 {
                    // One maximum in the last, partial block, or the last full one.
                    let i = n - 1 - (next() as usize % n.min(300));
                    row[i] = 5.0;
                }
                if case == 7 && n > 0 {
                    row.iter_mut().for_each(|x| *x = f32::NAN);
                }
                let want = defined(&row);
                // A second row for the pair's pass: the same values reversed.
                let other: Vec<f32> = row.iter().rev().copied().collect();
                let want_other = defined(&other);
                let same = |got: (f32, usize, bool), want: (f32, usize, bool)| {
                    (got.0 == want.0 || got.0.is_nan() && want.0.is_nan()) && got.1 == want.1 && got.2 == want.2
                };
                each_level(|level| {
                    // SAFETY: `row` holds n values; the level is supported.
                    let got = unsafe { (kernels(level).f32.top_block)(row.as_ptr(), n) };
                    assert!(same(got, want), "{level:?} n {n} case {case}: {got:?}, want {want:?}");
                    // SAFETY: both rows hold n values.
                    let pair = unsafe { (kernels(level).f32.top_block_pair)(row.as_ptr(), other.as_ptr(), n) };
                    assert!(
                        same(pair[0], want) && same(pair[1], want_other),
                        "{level:?} n {n} case {case}: pair {pair:?}"
                    );
                });
            }
        }
    }

    /// The definition of the masked scan: per block, the largest kept value (NaN ignored,
    /// -inf if none); and whether any value, kept or not, is NaN.
    fn defined_masked(row: &[f32], keep: &[u32]) -> (Vec<f32>, bool) {
        let kept = |i: usize| keep[i / 32] >> (i % 32) & 1 != 0;
        let bmax = (0..row.len().div_ceil(BLOCK))
            .map(|b| {
                (b * BLOCK..((b + 1) * BLOCK).min(row.len()))
                    .filter(|&i| kept(i) && !row[i].is_nan())
                    .fold(f32::NEG_INFINITY, |m, i| if row[i] > m { row[i] } else { m })
            })
            .collect();
        (bmax, row.iter().any(|x| x.is_nan()))
    }

    #[test]
    fn every_level_scans_the_kept_tokens_as_defined() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || crate::kernels::xorshift64(&mut state);
        for n in [1usize, 31, 255, 256, 300, 4097, 32000] {
            for case in 0..6 {
                let mut row: Vec<f32> = (0..n).map(|_| (next() % 9) as f32 - 4.0).collect();
                for x in row.iter_mut() {
                    let r = next() % 32;
                    match case {
                        1 if r == 0 => *x = f32::NAN,
                        2 if r < 4 => *x = if r % 2 == 0 { -0.0 } else { 0.0 },
                        3 if r == 0 => *x = f32::INFINITY,
                        3 if r == 1 => *x = f32::NEG_INFINITY,
                        _ => {}
                    }
                }
                // Masks: random bits, whole words clear or set, and the largest values masked.
                let keep: Vec<u32> = (0..n.div_ceil(32))
                    .map(|_| match (case, next() % 4) {
                        (4, 0) => 0,
                        (4, 1) => u32::MAX,
                        _ => next() as u32,
                    })
                    .collect();
                if case == 5 {
                    row.iter_mut()
                        .enumerate()
                        .filter(|(i, _)| keep[i / 32] >> (i % 32) & 1 == 0)
                        .for_each(|(_, x)| *x = 9.0);
                }
                let want = defined_masked(&row, &keep);
                each_level(|level| {
                    let mut got = vec![0.5f32; n.div_ceil(BLOCK)];
                    // SAFETY: `row` holds n values, `keep` n.div_ceil(32) words; the level is supported.
                    let nan = unsafe { (kernels(level).f32.scan_masked)(row.as_ptr(), keep.as_ptr(), n, &mut got) };
                    // (Compared as values: which zero a block of both zeros reports is the lanes'
                    // order, and no bound depends on it.)
                    assert_eq!((&got, nan), (&want.0, want.1), "{level:?} n {n} case {case}");
                });
            }
        }
    }
}
