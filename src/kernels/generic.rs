//! The kernels, written once over [`Simd`]. Each instruction set instantiates these inside its
//! own `#[target_feature]` functions; [`Scalar`] instantiates them as the reference.
//!
//! Rows are processed in blocks of [`BLOCK`] elements. A first pass records each block's maximum
//! (NaN ignored) and whether any NaN was seen; greedy rows then look for the first index of the
//! maximum in the first block that holds it, and sampling rows run the race.
//!
//! The race for a token i is `key_i = (x_i - m) * inv_t - ln E_i`; the token is the lowest index
//! of the largest key. Inline noise is generated per block with a known bound on its largest
//! `-ln E` (see [`BlockNoise`]), so a block or vector whose keys cannot reach the best key so far
//! is skipped without generating its noise. Pruning only skips tokens whose computed key is
//! provably below the best, so it never changes the result.

use super::simd::{Elem, Scalar, Simd};

/// Elements per block of the first pass.
pub(crate) const BLOCK: usize = 256;

const LN2_HI: f32 = 0.693_359_4; // 355/512: e * LN2_HI is exact for |e| < 2^14
const LN2_LO: f32 = -2.121_944_4e-4; // ln 2 - LN2_HI
/// ln 2 rounded up with room to spare, for upper bounds.
const LN2_UP: f32 = 0.693_158; // ln 2 * (1 + 2^-16)
const SQRT2_BITS: u32 = 0x3fb5_04f3;
const TWO_POW_M32: f32 = 2.328_306_4e-10; // 2^-32, exact

// ---------------------------------------------------------------------------------------------
// Math: ln, the counter hash, and the uniform-to-Exp(1) transform.
// ---------------------------------------------------------------------------------------------

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

/// An upper bound of `-ln exp_noise(a)` that costs a few integer operations: E >= t >= 2^(eb-151).
#[inline(always)]
pub(crate) fn noise_bound<S: Simd>(a: S::U) -> S::F {
    let c = S::xor_u(a, S::sign_fill(a));
    let eb = S::shr_u::<23>(S::to_bits(S::cvt_i32(S::shr_u::<8>(c))));
    let k = S::min_i32(S::sub_u(S::splat_u(151), eb), S::splat_u(33));
    S::add(S::mul(S::cvt_i32(k), S::splat(LN2_UP)), S::splat(1e-5))
}

/// Splits a 64-bit row key into the two 32-bit words the hash takes.
#[inline(always)]
pub(crate) fn key_words(key: u64) -> (u32, u32) {
    (key as u32, (key >> 32) as u32)
}

