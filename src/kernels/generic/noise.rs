//! The noise: ln, the counter hash, the uniform-to-Exp(1) transform and its cheap bounds, and
//! [`fill_noise`] (the pool and callers who want noise arrays).
//!
//! Every function here is a pure function of its lanes, so one lane ([`Scalar`]) is the
//! definition and the vector levels reproduce it bit for bit (no FMA: see `simd.rs`).

use crate::kernels::simd::{Scalar, Simd};

const LN2_HI: f32 = 0.693_359_4; // 355/512: e * LN2_HI is exact for |e| < 2^14
const LN2_LO: f32 = -2.121_944_4e-4; // ln 2 - LN2_HI
/// ln 2 rounded up with room to spare: `k * LN2_UP >= k ln 2` for `k >= 0`, by `k ln 2 * 2^-16`,
/// far more than the relative error of `ln` (below 2.5e-7), so that a bound `k * LN2_UP` of
/// `k ln 2` also bounds the computed logarithm.
pub(super) const LN2_UP: f32 = 0.693_158; // ln 2 * (1 + 2^-16)
/// ln 2 rounded down with the same room: `k * LN2_DOWN >= k ln 2` for `k <= 0` (an upper bound of
/// a negative multiple of ln 2 needs ln 2 rounded toward zero, not up).
pub(super) const LN2_DOWN: f32 = 0.693_136; // ln 2 * (1 - 2^-16)
const SQRT2_BITS: u32 = 0x3fb5_04f3;
const TWO_POW_M32: f32 = 2.328_306_4e-10; // 2^-32, exact

/// Natural log of positive normal lanes, plus an exponent offset `e_off` (result = ln(x) - e_off*ln2).
///
/// ln x = e ln2 + ln m with m in (sqrt(1/2), sqrt(2)], and ln m = 2 atanh(s), s = (m-1)/(m+1),
/// |s| <= 0.1716, from the series s + s^3/3 + s^5/5 + s^7/7 + s^9/9 (truncation below 1e-8
/// relative). No FMA, so every instruction set rounds identically.
#[inline(always)]
fn ln_core<S: Simd>(x: S::F, e_off: S::U) -> S::F {
    let bits = S::to_bits(x);
    let mut e = S::sub_u(S::sub_u(S::shr_u::<23>(bits), S::splat_u(127)), e_off);
    let mut mbits = S::or_u(S::and_u(bits, S::splat_u(0x007f_ffff)), S::splat_u(0x3f80_0000));
    let big = S::gt_i32(mbits, S::splat_u(SQRT2_BITS));
    mbits = S::select_u(big, S::sub_u(mbits, S::splat_u(0x0080_0000)), mbits);
    e = S::select_u(big, S::add_u(e, S::splat_u(1)), e);
    let m = S::from_bits(mbits);
    let one = S::splat(1.0);
    let s = S::div(S::sub(m, one), S::add(m, one));
    let s2 = S::mul(s, s);
    let mut p = S::splat(1.0 / 9.0);
    p = S::add(S::mul(p, s2), S::splat(1.0 / 7.0));
    p = S::add(S::mul(p, s2), S::splat(1.0 / 5.0));
    p = S::add(S::mul(p, s2), S::splat(1.0 / 3.0));
    let ts = S::add(s, s);
    let ln_m = S::add(ts, S::mul(ts, S::mul(s2, p)));
    let ef = S::cvt_i32(e);
    S::add(S::mul(ef, S::splat(LN2_HI)), S::add(S::mul(ef, S::splat(LN2_LO)), ln_m))
}

/// ln of positive normal lanes.
#[inline(always)]
pub(crate) fn ln<S: Simd>(x: S::F) -> S::F {
    ln_core::<S>(x, S::splat_u(0))
}

/// ln of any lanes: subnormals are scaled first; ln 0 = -inf, ln +inf = +inf, negative or NaN gives NaN.
#[inline(always)]
pub(crate) fn ln_any<S: Simd>(x: S::F) -> S::F {
    let zero = S::splat(0.0);
    let sub = S::and_m(S::lt(x, S::splat(f32::MIN_POSITIVE)), S::gt(x, zero));
    let xs = S::select(sub, S::mul(x, S::splat(16_777_216.0)), x);
    let off = S::select_u(sub, S::splat_u(24), S::splat_u(0));
    let mut r = ln_core::<S>(xs, off);
    r = S::select(S::eq(x, zero), S::splat(f32::NEG_INFINITY), r);
    r = S::select(S::eq(x, S::splat(f32::INFINITY)), S::splat(f32::INFINITY), r);
    S::select(S::or_m(S::lt(x, zero), S::is_nan(x)), S::splat(f32::NAN), r)
}

