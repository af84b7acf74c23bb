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

// ---------------------------------------------------------------------------------------------
// Probability mass (top-p, logprobs): a SIMD exp2, per-block sums of the weights
// `w = exp((x - m) * inv_t)` in f32 (with a proven error bound), as cheap bounds, and in f64;
// and the gathering of a row's values above a threshold.
//
// The weight of x is `2^t` with `t = fl32(fl32(x - m) * c)`, `c = fl32(inv_t * log2 e)`; the mass
// kernels sum the tokens with `lo <= x < cut`, where `lo` is finite and high enough that
// `t >= -125` (see `mass_lo`), so that every weight is a normal f32 (the kinds without a mask
// clamp t at -125 instead, for rows where that is the only bound). The tokens at or above a cut
// are gathered in index order (`gather_ge`, `mass_gather`), with a compress-store.
//
// The summation order does not depend on the SIMD level: a block of BLOCK = 256 values is read
// as 16 rows of 16 columns (`x[b*256 + r*16 + j]`), each column is summed in f32 over its 16 rows
// in a fixed pairwise tree, and the 16 column sums are added in f64 in a fixed tree. A level of
// `LANES` lanes handles `16 / LANES` column groups; the operations per element and per column
// are the same on every level, so every level returns bit-identical block sums.
// ---------------------------------------------------------------------------------------------

/// 1.5 * 2^23: `t + ROUND_MAGIC` rounds `|t| < 2^22` to an integer held in the low bits.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// 1.5 * 2^19: rounds `|t| < 2^18` to a multiple of 1/16.
const ROUND_MAGIC_16: f32 = 786_432.0;
/// 2^f on [-1/2, 1/2] = 1 + f (C1 + f (C2 + f (C3 + f (C4 + f C5)))), fitted for relative error.
#[allow(clippy::approx_constant)] // a fitted coefficient, not ln 2
const EXP2_C: [f32; 5] = [0.693_147, 0.240_222_42, 0.055_507_336, 0.009_671_513, 0.001_326_472_4];

/// The smallest exponent `t` the mass kernels accept (a weight of 2^-125, a normal f32).
pub(crate) const T_MIN: f32 = -125.0;

/// Row constants of the f32 mass kernels.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MassParams {
    /// The row's finite maximum.
    pub m: f32,
    /// `fl32(inv_t * log2 e)`.
    pub c: f32,
    /// Tokens with `lo <= x < cut` count; `lo` finite with `t(lo) >= T_MIN`.
    pub lo: f32,
    pub cut: f32,
}

/// Which weight the f32 mass kernels sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MassKind {
    /// `exp2(t)` (relative error below 2^-22), tokens `x >= lo`.
    Exp,
    /// `exp2(t)`, tokens `lo <= x < cut`.
    ExpCut,
    /// A cheap weight `S` with `S / 1.0847 <= 2^t <= S / 0.97855` (Schraudolph's exponent trick
    /// at 1/16), tokens `lo <= x < cut`.
    CheapCut,
    /// `exp2(max(t, T_MIN))` of every token, NaN and -inf included (2^-125 each): fewer
    /// operations, for rows without a floor.
    ExpAll,
    /// The cheap weight of `max(t, T_MIN)` of every token.
    CheapAll,
}

/// `t = (x - m) * c` in f32, the exponent of 2 of the weight of x.
#[inline(always)]
pub(crate) fn mass_t<S: Simd>(x: S::F, m: f32, c: f32) -> S::F {
    S::mul(S::sub(x, S::splat(m)), S::splat(c))
}

/// 2^t for `T_MIN <= t <= 0` (no check): relative error below 2^-22 (1.93e-7 measured over every
/// f32 in [-1, 0], which covers every fractional part that can occur).
///
/// t = k + f with k = round(t) and f = t - k exact in [-1/2, 1/2]; 2^f from a degree-5
/// polynomial (Horner, no FMA), 2^k added to the exponent field.
#[inline(always)]
pub(crate) fn exp2_neg<S: Simd>(t: S::F) -> S::F {
    let k = S::add(t, S::splat(ROUND_MAGIC));
    let f = S::sub(t, S::sub(k, S::splat(ROUND_MAGIC)));
    let mut p = S::splat(EXP2_C[4]);
    p = S::add(S::mul(p, f), S::splat(EXP2_C[3]));
    p = S::add(S::mul(p, f), S::splat(EXP2_C[2]));
    p = S::add(S::mul(p, f), S::splat(EXP2_C[1]));
    p = S::add(S::mul(p, f), S::splat(EXP2_C[0]));
    let y = S::add(S::mul(p, f), S::splat(1.0));
    // The bits of k are those of ROUND_MAGIC plus round(t); shifted by 23, only round(t) is left.
    S::from_bits(S::add_u(S::to_bits(y), S::shl_u::<23>(S::to_bits(k))))
}