// ---------------------------------------------------------------------------------------------
// Pass 1: block maxima.
// ---------------------------------------------------------------------------------------------

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
        while i + 4 * l <= end {
            let x0 = E::load::<S>(row.add(i));
            let x1 = E::load::<S>(row.add(i + l));
            let x2 = E::load::<S>(row.add(i + 2 * l));
            let x3 = E::load::<S>(row.add(i + 3 * l));
            // One unordered compare catches a NaN in either operand.
            nan = S::or_m(nan, S::or_m(S::unord(x0, x1), S::unord(x2, x3)));
            a0 = S::max(x0, a0);
            a1 = S::max(x1, a1);
            a2 = S::max(x2, a2);
            a3 = S::max(x3, a3);
            i += 4 * l;
        }
        while i + l <= end {
            let x = E::load::<S>(row.add(i));
            nan = S::or_m(nan, S::is_nan(x));
            a0 = S::max(x, a0);
            i += l;
        }
        let mut m = S::reduce_max(S::max(S::max(a0, a1), S::max(a2, a3)));
        while i < end {
            let x = E::load::<Scalar>(row.add(i));
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
#[inline(always)]
pub(crate) unsafe fn max_only<S: Simd, E: Elem>(row: *const E, n: usize) -> f32 {
    let l = S::LANES;
    let ninf = S::splat(f32::NEG_INFINITY);
    let (mut a0, mut a1, mut a2, mut a3) = (ninf, ninf, ninf, ninf);
    let mut i = 0;
    while i + 4 * l <= n {
        a0 = S::max(E::load::<S>(row.add(i)), a0);
        a1 = S::max(E::load::<S>(row.add(i + l)), a1);
        a2 = S::max(E::load::<S>(row.add(i + 2 * l)), a2);
        a3 = S::max(E::load::<S>(row.add(i + 3 * l)), a3);
        i += 4 * l;
    }
    let mut m = S::reduce_max(S::max(S::max(a0, a1), S::max(a2, a3)));
    while i < n {
        m = Scalar::max(E::load::<Scalar>(row.add(i)), m);
        i += 1;
    }
    m
}

/// The read floor of two streams: the largest of `n` elements of `row` and of `other`, in one
/// pass (what a race on external noise must read at least).
///
/// # Safety
/// `row` and `other` valid for `n` reads; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn max_two<S: Simd, E: Elem>(row: *const E, other: *const f32, n: usize) -> f32 {
    let l = S::LANES;
    let ninf = S::splat(f32::NEG_INFINITY);
    let (mut a0, mut a1, mut a2, mut a3) = (ninf, ninf, ninf, ninf);
    let mut i = 0;
    while i + 2 * l <= n {
        a0 = S::max(E::load::<S>(row.add(i)), a0);
        a1 = S::max(S::load_f32(other.add(i)), a1);
        a2 = S::max(E::load::<S>(row.add(i + l)), a2);
        a3 = S::max(S::load_f32(other.add(i + l)), a3);
        i += 2 * l;
    }
    let mut m = S::reduce_max(S::max(S::max(a0, a1), S::max(a2, a3)));
    while i < n {
        m = Scalar::max(E::load::<Scalar>(row.add(i)), Scalar::max(*other.add(i), m));
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
        let m = S::eq(E::load::<S>(row.add(i)), t);
        if S::any(m) {
            return Some(i + S::first(m));
        }
        i += l;
    }
    (i..end).find(|&j| E::load::<Scalar>(row.add(j)) == target)
}

// ---------------------------------------------------------------------------------------------
// The race with inline (counter-based) noise.
// ---------------------------------------------------------------------------------------------

/// The best key so far and its token; ties go to the lower token.
#[derive(Clone, Copy)]
pub(crate) struct Best {
    pub key: f32,
    pub token: usize,
}

impl Best {
    pub(crate) const NONE: Best = Best { key: f32::NEG_INFINITY, token: usize::MAX };

    #[inline(always)]
    pub(crate) fn offer(&mut self, key: f32, token: usize) {
        if key > self.key || (key == self.key && token < self.token) {
            *self = Best { key, token };
        }
    }

    /// Combines the bests of two ranges (in any order).
    pub(crate) fn merge(mut self, other: Best) -> Best {
        if other.token != usize::MAX {
            self.offer(other.key, other.token);
        }
        self
    }
}

/// Row constants of a race.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RaceParams {
    /// The row's finite maximum.
    pub m: f32,
    /// 1/T, at most f32::MAX.
    pub inv_t: f32,
    /// Tokens whose logit is below this do not race (the filters keep `x >= floor`); -inf keeps
    /// every finite logit.
    pub floor: f32,
}

/// The noise of the block of BLOCK tokens that starts at token `b * BLOCK`, built from the
/// memorylessness of Exp(1): the minimum of BLOCK independent Exp(1) values is Exp(BLOCK)
/// (`E_min = E(h1) / BLOCK`), its position `J` is uniform and independent of it (the top 8 bits
/// of `h2`), and every other value is `E_min + F_j` with `F_j ~ Exp(1)` from the token's own
/// hash, independent of the rest. So the values are exactly i.i.d. Exp(1), and `-ln E_min`
/// bounds every key of the block, which lets the race skip a block on one hash.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockNoise {
    pub e_min: f32,
    /// The block-relative position holding `e_min`.
    pub j_min: u32,
    /// An upper bound of `-ln E` over the block (`-ln e_min`, with room for rounding).
    pub g_max: f32,
    /// An upper bound of every key of the block (-inf if the filters keep none of it).
    pub bound: f32,
}