#[inline(always)]
fn fmix<S: Simd>(mut h: S::U) -> S::U {
    h = S::xor_u(h, S::shr_u::<16>(h));
    h = S::mul_u(h, S::splat_u(0x85eb_ca6b));
    h = S::xor_u(h, S::shr_u::<13>(h));
    h = S::mul_u(h, S::splat_u(0xc2b2_ae35));
    S::xor_u(h, S::shr_u::<16>(h))
}

/// 32 random bits for token `idx` of the row keyed by (`k0`, `k1`).
///
/// Two rounds of a 32-bit avalanche mix, each a bijection of its input, so the 32-bit values of
/// one row are all distinct and each is a pure function of (key, token index).
#[inline(always)]
pub(crate) fn hash<S: Simd>(idx: S::U, k0: S::U, k1: S::U) -> S::U {
    let h = S::xor_u(S::mul_u(idx, S::splat_u(0x9e37_79b9)), k0);
    fmix::<S>(S::add_u(fmix::<S>(h), k1))
}

/// E = -ln U with U = (a + 0.5) 2^-32, strictly inside (0, 1), with relative precision for
/// every E (a plain f32 U near 1 would keep only 24 bits of the small E that decide the race).
///
/// For U < 1/2, E = -ln U directly. For U >= 1/2, t = 1 - U = (!a + 0.5) 2^-32 is exact in
/// relative terms; arg = fl(1 - t) and E = -ln(1 - t) = -ln(arg) + e/arg with e = (arg - 1) + t
/// (computed exactly), and 1/arg ~ 2 - arg is close enough for a correction below 2^-25.
#[inline(always)]
pub(crate) fn exp_noise<S: Simd>(a: S::U) -> S::F {
    let sign = S::sign_fill(a);
    let hi = S::gt_i32(S::splat_u(0), a);
    let c = S::xor_u(a, sign);
    let t = S::mul(S::add(S::cvt_i32(c), S::splat(0.5)), S::splat(TWO_POW_M32));
    let one = S::splat(1.0);
    let arg = S::select(hi, S::sub(one, t), t);
    let l = ln::<S>(arg);
    let e = S::add(S::sub(arg, one), t);
    let corr = S::select(hi, S::mul(e, S::sub(S::splat(2.0), arg)), S::splat(0.0));
    S::sub(corr, l)
}

/// An upper bound of `-ln exp_noise(a)` that costs a few integer operations.
///
/// - `U >= 1/2` (the top bit of `a` set): `E >= t >= 2^(eb-151)`, so `-ln E <= k ln 2` with
///   `k = min(151 - eb, 33)` in [2, 33] (`c >> 8 < 2^23`, so `eb <= 149`; `c >> 8 = 0` gives
///   `eb = 0` and the cap 33, from `t >= 2^-33`), never negative, so ln 2 rounded up is the
///   right direction here (see [`LN2_DOWN`] where it is not).
/// - `U < 1/2`: `E = -ln U >= ln 2` (`t` rounds to at most 1/2), so `-ln E <= -ln ln 2 =
///   0.366513` ([`NEG_LN_LN2_UP`], with room for `ln`'s rounding): half the tokens get a bound
///   below 0.37 instead of at least `2 ln 2`, and a race skips more of them before their noise.
#[inline(always)]
pub(crate) fn noise_bound<S: Simd>(a: S::U) -> S::F {
    let c = S::xor_u(a, S::sign_fill(a));
    let eb = S::shr_u::<23>(S::to_bits(S::cvt_i32(S::shr_u::<8>(c))));
    let k = S::min_i32(S::sub_u(S::splat_u(151), eb), S::splat_u(33));
    let small = S::add(S::mul(S::cvt_i32(k), S::splat(LN2_UP)), S::splat(1e-5));
    S::select(S::gt_i32(S::splat_u(0), a), small, S::splat(NEG_LN_LN2_UP))
}

/// -ln ln 2 = 0.3665129 with room (1e-4) for the roundings of `E`'s and `-ln E`'s logarithms.
pub(super) const NEG_LN_LN2_UP: f32 = 0.366_62;

/// SplitMix64's output function: a bijection of u64 with good avalanche. The row keys and the
/// keys of the block streams (see `race.rs`) are derived with it.
#[inline(always)]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Splits a 64-bit row key into the two 32-bit words the hash takes.
#[inline(always)]
pub(crate) fn key_words(key: u64) -> (u32, u32) {
    (key as u32, (key >> 32) as u32)
}