/// The cheap weight of `T_MIN <= t <= 0`: `2^q (1 + r/16)` where `round(16 t) = 16 q + r`.
#[inline(always)]
fn cheap_exp2<S: Simd>(t: S::F) -> S::F {
    let k = S::add(t, S::splat(ROUND_MAGIC_16));
    S::from_bits(S::add_u(S::shl_u::<19>(S::to_bits(k)), S::splat_u(0x3f80_0000)))
}

/// Where a gathering kernel appends the values at or above the cut.
struct Sink {
    base: *mut f32,
    len: usize,
}

/// The weights of the `LANES` values at `p` (0 outside the kept range). Kind 5 is kind 1 that
/// also appends the values `>= cut` to `sink`.
#[inline(always)]
unsafe fn mass_vec<S: Simd, E: Elem, const KIND: u8>(p: *const E, mp: MassParams, sink: *mut Sink) -> S::F {
    let x = E::load::<S>(p);
    if KIND == 5 {
        let s = &mut *sink;
        s.len += S::compress_store(s.base.add(s.len), S::ge(x, S::splat(mp.cut)), x);
    }
    if KIND == 3 || KIND == 4 {
        // No mask: t clamped to T_MIN, NaN and -inf included. `(m - x) * -c` is `(x - m) * c`
        // (the roundings are symmetric) with -0 for x = m, so that t is never above -0 and its
        // bits as i32 grow with |t| (NaN of either sign included): an integer minimum clamps it,
        // off the floating-point adders.
        let t = S::mul(S::sub(S::splat(mp.m), x), S::splat(-mp.c));
        let t = S::from_bits(S::min_i32(S::to_bits(t), S::splat_u(T_MIN.to_bits())));
        return if KIND == 4 { cheap_exp2::<S>(t) } else { exp2_neg::<S>(t) };
    }
    let mut keep = S::ge(x, S::splat(mp.lo));
    if KIND != 0 {
        keep = S::and_m(keep, S::lt(x, S::splat(mp.cut)));
    }
    if !S::any(keep) {
        return S::splat(0.0);
    }
    let t = mass_t::<S>(x, mp.m, mp.c);
    let w = if KIND == 2 { cheap_exp2::<S>(t) } else { exp2_neg::<S>(t) };
    S::select(keep, w, S::splat(0.0))
}

/// The sum of rows `r..r + 4` of the column group at `q` (rows 16 apart), in the fixed tree.
/// (No closures in the kernels: they would not inherit the caller's target features.)
#[inline(always)]
unsafe fn mass_quad<S: Simd, E: Elem, const KIND: u8>(q: *const E, r: usize, mp: MassParams, sink: *mut Sink) -> S::F {
    let w0 = mass_vec::<S, E, KIND>(q.add(r * 16), mp, sink);
    let w1 = mass_vec::<S, E, KIND>(q.add((r + 1) * 16), mp, sink);
    let w2 = mass_vec::<S, E, KIND>(q.add((r + 2) * 16), mp, sink);
    let w3 = mass_vec::<S, E, KIND>(q.add((r + 3) * 16), mp, sink);
    S::add(S::add(w0, w1), S::add(w2, w3))
}

/// The sum of the 16 rows of the column group at `q`, in the fixed tree.
#[inline(always)]
unsafe fn mass_columns<S: Simd, E: Elem, const KIND: u8>(q: *const E, mp: MassParams, sink: *mut Sink) -> S::F {
    let a = S::add(mass_quad::<S, E, KIND>(q, 0, mp, sink), mass_quad::<S, E, KIND>(q, 4, mp, sink));
    let b = S::add(mass_quad::<S, E, KIND>(q, 8, mp, sink), mass_quad::<S, E, KIND>(q, 12, mp, sink));
    S::add(a, b)
}