const SALT_MIN: u32 = 0x6d69_6e45; // separates the block streams from the token stream
const SALT_POS: u32 = 0x706f_734a;

/// `BlockNoise` of `S::LANES` consecutive blocks starting at block index `b`, whose largest
/// logits are `bm`: (e_min, j_min, g_max, bound).
#[inline(always)]
fn block_noise<S: Simd>(b: u32, k: (u32, u32), bm: S::F, p: RaceParams) -> (S::F, S::U, S::F, S::F) {
    let idx = S::iota_u(b);
    let h1 = hash::<S>(idx, S::splat_u(k.0 ^ SALT_MIN), S::splat_u(k.1));
    let h2 = hash::<S>(idx, S::splat_u(k.0 ^ SALT_POS), S::splat_u(k.1));
    let e_min = S::mul(exp_noise::<S>(h1), S::splat(1.0 / BLOCK as f32));
    let g_max = S::add(S::sub(S::splat(0.0), ln::<S>(e_min)), S::splat(1e-4));
    let bound = S::add(S::mul(S::sub(bm, S::splat(p.m)), S::splat(p.inv_t)), g_max);
    let bound = S::select(S::ge(bm, S::splat(p.floor)), bound, S::splat(f32::NEG_INFINITY));
    (e_min, S::shr_u::<24>(h2), g_max, bound)
}

/// Fills `out` with the `BlockNoise` of blocks `first, first + 1, ...` of the row keyed by `key`,
/// whose largest logits are `bmax`.
///
/// # Safety
/// `bmax` has `out.len()` elements; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn fill_block_noise<S: Simd>(
    key: u64,
    first: usize,
    bmax: &[f32],
    p: RaceParams,
    out: &mut [BlockNoise],
) {
    let k = key_words(key);
    let (mut e, mut j, mut g, mut u) = ([0f32; 64], [0u32; 64], [0f32; 64], [0f32; 64]);
    let mut b = 0;
    while b < out.len() {
        let lanes = if b + S::LANES <= out.len() {
            let (ve, vj, vg, vu) = block_noise::<S>((first + b) as u32, k, S::load_f32(bmax.as_ptr().add(b)), p);
            S::store(e.as_mut_ptr(), ve);
            S::store_u(j.as_mut_ptr(), vj);
            S::store(g.as_mut_ptr(), vg);
            S::store(u.as_mut_ptr(), vu);
            S::LANES
        } else {
            (e[0], j[0], g[0], u[0]) = block_noise::<Scalar>((first + b) as u32, k, bmax[b], p);
            1
        };
        for l in 0..lanes {
            out[b + l] = BlockNoise { e_min: e[l], j_min: j[l], g_max: g[l], bound: u[l] };
        }
        b += lanes;
    }
}

/// The exact keys of the `LANES` tokens at `row[i..]`, which lie in a block with noise `bn`;
/// `i0` is the block-relative index of `row[i]` and `t` the vocabulary index of `row[i]`.
#[inline(always)]
unsafe fn race_inline_vec<S: Simd, E: Elem>(
    row: *const E,
    i: usize,
    (i0, t): (u32, u32),
    bn: BlockNoise,
    p: RaceParams,
    k: (u32, u32),
    best: &mut Best,
) {
    let x = E::load::<S>(row.add(i));
    let d = S::mul(S::sub(x, S::splat(p.m)), S::splat(p.inv_t));
    let racing = S::and_m(S::gt(d, S::splat(f32::NEG_INFINITY)), S::ge(x, S::splat(p.floor)));
    // Most vectors of a live block stop here: even the block's smallest noise cannot lift them.
    let live = S::and_m(S::ge(S::add(d, S::splat(bn.g_max)), S::splat(best.key)), racing);
    if !S::any(live) {
        return;
    }
    // A tighter bound per token from its own noise bits: E_j = E_min + F_j >= F_j, except at
    // the block minimum's position, where E = E_min.
    let h = hash::<S>(S::iota_u(t), S::splat_u(k.0), S::splat_u(k.1));
    let is_min = S::eq(S::cvt_i32(S::iota_u(i0)), S::cvt_i32(S::splat_u(bn.j_min)));
    let g = S::select(is_min, S::splat(bn.g_max), noise_bound::<S>(h));
    let live = S::and_m(live, S::ge(S::add(d, g), S::splat(best.key)));
    if !S::any(live) {
        return;
    }
    let e_min = S::splat(bn.e_min);
    let e = S::select(is_min, e_min, S::add(e_min, exp_noise::<S>(h)));
    let key = S::sub(d, ln::<S>(e));
    let kv = S::select(live, key, S::splat(f32::NEG_INFINITY));
    let top = S::reduce_max(kv);
    let lane = S::first(S::and_m(live, S::eq(kv, S::splat(top))));
    best.offer(top, t as usize + lane);
}