/// The noise of the `LANES` tokens `first + j ..` into `out[j..]`: E, or ln E if `log`.
///
/// # Safety
/// `out` valid for `S::LANES` writes at `j`; `S` usable here.
#[inline(always)]
unsafe fn fill_vec<S: Simd>(out: *mut f32, j: usize, first: u32, k: (u32, u32), log: bool) {
    let h = hash::<S>(S::iota_u(first.wrapping_add(j as u32)), S::splat_u(k.0), S::splat_u(k.1));
    let e = exp_noise::<S>(h);
    // SAFETY: the caller's contract.
    unsafe { S::store(out.add(j), if log { ln::<S>(e) } else { e }) };
}

/// [`fill_vec`] of `N` vectors, each step taken for all of them before the next: one vector's
/// chain (the hash, then two logarithms for ln E, each with a division) is long, and side by
/// side the chains overlap (the out-of-order window alone overlapped too few of them).
///
/// # Safety
/// `out` valid for `N * S::LANES` writes at `j`; `S` usable here.
#[inline(always)]
unsafe fn fill_vecs<S: Simd, const N: usize>(out: *mut f32, j: usize, first: u32, k: (u32, u32), log: bool) {
    // (Loops, not closures: a closure would not inherit the level's target features.)
    let l = S::LANES;
    let mut h = [S::splat_u(0); N];
    for (i, h) in h.iter_mut().enumerate() {
        *h = hash::<S>(S::iota_u(first.wrapping_add((j + i * l) as u32)), S::splat_u(k.0), S::splat_u(k.1));
    }
    let mut v = [S::splat(0.0); N];
    for i in 0..N {
        v[i] = exp_noise::<S>(h[i]);
    }
    if log {
        for v in v.iter_mut() {
            *v = ln::<S>(*v);
        }
    }
    for (i, &v) in v.iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe { S::store(out.add(j + i * l), v) };
    }
}

/// Vectors [`fill_noise`] computes side by side: on Zen 5 (AVX-512) four took LOG_EXP
/// generation from 0.42 to 0.52-0.62e9 values/s a thread and EXP from 0.51-0.71 to 0.78-0.91e9
/// (`examples/pool_rate`, alternated); two and eight were slower than four.
const NV: usize = 4;

/// Writes the noise of tokens `first .. first + n` of the row keyed by `key`: E, or ln E if `log`.
///
/// # Safety
/// `out` valid for `n` writes; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn fill_noise<S: Simd>(out: *mut f32, n: usize, key: u64, first: u32, log: bool) {
    let k = key_words(key);
    let mut j = 0;
    while j + NV * S::LANES <= n {
        // SAFETY: j + NV LANES <= n values of `out`; `S` usable (the caller's contract).
        unsafe { fill_vecs::<S, NV>(out, j, first, k, log) };
        j += NV * S::LANES;
    }
    while j + S::LANES <= n {
        // SAFETY: j + LANES <= n values of `out`; `S` usable (the caller's contract).
        unsafe { fill_vec::<S>(out, j, first, k, log) };
        j += S::LANES;
    }
    while j < n {
        // SAFETY: j < n; Scalar runs anywhere.
        unsafe { fill_vec::<Scalar>(out, j, first, k, log) };
        j += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::{exp_noise, hash, key_words, ln};
    use crate::kernels::kernels;
    use crate::kernels::simd::Scalar;
    use crate::kernels::test_support::each_level;

    /// Every level writes, bit for bit, the noise of the one-lane definition: `exp_noise` of
    /// the token's hash, and its `ln` for LOG_EXP; at lengths that end inside the side-by-side
    /// vectors, a single vector and the scalar tail, from any first token.
    #[test]
    fn every_level_fills_the_noise_of_the_definition() {
        let key = 0x9e37_79b9_7f4a_7c15u64;
        let k = key_words(key);
        for (n, first) in [(1usize, 0u32), (63, 5), (64, 0), (100, 17), (257, 4_000_000_000), (4103, 123)] {
            for log in [false, true] {
                let want: Vec<u32> = (0..n as u32)
                    .map(|j| {
                        let e = exp_noise::<Scalar>(hash::<Scalar>(first.wrapping_add(j), k.0, k.1));
                        (if log { ln::<Scalar>(e) } else { e }).to_bits()
                    })
                    .collect();
                each_level(|level| {
                    let mut got = vec![0f32; n];
                    // SAFETY: `got` holds n values; the level is supported.
                    unsafe { (kernels(level).fill_noise)(got.as_mut_ptr(), n, key, first, log) };
                    let got: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
                    assert_eq!(got, want, "{level:?} n {n} first {first} log {log}");
                });
            }
        }
    }
}