/// The f64 sum of 16 column sums, in a fixed tree.
#[inline(always)]
fn sum16(c: &[f32; 16]) -> f64 {
    let mut h = [0f64; 8];
    for j in 0..8 {
        h[j] = c[j] as f64 + c[j + 8] as f64;
    }
    ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]))
}

/// The mass of one full block at `q`.
#[inline(always)]
unsafe fn mass_block<S: Simd, E: Elem, const KIND: u8>(q: *const E, mp: MassParams, sink: *mut Sink) -> f64 {
    let mut cols = [0f32; 16];
    let mut g = 0;
    while g < 16 {
        S::store(cols.as_mut_ptr().add(g), mass_columns::<S, E, KIND>(q.add(g), mp, sink));
        g += S::LANES;
    }
    sum16(&cols)
}

/// Writes the mass (see [`MassKind`]) of each BLOCK of `row` into `out`: a sum of f32 weights,
/// the same on every SIMD level. Blocks whose maximum in `bmax` (if not empty) is below `lo`
/// give 0 without being read.
///
/// # Safety
/// `row` valid for `n` reads; `out` has `n.div_ceil(BLOCK)` elements, and `bmax` as many or none.
#[inline(always)]
pub(crate) unsafe fn mass<S: Simd, E: Elem>(
    row: *const E,
    n: usize,
    bmax: &[f32],
    mp: MassParams,
    kind: MassKind,
    out: &mut [f64],
) {
    match kind {
        MassKind::Exp => mass_kind::<S, E, 0>(row, n, bmax, mp, out),
        MassKind::ExpCut => mass_kind::<S, E, 1>(row, n, bmax, mp, out),
        MassKind::CheapCut => mass_kind::<S, E, 2>(row, n, bmax, mp, out),
        MassKind::ExpAll => mass_kind::<S, E, 3>(row, n, bmax, mp, out),
        MassKind::CheapAll => mass_kind::<S, E, 4>(row, n, bmax, mp, out),
    }
}

#[inline(always)]
unsafe fn mass_kind<S: Simd, E: Elem, const KIND: u8>(
    row: *const E,
    n: usize,
    bmax: &[f32],
    mp: MassParams,
    out: &mut [f64],
) {
    for (b, o) in out.iter_mut().enumerate() {
        if !bmax.is_empty() && bmax[b] < mp.lo {
            *o = 0.0;
            continue;
        }
        let start = b * BLOCK;
        *o = if start + BLOCK <= n {
            mass_block::<S, E, KIND>(row.add(start), mp, std::ptr::null_mut())
        } else {
            // The last, partial block: padded with -inf, which counts as nothing (or as 2^-125
            // in the kinds without a mask).
            let mut tmp = [f32::NEG_INFINITY; BLOCK];
            for (i, t) in tmp.iter_mut().enumerate().take(n - start) {
                *t = E::load::<Scalar>(row.add(start + i));
            }
            mass_block::<S, f32, KIND>(tmp.as_ptr(), mp, std::ptr::null_mut())
        };
    }
}