/// Races every token of block `b` (whose noise is `bn`) against `best`.
#[inline(always)]
unsafe fn race_block<S: Simd, E: Elem>(
    row: *const E,
    n: usize,
    (b, bn): (usize, BlockNoise),
    p: RaceParams,
    k: (u32, u32),
    base: usize,
    best: &mut Best,
) {
    let (start, end) = (b * BLOCK, ((b + 1) * BLOCK).min(n));
    let mut i = start;
    while i + S::LANES <= end {
        race_inline_vec::<S, E>(row, i, ((i - start) as u32, (base + i) as u32), bn, p, k, best);
        i += S::LANES;
    }
    while i < end {
        race_inline_vec::<Scalar, E>(row, i, ((i - start) as u32, (base + i) as u32), bn, p, k, best);
        i += 1;
    }
}

/// The best (key, token) among the `n` tokens at `row`, which start at vocabulary index `base`
/// (a multiple of BLOCK) and have block maxima `bmax`, in a row with finite maximum `p.m`.
/// `Best::NONE` if no token races. Tiles of one row combine with [`Best::merge`].
///
/// The block holding the range's maximum goes first, so that the best key is high from the
/// start; a block whose maximum logit plus its noise bound cannot reach the best is skipped
/// without reading it.
///
/// # Safety
/// `row` valid for `n` reads; `bmax` from [`scan`] of the same range; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn race_inline<S: Simd, E: Elem>(
    row: *const E,
    n: usize,
    bmax: &[f32],
    p: RaceParams,
    key: u64,
    base: usize,
    blocks: &mut Vec<BlockNoise>,
) -> Best {
    let k = key_words(key);
    blocks.clear();
    blocks.resize(bmax.len(), BlockNoise { e_min: 0.0, j_min: 0, g_max: 0.0, bound: 0.0 });
    fill_block_noise::<S>(key, base / BLOCK, bmax, p, blocks);
    let mut best = Best::NONE;
    // The block with the highest bound first: it most often holds the winner, and a high best
    // key early lets the bounds of most other blocks fall short of it.
    // Promising blocks first, so that the best key is high early and most bounds fall short of
    // it: the block of the highest bound, then every block within PROMISING of it, then the rest.
    // The order only changes how much work is skipped, never the result.
    const PROMISING: f32 = 3.0;
    let top = blocks.iter().fold(f32::NEG_INFINITY, |a, bn| Scalar::max(bn.bound, a));
    let first = blocks.iter().position(|bn| bn.bound == top).unwrap_or(0);
    let b_of = |b: usize| (b, blocks[b]);
    race_block::<S, E>(row, n, b_of(first), p, k, base, &mut best);
    let cut = top - PROMISING;
    for (b, bn) in blocks.iter().enumerate() {
        if b != first && bn.bound >= cut && bn.bound >= best.key {
            race_block::<S, E>(row, n, (b, *bn), p, k, base, &mut best);
        }
    }
    for (b, bn) in blocks.iter().enumerate() {
        if b != first && bn.bound < cut && bn.bound >= best.key {
            race_block::<S, E>(row, n, (b, *bn), p, k, base, &mut best);
        }
    }
    best
}

