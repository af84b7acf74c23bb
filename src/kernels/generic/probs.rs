//! The check of a probability row (the draft model's `q` of a verify call): its sum and whether
//! any value is negative, in one pass that keeps up with memory.
//!
//! The sum is defined lane-count free, so that every level computes it bit for bit: per chunk
//! of 64 values `c`, lane `l < 8` holds
//! `((c[l] + c[16+l]) + (c[32+l] + c[48+l])) + ((c[8+l] + c[24+l]) + (c[40+l] + c[56+l]))` in
//! f32 (a tree, so that no chain of additions waits on the one before); four f64 sums take
//! `lane j + lane j+4` of every chunk; the total is `((s0 + s2) + (s1 + s3))` plus the values
//! past the last whole chunk, added in order in f64. Within 1e-6 of the exact sum for values
//! that sum to about 1, which is what the 1e-3 check needs.

use crate::kernels::simd::Simd;

/// The lane sums of one chunk of 64 values at `p`, by the definition above, into `t[..8]`.
///
/// # Safety
/// `p` valid for 64 reads; `S` usable here.
#[inline(always)]
unsafe fn chunk_sum<S: Simd>(p: *const f32, t: &mut [f32; 16], neg: &mut S::M) {
    let zero = S::splat(0.0);
    // SAFETY: the loads stay in the 64 values at `p` (the caller's contract).
    let load = |k: usize| unsafe { S::load_f32(p.add(k * S::LANES)) };
    match S::LANES {
        8 => {
            let v: [S::F; 8] = std::array::from_fn(load);
            let low = S::or_m(
                S::or_m(S::or_m(S::lt(v[0], zero), S::lt(v[1], zero)), S::or_m(S::lt(v[2], zero), S::lt(v[3], zero))),
                S::or_m(S::or_m(S::lt(v[4], zero), S::lt(v[5], zero)), S::or_m(S::lt(v[6], zero), S::lt(v[7], zero))),
            );
            *neg = S::or_m(*neg, low);
            let a = S::add(S::add(v[0], v[2]), S::add(v[4], v[6]));
            let b = S::add(S::add(v[1], v[3]), S::add(v[5], v[7]));
            // SAFETY: `t` holds 16 >= 8 lanes.
            unsafe { S::store(t.as_mut_ptr(), S::add(a, b)) };
        }
        16 => {
            // Vector j is [c[16j..16j+8] | c[16j+8..16j+16]]: its halves are the groups 2j, 2j+1.
            let w: [S::F; 4] = std::array::from_fn(load);
            let low =
                S::or_m(S::or_m(S::lt(w[0], zero), S::lt(w[1], zero)), S::or_m(S::lt(w[2], zero), S::lt(w[3], zero)));
            *neg = S::or_m(*neg, low);
            // SAFETY: `t` holds 16 lanes.
            unsafe { S::store(t.as_mut_ptr(), S::add(S::add(w[0], w[1]), S::add(w[2], w[3]))) };
            for l in 0..8 {
                t[l] += t[l + 8];
            }
        }
        _ => {
            // SAFETY: `p` valid for 64 reads (the caller's contract).
            let c = unsafe { std::slice::from_raw_parts(p, 64) };
            for (l, tl) in t.iter_mut().enumerate().take(8) {
                let a = (c[l] + c[16 + l]) + (c[32 + l] + c[48 + l]);
                let b = (c[8 + l] + c[24 + l]) + (c[40 + l] + c[56 + l]);
                *tl = a + b;
            }
            *neg = S::or_m(*neg, S::mask_bits(c.iter().any(|&x| x < 0.0) as u32));
        }
    }
}

/// The sum of the `n` values at `row` (defined in the module doc) and whether any is `< 0`
/// (-inf included; NaN is not, but makes the sum NaN).
///
/// # Safety
/// `row` valid for `n` reads; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn prob_sum<S: Simd>(row: *const f32, n: usize) -> (f64, bool) {
    let (mut sums, mut t, mut neg) = ([0f64; 4], [0f32; 16], S::none());
    let whole = n / 64 * 64;
    let mut i = 0;
    while i < whole {
        // SAFETY: i + 64 <= n.
        unsafe { chunk_sum::<S>(row.add(i), &mut t, &mut neg) };
        for j in 0..4 {
            sums[j] += t[j] as f64 + t[j + 4] as f64;
        }
        i += 64;
    }
    let (mut tail, mut negative) = (0f64, S::any(neg));
    // SAFETY: whole <= n.
    for &x in unsafe { std::slice::from_raw_parts(row.add(whole), n - whole) } {
        tail += x as f64;
        negative |= x < 0.0;
    }
    (((sums[0] + sums[2]) + (sums[1] + sums[3])) + tail, negative)
}

#[cfg(test)]
mod tests {
    use crate::kernels::kernels;
    use crate::kernels::test_support::each_level;

    /// The module doc's definition, one value at a time.
    fn defined(row: &[f32]) -> (f64, bool) {
        let whole = row.len() / 64 * 64;
        let mut sums = [0f64; 4];
        for c in row[..whole].chunks_exact(64) {
            let lane = |l: usize| {
                let a = (c[l] + c[16 + l]) + (c[32 + l] + c[48 + l]);
                let b = (c[8 + l] + c[24 + l]) + (c[40 + l] + c[56 + l]);
                a + b
            };
            for (j, s) in sums.iter_mut().enumerate() {
                *s += lane(j) as f64 + lane(j + 4) as f64;
            }
        }
        let tail: f64 = row[whole..].iter().fold(0.0, |a, &x| a + x as f64);
        (((sums[0] + sums[2]) + (sums[1] + sums[3])) + tail, row.iter().any(|&x| x < 0.0))
    }

    #[test]
    fn every_level_computes_the_defined_sum_bit_for_bit() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = || (crate::kernels::xorshift64(&mut state) >> 40) as f32 / (1u64 << 24) as f32;
        for n in [0usize, 1, 63, 64, 65, 1000, 32000, 151_936] {
            let mut row: Vec<f32> = (0..n).map(|_| next().powi(8)).collect();
            let total: f64 = row.iter().map(|&x| x as f64).sum();
            row.iter_mut().for_each(|x| *x = (*x as f64 / total.max(1e-30)) as f32);
            for negative in [None, Some(n / 2), Some(n.saturating_sub(1))] {
                let mut r = row.clone();
                if let Some(i) = negative.filter(|_| n > 0) {
                    r[i] = -1e-30;
                }
                let want = defined(&r);
                let exact: f64 = r.iter().map(|&x| x as f64).sum();
                assert!((want.0 - exact).abs() <= 1e-6 * exact.abs().max(1e-30), "n {n}: {} vs {exact}", want.0);
                each_level(|level| {
                    // SAFETY: the row holds r.len() values; the level is supported.
                    let got = unsafe { (kernels(level).prob_sum)(r.as_ptr(), r.len()) };
                    assert_eq!((got.0.to_bits(), got.1), (want.0.to_bits(), want.1), "{level:?}, n {n}, {negative:?}");
                });
            }
        }
        let nan = [0.5f32, f32::NAN, 0.5];
        each_level(|level| {
            // SAFETY: as above.
            assert!(unsafe { (kernels(level).prob_sum)(nan.as_ptr(), 3) }.0.is_nan(), "{level:?}");
        });
    }
}