/// [`mass`] of kind `ExpCut`, and also appends to `cands`, in row order, every value `x >= cut`
/// (`cut` finite) of the blocks whose maximum in `bmax` reaches `cut`: one pass for the mass below
/// a cut and the tokens above it.
///
/// # Safety
/// As [`mass`], with `bmax` not empty.
#[inline(always)]
pub(crate) unsafe fn mass_gather<S: Simd, E: Elem>(
    row: *const E,
    n: usize,
    bmax: &[f32],
    mp: MassParams,
    out: &mut [f64],
    cands: &mut Vec<f32>,
) {
    let vcut = S::splat(mp.cut);
    for (b, o) in out.iter_mut().enumerate() {
        let bm = bmax[b];
        if bm < mp.lo {
            *o = 0.0;
            continue;
        }
        let start = b * BLOCK;
        let end = (start + BLOCK).min(n);
        if bm >= mp.cut && S::LANES == 16 && end - start == BLOCK {
            // Sixteen lanes visit a block's rows in index order: gather on the way.
            cands.reserve(BLOCK + 64);
            let mut sink = Sink { base: cands.as_mut_ptr(), len: cands.len() };
            *o = mass_block::<S, E, 5>(row.add(start), mp, &mut sink);
            cands.set_len(sink.len);
            continue;
        }
        if bm >= mp.cut {
            cands.reserve(BLOCK + 64);
            let base = cands.as_mut_ptr();
            let mut len = cands.len();
            let mut i = start;
            while i + S::LANES <= end {
                let x = E::load::<S>(row.add(i));
                len += S::compress_store(base.add(len), S::ge(x, vcut), x);
                i += S::LANES;
            }
            while i < end {
                let x = E::load::<Scalar>(row.add(i));
                len += Scalar::compress_store(base.add(len), x >= mp.cut, x);
                i += 1;
            }
            cands.set_len(len);
        }
        *o = if end - start == BLOCK {
            mass_block::<S, E, 1>(row.add(start), mp, std::ptr::null_mut())
        } else {
            let mut tmp = [f32::NEG_INFINITY; BLOCK];
            for (i, t) in tmp.iter_mut().enumerate().take(end - start) {
                *t = E::load::<Scalar>(row.add(start + i));
            }
            mass_block::<S, f32, 1>(tmp.as_ptr(), mp, std::ptr::null_mut())
        };
    }
}

/// Writes the f32 weight `exp2(t)` of each of the `n` values at `row` into `out` (0 outside
/// `lo <= x < cut`).
///
/// # Safety
/// `row` valid for `n` reads, `out` for `n` writes; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn mass_weights<S: Simd, E: Elem>(row: *const E, n: usize, mp: MassParams, out: *mut f32) {
    let mut i = 0;
    while i + S::LANES <= n {
        S::store(out.add(i), mass_vec::<S, E, 1>(row.add(i), mp, std::ptr::null_mut()));
        i += S::LANES;
    }
    while i < n {
        Scalar::store(out.add(i), mass_vec::<Scalar, E, 1>(row.add(i), mp, std::ptr::null_mut()));
        i += 1;
    }
}

/// Appends to `out`, in row order, every value `x >= lo` (`lo` finite) of the blocks whose
/// maximum in `bmax` reaches `lo`.
///
/// # Safety
/// `row` valid for `n` reads; `bmax` has `n.div_ceil(BLOCK)` elements; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn gather_ge<S: Simd, E: Elem>(row: *const E, n: usize, bmax: &[f32], lo: f32, out: &mut Vec<f32>) {
    let l = S::LANES;
    let vlo = S::splat(lo);
    for (b, &bm) in bmax.iter().enumerate() {
        if bm < lo {
            continue;
        }
        let (start, end) = (b * BLOCK, ((b + 1) * BLOCK).min(n));
        // Room for the block and one vector written past its last value.
        out.reserve(BLOCK + 64);
        let base = out.as_mut_ptr();
        let mut len = out.len();
        let mut i = start;
        while i + l <= end {
            let x = E::load::<S>(row.add(i));
            len += S::compress_store(base.add(len), S::ge(x, vlo), x);
            i += l;
        }
        while i < end {
            let x = E::load::<Scalar>(row.add(i));
            len += Scalar::compress_store(base.add(len), x >= lo, x);
            i += 1;
        }
        out.set_len(len);
    }
}

// The f64 weights: `exp(a)` for `a = (x - m) * inv_t` computed exactly in f64.

const MAGIC52: f64 = 6_755_399_441_055_744.0; // 1.5 * 2^52
const LN2_HI64: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000); // 32 bits: k * LN2_HI64 is exact
const LN2_LO64: f64 = f64::from_bits(0x3dea_39ef_3579_3c76); // ln 2 - LN2_HI64
/// The smallest `a` the f64 weights accept.
pub(crate) const A_MIN64: f64 = -700.0;