// ---------------------------------------------------------------------------------------------
// The race with external noise (the caller's or a pool's).
// ---------------------------------------------------------------------------------------------

/// Whether external noise values are E or ln E.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ExtKind {
    Exp,
    LogExp,
}

/// The keys of the `LANES` tokens at `i` given `ln_e`: masked (-inf), NaN and filtered-out
/// logits get NaN, which no comparison (and no `max`) takes.
#[inline(always)]
unsafe fn ext_key<S: Simd, E: Elem>(row: *const E, i: usize, p: RaceParams, ln_e: S::F) -> S::F {
    let x = E::load::<S>(row.add(i));
    let d = S::mul(S::sub(x, S::splat(p.m)), S::splat(p.inv_t));
    let key = S::sub(d, ln_e);
    let racing = S::and_m(S::gt(d, S::splat(f32::NEG_INFINITY)), S::ge(x, S::splat(p.floor)));
    S::select(racing, key, S::splat(f32::NAN))
}

/// The keys of ln-E noise, for `LANES` tokens at `i`. Unfiltered, no mask is needed: a masked
/// logit's key is -inf or NaN, a NaN logit's is NaN, and `max` takes neither over a real key.
#[inline(always)]
unsafe fn log_exp_key<S: Simd, E: Elem, const FILTERED: bool>(
    row: *const E,
    noise: *const f32,
    i: usize,
    p: RaceParams,
) -> S::F {
    if FILTERED {
        ext_key::<S, E>(row, i, p, S::load_f32(noise.add(i)))
    } else {
        let x = E::load::<S>(row.add(i));
        S::sub(S::mul(S::sub(x, S::splat(p.m)), S::splat(p.inv_t)), S::load_f32(noise.add(i)))
    }
}

/// The best (key, token) of `[0, n)` with ln-E noise, as a plain max pass: each block's largest
/// key, the first block holding the overall largest, then a rescan of that block for the first
/// index holding it. Two streams read once, plus one block.
#[inline(always)]
unsafe fn race_log_exp<S: Simd, E: Elem, const FILTERED: bool>(
    row: *const E,
    noise: *const f32,
    n: usize,
    p: RaceParams,
    base: usize,
) -> Best {
    let l = S::LANES;
    let (mut top, mut top_block) = (f32::NEG_INFINITY, usize::MAX);
    for b in 0..n.div_ceil(BLOCK) {
        let (start, end) = (b * BLOCK, ((b + 1) * BLOCK).min(n));
        let ninf = S::splat(f32::NEG_INFINITY);
        let (mut a0, mut a1, mut a2, mut a3) = (ninf, ninf, ninf, ninf);
        let mut i = start;
        while i + 4 * l <= end {
            a0 = S::max(log_exp_key::<S, E, FILTERED>(row, noise, i, p), a0);
            a1 = S::max(log_exp_key::<S, E, FILTERED>(row, noise, i + l, p), a1);
            a2 = S::max(log_exp_key::<S, E, FILTERED>(row, noise, i + 2 * l, p), a2);
            a3 = S::max(log_exp_key::<S, E, FILTERED>(row, noise, i + 3 * l, p), a3);
            i += 4 * l;
        }
        while i + l <= end {
            a0 = S::max(log_exp_key::<S, E, FILTERED>(row, noise, i, p), a0);
            i += l;
        }
        let mut m = S::reduce_max(S::max(S::max(a0, a1), S::max(a2, a3)));
        while i < end {
            m = Scalar::max(log_exp_key::<Scalar, E, FILTERED>(row, noise, i, p), m);
            i += 1;
        }
        if m > top {
            (top, top_block) = (m, b);
        }
    }
    if top_block == usize::MAX {
        return Best::NONE;
    }
    let start = top_block * BLOCK;
    let end = (start + BLOCK).min(n);
    let i = (start..end).find(|&i| log_exp_key::<Scalar, E, FILTERED>(row, noise, i, p) == top).unwrap_or(start);
    Best { key: top, token: base + i }
}

/// An upper bound of `-ln E` from the bits of E: E >= 2^(e - 127) for a normal E with biased
/// exponent e; +inf for 0 and subnormals (their ln is below -87); negative, infinite or NaN E,
/// whose key never wins, get a finite bound.
#[inline(always)]
fn exp_bits_bound<S: Simd>(e: S::F) -> S::F {
    let eb = S::shr_u::<23>(S::to_bits(e));
    let k = S::cvt_i32(S::sub_u(S::splat_u(127), eb));
    let bound = S::add(S::mul(k, S::splat(LN2_UP)), S::splat(1e-5));
    S::select(S::lt(e, S::splat(f32::MIN_POSITIVE)), S::splat(f32::INFINITY), bound)
}

/// Races the `LANES` tokens at `i` with E noise: only vectors that a bound from the bits of E
/// lets reach the best get their exact `ln E`.
#[inline(always)]
unsafe fn race_exp_vec<S: Simd, E: Elem>(
    row: *const E,
    noise: *const f32,
    i: usize,
    p: RaceParams,
    base: usize,
    best: &mut Best,
) {
    let x = E::load::<S>(row.add(i));
    let d = S::mul(S::sub(x, S::splat(p.m)), S::splat(p.inv_t));
    let g = S::load_f32(noise.add(i));
    if !S::any(S::ge(S::add(d, exp_bits_bound::<S>(g)), S::splat(best.key))) {
        return;
    }
    let key = ext_key::<S, E>(row, i, p, ln_any::<S>(g));
    let kv = S::select(S::gt(key, S::splat(f32::NEG_INFINITY)), key, S::splat(f32::NEG_INFINITY));
    let top = S::reduce_max(kv);
    if top > f32::NEG_INFINITY {
        best.offer(top, base + i + S::first(S::eq(kv, S::splat(top))));
    }
}

/// The best (key, token) among the `n` tokens at `row` (vocabulary index `base` onwards), given
/// one noise value per token at `noise`; `Best::NONE` when no key is a number above -inf
/// (external noise that is +inf or NaN everywhere that matters).
///
/// # Safety
/// `row` and `noise` valid for `n` reads; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn race_external<S: Simd, E: Elem>(
    row: *const E,
    noise: *const f32,
    n: usize,
    p: RaceParams,
    kind: ExtKind,
    base: usize,
) -> Best {
    if kind == ExtKind::LogExp {
        return if p.floor == f32::NEG_INFINITY {
            race_log_exp::<S, E, false>(row, noise, n, p, base)
        } else {
            race_log_exp::<S, E, true>(row, noise, n, p, base)
        };
    }
    let mut best = Best::NONE;
    let mut i = 0;
    while i + S::LANES <= n {
        race_exp_vec::<S, E>(row, noise, i, p, base, &mut best);
        i += S::LANES;
    }
    while i < n {
        race_exp_vec::<Scalar, E>(row, noise, i, p, base, &mut best);
        i += 1;
    }
    best
}

// ---------------------------------------------------------------------------------------------
// Noise generation (the pool and callers who want noise arrays).
// ---------------------------------------------------------------------------------------------

#[inline(always)]
unsafe fn fill_vec<S: Simd>(out: *mut f32, j: usize, first: u32, k: (u32, u32), log: bool) {
    let h = hash::<S>(S::iota_u(first.wrapping_add(j as u32)), S::splat_u(k.0), S::splat_u(k.1));
    let e = exp_noise::<S>(h);
    S::store(out.add(j), if log { ln::<S>(e) } else { e });
}

/// Writes the noise of tokens `first .. first + n` of the row keyed by `key`: E, or ln E if `log`.
///
/// # Safety
/// `out` valid for `n` writes; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn fill_noise<S: Simd>(out: *mut f32, n: usize, key: u64, first: u32, log: bool) {
    let k = key_words(key);
    let mut j = 0;
    while j + S::LANES <= n {
        fill_vec::<S>(out, j, first, k, log);
        j += S::LANES;
    }
    while j < n {
        fill_vec::<Scalar>(out, j, first, k, log);
        j += 1;
    }
}