/// exp(a) for `A_MIN64 <= a <= 0` in f64, relative error below 1e-15: a = k ln2 + r, |r| <=
/// ln2/2, exp(r) from its Taylor series to degree 12 (truncation below 2e-16), no FMA.
#[inline(always)]
pub(crate) fn exp64(a: f64) -> f64 {
    let k = a * std::f64::consts::LOG2_E + MAGIC52;
    let kf = k - MAGIC52;
    let r = (a - kf * LN2_HI64) - kf * LN2_LO64;
    let r2 = r * r;
    let r4 = r2 * r2;
    let r8 = r4 * r4;
    const C: [f64; 13] = [
        1.0,
        1.0,
        1.0 / 2.0,
        1.0 / 6.0,
        1.0 / 24.0,
        1.0 / 120.0,
        1.0 / 720.0,
        1.0 / 5040.0,
        1.0 / 40320.0,
        1.0 / 362_880.0,
        1.0 / 3_628_800.0,
        1.0 / 39_916_800.0,
        1.0 / 479_001_600.0,
    ];
    let q0 = (C[0] + C[1] * r) + (C[2] + C[3] * r) * r2;
    let q1 = (C[4] + C[5] * r) + (C[6] + C[7] * r) * r2;
    let q2 = (C[8] + C[9] * r) + ((C[10] + C[11] * r) + C[12] * r2) * r2;
    let y = (q0 + q1 * r4) + q2 * r8;
    // The bits of k are those of MAGIC52 plus round(a / ln2); shifted by 52, only the latter is left.
    f64::from_bits(y.to_bits().wrapping_add(k.to_bits() << 52))
}

/// Row constants of the f64 mass kernel: `a = (x - m) * s` in f64; tokens `lo <= x < cut` with
/// `lo` finite and `a(lo) >= A_MIN64`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mass64Params {
    pub m: f64,
    pub s: f64,
    pub lo: f32,
    pub cut: f32,
}

#[inline(always)]
fn weight64(x: f32, p: Mass64Params) -> f64 {
    let keep = x >= p.lo && x < p.cut;
    let a = if keep { (x as f64 - p.m) * p.s } else { 0.0 };
    let w = exp64(a);
    if keep {
        w
    } else {
        0.0
    }
}

/// Writes the f64 mass of each BLOCK of `row` into `out`: per column of 16 a pairwise tree,
/// then the 16 columns in a fixed tree, so every level gives the same sums. Blocks whose
/// maximum is below `lo` give 0 without being read.
///
/// # Safety
/// As [`mass`].
#[inline(always)]
pub(crate) unsafe fn mass64<S: Simd, E: Elem>(row: *const E, n: usize, bmax: &[f32], p: Mass64Params, out: &mut [f64]) {
    for (b, o) in out.iter_mut().enumerate() {
        if !bmax.is_empty() && bmax[b] < p.lo {
            *o = 0.0;
            continue;
        }
        let start = b * BLOCK;
        let mut xs = [f32::NAN; BLOCK];
        if start + BLOCK <= n {
            let mut i = 0;
            while i < BLOCK {
                S::store(xs.as_mut_ptr().add(i), E::load::<S>(row.add(start + i)));
                i += S::LANES;
            }
        } else {
            for (i, t) in xs.iter_mut().enumerate().take(n - start) {
                *t = E::load::<Scalar>(row.add(start + i));
            }
        }
        let mut w = [0f64; BLOCK];
        for i in 0..BLOCK {
            w[i] = weight64(xs[i], p);
        }
        let mut c = [0f64; 16];
        for (j, cj) in c.iter_mut().enumerate() {
            let mut q = [0f64; 4];
            for (i, qi) in q.iter_mut().enumerate() {
                let r = 4 * i * 16 + j;
                *qi = (w[r] + w[r + 16]) + (w[r + 32] + w[r + 48]);
            }
            *cj = (q[0] + q[1]) + (q[2] + q[3]);
        }
        let mut h = [0f64; 8];
        for j in 0..8 {
            h[j] = c[j] + c[j + 8];
        }
        *o = ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]));
    }
}

/// `out[i] = exp((xs[i] - m) * s)` in f64 for values with `a >= A_MIN64` (0 below).
///
/// # Safety
/// `S` usable here (only its instruction set is used, through the compiler).
#[inline(always)]
pub(crate) unsafe fn weights64<S: Simd>(xs: &[f32], m: f64, s: f64, out: &mut [f64]) {
    for (o, &x) in out.iter_mut().zip(xs) {
        let a = (x as f64 - m) * s;
        let keep = a >= A_MIN64;
        let w = exp64(if keep { a } else { 0.0 });
        *o = if keep { w } else { 0.0 };
    }
}
